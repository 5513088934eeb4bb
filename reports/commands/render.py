"""`python -m reports render`: report.md/.json/.html, supported-models.md and the step summary from the store."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reports.analysis import analyse_aggregates, failing_now_markdown, plain_link
from reports.clones import GitRepo
from reports.commands.interface import Command
from reports.commands.options import add_deepspeed_repo, add_known_failures, add_store, known_failures
from reports.outputs import build_report, check_drift, model_families, model_support, write_outputs
from reports.store import HistoryStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_store(parser)
    parser.add_argument("--out", type=Path, default=Path("results"), help="output folder (default results/)")
    parser.add_argument(
        "--docs",
        type=Path,
        help="a copy of DeepSpeed's automatic-tensor-parallelism.md: report drift, "
        "write supported-models.diff against it",
    )
    add_deepspeed_repo(parser)
    add_known_failures(parser)


@contextmanager
def without_cycle_collection() -> Iterator[None]:
    """Render builds its objects (~1 M at a year: groups, statuses, the report's dicts) to keep them until it ends,
    and makes next to no reference cycles; the cycle collector's full passes walk every one of them again as they
    grow, ~0.7 s of render's CPU at a year for nothing (peak memory the same). Reference counting still frees what
    is dropped."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run(args: argparse.Namespace) -> int:
    with without_cycle_collection():
        return _render(args)


def _render(args: argparse.Namespace) -> int:
    repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    with HistoryStore(args.store, create=False, read_only=True) as store:
        aggregates = store.aggregates()
        history = analyse_aggregates(aggregates, repo, store.bisections(), store.triage_attempts())
    drift = check_drift(model_support(history, model_families()), args.docs) if args.docs else None
    report = build_report(history, aggregates, drift, known_failures(args.known_failures))
    for path in write_outputs(report, history, drift, args.out):
        print(f"wrote {path}")
    # The first section, where a run ends (`nox -s matrix`), from the report just written (not read back from its
    # 23 MB of JSON at a year); like everything a command prints, redacted on its way out (reports.__main__).
    print("\n".join(failing_now_markdown(report, plain_link)), end="")
    if drift:
        print(
            f"docs drift: {len(drift.listed_but_failing)} listed but failing, "
            f"{len(drift.passing_but_unlisted)} passing but unlisted"
        )
    return 0


COMMAND = Command("render", "write report.md/.json/.html, supported-models.md, summary", add_arguments, run)

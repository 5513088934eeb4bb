"""`python -m reports render`: report.md/.json/.html, supported-models.md and the step summary from the store."""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reports.analysis import analyse_aggregates, console_lines, counts_line
from reports.clones import GitRepo
from reports.commands.interface import Command
from reports.commands.options import add_deepspeed_repo, add_known_failures, add_store, known_failures
from reports.outputs import (
    ATLAS_FOLDER,
    append_step_summary,
    build_report,
    check_drift,
    draft_runs,
    inert,
    model_families,
    model_support,
    result_files,
    staged,
    write_drafts,
    write_outputs,
    write_repro_scripts,
    writing_to,
)
from reports.store import KEEP_RECENT_RUNS, HistoryStore, with_published_history


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
    parser.add_argument(
        "--history",
        metavar="ARCHIVE",
        help="also read a nightly's published history: its results archive (a folder, or a git URL of its "
        "autotp-history branch, URL#branch for another), so failures it already has say since when and which PR",
    )


@contextmanager
def without_cycle_collection() -> Iterator[None]:
    """Render builds its objects (~1 M at a year: groups, statuses, the report's dicts) to keep them until it ends,
    and makes next to no reference cycles; the cycle collector's full passes walk every one of them again as they
    grow, for nothing (docs/findings.md, "Figures from the docstrings"). Reference counting still frees what is
    dropped."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run(args: argparse.Namespace) -> int:
    with without_cycle_collection():
        if args.history is None:
            return _render(args)
        with tempfile.TemporaryDirectory(prefix="autotp-history-") as scratch:
            store, line, skipped = with_published_history(args.store, args.history, Path(scratch), KEEP_RECENT_RUNS)
            for reason in skipped:
                print(f"skipped {reason}", file=sys.stderr)
            print(line)
            return _render(argparse.Namespace(**{**vars(args), "store": store}))


def _render(args: argparse.Namespace) -> int:
    repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    with HistoryStore(args.store, create=False, read_only=True) as store:
        aggregates = store.aggregates()
        history = analyse_aggregates(aggregates, repo, store.bisections(), store.triage_attempts())
        drift = check_drift(model_support(history, model_families()), args.docs) if args.docs else None
        # Every output (repro scripts and drafts too) is written into one staging folder and moved into place
        # together: a render that fails leaves the previous one's files as they were, none of them beside new ones.
        with writing_to(args.out), staged(args.out) as stage:
            # The files the report links are written first: it names a file only when it is there.
            scripts = write_repro_scripts(history, aggregates, stage, print)
            report = build_report(
                history,
                aggregates,
                drift,
                known_failures(args.known_failures),
                result_files(args.out, history, stage, tuple(store.remedy_results())),
            )
            if scripts:  # a draft inlines its example cell's script, written here (the cells' transformers)
                observations = store.observations(draft_runs(report, history, aggregates))
                report = write_drafts(report, history, observations, stage, inert)
            written = write_outputs(report, history, (drift, args.docs) if drift else None, args.out, stage)
    written.append(append_step_summary(report, args.out))
    pages = [path for path in written if path.parent.name == ATLAS_FOLDER]
    shown = [str(path.relative_to(args.out)) if path.is_relative_to(args.out) else str(path) for path in written]
    print(
        f"wrote {', '.join(name for name, path in zip(shown, written) if path not in pages)}"
        + (f" and {len(pages)} checkpoint pages" if pages else "")
        + f" in {args.out}"
    )
    # The causes, where a run ends (`nox -s matrix`), one plain line each, from the report just written (not read back
    # from its 23 MB of JSON at a year); like everything a command prints, redacted on its way out
    # (reports.__main__); then the count, the run's last line.
    if report.failing_now.causes:
        print(f"Failing now, by cause ({args.out / 'report.md'} says what AutoTP did and whose bug each is):")
    for line in console_lines(report.failing_now):
        print(line)
    if drift:
        print(
            f"docs drift: {len(drift.listed_but_failing)} listed but failing, "
            f"{len(drift.passing_but_unlisted)} passing but unlisted"
        )
    print(f"{counts_line(report.failing_now)} at {history.latest.describe()} (report: {args.out / 'report.md'})")
    return 0


COMMAND = Command("render", "write report.md/.json/.html, supported-models.md, summary", add_arguments, run)

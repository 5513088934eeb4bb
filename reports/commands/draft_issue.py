"""`python -m reports draft-issue`: a bug report for DeepSpeed's tracker for one failing cause or cell."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports.analysis import analyse
from reports.clones import GitRepo
from reports.commands.interface import Command
from reports.commands.options import add_deepspeed_repo, add_known_failures, add_store, known_failures
from reports.outputs import inert, write_draft, writing_to
from reports.store import HistoryStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--cause", help="a cause id of report.json failing_now (the report lists them)")
    which.add_argument("--cell", help="a failing cell id at the latest versions, e.g. bloom-eager-fp32-tp2")
    add_store(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("results"),
        help="output folder; the report and its repro script go to OUT/draft-issue/",
    )
    add_known_failures(parser)
    add_deepspeed_repo(parser)


def run(args: argparse.Namespace) -> int:
    repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    with HistoryStore(args.store, create=False, read_only=True) as store:
        observations = store.observations()
        history = analyse(observations, repo, store.bisections(), store.triage_attempts())
        remedies = tuple(store.remedy_results())
    with writing_to(args.out):
        draft = write_draft(
            history,
            observations,
            known_failures(args.known_failures),
            cause=args.cause,
            cell=args.cell,
            out_dir=args.out,
            inert=inert,
            remedies=remedies,
        )
    print(f"# {draft.title}\n\n{draft.body}")
    print(f"wrote {draft.file}", file=sys.stderr)
    return 0


COMMAND = Command(
    "draft-issue",
    "a Markdown bug report for DeepSpeed's tracker, for one cause failing at the latest versions",
    add_arguments,
    run,
)

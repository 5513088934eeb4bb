"""`python -m reports archive-needs`: which archive entries a merge reads (a sparse checkout of the data branch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from reports import ReportsError
from reports.commands.interface import Command
from reports.commands.options import add_store
from reports.store import HistoryStore, Redact, RunRecords, admit, find_junit_files, needed_paths, redactor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=Path, help="JUnit files, results/ or artifact folders")
    parser.add_argument(
        "--names", type=Path, required=True, help="the archive's file names, one a line (git ls-tree -r --name-only)"
    )
    add_store(parser)


def run(args: argparse.Namespace) -> int:
    """Print the archive entries (of the names listed in --names) that merging INPUTS into the store needs read:
    the data branch is then checked out sparsely (.github/scripts/results-archive.sh fetch STORE INPUTS)."""
    try:
        names = args.names.read_text().split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportsError(
            f"{args.names}: cannot read the archive's entry names ({exc}); pass `git ls-tree` output"
        ) from None
    redact = redactor()
    incoming = {r.run.run_id for path in find_junit_files(args.inputs) for r in _readable_runs(path, redact)}
    with HistoryStore(args.store, create=False, read_only=True) as store:
        stored = {run.run_id for run in store.runs()}
    print("".join(f"{name}\n" for name in needed_paths(names, stored, incoming)), end="")
    return 0


def _readable_runs(path: Path, redact: Redact) -> list[RunRecords]:
    """The runs of a JUnit file as merge's door reads them, none when merge would skip it (it says why then)."""
    try:
        return admit(path, redact)
    except ReportsError:
        return []


COMMAND = Command(
    "archive-needs",
    "the archive entries merging INPUTS into --store reads (for a sparse checkout of the data branch)",
    add_arguments,
    run,
)

"""`python -m reports verify`: exit 1 when the store holds what its archive lacks."""

from __future__ import annotations

import argparse
import sys

from reports.commands.interface import Command
from reports.commands.options import add_archive, add_store
from reports.store import HistoryStore, ResultsArchive, answer_key, default_archive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive(parser)
    add_store(parser)


def run(args: argparse.Namespace) -> int:
    """Exit 1 when the store holds a run or an answer the archive lacks: a lost store would lose it."""
    archive = ResultsArchive(args.archive or default_archive(args.store))
    archived_runs = {entry.run_id for entry in archive.entries()}
    archived_answers = {answer_key(answer) for answer in archive.answers()}
    with HistoryStore(args.store, create=False, read_only=True) as store:
        runs = [run.run_id for run in store.runs()]
        answers = [answer_key(answer) for answer in [*store.bisections(), *store.triage_attempts()]]
    missing_runs = [run_id for run_id in runs if run_id not in archived_runs]
    missing_answers = [key for key in answers if key not in archived_answers]
    if missing_runs or missing_answers:
        shown = ", ".join(missing_runs[:3]) + (", ..." if len(missing_runs) > 3 else "")
        print(
            f"error: {args.store}: {len(missing_runs)} run(s) ({shown}) and {len(missing_answers)} answer(s) are "
            f"not in the archive {archive.root}, so a lost store would lose them; merge the runs' JUnit files "
            f"again with `python -m reports merge FILES --store {args.store}` (it archives them and the answers)",
            file=sys.stderr,
        )
        return 1
    print(f"{args.store}: all {len(runs)} run(s) and {len(answers)} answer(s) are in the archive {archive.root}")
    return 0


COMMAND = Command(
    "verify",
    "exit 1 when the store holds a run or answer the results archive lacks (it could not be rebuilt)",
    add_arguments,
    run,
)

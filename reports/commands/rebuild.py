"""`python -m reports rebuild`: the history store recreated, or brought up to date, from the results archive."""

from __future__ import annotations

import argparse
import sys

from reports.commands.interface import Command
from reports.commands.options import add_archive, add_keep_recent_runs, add_store
from reports.store import HistoryStore, ResultsArchive, bring_up_to_date, default_archive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive(parser)
    add_store(parser)
    add_keep_recent_runs(parser)


def run(args: argparse.Namespace) -> int:
    """Import every archive entry the store lacks: a new store gets the whole history, a stale one (an older
    cache) the runs merged since. A first attempt whose run is stored is skipped unread. Every entry is read and
    validated as merge's door does; one that does not open, is not valid or contradicts the store is skipped with a
    line naming it (`verify` fails on it), and the rest imports. All of it lands in one transaction: the store is
    never left half-imported."""
    archive = ResultsArchive(args.archive or default_archive(args.store))
    with HistoryStore(args.store, create=True) as store:
        counts = bring_up_to_date(store, archive, args.keep_recent_runs)
    for reason in counts.skipped:
        print(f"skipped {reason}", file=sys.stderr)
    print(
        f"{args.store}: {counts.runs} new run(s), {counts.results} new result(s) from {counts.read} of "
        f"{counts.entries} archive entries in {archive.root}, {counts.answers} new answer(s)"
        + (f", {counts.remedy_results} new remedy result(s)" if counts.remedy_results else "")
        + (f"; {len(counts.skipped)} skipped (above)" if counts.skipped else "")
    )
    return 0


COMMAND = Command(
    "rebuild",
    "recreate the history store (or bring a stale one up to date) from the results archive",
    add_arguments,
    run,
)

"""`python -m reports rebuild`: the history store recreated, or brought up to date, from the results archive."""

from __future__ import annotations

import argparse
import sys

from reports.commands.interface import Command
from reports.commands.options import add_archive, add_keep_recent_runs, add_store
from reports.store import Bisection, HistoryStore, ResultsArchive, StoreConflict, answer_key, default_archive
from reports.store import DamagedEntry


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
    entries = archive.entries()
    runs = results = read = 0
    skipped = []
    with HistoryStore(args.store, create=True) as store:
        stored = {run.run_id for run in store.runs()}
        with store.transaction():
            for entry in entries:  # every one in order: a damaged one is skipped, never the end of the history
                if entry.attempt == 1 and entry.run_id in stored:
                    continue
                try:
                    records = archive.read(entry)
                    counts = store.import_runs([(records.run, list(records.results))], source=entry.path)
                except (DamagedEntry, StoreConflict) as exc:
                    skipped.append(str(exc))
                    continue
                store.record_entries({archive.name(entry): archive.sha256(entry)})
                read += 1
                runs += counts.new_runs
                results += counts.new_results
            known = {answer_key(answer) for answer in [*store.bisections(), *store.triage_attempts()]}
            answers = [answer for answer in archive.answers(skipped.append) if answer_key(answer) not in known]
            for answer in answers:
                (store.add_bisection if isinstance(answer, Bisection) else store.add_triage_attempt)(answer)
        store.compact(args.keep_recent_runs)
    for reason in skipped:
        print(f"skipped {reason}", file=sys.stderr)
    print(
        f"{args.store}: {runs} new run(s), {results} new result(s) from {read} of {len(entries)} archive "
        f"entries in {archive.root}, {len(answers)} new answer(s)"
        + (f"; {len(skipped)} skipped (above)" if skipped else "")
    )
    return 0


COMMAND = Command(
    "rebuild",
    "recreate the history store (or bring a stale one up to date) from the results archive",
    add_arguments,
    run,
)

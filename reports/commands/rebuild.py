"""`python -m reports rebuild`: the history store recreated, or brought up to date, from the results archive."""

from __future__ import annotations

import argparse

from reports.commands.interface import Command
from reports.commands.options import add_archive, add_keep_recent_runs, add_store
from reports.store import Bisection, HistoryStore, ResultsArchive, answer_key, default_archive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive(parser)
    add_store(parser)
    add_keep_recent_runs(parser)


def run(args: argparse.Namespace) -> int:
    """Import every archive entry the store lacks: a new store gets the whole history, a stale one (an older
    cache) the runs merged since. A first attempt whose run is stored is skipped unread (all-or-nothing imports)."""
    archive = ResultsArchive(args.archive or default_archive(args.store))
    entries = archive.entries()
    runs = results = read = 0
    with HistoryStore(args.store, create=True) as store:
        stored = {run.run_id for run in store.runs()}
        for entry in entries:
            if entry.attempt == 1 and entry.run_id in stored:
                continue
            counts = store.import_runs([archive.read(entry)], source=entry.path)
            read += 1
            runs += counts.new_runs
            results += counts.new_results
        known = {answer_key(answer) for answer in [*store.bisections(), *store.triage_attempts()]}
        answers = [answer for answer in archive.answers() if answer_key(answer) not in known]
        for answer in answers:
            (store.add_bisection if isinstance(answer, Bisection) else store.add_triage_attempt)(answer)
        store.compact(args.keep_recent_runs)
    print(
        f"{args.store}: {runs} new run(s), {results} new result(s) from {read} of {len(entries)} archive "
        f"entries in {archive.root}, {len(answers)} new answer(s)"
    )
    return 0


COMMAND = Command(
    "rebuild",
    "recreate the history store (or bring a stale one up to date) from the results archive",
    add_arguments,
    run,
)

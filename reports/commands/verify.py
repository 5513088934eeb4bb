"""`python -m reports verify`: exit 1 when the archive could not rebuild the store: the archive is rebuilt into a
scratch store and compared with the live one, so every entry rebuild would skip (not a regular file, listed under
two names, damaged, changed since it was recorded, contradicting another attempt) and every run, verdict or answer
the rebuilt store would lack or hold otherwise is named."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from reports.commands.interface import Command
from reports.commands.options import add_archive, add_store
from reports.store import (
    KEEP_RECENT_RUNS,
    HistoryStore,
    ResultsArchive,
    Run,
    answer_key,
    bring_up_to_date,
    canonical,
    default_archive,
)

Verdicts = dict[str, tuple[Run, frozenset[tuple[str, str, str, str]]]]
"""Each trusted run of a store by run id: its record and its results' (cell id, outcome, class, signature)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive(parser)
    add_store(parser)


def run(args: argparse.Namespace) -> int:
    """Rebuild the archive into a scratch store (exactly what `rebuild` does with a lost store) and compare: every
    entry the rebuild skipped, every entry whose SHA-256 differs from the one recorded when it was merged, every entry
    the store recorded that is no longer listed, every trusted run or answer of the store the rebuilt one lacks or
    holds with another record or other verdicts, every remedy result (a proof) it lacks. Entries a sparse checkout left
    out (the data branch's index only)
    are checked by name. Untrusted runs (a pull request's) are never archived."""
    archive = ResultsArchive(args.archive or default_archive(args.store))
    listing = archive.listing()
    present = tuple(entry for entry in listing.entries if os.path.lexists(entry.path))
    index_only = {entry.run_id for entry in listing.entries} - {entry.run_id for entry in present}
    with HistoryStore(args.store, create=False, read_only=True) as store:
        live = _verdicts(store)
        answers = {answer_key(answer) for answer in store.answers()}
        proofs = {canonical(result) for result in store.remedy_results()}
        recorded = store.entry_hashes()
    with tempfile.TemporaryDirectory(prefix="autotp-verify-") as scratch:
        with HistoryStore(Path(scratch) / "rebuilt.sqlite", create=True) as rebuilt:
            counts = bring_up_to_date(rebuilt, archive, KEEP_RECENT_RUNS, replace(listing, entries=present))
            reproduced, hashes = _verdicts(rebuilt), rebuilt.entry_hashes()
            reproduced_answers = {answer_key(answer) for answer in rebuilt.answers()}
            missing_proofs = proofs - {canonical(result) for result in rebuilt.remedy_results()}
    problems = list(counts.skipped)
    problems += [
        f"{archive.root / name}: SHA-256 {hashes[name][:16]}… differs from the {expected[:16]}… recorded when it was "
        "merged: the entry was changed; restore it from the data branch's history"
        for name, expected in sorted(recorded.items())
        if name in hashes and hashes[name] != expected
    ]
    listed = {archive.name(entry) for entry in listing.entries}
    problems += [
        f"{archive.root / name}: recorded in {args.store} but no longer in the archive; restore it from the data "
        "branch's history"
        for name in sorted(recorded.keys() - listed)
    ]
    problems += _differences(live, reproduced, index_only, args.store, archive.root)
    missing_runs = sorted(run_id for run_id in live if run_id not in reproduced and run_id not in index_only)
    missing_answers = answers - reproduced_answers
    if missing_proofs:
        problems.append(
            f"{args.store}: {len(missing_proofs)} remedy result(s) are not in the archive {archive.root}, so a lost "
            f"store would lose the proofs; merge the results' remedies.json again with `python -m reports merge`"
        )
    if missing_runs or missing_answers:
        shown = ", ".join(missing_runs[:3]) + (", ..." if len(missing_runs) > 3 else "")
        problems.append(
            f"{args.store}: {len(missing_runs)} run(s) ({shown}) and {len(missing_answers)} answer(s) are "
            f"not in the archive {archive.root}, so a lost store would lose them; merge the runs' JUnit files "
            f"again with `python -m reports merge FILES --store {args.store}` (it archives them and the answers)"
        )
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"{archive.root}: {counts.read} of {len(listing.entries)} entries read back valid"
        + (f" ({len(listing.entries) - len(present)} in the data branch's index only)" if index_only else "")
    )
    print(f"{args.store}: all {len(live)} run(s) and {len(answers)} answer(s) are in the archive {archive.root}")
    return 0


def _verdicts(store: HistoryStore) -> Verdicts:
    """The trusted runs of a store with their verdicts (what compaction keeps of every result)."""
    runs = {run.run_id: run for run in store.runs() if run.trusted}
    results: dict[str, set[tuple[str, str, str, str]]] = {run_id: set() for run_id in runs}
    for observation in store.observations(list(runs)):
        result = observation.result
        results[result.run_id].add((result.cell.id, result.outcome, result.failure_class, result.signature))
    return {run_id: (run, frozenset(results[run_id])) for run_id, run in runs.items()}


def _differences(live: Verdicts, rebuilt: Verdicts, index_only: set[str], store: Path, archive: Path) -> list[str]:
    """A line per run both stores hold whose record or verdicts differ."""
    found = []
    for run_id, (run, verdicts) in sorted(live.items()):
        if run_id not in rebuilt or run_id in index_only:
            continue
        other_run, other_verdicts = rebuilt[run_id]
        if other_run != run:
            found.append(
                f"{store}: run {run_id!r} is held with other provenance or versions than the archive {archive} "
                "rebuilds it with; rebuild the store from the archive (`python -m reports rebuild` into a new file)"
            )
        elif other_verdicts != verdicts:
            cells = sorted({cell for cell, *_ in verdicts ^ other_verdicts})
            found.append(
                f"{store}: run {run_id!r} has other verdicts than the archive {archive} rebuilds "
                f"(cells {', '.join(cells[:3])}{', ...' if len(cells) > 3 else ''}); rebuild the store from the archive"
            )
    return found


COMMAND = Command(
    "verify",
    "exit 1 when the archive rebuilt into a scratch store differs from the store (an entry skipped, changed or lost, "
    "a run, verdict or answer the archive lacks)",
    add_arguments,
    run,
)

"""`python -m reports merge`: JUnit files into the results archive and the history store."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from matrix.remedies import RemedyResult
from reports import ReportsError
from reports.commands.interface import Command
from reports.commands.options import add_archive, add_keep_recent_runs, add_store
from reports.store import (
    ArchiveConflict,
    HistoryStore,
    Redact,
    ResultsArchive,
    RunRecords,
    StoreConflict,
    admit,
    admit_remedies,
    default_archive,
    find_junit_files,
    find_remedy_files,
    redactor,
    refused_untrusted,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs", nargs="+", type=Path, help="JUnit files, remedies.json files, results/ or artifact folders"
    )
    add_store(parser)
    add_archive(parser)
    add_keep_recent_runs(parser)
    parser.add_argument(
        "--untrusted",
        action="store_true",
        help="the files are a pull request's results: stored as untrusted runs (never a gate's baseline, never "
        "publish's previous run) and never archived; CI merges them into a disposable copy of the store",
    )


def run(args: argparse.Namespace) -> int:
    """Exit 0 only when something usable was read and nothing contradicts the archive or the store: a folder of
    truncated files must not look like a night whose results were all known already. Every file passes the door
    (reports.store.door: read, redacted, validated) before anything of it is written; one that fails is skipped with
    one line naming it, the field and the value, and the others merge. One file's records are held at a time."""
    remedy_files = find_remedy_files(args.inputs)
    files = [path for path in find_junit_files(args.inputs) if path not in remedy_files]
    redact = redactor()
    archive = ResultsArchive(args.archive or default_archive(args.store), redact)
    merged = _Merged()
    with ExitStack() as opened:
        store: HistoryStore | None = None  # opened at the first usable file: none leaves the store unchanged
        for path in files:
            try:
                file_runs = admit(path, redact, trusted=not args.untrusted)
            except ReportsError as exc:  # one bad file must not stop the others
                print(f"skipped {exc}", file=sys.stderr)
                merged.skipped += 1
                continue
            store = store or opened.enter_context(HistoryStore(args.store, create=True))
            _merge_file(path, file_runs, store, archive, args.untrusted, merged)
            del file_runs  # before the next file's are read
        for results in _admitted_remedies(remedy_files, redact, args.untrusted, merged):
            store = store or opened.enter_context(HistoryStore(args.store, create=True))
            merged.remedy_results += store.add_remedy_results(results)
            merged.archived_remedies += archive.add_remedy_results(results)
            merged.imported += 1
        if store is None:
            given = len(files) + len(remedy_files)
            found = f"all {given} file(s) were skipped (above)" if given else "no JUnit (*.xml) file in them"
            raise ReportsError(
                f"nothing to import from {' '.join(map(str, args.inputs))}: {found}; {args.store} is "
                "unchanged — pass the session's junit/ folder or the downloaded artifacts"
            )
        if not args.untrusted:
            merged.answers = archive.add_answers(store.answers())  # bisect/triage since
        store.compact(args.keep_recent_runs)  # old results keep their verdict only (reports/README.md "Compaction")
    for conflict in merged.conflicts:
        print(f"conflict {conflict}", file=sys.stderr)
    trust = " (untrusted: a pull request's)" if args.untrusted else ""
    print(
        f"{args.store}: {merged.runs} new run(s){trust}, {merged.results} new result(s) from {merged.imported} "
        f"file(s); {merged.skipped} skipped"
    )
    if args.untrusted:
        print(f"{archive.root}: nothing archived (untrusted runs are never part of the history)")
    else:
        entries = f"{merged.archived} new archive entr{'y' if merged.archived == 1 else 'ies'}"
        print(f"{archive.root}: {entries}, {merged.answers} new answer(s)")
    if remedy_files and not args.untrusted:  # the proofs (docs/remedies.md "The proofs are history")
        print(
            f"{args.store} and {archive.root}: {merged.remedy_results} and {merged.archived_remedies} new remedy "
            f"result(s) from {len(remedy_files)} remedies.json file(s)"
        )
    if merged.conflicts:
        raise ReportsError(
            f"{len(merged.conflicts)} file(s) contradict runs already in {args.store} or its archive (above) "
            "and were not imported"
        )
    return 0


@dataclass
class _Merged:
    """What a merge did so far, for its closing lines."""

    runs: int = 0  # new runs stored
    results: int = 0  # new results stored
    imported: int = 0  # files imported
    skipped: int = 0  # files the door refused
    archived: int = 0  # archive entries written
    answers: int = 0  # answers archived
    remedy_results: int = 0  # results of `nox -s remedy` stored (reports.store.remedy_door)
    archived_remedies: int = 0  # and archived
    conflicts: list[str] = field(default_factory=list)  # files contradicting the store or the archive, one line each


def _admitted_remedies(
    paths: list[Path], redact: Redact, untrusted: bool, merged: _Merged
) -> Iterator[list[RemedyResult]]:
    """Each remedies.json through its door (reports.store.remedy_door), a refused one skipped with its line; a pull
    request's are never merged (a proof is the history's own)."""
    for path in paths:
        try:
            if untrusted:
                raise refused_untrusted(path)
            yield admit_remedies(path, redact)
        except ReportsError as exc:
            print(f"skipped {exc}", file=sys.stderr)
            merged.skipped += 1


def _merge_file(
    path: Path,
    file_runs: list[RunRecords],
    store: HistoryStore,
    archive: ResultsArchive,
    untrusted: bool,
    merged: _Merged,
) -> None:
    try:
        if not untrusted:  # first: the archive is what the store is rebuilt from; a remedied run the door marked
            written = archive.add(path, [records for records in file_runs if records.run.trusted])  # is never in it
            merged.archived += len(written)
            store.record_entries({archive.name(entry): archive.sha256(entry) for entry in written})
        counts = store.import_runs([(records.run, list(records.results)) for records in file_runs], path)
    except (ArchiveConflict, StoreConflict) as exc:
        merged.conflicts.append(str(exc))
        return
    merged.imported += 1
    merged.runs += counts.new_runs
    merged.results += counts.new_results


COMMAND = Command("merge", "import JUnit files into the history store and the results archive", add_arguments, run)

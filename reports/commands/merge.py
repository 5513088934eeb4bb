"""`python -m reports merge`: JUnit files into the results archive and the history store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports import ReportsError
from reports.commands.interface import Command
from reports.commands.options import add_archive, add_keep_recent_runs, add_store
from reports.store import (
    ArchiveConflict,
    HistoryStore,
    ResultsArchive,
    StoreConflict,
    admit,
    default_archive,
    find_junit_files,
    redactor,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=Path, help="JUnit files, results/ or artifact folders")
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
    (reports.store.door: read, redacted, validated) before anything is written; one that fails is skipped with one
    line naming it, the field and the value, and the others merge."""
    files = find_junit_files(args.inputs)
    redact = redactor()
    archive = ResultsArchive(args.archive or default_archive(args.store), redact)
    readable, skipped = [], []
    for path in files:
        try:
            readable.append((path, admit(path, redact, trusted=not args.untrusted)))
        except ReportsError as exc:  # one bad file must not stop the others
            skipped.append(str(exc))
    for reason in skipped:
        print(f"skipped {reason}", file=sys.stderr)
    if not readable:
        found = f"all {len(files)} file(s) were skipped (above)" if files else "no JUnit (*.xml) file in them"
        raise ReportsError(
            f"nothing to import from {' '.join(map(str, args.inputs))}: {found}; {args.store} is "
            "unchanged — pass the session's junit/ folder or the downloaded artifacts"
        )
    runs = results = imported = archived = answers = 0
    conflicts = []
    with HistoryStore(args.store, create=True) as store:
        for path, file_runs in readable:
            try:
                if not args.untrusted:  # first: the archive is what the store is rebuilt from
                    written = archive.add(path, file_runs)
                    archived += len(written)
                    store.record_entries({archive.name(entry): archive.sha256(entry) for entry in written})
                counts = store.import_runs([(records.run, list(records.results)) for records in file_runs], path)
            except (ArchiveConflict, StoreConflict) as exc:
                conflicts.append(str(exc))
                continue
            imported += 1
            runs += counts.new_runs
            results += counts.new_results
        if not args.untrusted:
            answers = archive.add_answers(store.answers())  # bisect/triage since
        store.compact(args.keep_recent_runs)  # old results keep their verdict only (reports/README.md "Compaction")
    for conflict in conflicts:
        print(f"conflict {conflict}", file=sys.stderr)
    trust = " (untrusted: a pull request's)" if args.untrusted else ""
    print(
        f"{args.store}: {runs} new run(s){trust}, {results} new result(s) from {imported} file(s); "
        f"{len(skipped)} skipped"
    )
    if args.untrusted:
        print(f"{archive.root}: nothing archived (untrusted runs are never part of the history)")
    else:
        print(f"{archive.root}: {archived} new archive entr{'y' if archived == 1 else 'ies'}, {answers} new answer(s)")
    if conflicts:
        raise ReportsError(
            f"{len(conflicts)} file(s) contradict runs already in {args.store} or its archive (above) "
            "and were not imported"
        )
    return 0


COMMAND = Command("merge", "import JUnit files into the history store and the results archive", add_arguments, run)

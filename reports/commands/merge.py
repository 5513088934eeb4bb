"""`python -m reports merge`: JUnit files into the results archive and the history store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports import ReportsError
from reports.commands.interface import Command
from reports.commands.options import add_archive, add_keep_recent_runs, add_store
from reports.store import ArchiveConflict, HistoryStore, ResultsArchive, StoreConflict, default_archive
from reports.store import find_junit_files, read_junit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=Path, help="JUnit files, results/ or artifact folders")
    add_store(parser)
    add_archive(parser)
    add_keep_recent_runs(parser)


def run(args: argparse.Namespace) -> int:
    """Exit 0 only when something usable was read and nothing contradicts the archive or the store: a folder of
    truncated files must not look like a night whose results were all known already."""
    files = find_junit_files(args.inputs)
    archive = ResultsArchive(args.archive or default_archive(args.store))
    readable, skipped = [], []
    for path in files:
        try:
            readable.append((path, read_junit(path)))
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
    runs = results = imported = archived = 0
    conflicts = []
    with HistoryStore(args.store, create=True) as store:
        for path, file_runs in readable:
            try:
                archived += len(archive.add(path, file_runs))  # first: the archive is what the store is rebuilt from
                counts = store.import_runs(file_runs, source=path)
            except (ArchiveConflict, StoreConflict) as exc:
                conflicts.append(str(exc))
                continue
            imported += 1
            runs += counts.new_runs
            results += counts.new_results
        answers = archive.add_answers([*store.bisections(), *store.triage_attempts()])  # bisect/triage since
        store.compact(args.keep_recent_runs)  # old results keep their verdict only (reports/README.md "Compaction")
    for conflict in conflicts:
        print(f"conflict {conflict}", file=sys.stderr)
    print(f"{args.store}: {runs} new run(s), {results} new result(s) from {imported} file(s); {len(skipped)} skipped")
    print(f"{archive.root}: {archived} new archive entr{'y' if archived == 1 else 'ies'}, {answers} new answer(s)")
    if conflicts:
        raise ReportsError(
            f"{len(conflicts)} file(s) contradict runs already in {args.store} or its archive (above) "
            "and were not imported"
        )
    return 0


COMMAND = Command("merge", "import JUnit files into the history store and the results archive", add_arguments, run)

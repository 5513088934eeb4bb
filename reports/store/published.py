"""A store brought up to date from a results archive (`rebuild`), and a local run read together with a nightly's
published history (`render --history`): a contributor's first run then says "known since 0.19.x, first bad PR #…"
for the failures the nightly already has, instead of "since the first run".

A published history is a results archive (reports/README.md "Archive"): a folder, a results folder holding one
(`archive/`), or a git repository whose branch is one (CI pushes it to the `autotp-history` branch): an https or
file URL, `#<branch>` naming another branch. The local store is copied (never written) and the archive's runs and
answers it lacks are imported into the copy, which the command then reads like any store."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from reports import ReportsError
from reports.store.archive import ArchiveListing, DamagedEntry, ResultsArchive, answer_key
from reports.store.history_store import HistoryStore, StoreConflict
from reports.store.records import Bisection
from suites.base.git import GitFailed, run_git

PUBLISHED_BRANCH = "autotp-history"
"""The branch CI pushes the archive to (.github/workflows/autotp.yml ARCHIVE_BRANCH)."""
CLONE_TIMEOUT_S = 600
# A published history is anyone's repository: its links are checked out as the small files that hold their targets
# (never as links: an entry linked to /dev/zero or a FIFO is then a damaged entry like any other), only https and
# file URLs are followed (never ext:: or a transport that runs a command), and no filter or hook of ours runs on it.
_HOSTILE_CLONE = (
    "-c",
    "core.symlinks=false",
    "-c",
    "protocol.allow=never",
    "-c",
    "protocol.https.allow=always",
    "-c",
    "protocol.file.allow=always",
    "-c",
    "core.hooksPath=/dev/null",
)


@dataclass(frozen=True)
class RebuildCounts:
    runs: int
    results: int
    read: int
    entries: int
    answers: int
    remedy_results: int
    """Results of `nox -s remedy` the store lacked."""
    skipped: tuple[str, ...]
    """One line per entry or answer left out: it does not open, is not valid or contradicts the store."""


def bring_up_to_date(
    store: HistoryStore, archive: ResultsArchive, keep_recent_runs: int, listing: ArchiveListing | None = None
) -> RebuildCounts:
    """Import every archive entry the store lacks (a first attempt whose run is stored is skipped unread), then the
    answers and remedy results it lacks; compacts as every import does. Every entry is read and validated as merge's
    door does; one that is not a regular file, is listed under two names, does not open, is not valid or contradicts
    the store is skipped with a line naming it (`verify` fails on it), and the rest imports. All of it lands in one
    transaction: the store is never left half-imported. `listing`: the entries to import, when not all the archive
    lists."""
    listing = listing or archive.listing()
    entries = listing.entries
    runs = results = read = 0
    skipped: list[str] = list(listing.refused)
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
        known = {answer_key(answer) for answer in store.answers()}
        answers = [answer for answer in archive.answers(skipped.append) if answer_key(answer) not in known]
        for answer in answers:
            if isinstance(answer, Bisection):
                store.add_bisection(answer)
            else:
                store.add_triage_attempt(answer)
        proofs = store.add_remedy_results(archive.remedy_results(skipped.append))  # the proofs a report states
    store.compact(keep_recent_runs)
    return RebuildCounts(runs, results, read, len(entries), len(answers), proofs, tuple(skipped))


def published_archive(source: str, scratch: Path) -> Path:
    """The archive folder `source` names: a git URL cloned (depth 1) into `scratch`, or a local folder (an archive,
    or a results folder holding `archive/`)."""
    if "://" in source:
        url, _, branch = source.partition("#")
        clone = scratch / "published"
        try:
            done = run_git(
                *_HOSTILE_CLONE,
                *("clone", "--quiet", "--depth", "1", "--branch", branch or PUBLISHED_BRANCH, "--", url, str(clone)),
                timeout=CLONE_TIMEOUT_S,
                env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
            )
        except GitFailed as failed:
            if not failed.timed_out:
                raise ReportsError(f"--history {source}: {failed}; or pass a local folder") from None
            raise ReportsError(
                f"--history {source}: the clone did not finish in {CLONE_TIMEOUT_S} s; pass a local folder"
            ) from None
        if done.returncode != 0:
            raise ReportsError(
                f"--history {source}: cannot clone branch {branch or PUBLISHED_BRANCH} "
                f"({done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'git failed'}); pass the "
                "repository URL of a nightly's autotp-history branch (URL#branch for another) or a local folder"
            )
        return clone
    folder = Path(source)
    if (folder / "archive").is_dir():
        return folder / "archive"
    if not folder.is_dir():
        raise ReportsError(f"--history {source}: no such folder; pass a results archive folder or a git URL")
    return folder


def with_published_history(
    store: Path, source: str, scratch: Path, keep_recent_runs: int
) -> tuple[Path, str, tuple[str, ...]]:
    """A copy of `store` (in `scratch`) holding also the published history's runs and answers, one line saying what
    it added, and a line per entry or answer of it left out (rebuild's)."""
    archive = ResultsArchive(published_archive(source, scratch))
    combined = scratch / "combined.sqlite"
    if store.is_file():
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as local, sqlite3.connect(combined) as copy:
            local.backup(copy)
    with HistoryStore(combined, create=True) as history:
        counts = bring_up_to_date(history, archive, keep_recent_runs)
    return (
        combined,
        f"history: {counts.runs} run(s) and {counts.answers} answer(s) from the published history {source} "
        f"read with {store}" + (f"; {len(counts.skipped)} skipped (above)" if counts.skipped else ""),
        counts.skipped,
    )

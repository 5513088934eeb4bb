"""The results archive: every merged run's records, append-only, the source the history store is rebuilt from.

Layout (reports/README.md "Archive"): `<archive>/<session>/<run id>.<attempt>.tar.gz`, names percent-encoded
(`:` of the start time becomes `%3A`). An entry of format 2 is a gzip'd tar of one member, `records.json`: the run's
records as they passed the door (reports.store.door) — read, redacted, validated — as canonical JSON; never the raw
bytes a runner sent, which are public once the archive is pushed. Entries of format 1 (the JUnit file byte for byte
and that run's cells.jsonl lines) are read back through the same door, so they rebuild as they did. Attempt 1 is the
run as first merged; a later merge of the same run that adds cells (a run continued after an interruption) adds
attempt 2, and so on. Entries are written once and never changed: merging the same run again adds nothing, and a run
that comes back with another verdict for a cell it already has is an error. Only trusted runs are archived.

Answers (what bisect and triage found) are kept as well, one small JSON file each, named by a hash of its
content: `<archive>/answers/bisection-<hash>.json` and `triage-attempt-<hash>.json`. So are the results of
`nox -s remedy` (the proofs a report states), one file each: `<archive>/remedies/<remedy>-<hash>.json`, read back
through their door (reports.store.remedy_door).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from matrix.remedies import RemedyResult
from reports import ReportsError
from reports.store.door import Redact, Rejected, admitted_bytes, redact_fields, redactor
from reports.store.entry_files import (
    MAX_ANSWER_BYTES,
    MAX_ENTRY_BYTES,
    EntryRefused,
    read_regular,
    regular_files,
    tar_members,
)
from reports.store.entry_records import entry_json, from_json
from reports.store.junit import MalformedJUnit, shown
from reports.store.proof_rows import canonical
from reports.store.records import (
    Bisection,
    CellKey,
    CellResult,
    Commit,
    Run,
    RunRecords,
    TriageAttempt,
    parse_pins,
    pins_text,
)
from reports.store.remedy_door import MAX_RESULTS_BYTES, admit_remedies_text
from reports.store.validation import first_problem, in_utc, problems_of
from suites.base.git import GitFailed, run_git

ANSWERS = "answers"
REMEDIES = "remedies"
RECORDS_MEMBER = "records.json"  # format 2
JUNIT_MEMBER = "junit.xml"  # format 1, with CELLS_MEMBER
CELLS_MEMBER = "cells.jsonl"
_ENTRY_NAME = re.compile(r"(?P<run>.+)\.(?P<attempt>[1-9][0-9]*)\.tar\.gz")
# What may stay unencoded in a file name: safe in git, on every OS and in an artifact upload.
_SAFE = "@()+,=_.-"


def default_archive(store: Path) -> Path:
    """The archive of a store, unless given: `archive/` next to it (in CI, the checkout of the data branch)."""
    return Path(store).parent / "archive"


@dataclass(frozen=True)
class ArchiveEntry:
    path: Path
    run_id: str
    attempt: int


@dataclass(frozen=True)
class ArchiveListing:
    """What an archive lists: its entries, and a line for each file in their place that is left out unread (not a
    regular file, not the name merge gives its run, a run id listed under two names)."""

    entries: tuple[ArchiveEntry, ...]
    refused: tuple[str, ...]


class ArchiveConflict(ReportsError):
    """A run came back with content that contradicts what the archive already holds for it."""


class DamagedEntry(ReportsError):
    """An entry that does not open, or whose records are not valid: rebuild skips it, verify names it."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}; restore it from the data branch's history, or move it out of the archive")


class ResultsArchive:
    def __init__(self, root: Path, redact: Redact | None = None):
        self.root = Path(root)
        self._redact = redact or redactor()

    def entries(self) -> list[ArchiveEntry]:
        """Every entry, in (session, run id, attempt) order (what `listing` refuses left out)."""
        return list(self.listing().entries)

    def listing(self) -> ArchiveListing:
        """Every entry, in (session, run id, attempt) order, and a line naming each file left out unread: one that is
        not a regular file (a link, a FIFO), whose name is not the one merge gives its run (`%40` for `@`, another
        folder than its session's), or whose run id is also listed under another name (which of them is the run's
        cannot be told: all are left out)."""
        if not self.root.is_dir():
            raise ReportsError(
                f"{self.root}: no results archive here; pass the folder `python -m reports merge` "
                "archived into (in CI, the checkout of the autotp-history branch)"
            )
        listed = regular_files(self.root, ".tar.gz", depth=2)
        refused = [f"{refusal}; move it out of {self.root}" for refusal in listed.refused]
        present = set(listed.files)
        gone = {refusal.path for refusal in listed.refused}
        by_run: dict[str, list[ArchiveEntry]] = defaultdict(list)
        for path in sorted(present | (self._index_only_paths() - gone)):
            entry = _entry_at(path)
            if entry is None or _entry_name(entry.run_id, entry.attempt) != path.name:
                refused.append(
                    f"{path}: not the name merge gives an entry (<run id, percent-encoded>.<attempt>.tar.gz); "
                    f"move it out of {self.root}"
                )
                continue
            by_run[entry.run_id].append(entry)
        found = []
        for run_id, entries in by_run.items():
            names = {(entry.path.parent.name, entry.attempt) for entry in entries}
            if len({folder for folder, _ in names}) > 1:
                refused += [
                    f"{entry.path}: run {shown(run_id)} is listed under {len(entries)} names "
                    f"({', '.join(self.name(e) for e in entries)}); one run has one; move the ones merge did not "
                    f"write out of {self.root}"
                    for entry in entries
                ]
                continue
            found += entries
        found.sort(key=lambda entry: (entry.path.parent.name, entry.run_id, entry.attempt))
        return ArchiveListing(tuple(found), tuple(refused))

    def _index_only_paths(self) -> set[Path]:
        """When the folder is a git checkout (the data branch), the entries its index holds but a sparse checkout
        left out (.github/scripts/results-archive.sh fetches only the entries a merge needs into a cached store):
        their names are what `verify` compares, their content is not read."""
        try:
            git = run_git("ls-files", "-z", "--", "*/*.tar.gz", folder=self.root)
            inside = run_git("rev-parse", "--show-prefix", folder=self.root)
        except GitFailed:  # no git: no checkout to read
            return set()
        if git.returncode != 0 or inside.returncode != 0 or inside.stdout.strip():  # not the root of a checkout
            return set()
        indexed = {self.root / name for name in git.stdout.split("\0") if name.count("/") == 1}
        return {path for path in indexed if not os.path.lexists(path)}

    def name(self, entry: ArchiveEntry) -> str:
        """The entry's path inside the archive, as the store records its hash."""
        return entry.path.relative_to(self.root).as_posix()

    def sha256(self, entry: ArchiveEntry) -> str:
        return hashlib.sha256(self._bytes(entry.path)).hexdigest()

    def read(self, entry: ArchiveEntry) -> RunRecords:
        """The entry's run with its results and details, validated as at the door; raise DamagedEntry when it does
        not open or its records are not what the door lets in."""
        runs = _records_of(entry.path, self._bytes(entry.path), self._redact)
        records = next((r for r in runs if r.run.run_id == self._redact(entry.run_id)), None)
        if records is None:
            held = ", ".join(shown(r.run.run_id) for r in runs)
            raise DamagedEntry(entry.path, f"holds run {held}, not {shown(entry.run_id)}: the entry was renamed")
        if _folder(records.run) != entry.path.parent.name:
            raise DamagedEntry(
                entry.path,
                f"holds a run of session {shown(records.run.session)}, archived in the folder "
                f"{shown(_folder(records.run))}, not {shown(entry.path.parent.name)}: the entry was moved",
            )
        return records

    def add(self, source: Path, runs: list[RunRecords]) -> list[ArchiveEntry]:
        """Archive each run (as it passed the door) that brings cells the archive lacks; return the entries written.
        Raise ArchiveConflict when a run contradicts its archived content."""
        written = []
        for records in runs:
            if not records.run.trusted:
                raise ReportsError(f"{source}: run {records.run.run_id!r} is a pull request's: it is never archived")
            self._refuse_case_twins(source, records.run)
            tried = set()
            while (attempt := self._next_attempt(source, records.run, records.results)) is not None:
                if attempt in tried:  # the name exists, yet no attempt of this run is listed under it
                    raise ArchiveConflict(
                        f"{source}: run {records.run.run_id!r} cannot be archived as attempt {attempt}"
                    )
                tried.add(attempt)
                entry = self._entry(records.run, attempt)
                if self._write_new(entry.path, _tar_gz({RECORDS_MEMBER: entry_json(records)})):
                    written.append(entry)
                    break
                # another merge wrote this attempt meanwhile: compare with it too
        return written

    def _refuse_case_twins(self, source: Path, run: Run) -> None:
        """A session folder (or a run's entry in it) whose name differs from one the archive has only in case is
        refused: a checkout on Windows or macOS would hold one file for both."""
        folder, name = _folder(run), quote(run.run_id, safe=_SAFE)
        twins = [other for other in _listed(self.root) if other != folder and other.casefold() == folder.casefold()]
        for entry in filter(None, (_entry_at(Path(other)) for other in _listed(self.root / folder))):
            other = quote(entry.run_id, safe=_SAFE)
            if other != name and other.casefold() == name.casefold():
                twins.append(other)
        if twins:
            raise ArchiveConflict(
                f"{source}: run {run.run_id!r} would be archived beside {twins[0]!r}, whose name differs from its "
                "only in case: a checkout on Windows or macOS holds one for both; rename the session"
            )

    def add_answers(self, answers: list[Bisection | TriageAttempt]) -> int:
        """Archive the answers not archived yet (redacted); return how many were."""
        written = 0
        for answer in answers:
            text = answer_key(redact_fields(answer, self._redact))
            kind = "bisection" if isinstance(answer, Bisection) else "triage-attempt"
            path = self.root / ANSWERS / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
            written += not path.exists() and self._write_new(path, text.encode())
        return written

    def answers(self, on_damaged: Callable[[str], None] | None = None) -> list[Bisection | TriageAttempt]:
        """Every archived answer, oldest first, redacted as they are read (an answer archived before a secret was
        known as one). One that cannot be read raises ReportsError, or with `on_damaged` is passed to it (a line
        naming the file) and left out."""
        found: list[Bisection | TriageAttempt] = []
        folder = self.root / ANSWERS
        listed = regular_files(folder, ".json", depth=1) if os.path.isdir(folder) else None
        damaged = [str(refusal) for refusal in listed.refused] if listed else []
        if os.path.islink(folder):
            damaged.append(f"{folder}: is a link, not the archive's folder of answers")
        for line in damaged:
            if on_damaged is None:
                raise ReportsError(line)
            on_damaged(f"{line}; move it out of {self.root}")
        for path in listed.files if listed and not os.path.islink(folder) else ():
            try:
                fields_ = json.loads(read_regular(path, MAX_ANSWER_BYTES))
                cell = CellKey(**fields_.pop("cell"))
                if path.name.startswith("bisection-"):
                    suspects = tuple(Commit(**{**c, "files": tuple(c["files"])}) for c in fields_.pop("suspects"))
                    answer: Bisection | TriageAttempt = Bisection(
                        cell,
                        **{
                            **fields_,
                            "held_fixed": parse_pins(fields_["held_fixed"]),
                            "files": tuple(fields_["files"]),
                            "untestable": tuple(fields_["untestable"]),
                        },
                        suspects=suspects,
                    )
                else:
                    answer = TriageAttempt(cell, **{**fields_, "held_fixed": parse_pins(fields_["held_fixed"])})
                problems = problems_of(answer)
                if problems:
                    raise ValueError(f"{problems[0]}, which bisect and triage never record")
            except (EntryRefused, ValueError, TypeError, KeyError, AttributeError) as exc:
                damage = (
                    f"{path}: not a readable archived answer ({type(exc).__name__}: {exc}); restore it "
                    "from the data branch's history"
                )
                if on_damaged is None:
                    raise ReportsError(damage) from None
                on_damaged(damage)
                continue
            found.append(redact_fields(answer, self._redact))
        return sorted(found, key=lambda answer: (answer.recorded_at, answer_key(answer)))

    def add_remedy_results(self, results: list[RemedyResult]) -> int:
        """Archive the remedy results not archived yet (each passed the door); return how many were."""
        written = 0
        for result in results:
            text = canonical(redact_fields(result, self._redact))
            path = self.root / REMEDIES / f"{result.remedy}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
            written += not path.exists() and self._write_new(path, text.encode())
        return written

    def remedy_results(self, on_damaged: Callable[[str], None]) -> list[RemedyResult]:
        """Every archived remedy result, through the door again (whoever pushes to the data branch chose the files):
        one that is refused is passed to `on_damaged` (a line naming the file) and left out."""
        folder = self.root / REMEDIES
        if os.path.islink(folder) or not os.path.isdir(folder):
            return []
        listed = regular_files(folder, ".json", depth=1)
        for refusal in listed.refused:
            on_damaged(f"{refusal}; move it out of {self.root}")
        found = []
        for path in listed.files:
            try:
                found += admit_remedies_text(path, b"[" + read_regular(path, MAX_RESULTS_BYTES) + b"]", self._redact)
            except (EntryRefused, ReportsError) as exc:
                on_damaged(f"{exc}; restore it from the data branch's history")
        return found

    def _entry(self, run: Run, attempt: int) -> ArchiveEntry:
        """Where a run's attempt is kept: one folder below the archive, whatever the names hold (the door lets only
        safe names in; this is the last check before a file is written)."""
        path = self.root / _folder(run) / _entry_name(run.run_id, attempt)
        root = self.root.resolve()
        if path.resolve().parent.parent != root or path.parent.name in ("", ".", ".."):
            raise ReportsError(
                f"run {run.run_id!r} of session {run.session!r} would be archived at {path}, outside {self.root}; "
                "its names are not a session's"
            )
        return ArchiveEntry(path, run.run_id, attempt)

    def _attempts_of(self, run: Run) -> list[ArchiveEntry]:
        folder = self._entry(run, 1).path.parent
        # quote() leaves no glob character in the name
        entries = (_entry_at(path) for path in folder.glob(f"{quote(run.run_id, safe=_SAFE)}.*.tar.gz"))
        # (merge reads them: an entry that is not a regular file is refused when it is read)
        return sorted((entry for entry in entries if entry and entry.run_id == run.run_id), key=lambda e: e.attempt)

    def _next_attempt(self, source: Path, run: Run, results: tuple[CellResult, ...]) -> int | None:
        """The attempt number a new entry for `run` gets, or None when the archive already holds all of it."""
        verdicts: dict[CellKey, tuple[str, str, str]] = {}
        attempts = 0
        for entry in self._attempts_of(run):
            path = entry.path
            archived = self.read(entry)
            if archived.run != run:
                raise ArchiveConflict(
                    f"{source}: run {run.run_id!r} is archived in {path} with different provenance/versions; run ids "
                    "must be unique per session — check how the file was produced"
                )
            for result in archived.results:
                verdicts.setdefault(result.cell, _verdict(result))
            attempts = max(attempts, entry.attempt)
        new_cells = False
        for result in results:
            known = verdicts.get(result.cell)
            if known is None:
                new_cells = True
            elif known != _verdict(result):
                raise ArchiveConflict(
                    f"{source}: run {run.run_id!r} cell {result.cell.id} is {_describe(_verdict(result))} here but "
                    f"{_describe(known)} in the archive ({self.root}); a run's verdicts never change — check how the "
                    "file was produced"
                )
        return attempts + 1 if new_cells else None

    @staticmethod
    def _write_new(path: Path, content: bytes) -> bool:
        """Create `path` with `content` unless it exists (never replaced: two merges race safely)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            staging.write_bytes(content)  # a full disk leaves no half-written staging file behind
            os.link(staging, path)  # fails if the name exists, unlike a rename
        except FileExistsError:
            return False
        finally:
            staging.unlink(missing_ok=True)
        return True

    @staticmethod
    def _bytes(path: Path) -> bytes:
        try:
            return read_regular(path, MAX_ENTRY_BYTES)
        except EntryRefused as exc:
            raise DamagedEntry(path, exc.reason) from None


def _records_of(path: Path, content: bytes, redact: Redact) -> list[RunRecords]:
    """The runs of an entry's bytes, of either format (one run; a format-1 JUnit file may hold more, and its entry is
    the one of them it is named after), redacted and validated."""
    members = _members(path, content)
    if RECORDS_MEMBER in members:
        try:
            runs = [redact_fields(from_json(json.loads(members[RECORDS_MEMBER])), redact)]
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise DamagedEntry(path, f"{RECORDS_MEMBER} is not a run's records ({type(exc).__name__}: {exc})") from None
    elif JUNIT_MEMBER in members:
        with tempfile.TemporaryDirectory() as scratch:
            try:
                runs = admitted_bytes(members[JUNIT_MEMBER], Path(scratch), redact)
            except (MalformedJUnit, Rejected) as exc:
                raise DamagedEntry(path, f"its {JUNIT_MEMBER} (format 1): {exc.reason}") from None
    else:
        raise DamagedEntry(path, f"holds neither {RECORDS_MEMBER} (format 2) nor {JUNIT_MEMBER} (format 1)")
    for records in runs:
        if problem := first_problem(records):
            raise DamagedEntry(path, f"its records are not what merge lets in: {problem}")
    return [in_utc(records) for records in runs]


def _members(path: Path, content: bytes) -> dict[str, bytes]:
    try:
        return tar_members(path, content, (RECORDS_MEMBER, JUNIT_MEMBER, CELLS_MEMBER))
    except EntryRefused as exc:
        raise DamagedEntry(path, exc.reason) from None


def needed_paths(names: list[str], stored_runs: set[str], incoming_runs: set[str]) -> list[str]:
    """Of the archive's entry names (paths relative to it), those a store holding `stored_runs` needs read to merge
    `incoming_runs`: the entries of runs it lacks (what `rebuild` imports), every later attempt (it may add cells to
    a stored run) and the entries of the incoming runs (`add` compares a run with its archived attempts). The
    answers are small and always needed (ANSWERS)."""
    needed = []
    for name in names:
        entry = _entry_at(Path(name))
        if entry is not None and (
            entry.run_id not in stored_runs or entry.attempt > 1 or entry.run_id in incoming_runs
        ):
            needed.append(name)
    return needed


def answer_key(answer: Bisection | TriageAttempt) -> str:
    """An answer's content as canonical JSON: equal answers, equal keys (what makes archiving them idempotent). The
    held-fixed pins are kept as their text (`pins_text`), the form the archive has always had."""
    return json.dumps({**asdict(answer), "held_fixed": pins_text(answer.held_fixed)}, sort_keys=True)


def _listed(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:  # a folder not made yet
        return []


def _folder(run: Run) -> str:
    """The folder of a run's session in the archive."""
    return quote(run.session or "no-session", safe=_SAFE)


def _entry_name(run_id: str, attempt: int) -> str:
    """The file name of a run's attempt in its session's folder: the one spelling merge writes."""
    return f"{quote(run_id, safe=_SAFE)}.{attempt}.tar.gz"


def _entry_at(path: Path) -> ArchiveEntry | None:
    name = _ENTRY_NAME.fullmatch(path.name)
    return ArchiveEntry(path, unquote(name["run"]), int(name["attempt"])) if name else None


def _verdict(result: CellResult) -> tuple[str, str, str]:
    return result.outcome, result.failure_class, result.signature


def _describe(verdict: tuple[str, str, str]) -> str:
    outcome, failure_class, signature = verdict
    return f"{outcome} ({failure_class}: {signature})" if outcome == "fail" else outcome


def _tar_gz(members: dict[str, bytes]) -> bytes:
    """The same members always give the same bytes (no times, owners or modes from this machine)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, content in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(content), 0o644, 0
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()

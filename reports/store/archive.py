"""The results archive: every merged run's raw results, append-only, the source the history store is rebuilt from.

Layout (reports/README.md "Archive"): `<archive>/<session>/<run id>.<attempt>.tar.gz`, names percent-encoded
(`:` of the start time becomes `%3A`), each a gzip'd tar of two members: `junit.xml`, the JUnit file the run
came in, byte for byte, and `cells.jsonl`, that run's lines of the cells.jsonl beside it (empty when the input
had none). Attempt 1 is the run as first merged; a later merge of the same run that adds cells (a run continued
after an interruption) adds attempt 2, and so on. Entries are written once and never changed: merging the same
run again adds nothing, and a run that comes back with another verdict for a cell it already has is an error.

Answers (what bisect and triage found) are kept as well, one small JSON file each, named by a hash of its
content: `<archive>/answers/bisection-<hash>.json` and `triage-attempt-<hash>.json`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from reports import ReportsError
from reports.store.junit import MalformedJUnit, read_junit
from reports.store.records import Bisection, CellKey, CellResult, Commit, Run, TriageAttempt, parse_pins, pins_text
from suites.records.run_records import MalformedRecord, read_records

ANSWERS = "answers"
JUNIT_MEMBER = "junit.xml"
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


class ArchiveConflict(ReportsError):
    """A run came back with content that contradicts what the archive already holds for it."""


class ResultsArchive:
    def __init__(self, root: Path):
        self.root = Path(root)

    def entries(self) -> list[ArchiveEntry]:
        """Every entry, in (session, run id, attempt) order."""
        if not self.root.is_dir():
            raise ReportsError(
                f"{self.root}: no results archive here; pass the folder `python -m reports merge` "
                "archived into (in CI, the checkout of the autotp-history branch)"
            )
        found = []
        for path in self._entry_paths():
            entry = _entry_at(path)
            if entry is None:
                raise ReportsError(
                    f"{path}: not an archive entry name (<run id>.<attempt>.tar.gz); move it out of {self.root}"
                )
            found.append(entry)
        return sorted(found, key=lambda entry: (entry.path.parent.name, entry.run_id, entry.attempt))

    def _entry_paths(self) -> set[Path]:
        """The entries' files: those in the folder, and, when the folder is a git checkout (the data branch), those
        its index holds but a sparse checkout left out (.github/scripts/results-archive.sh fetches only the entries
        a merge needs into a cached store): their names are what `verify` compares, their content is not read."""
        present = set(self.root.glob("*/*.tar.gz"))
        git = subprocess.run(
            ["git", "-C", str(self.root), "ls-files", "-z", "--", "*/*.tar.gz"], capture_output=True, text=True
        )
        inside = subprocess.run(
            ["git", "-C", str(self.root), "rev-parse", "--show-prefix"], capture_output=True, text=True
        )
        if git.returncode != 0 or inside.returncode != 0 or inside.stdout.strip():  # not the root of a checkout
            return present
        return present | {self.root / name for name in git.stdout.split("\0") if name.count("/") == 1}

    def read(self, entry: ArchiveEntry) -> tuple[Run, list[CellResult]]:
        """The entry's run and results, read from its JUnit exactly as `merge` read them."""
        junit = self._member(entry.path, JUNIT_MEMBER)
        with tempfile.TemporaryDirectory() as scratch:
            staged = Path(scratch) / JUNIT_MEMBER
            staged.write_bytes(junit)
            try:
                runs = read_junit(staged)
            except MalformedJUnit as exc:
                raise ReportsError(
                    f"{entry.path}: {exc.reason}; the archive entry is damaged — restore it from "
                    "the data branch's history"
                ) from None
        for run, results in runs:
            if run.run_id == entry.run_id:
                return run, results
        raise ReportsError(
            f"{entry.path}: holds no run {entry.run_id!r}; the entry was renamed or damaged — "
            "restore it from the data branch's history"
        )

    def add(self, source: Path, runs: list[tuple[Run, list[CellResult]]]) -> list[ArchiveEntry]:
        """Archive each run of the JUnit file `source` (already read) that brings cells the archive lacks;
        return the entries written. Raise ArchiveConflict when a run contradicts its archived content."""
        junit = Path(source).read_bytes()
        written = []
        for run, results in runs:
            while True:
                attempt = self._next_attempt(source, run, results)
                if attempt is None:
                    break
                entry = self._entry(run, attempt)
                if self._write_new(
                    entry.path, _tar_gz({JUNIT_MEMBER: junit, CELLS_MEMBER: _cells_lines(source, run.run_id)})
                ):
                    written.append(entry)
                    break
                # another merge wrote this attempt meanwhile: compare with it too
        return written

    def add_answers(self, answers: list[Bisection | TriageAttempt]) -> int:
        """Archive the answers not archived yet; return how many were."""
        written = 0
        for answer in answers:
            text = answer_key(answer)
            kind = "bisection" if isinstance(answer, Bisection) else "triage-attempt"
            path = self.root / ANSWERS / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
            written += not path.exists() and self._write_new(path, text.encode())
        return written

    def answers(self) -> list[Bisection | TriageAttempt]:
        """Every archived answer, oldest first."""
        found: list[Bisection | TriageAttempt] = []
        for path in (self.root / ANSWERS).glob("*.json"):
            try:
                fields = json.loads(path.read_text())
                cell = CellKey(**fields.pop("cell"))
                if path.name.startswith("bisection-"):
                    suspects = tuple(Commit(**{**c, "files": tuple(c["files"])}) for c in fields.pop("suspects"))
                    found.append(
                        Bisection(
                            cell,
                            **{
                                **fields,
                                "held_fixed": parse_pins(fields["held_fixed"]),
                                "files": tuple(fields["files"]),
                                "untestable": tuple(fields["untestable"]),
                            },
                            suspects=suspects,
                        )
                    )
                else:
                    found.append(TriageAttempt(cell, **{**fields, "held_fixed": parse_pins(fields["held_fixed"])}))
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ReportsError(
                    f"{path}: not a readable archived answer ({type(exc).__name__}: {exc}); restore it "
                    "from the data branch's history"
                ) from None
        return sorted(found, key=lambda answer: (answer.recorded_at, answer_key(answer)))

    def _entry(self, run: Run, attempt: int) -> ArchiveEntry:
        folder = self.root / quote(run.session or "no-session", safe=_SAFE)
        return ArchiveEntry(folder / f"{quote(run.run_id, safe=_SAFE)}.{attempt}.tar.gz", run.run_id, attempt)

    def _attempts_of(self, run: Run) -> list[ArchiveEntry]:
        folder = self._entry(run, 1).path.parent
        entries = (_entry_at(path) for path in folder.glob(f"{quote(run.run_id, safe=_SAFE)}.*.tar.gz"))
        return sorted((entry for entry in entries if entry and entry.run_id == run.run_id), key=lambda e: e.attempt)

    def _next_attempt(self, source: Path, run: Run, results: list[CellResult]) -> int | None:
        """The attempt number a new entry for `run` gets, or None when the archive already holds all of it."""
        verdicts: dict[CellKey, tuple[str, str, str]] = {}
        attempts = 0
        for entry in self._attempts_of(run):
            path = entry.path
            archived_run, archived_results = self.read(entry)
            if archived_run != run:
                raise ArchiveConflict(
                    f"{source}: run {run.run_id!r} is archived in {path} with different provenance/versions; run ids "
                    "must be unique per session — check how the file was produced"
                )
            for result in archived_results:
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
        staging.write_bytes(content)
        try:
            os.link(staging, path)  # fails if the name exists, unlike a rename
        except FileExistsError:
            return False
        finally:
            staging.unlink()
        return True

    @staticmethod
    def _member(path: Path, name: str) -> bytes:
        try:
            with tarfile.open(path, "r:gz") as tar:
                member = tar.extractfile(name)
                if member is None:
                    raise KeyError(name)
                return member.read()
        except (OSError, EOFError, tarfile.TarError, KeyError) as exc:
            raise ReportsError(
                f"{path}: not a readable archive entry ({exc}); restore it from the data branch's history"
            ) from None


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


def _entry_at(path: Path) -> ArchiveEntry | None:
    name = _ENTRY_NAME.fullmatch(path.name)
    return ArchiveEntry(path, unquote(name["run"]), int(name["attempt"])) if name else None


def _verdict(result: CellResult) -> tuple[str, str, str]:
    return result.outcome, result.failure_class, result.signature


def _describe(verdict: tuple[str, str, str]) -> str:
    outcome, failure_class, signature = verdict
    return f"{outcome} ({failure_class}: {signature})" if outcome == "fail" else outcome


def _cells_lines(junit: Path, run_id: str) -> bytes:
    """The run's records of the cells.jsonl in the results folder the JUnit file came from (`<results>/junit/`)."""
    folder = Path(junit).parent
    results_dir = folder.parent if folder.name == "junit" else folder
    try:
        records = read_records(results_dir)
    except MalformedRecord as error:
        raise ReportsError(str(error)) from None
    return "".join(
        json.dumps(record) + "\n"
        for record in records
        if (record.get("run") or {}).get("id") == run_id and not record.get("faults")
    ).encode()


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

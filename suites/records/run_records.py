"""What a run writes: `results/cells.jsonl` (one record per cell, on disk before the next cell
starts) and the same fields as JUnit properties. The format is documented in README.md."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import math
import os
import platform
import socket
import subprocess
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from matrix import PROJECT_ROOT
from matrix.cells import Cell, selection_options
from matrix.installed import VERSION_CONSTANTS, direct_url, imported_version, package_constants
from matrix.json_records import write_record
from matrix.redaction import redact
from matrix.version_axes import AXES
from suites.base.atomic import write_text_atomically
from suites.base.git import GitFailed, run_git
from suites.engine.rank_group import launch_environment
from suites.verdicts.outcome import CellOutcome, what_happened
from suites.verdicts.vocabulary import FAILURE_CLASSES, OUTCOMES

CellRecord = dict[str, Any]
"""One cells.jsonl record as JSON reads it back: its fields are README.md's; `read_records` checks `cell.id`,
`outcome` and `failure_class` of each, and `CellRecorder.record` writes them."""
RecordProperty = Callable[[str, object], None]
"""pytest's `record_property` fixture: one JUnit property of the test."""


def _git(folder: Path | str, *args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return run_git(*args, folder=folder, timeout=60)
    except GitFailed:  # no git, or it hung
        return None


@cache
def harness_commit(root: Path = PROJECT_ROOT) -> str:
    """This harness's own commit: git HEAD of the project, with `-dirty` when tracked files differ from it;
    "" when the project is not a git checkout of its own (e.g. a copy inside some other repository)."""
    head = _git(root, "rev-parse", "--show-toplevel", "HEAD")
    if head is None or head.returncode != 0 or len(head.stdout.split()) != 2:
        return ""
    toplevel, sha = head.stdout.split()
    if Path(toplevel).resolve() != Path(root).resolve():
        return ""
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{sha}-dirty" if status is not None and status.stdout.strip() else sha


def git_has_commit(folder: Path, sha: str) -> bool:
    """Whether commit `sha` exists in the git repository at `folder`."""
    found = _git(folder, "cat-file", "-e", f"{sha}^{{commit}}")
    return found is not None and found.returncode == 0


def deepspeed_commit(
    origin: dict[str, Any] | None, stamped: str, has_commit: Callable[[Path, str], bool], harness: str = ""
) -> str:
    """DeepSpeed's own commit, or "" when it was not installed from git.

    `origin` is DeepSpeed's PEP 610 direct_url.json; `stamped` is deepspeed.git_version_info.git_hash,
    which DeepSpeed's setup.py takes from `git rev-parse HEAD` of whatever repository its build folder
    sits in (e.g. this harness, when nox builds an sdist under .nox/), so it is trusted only for a build
    from a local folder whose own repository holds that commit. `harness` is this harness's commit,
    never DeepSpeed's."""
    if not origin or "archive_info" in origin:
        return ""  # a release from an index, or an archive: no commit to speak of
    vcs = origin.get("vcs_info")
    if vcs is not None:
        commit: str = vcs.get("commit_id", "") if vcs.get("vcs") == "git" else ""
        return commit
    if "dir_info" not in origin:
        return ""
    stamped = (stamped or "").strip()
    url = urlparse(origin.get("url", ""))
    if not stamped or stamped == "unknown" or url.scheme != "file":
        return ""
    if harness and harness.removesuffix("-dirty").startswith(stamped):
        return ""
    return stamped if has_commit(Path(unquote(url.path)), stamped) else ""


def _imported_git_hash() -> str:
    """DeepSpeed's commit as its import says it (no installed version file: git_version_info's fallback)."""
    try:
        # lazily: `python -m reports` and nox's own process import this module, and have no deepspeed
        from deepspeed.git_version_info import git_hash
    except ImportError:
        return ""
    return git_hash or ""


def installed_versions() -> dict[str, str]:
    """Every version axis's package as imported (`__version__`), python, and DeepSpeed's commit, read from the
    packages' files as their import would set them."""
    constant = package_constants("deepspeed", VERSION_CONSTANTS["deepspeed"][0]).get("git_hash")
    stamped = constant if isinstance(constant, str) else _imported_git_hash()
    return {
        **{axis: imported_version(axis) for axis in AXES},
        "python": platform.python_version(),
        "deepspeed_git": deepspeed_commit(direct_url("deepspeed"), stamped, git_has_commit, harness_commit()),
    }


def platform_of_run() -> tuple[str, str]:
    """(accelerator, communication backend) the rank groups of this machine use. CPU ranks get DS_ACCELERATOR=cpu
    (suites/engine/rank_group.py launch_environment), which is then known without importing DeepSpeed; on CPU,
    DeepSpeed uses oneCCL when its bindings import and falls back to gloo otherwise."""
    if launch_environment().get("DS_ACCELERATOR") != "cpu":
        # lazily: `python -m reports` and nox's own process import this module, and have no deepspeed
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        if accelerator.device_name() != "cpu":
            return accelerator.device_name(), accelerator.communication_backend_name()
    if importlib.util.find_spec("oneccl_bindings_for_pytorch") is None:
        return "cpu", "gloo"
    try:
        import oneccl_bindings_for_pytorch  # noqa: F401
    except ImportError:
        return "cpu", "gloo"
    return "cpu", "ccl"


@dataclass
class RunInfo:
    session: str
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    host: str = field(default_factory=socket.gethostname)
    accelerator: str = field(default_factory=lambda: platform_of_run()[0])
    backend: str = field(default_factory=lambda: platform_of_run()[1])
    harness_git: str = field(default_factory=harness_commit)  # this harness's commit, not DeepSpeed's
    # The day the environment's dependencies were resolved as of (`--as-of release-date`); "" for the newest.
    dependencies_as_of: str = field(default_factory=lambda: os.environ.get("AUTOTP_DEPENDENCIES_AS_OF", ""))

    @property
    def id(self) -> str:
        return f"{self.session}@{self.started}@{self.host}"

    def json_shape(self, written: dict[str, Any]) -> dict[str, Any]:
        """cells.jsonl's "run": its id first, then session, host and start (write_record)."""
        return {"id": self.id, **{name: written[name] for name in ("session", "host", "started")}, **written}

    @staticmethod
    def own_shape(run: dict[str, Any]) -> dict[str, Any]:
        """json_shape's inverse: the id is derived from the fields."""
        return {name: item for name, item in run.items() if name != "id"}


class MalformedRecord(ValueError):
    """A cells.jsonl line that parses but is not a cell record of this harness."""


def read_records(results_dir: Path) -> list[CellRecord]:
    """The records of `results_dir/cells.jsonl`, the one reader of the file; a record whose outcome or failure
    class is not one of the harness's raises MalformedRecord naming the file and line."""
    path = results_dir / "cells.jsonl"
    return _parsed(path, path.read_text().splitlines() if path.exists() else [], 1)


class AppendedRecords:
    """The records of whole lines appended to a cells.jsonl since the last call of `new` (all at the first), read
    as `read_records` reads them: the file only grows, so a run that asks after every cell reads each line once
    instead of the whole file each time (a results folder keeps every earlier run's records; ~2.4 MB after four
    default matrices)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        """Bytes read: whole lines only, so a line another pytest-xdist worker is still writing is read later."""
        self.lines = 0

    def new(self) -> list[CellRecord]:
        try:
            with self.path.open("rb") as stream:
                stream.seek(self.offset)
                appended = stream.read()
        except FileNotFoundError:
            return []
        complete = appended[: appended.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = complete.decode().splitlines()
        first, self.lines = self.lines + 1, self.lines + len(lines)
        return _parsed(self.path, lines, first)


def _parsed(path: Path, lines: list[str], first_number: int) -> list[CellRecord]:
    records: list[CellRecord] = []
    for number, line in enumerate(lines, start=first_number):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill mid-write: that cell runs again
        if problem := _record_problem(record):
            raise MalformedRecord(
                f"{path}:{number}: {problem}; this file was not written by the harness: move it "
                "away or pass another results folder"
            )
        records.append(record)
    return records


def _record_problem(record: object) -> str | None:
    if not isinstance(record, dict) or not isinstance(record.get("cell"), dict) or "id" not in record["cell"]:
        return "not a cell record (no cell.id)"
    if record.get("outcome") not in OUTCOMES:
        return f"outcome {record.get('outcome')!r} is not one of {', '.join(OUTCOMES)}"
    if record["outcome"] == "fail" and record.get("failure_class") not in FAILURE_CLASSES:
        return f"failure_class {record.get('failure_class')!r} is not one of {', '.join(FAILURE_CLASSES)}"
    return None


class RecordNotWritten(OSError):
    """A cell's record could not be written to cells.jsonl: the message says its outcome, why and what to do."""


def cells_without_record(expected: list[Cell], records: list[CellRecord]) -> list[str]:
    """Lines for the end of a run: the cells of `expected` no record of `records` holds (an interrupted run, a record
    that could not be written), and how to run them; none when every cell has one."""
    recorded = {record["cell"]["id"] for record in records}
    missing = [cell for cell in expected if cell.id not in recorded]
    if not missing:
        return []
    shown = ", ".join(cell.id for cell in missing[:20]) + (
        f" and {len(missing) - 20} more" if len(missing) > 20 else ""
    )
    return [
        f"{len(missing)} of {len(expected)} cells of this run have no result: {shown}",
        "the same command continues this run: it keeps every cell with a result and runs only these "
        f"(one alone: nox -s matrix -- {selection_options(missing[0])})",
    ]


class RunState:
    """`results/run-state.json`: which run the folder holds and whether all its cells finished, so an
    interrupted run of the same session, selection and versions is continued instead of restarted."""

    def __init__(self, results_dir: Path, session: str, selection: dict[str, object], versions: dict[str, str]):
        self.path = results_dir / "run-state.json"
        self.identity: dict[str, object] = {"session": session, "selection": selection, "versions": versions}

    def resumable_start(self) -> str | None:
        """The start time (run id part) of an unfinished earlier run with the same identity."""
        try:
            previous = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        same = {key: previous.get(key) for key in self.identity} == self.identity
        started: str | None = previous.get("started") if same and not previous.get("complete") else None
        return started

    def write(self, started: str, complete: bool) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(
            self.path, json.dumps({**self.identity, "started": started, "complete": complete}, indent=1)
        )


class CellRecorder:
    """Appends one record per cell to cells.jsonl (several pytest-xdist workers may share the file).
    Cells the same run id already finished (before an interruption) are replayed, not run again."""

    def __init__(
        self,
        results_dir: Path,
        run: RunInfo,
        versions: dict[str, str],
        *,
        state: RunState | None = None,
        expected_cells: Collection[str] = frozenset(),
        faults: tuple[str, ...] = (),
    ):
        self.results_dir = results_dir
        self.faults = tuple(faults)
        """Injected fault hooks (harness self-tests): every record says so, and none is replayed without them."""
        self.path = results_dir / "cells.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run = run
        self.versions = versions
        self.state = state
        self.expected_cells = set(expected_cells)
        self.records: list[CellRecord] = []
        self.on_disk = AppendedRecords(self.path)
        of_run = [r for r in self.on_disk.new() if r["run"]["id"] == run.id]
        self.finished = {r["cell"]["id"]: r for r in of_run if tuple(r.get("faults", ())) == self.faults}
        self.cells_of_run_on_disk = {r["cell"]["id"] for r in of_run}
        """Every cell of this run in cells.jsonl, whoever wrote it (pytest-xdist workers share the file)."""

    def replay(self, cell_id: str, record_property: RecordProperty | None = None) -> CellRecord | None:
        """The record of a cell this run already finished before it was interrupted, re-emitted to JUnit."""
        record = self.finished.get(cell_id)
        if record is not None:
            self._emit(record, record_property)
        return record

    def record(self, cell: Cell, outcome: CellOutcome, record_property: RecordProperty | None = None) -> CellRecord:
        record: CellRecord = {
            "cell": cell.coordinates(),
            "outcome": outcome.outcome,
            "failure_class": outcome.failure_class,
            "signature": redact(outcome.signature),
            "message": redact(outcome.message),
            "versions": self.versions,
            "run": write_record(self.run),
            # A NaN or infinite figure (logits that are NaN) is left out: the failure's signature says so, and the
            # door refuses a file that holds one (reports/store/validation.py), which would lose every other cell.
            "metrics": {name: value for name, value in outcome.metrics.items() if math.isfinite(value)},
        }
        if outcome.logs:
            record["logs"] = outcome.logs
        if outcome.checkpoint:
            record["checkpoint"] = outcome.checkpoint
        if cell.model.checkpoints:  # the hub ids a faithful cell's verdict stands for (matrix.shapes.faithful_groups)
            record["checkpoints"] = list(cell.model.checkpoints)
        if self.faults:
            record["faults"] = list(self.faults)
        for name in ("autotp", "broke_at", "cause"):  # typed records (suites/verdicts/mechanism.py), as dicts
            if value := getattr(outcome, name):
                record[name] = write_record(value)
        try:
            self._append(record)
        except OSError as error:  # a full disk, a folder made read-only: the cell ran, its record is not kept
            if record_property is not None:  # JUnit still gets it, if its own file can be written at the end
                for key, value in junit_properties(record).items():
                    record_property(key, value)
            raise RecordNotWritten(
                f"{cell.id} ended {record['outcome']} {record['failure_class']}".rstrip()
                + f", and its record could not be written to {self.path}: {error}. "
                + what_happened(error, self.path)
                + "; the same command continues this run and runs the cells without a record"
            ) from error
        self._emit(record, record_property)
        return record

    def _append(self, record: CellRecord) -> None:
        """One line at the end of cells.jsonl, on disk before this returns; a line an earlier write left cut short
        (a full disk) is ended first, so it does not swallow this one (a cut line is skipped when read)."""
        with self.path.open("ab+") as stream:
            fcntl.flock(stream, fcntl.LOCK_EX)  # xdist workers append to the same file
            size = stream.seek(0, os.SEEK_END)
            cut = size > 0 and stream.seek(size - 1) >= 0 and stream.read(1) != b"\n"
            stream.write((b"\n" if cut else b"") + json.dumps(record).encode() + b"\n")
            stream.flush()
            os.fsync(stream.fileno())

    def _emit(self, record: CellRecord, record_property: RecordProperty | None) -> None:
        self.records.append(record)
        self.cells_of_run_on_disk.update(r["cell"]["id"] for r in self.on_disk.new() if r["run"]["id"] == self.run.id)
        if self.state and self.expected_cells <= self.cells_of_run_on_disk:
            self.state.write(self.run.started, complete=True)
        if record_property is not None:
            for key, value in junit_properties(record).items():
                record_property(key, value)


def junit_properties(record: CellRecord) -> dict[str, str]:
    properties = {f"cell.{k}": v for k, v in record["cell"].items()}
    properties.update(outcome=record["outcome"], failure_class=record["failure_class"], signature=record["signature"])
    properties.update({f"version.{k}": v for k, v in record["versions"].items()})
    properties.update({f"run.{k}": v for k, v in record["run"].items()})
    properties.update({f"metric.{k}": f"{v:.6g}" for k, v in record["metrics"].items()})
    if record.get("logs"):
        properties["logs"] = record["logs"]
    properties.update({f"checkpoint.{k}": v for k, v in record.get("checkpoint", {}).items()})
    if record.get("faults"):
        properties["faults"] = ",".join(record["faults"])
    if record.get("checkpoints"):
        properties["checkpoints"] = ",".join(record["checkpoints"])  # hub ids hold no comma
    properties.update({f"cause.{k}": v for k, v in record.get("cause", {}).items()})
    properties.update({f"broke_at.{k}": v for k, v in record.get("broke_at", {}).items()})
    if record.get("autotp"):
        properties["autotp"] = json.dumps(record["autotp"], separators=(",", ":"))
    return {name: str(value) for name, value in properties.items()}


def launcher_command(tp: int, script: str) -> str:
    """The command that runs a script at `tp` ranks with DeepSpeed's launcher, on a CPU-only machine too: LOCAL_SIZE
    is the device count DeepSpeed's CPU accelerator takes; without it the launcher asks `numactl --hardware`, which
    DeepSpeed 0.14.4 to 0.18.9 (at least) run unguarded, so a machine without numactl fails before any rank starts.
    A GPU accelerator ignores it."""
    return f"LOCAL_SIZE={tp} deepspeed --num_gpus {tp} {script}"


def environment_report(run: RunInfo, versions: dict[str, str], ran_here: bool) -> str:
    """What a bug report needs besides the repro script (no secrets: only versions and hardware). `ran_here`: written
    on the machine that ran the cell, which then adds its os, cpu and gpus; a report rendered from the history
    elsewhere knows only what the run recorded. Never the interpreter's path: this host's folders mean nothing where
    the report is read."""
    lines = [f"{name}: {value}" for name, value in versions.items() if value]
    lines += [f"autotp-matrix harness: {run.harness_git}"] if run.harness_git else []
    lines += [f"accelerator: {run.accelerator}", f"backend: {run.backend}"]
    if not ran_here:
        return "\n".join(lines)
    lines += [f"os: {platform.platform()}", f"cpu: {platform.processor() or platform.machine()} x {os.cpu_count()}"]
    try:
        # lazily: `python -m reports` and nox's own process import this module, and have no torch
        import torch

        if torch.cuda.is_available():
            lines.append("gpus: " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
    except ImportError:
        pass
    return "\n".join(lines)


if __name__ == "__main__":
    # `python -m suites.records.run_records --versions`: what a nox session really installed.
    for name, value in installed_versions().items():
        print(f"{name:>14}: {value or '-'}")

"""A cell's outcome: pass, fail (with exactly one failure class), skip or unsupported, plus a normalised error
signature so identical failures group across models and runs."""

from __future__ import annotations

import errno
import importlib.util
import json
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from matrix import PROJECT_ROOT, is_harness_file
from matrix.disk_space import disk_full_at, disk_full_line
from matrix.json_records import read_record
from matrix.redaction import redact
from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import AutoTPRecord, BreakPoint
from suites.verdicts.vocabulary import FAILURE_CLASSES, OUTCOMES, FailureClass, FailureClassIfFailed, Outcome

STAGE_CLASS: dict[str, FailureClass] = {"setup": "setup", "shard": "shard", "forward": "forward"}
"""A rank's stages in order, and the class of a failure raised in each."""


class LibraryOutputError(Exception):
    """A library's failure the harness found itself: an output it returned that is missing, of the wrong shape or
    not finite (validated where it enters the harness), or a failure a user's fresh process hits that a
    long-lived rank cannot (`suites/variants/loading.py` `fresh_process_meta_failure`). The library's fault, with
    the class of the check or stage that produced it, never `setup` although the harness raised it."""

    def __init__(
        self,
        failure_class: FailureClass,
        signature: str,
        detail: str = "",
        explanation: str = "a library's output failed validation where it entered the harness",
    ):
        super().__init__(f"{signature}{': ' + detail if detail else ''}")
        if failure_class not in FAILURE_CLASSES:
            raise ValueError(f"failure class must be one of {sorted(FAILURE_CLASSES)}, got {failure_class!r}")
        self.failure_class, self.signature, self.explanation = failure_class, signature, explanation


@dataclass(frozen=True)
class RankError:
    """What a rank that raised writes at once (`error-<seq>.<rank>.json`), so the driver can name the failure
    even when the other ranks are left waiting in a collective."""

    rank: int
    stage: str
    """One of STAGE_CLASS."""
    failure_class: FailureClass
    signature: str
    message: str
    broke_at: BreakPoint | None = None
    """The module whose forward raised, or the one init_inference was replacing (suites/checks/breakpoints.py)."""


def log_folder(cell: str) -> str:
    """Where a results folder keeps a failing cell's rank logs, relative to it (and to the report beside it): the
    pointer a record carries, what reports link."""
    return f"logs/{cell}/"


def first_error(errors: list[RankError]) -> RankError:
    """The error that decides a cell's verdict when ranks raise: the earliest stage, then the lowest rank."""
    return min(errors, key=lambda e: (list(STAGE_CLASS).index(e.stage), e.rank))


_SHAPE = re.compile(r"(?<![\w.])\d+(?:x\d+)+(?![\w.])")
"""A shape written as a product (`48x256`, `0x4`): each factor a number, never a hex literal."""
_HEX = re.compile(r"(?<![\w.])0x(?=[0-9a-fA-F]*[a-fA-F]|[0-9a-fA-F]{8})[0-9a-fA-F]+")
"""A hex literal (an address): a letter among its digits, or eight digits or more."""
_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(\.\d+)?([eE][-+]?\d+)?")
_INTERESTING_FRAMES = ("deepspeed", "transformers")


@dataclass
class CellOutcome:
    outcome: Outcome
    """`pass`, `fail`, `skip` or `unsupported` (suites/verdicts/vocabulary.py `Outcome`)."""
    failure_class: FailureClassIfFailed = ""
    signature: str = ""
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    logs: str = ""
    """Folder with the end of the launcher, fork-server and rank logs a failing cell wrote (or its setup failure:
    setup.log), kept for every failing cell (suites/engine/rank_group.py RankGroupPool.keep_logs): relative to the
    results folder (`log_folder`), never a path of the machine that ran it."""
    checkpoint: dict[str, str] = field(default_factory=dict)
    """The weights the cell loaded: `source` (`tiny` or the hub id) and `revision` (hub commit, or the
    tiny checkpoint's content hash); empty when the cell skipped before choosing a checkpoint."""
    autotp: AutoTPRecord | None = None
    """What AutoTP did to the model on rank 0 (suites/checks/sharding.py); None where it never sharded."""
    broke_at: BreakPoint | None = None
    """Where a failed cell broke, where the ranks located it."""
    cause: Cause | None = None
    """A failed cell's cause (suites/verdicts/mechanism.py `cause_of`), set by the driver."""

    @property
    def failed_class(self) -> FailureClass:
        """The class of a failed outcome (a harness bug to ask one that did not fail)."""
        if not self.failure_class:
            raise ValueError(f"a {self.outcome} outcome has no failure class")
        return self.failure_class

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")
        if self.outcome == "fail" and self.failure_class not in FAILURE_CLASSES:
            raise ValueError(f"failure class must be one of {sorted(FAILURE_CLASSES)}, got {self.failure_class!r}")


def mask_numbers(text: str) -> str:
    """Every number as N: the factors of a shape (`0x4` and `48x256` alike: NxN), hex literals, decimals."""
    text = _SHAPE.sub(lambda shape: "x".join("N" * (shape[0].count("x") + 1)), text)
    return _NUMBER.sub("N", _HEX.sub("N", text))


def exception_signature(error: BaseException, at: str | None = None) -> str:
    """`Type: message-with-numbers-masked @ package/file.py:function` of the deepest frame inside
    deepspeed or transformers (the code that raised), or the deepest frame when none is; `at` names the
    place instead (the harness's own frame, `harness_frame`)."""
    # Redacted before it is cut and its numbers are masked: a secret cut short, or with its digits masked, would no
    # longer be the value the redactor looks for, and what was left of it would be recorded.
    first_line = redact((str(error).strip().splitlines() or [""])[0])[:300]
    if at:
        return f"{type(error).__name__}: {mask_numbers(first_line)} @ {at}"
    frames = traceback.extract_tb(error.__traceback__)
    interesting = [f for f in frames if any(f"/{pkg}/" in f.filename for pkg in _INTERESTING_FRAMES)]
    where = ""
    if candidates := interesting or list(frames):
        frame = candidates[-1]
        path = frame.filename
        for pkg in _INTERESTING_FRAMES:
            if f"/{pkg}/" in path:
                path = pkg + "/" + path.split(f"/{pkg}/", 1)[1]
                break
        else:
            path = path.rsplit("/", 1)[-1]
        where = f" @ {path}:{frame.name}"
    return f"{type(error).__name__}: {mask_numbers(first_line)}{where}"


LIBRARIES_UNDER_TEST = ("deepspeed", "transformers", "accelerate")
"""Their code raising is their fault. torch, the standard library and every other package (pydantic, numpy,
tokenizers) are tools: whoever called them owns what they raise."""


def _package_roots(names: tuple[str, ...]) -> list[Path]:
    return [root for name in names if (root := _package_root(name)) is not None]


def _package_root(name: str) -> Path | None:
    """The folder of package `name`, imported or not: a package whose import failed is no longer in sys.modules, yet
    the frames of its failed import are its code."""

    module = sys.modules.get(name)
    file = getattr(module, "__file__", None) if module is not None else None
    if file is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        file = spec.origin if spec is not None else None
    return Path(file).resolve().parent if file else None


def _frame_owner(filename: str, libraries: list[Path]) -> str:
    """`harness`, `library` or `tool` (a frame whose caller decides)."""
    if not filename.startswith("/"):
        return "tool"  # <frozen importlib._bootstrap>, <string>
    path = Path(filename).resolve()
    if is_harness_file(filename):
        return "harness"
    if any(path.is_relative_to(root) for root in libraries) or path.is_relative_to(PROJECT_ROOT / "tests"):
        return "library"
    return "tool"


def raising_owner(error: BaseException) -> tuple[str, traceback.FrameSummary | None]:
    """Whose fault an exception is, the one rule for a stage's error (`harness_frame`) and a process's death
    (`death_record`): the deepest frame that is the harness's or a library's under test decides (tools in
    between belong to their caller). A config the harness built that DeepSpeed's pydantic models refuse is
    the harness's. `("tool", None)` when neither appears."""
    if type(error).__name__ == "ValidationError" and type(error).__module__.startswith("pydantic"):
        return "harness", None
    libraries = _package_roots(LIBRARIES_UNDER_TEST)
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        owner = _frame_owner(frame.filename, libraries)
        if owner != "tool":
            return owner, frame
    return "tool", None


def harness_frame(error: BaseException) -> str | None:
    """`suites/<file>.py:<function>` when the harness owns `error` raised inside a cell's stage (see
    `raising_owner`); None when DeepSpeed, transformers or a test fault (standing for a library bug) does."""
    owner, frame = raising_owner(error)
    if owner != "harness":
        return None
    if frame is None:
        return "a config the harness built (pydantic refused it)"
    return f"{Path(frame.filename).resolve().relative_to(PROJECT_ROOT)}:{frame.name}"


@dataclass(frozen=True)
class DeathRecord:
    """What a process of a rank group writes before an exception ends it (outside any cell's stages: while the fork
    server or a rank starts, or between cells)."""

    failure_class: FailureClass
    """`crash` where library code raised, `setup` where the harness's did (death_record)."""
    signature: str
    message: str


def death_record(error: BaseException, where: str) -> DeathRecord:
    """Whose fault decides the class (`raising_owner`): a library's, the rank died there (`crash`); the harness's or
    nobody's (rank setup, bookkeeping), the harness failed (`setup`), never reported as DeepSpeed's. A library that
    cannot be imported (`library_import_failure`) is the environment's (`install`): no AutoTP code ran, and every cell
    of the environment would fail the same way until it is rebuilt."""
    if broken := library_import_failure(error):
        return DeathRecord(
            failure_class="install",
            signature=exception_signature(error),
            message=f"{where} could not import {broken}: the environment is broken or incomplete (a dependency "
            "missing or of another version than the one it was built with), not AutoTP and not the harness. "
            "Rebuild the environment (remove its folder under .nox/envs/ or AUTOTP_ENV_ROOT; the next nox session "
            "installs it again), then rerun the same command: it runs the cells without a verdict.\n"
            + "".join(traceback.format_exception(error))[-4000:],
        )
    owner: FailureClass = "crash" if raising_owner(error)[0] == "library" else "setup"
    return DeathRecord(
        failure_class=owner,
        signature=exception_signature(error),
        message=f"{where} raised ({'library code' if owner == 'crash' else 'harness code: a harness bug'}):\n"
        + "".join(traceback.format_exception(error))[-4000:],
    )


def library_import_failure(error: BaseException) -> str | None:
    """The library under test an ImportError is the failed import of: one that is not installed at all, or whose
    own import raised it (a frame of its package in the traceback: its dependency missing or broken); None for any
    other error, and for a harness import of a module the installed release lacks (the harness's, `setup`)."""
    if not isinstance(error, ImportError):
        return None
    if error.name in LIBRARIES_UNDER_TEST:
        return error.name
    roots = {name: root for name in LIBRARIES_UNDER_TEST if (root := _package_root(name)) is not None}
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename.startswith("/"):
            path = Path(frame.filename).resolve()
            for name, root in roots.items():
                if path.is_relative_to(root):
                    return name
    return None


def read_death_records(folder: Path, pattern: str) -> list[DeathRecord]:
    records: list[DeathRecord] = []
    for path in sorted(folder.glob(pattern)):
        try:
            records.append(read_record(DeathRecord, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue  # written atomically, so only a vanished folder (or a file of an older harness) gets here
    return records


def what_happened(error: BaseException, writing: Path | None = None) -> str:
    """What an exception of the harness's own work (its files, its processes) says about the machine, and what to do,
    in words for whoever reads the cell's record: a file another process removed, a full disk, a folder that is not
    writable; otherwise a harness bug. `writing`: the file being written, when the error does not name it."""
    if (full := disk_full_at(error)) is not None:
        return disk_full_line(full or str(writing or ""), "rerun the cell")
    if isinstance(error, OSError):
        name = str(error.filename or "")
        if isinstance(error, FileNotFoundError) and name.startswith("/dev/shm/"):
            return (
                f"DeepSpeed's shared-memory all-reduce buffer {name} vanished while the cell ran: another process "
                "on this machine removed it, or /dev/shm was cleaned. The machine's fault, not AutoTP's: rerun the cell"
            )
        if isinstance(error, FileNotFoundError):
            return (
                f"a file the harness was using vanished ({name}): another process removed it, or the temporary "
                "folder was cleaned while the run went on. The machine's fault, not AutoTP's: rerun the cell"
            )
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return f"{name or 'a folder the harness writes'} is not writable: fix its permissions, then rerun the cell"
    return "the harness raised: a harness bug (its traceback below); report it, then rerun the cell"


def harness_failure(error: Exception, rerun: str) -> CellOutcome:
    """The `setup` failure of a cell whose driver-side work raised outside the checks (preparing it, its rank group's
    bookkeeping, keeping its logs): the harness's, whichever code raised, and never the cell's verdict on AutoTP.
    `rerun`: the command that runs the cell again."""
    return failed(
        "setup",
        exception_signature(error),
        f"{what_happened(error)}: {rerun}\n(the rank group was restarted; the run went on with the next cell)\n"
        + redact("".join(traceback.format_exception(error))[-4000:]),
    )


def failed(
    failure_class: FailureClass,
    signature: str,
    message: str,
    metrics: dict[str, float] | None = None,
    broke_at: BreakPoint | None = None,
) -> CellOutcome:
    return CellOutcome(
        outcome="fail",
        failure_class=failure_class,
        signature=signature,
        message=message,
        metrics=metrics or {},
        broke_at=broke_at,
    )

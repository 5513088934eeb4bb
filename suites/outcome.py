"""A cell's outcome: pass, fail (with exactly one failure class) or skip, plus a normalised error
signature so identical failures group across models and runs."""

from __future__ import annotations

import json
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from matrix import PROJECT_ROOT

FAILURE_CLASSES = {
    "setup": "the harness failed: building or loading the model or its reference, or its own code raised in a stage "
             "(a harness bug for tiny checkpoints, or a model output it cannot read)",
    "shard": "deepspeed.init_inference raised",
    "forward": "the sharded model raised during forward, generate or the loss",
    "numerics": "logits, perplexity or rank agreement beyond tolerance",
    "generation": "greedy tokens or decode-step logits differ from the reference",
    "memory": "a rank holds about as many parameter bytes as the unsharded model",
    "timeout": "the rank group did not answer within the cell timeout (e.g. a deadlocked collective)",
    "crash": "a rank process died (signal, os._exit, segfault, OOM kill)",
    "install": "the session's environment could not be installed",
}

STAGE_CLASS = {"setup": "setup", "shard": "shard", "forward": "forward"}
"""A rank's stages in order, and the class of a failure raised in each."""


def first_error(errors: list[dict]) -> dict:
    """The error that decides a cell's verdict when ranks raise: the earliest stage, then the lowest rank."""
    return min(errors, key=lambda e: (list(STAGE_CLASS).index(e["stage"]), e["rank"]))


_NUMBER = re.compile(r"(?<![A-Za-z_])(0x[0-9a-fA-F]+|\d+(\.\d+)?([eE][-+]?\d+)?)")
_INTERESTING_FRAMES = ("deepspeed", "transformers")


@dataclass
class CellOutcome:
    outcome: str
    """`pass`, `fail` or `skip`."""
    failure_class: str = ""
    signature: str = ""
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    logs: str = ""
    """Folder with the launcher, fork-server and rank logs, kept when the cell ended its rank group."""
    checkpoint: dict[str, str] = field(default_factory=dict)
    """The weights the cell loaded: `source` (`tiny` or the hub id) and `revision` (hub commit, or the
    tiny checkpoint's content hash); empty when the cell skipped before choosing a checkpoint."""

    def __post_init__(self):
        if self.outcome not in ("pass", "fail", "skip"):
            raise ValueError(f"outcome must be pass, fail or skip, got {self.outcome!r}")
        if self.outcome == "fail" and self.failure_class not in FAILURE_CLASSES:
            raise ValueError(f"failure class must be one of {sorted(FAILURE_CLASSES)}, got {self.failure_class!r}")

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def mask_numbers(text: str) -> str:
    return _NUMBER.sub("N", text)


def exception_signature(error: BaseException) -> str:
    """`Type: message-with-numbers-masked @ package/file.py:function` of the deepest frame inside
    deepspeed or transformers (the code that raised), or the deepest frame when none is."""
    frames = traceback.extract_tb(error.__traceback__)
    interesting = [f for f in frames if any(f"/{pkg}/" in f.filename for pkg in _INTERESTING_FRAMES)]
    where = ""
    frame = (interesting or frames or [None])[-1]
    if frame is not None:
        path = frame.filename
        for pkg in _INTERESTING_FRAMES:
            if f"/{pkg}/" in path:
                path = pkg + "/" + path.split(f"/{pkg}/", 1)[1]
                break
        else:
            path = path.rsplit("/", 1)[-1]
        where = f" @ {path}:{frame.name}"
    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    return f"{type(error).__name__}: {mask_numbers(first_line)}{where}"


_LIBRARY_FRAMES = ("/deepspeed/", "/torch/")
_HARNESS_FOLDERS = tuple(str(PROJECT_ROOT / package) + "/" for package in ("suites", "matrix"))


def harness_frame(error: BaseException) -> str | None:
    """`suites/<file>.py:<function>` when the harness's own code raised `error` inside a cell's stage: the
    deepest frame outside torch (which the harness and the libraries both call, so its caller decides)
    is in suites/ or matrix/. None when DeepSpeed, transformers or any other code raised it (test
    faults included: they stand for library bugs)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/torch/" not in f.filename]
    if not frames or not frames[-1].filename.startswith(_HARNESS_FOLDERS):
        return None
    return f"{Path(frames[-1].filename).relative_to(PROJECT_ROOT)}:{frames[-1].name}"


def raised_in_library(error: BaseException) -> bool:
    """Whether the frame that raised is DeepSpeed's or torch's own Python code."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and any(part in frames[-1].filename for part in _LIBRARY_FRAMES)


def death_record(error: BaseException, where: str) -> dict:
    """What a process of a rank group writes before an exception ends it (outside any cell's stages:
    while the fork server or a rank starts, or between cells). Whose fault decides the class: raised
    in DeepSpeed's or torch's code, the rank died there (`crash`); raised anywhere else (the harness's
    imports, rank setup, bookkeeping), the harness failed (`setup`), never reported as DeepSpeed's."""
    owner = "crash" if raised_in_library(error) else "setup"
    return {"failure_class": owner, "signature": exception_signature(error),
            "message": f"{where} raised ({'DeepSpeed/torch code' if owner == 'crash' else 'harness code: a harness bug'}):\n"
                       + "".join(traceback.format_exception(error))[-4000:]}


def read_death_records(folder: Path, pattern: str) -> list[dict]:
    records = []
    for path in sorted(folder.glob(pattern)):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # written atomically, so only a vanished folder gets here
    return records


def failed(failure_class: str, signature: str, message: str, metrics: dict | None = None) -> CellOutcome:
    return CellOutcome("fail", failure_class, signature, message, metrics or {})

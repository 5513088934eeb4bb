"""The driver's side of the unsharded reference: a reference's cache file (`cached_reference`), computed on a miss in
the reference process (started with `python -m suites.reference.unsharded serve`, reused while the models are small)
or, on CPU, in a child of the run's fork server; what they answer, or why they died, raised here."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import transformers

from matrix import PROJECT_ROOT
from matrix.checkpoints import Checkpoint
from matrix.registry import DType
from suites.checks import inputs
from suites.checks.inputs import ProbeSpec
from suites.checks.task_probe import AccuracyTask
from suites.reference.unsharded import (
    REFERENCE_FORMAT,
    Answer,
    ObservationsRequest,
    ReferenceFailed,
    ReferenceRequest,
    TaskRequest,
    checkpoint_identity,
    path_for,
    reference_identity,
    request_to_json,
    tokenizer_identity,
)
from suites.variants.quantization import QuantizationUnavailable

if TYPE_CHECKING:  # the memory plan's types only: the plan itself is made by the driver (suites/run/driver.py)
    from suites.reference.memory_plan import ReferencePlan


REFERENCE_PROCESS_REUSE_BELOW = 256 << 20

"""Models at least this large (bytes in the cell's dtype) end the reference process after their
reference: below it, the ~5 s start of a new process would cost more than the memory it returns."""


def cached_reference(
    checkpoint: Checkpoint,
    dtype: DType,
    spec: ProbeSpec,
    *,
    plan: ReferencePlan,
    trust_remote_code: bool = False,
    quantization: str = "",
    quant_group_size: int = 0,
    fork_server: ReferenceForker | None = None,
) -> Path:
    """Path of the reference observations on disk, computed on a cache miss, offloaded as `plan` says (the plan that
    let the cell run, suites/run/driver.py), in a child of `fork_server` (the run's, on CPU), else by the reference
    process."""
    request = observations_request(
        checkpoint,
        dtype,
        spec,
        plan=plan,
        trust_remote_code=trust_remote_code,
        quantization=quantization,
        quant_group_size=quant_group_size,
    )
    return cached(request, plan, fork_server)


def observations_request(
    checkpoint: Checkpoint,
    dtype: DType,
    spec: ProbeSpec,
    *,
    plan: ReferencePlan,
    trust_remote_code: bool = False,
    quantization: str = "",
    quant_group_size: int = 0,
) -> ObservationsRequest:
    """The request that computes a reference (`cached_reference`'s arguments): its cache file is `request.path`."""
    identity = reference_identity(checkpoint, dtype, spec, quantization, quant_group_size)
    return ObservationsRequest(
        path=str(path_for(identity)),
        identity=identity,
        checkpoint=checkpoint.folder,
        tokenizer=checkpoint.tokenizer,
        dtype=dtype,
        spec=spec,
        trust_remote_code=trust_remote_code,
        quantization=quantization,
        quant_group_size=quant_group_size,
        max_memory=plan.max_memory(),
        offload=plan.offload,
        corpus_file=str(inputs.CORPUS_FILE),
        planned_peak_bytes=plan.host_bytes,
    )


def cached(request: ObservationsRequest, plan: ReferencePlan, fork_server: ReferenceForker | None = None) -> Path:
    """The request's cache file, computed first on a miss (as `cached_reference` says; `plan`: the request's)."""
    path = Path(request.path)
    if not path.exists():
        _compute(request, plan.model_bytes >= REFERENCE_PROCESS_REUSE_BELOW, fork_server)
    return path


def cached_task_reference(
    checkpoint: Checkpoint,
    dtype: DType,
    task: AccuracyTask,
    trust_remote_code: bool = False,
    fork_server: ReferenceForker | None = None,
) -> Path:
    """Path of the unsharded model's per-item correctness on an accuracy task (JSON list of bools)."""

    identity = {
        "format": REFERENCE_FORMAT,
        "checkpoint": checkpoint_identity(checkpoint),
        "tokenizer": tokenizer_identity(checkpoint),
        "dtype": dtype,
        "task": task.fingerprint,
        "torch": str(torch.__version__),
        "transformers": transformers.__version__,
    }
    path = path_for(identity, prefix="task-", suffix=".json")
    if not path.exists():
        request = TaskRequest(
            path=str(path),
            checkpoint=checkpoint.folder,
            tokenizer=checkpoint.tokenizer,
            dtype=dtype,
            task=task,
            trust_remote_code=trust_remote_code,
        )
        _compute(request, False, fork_server)
    return path


def _answered(answer: Answer) -> Answer:
    """The answer of a reference computed elsewhere, or its failure raised here."""
    if "error" in answer:
        error = answer["error"]
        if error["quantization_unavailable"]:
            raise QuantizationUnavailable(error["message"])
        raise ReferenceFailed(error["signature"], error["message"])
    return answer


def _died(code: int | None, log_path: Path, log_tail: str) -> ReferenceFailed:
    return ReferenceFailed(
        "ReferenceProcessDied: the reference process exited without an answer",
        f"the reference process died (exit code {code}); log {log_path}:\n{log_tail}",
    )


class ReferenceProcess:
    """The driver's handle on the reference process: one JSON request a line on its stdin, one JSON
    answer a line back; its own output goes to a log whose tail is quoted when it fails."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.log_path = Path(tempfile.gettempdir()) / f"autotp-reference-{os.getpid()}.log"

    def start(self) -> subprocess.Popen[str]:
        """The running process, started now unless it runs (its imports take seconds)."""
        if self.process is None or self.process.poll() is not None:
            with self.log_path.open("a") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "suites.reference.unsharded", "serve"],
                    cwd=PROJECT_ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
        return self.process

    def compute(self, request: ReferenceRequest, exit_after: bool) -> Answer:
        process = self.start()
        assert process.stdin is not None and process.stdout is not None  # Popen with PIPE for both
        process.stdin.write(json.dumps(request_to_json(request)) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:  # killed (e.g. by the OOM killer) or crashed
            code, self.process = process.wait(), None
            raise _died(code, self.log_path, _log_tail(self.log_path))
        if exit_after:
            self.close()
        return _answered(json.loads(line))

    def close(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            assert self.process.stdin is not None  # Popen with stdin=PIPE
            self.process.stdin.close()  # the process ends when its stdin closes
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def _log_tail(log_path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ComputesReferences(Protocol):
    """What computes a reference in a process of its own (a `ReferenceForker`, or one of its series)."""

    def compute_reference(self, request: ReferenceRequest) -> Answer | None:
        """`answer(request)` as the child wrote it, {"died": exit code, "log": path} when it died without one, or
        None when the server cannot start."""
        ...


class ReferenceForker(ComputesReferences, Protocol):
    """Where a CPU run computes references: its fork server (suites/engine/fork_server.py `ForkServer`), which forks
    a child after its imports of torch, transformers and DeepSpeed, instead of a reference process that imports them
    all again (10-14 CPU s on the cold path). Each child is a process of its own that never shards, holds no process
    group and no rank's variables, and has exited when its reference returns, so its memory is back with the OS
    before the rank group loads the model."""

    def reference_series(self) -> AbstractContextManager[ComputesReferences]:
        """One child that computes many references one after another (a run's tiny ones, suites/run/ahead.py), ended
        when the block ends."""
        ...


def _compute(request: ReferenceRequest, exit_after: bool, forker: ReferenceForker | None) -> Answer:
    """In a child of the run's fork server when it has one (CPU), else in the reference process; `exit_after`: the
    reference process ends after this one (a forked child always does)."""
    # A server that cannot start (its imports fail) answers None: the group's start reports whose fault that is,
    # and the reference process computes the reference, as it did before references were forked.
    answer = forker.compute_reference(request) if forker is not None else None
    if answer is None:
        return _reference_process.compute(request, exit_after)
    if "died" in answer:
        raise _died(answer["died"], Path(answer["log"]), _log_tail(Path(answer["log"])))
    return _answered(answer)


_reference_process = ReferenceProcess()

atexit.register(_reference_process.close)


def start_reference_process() -> None:
    """Start the reference process ahead of its first request: its imports then run beside what the driver does
    before asking (writing a tiny checkpoint)."""
    _reference_process.start()


def reference_process_pids() -> list[int]:
    """The reference process of this driver, while it runs (idle between references)."""
    process = _reference_process.process
    return [process.pid] if process is not None and process.poll() is None else []

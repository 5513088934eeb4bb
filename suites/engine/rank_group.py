"""Driver side of a rank group: N worker processes started once (forked from the fork server on CPU,
by DeepSpeed's launcher on accelerators) and fed many cells through files in a work folder.

The driver owns every timeout and the group's life: a hung collective or a dead rank ends the
group (the whole process group is killed, so no orphan ranks), the cell gets `timeout` or
`crash`, and the next cell starts a fresh group.
"""

from __future__ import annotations

import ast
import atexit
import fcntl
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix import PROJECT_ROOT, cache_root
from matrix.harness_cache import used
from matrix.json_records import read_record, write_record
from matrix.redaction import redact
from suites.base.atomic import write_text_atomically
from suites.engine import doorbells, oom_kills
from suites.engine.fork_server import ForkedGroup, ForkServer, GroupStartFailure
from suites.verdicts.mechanism import AutoTPRecord
from suites.verdicts.outcome import CellOutcome, RankError, failed, first_error, log_folder, read_death_records

if TYPE_CHECKING:  # the job's module imports torch; the driver starts the fork server before any such import
    from suites.checks.contracts import Job

WORKER = Path(__file__).resolve().parent / "worker.py"
ERROR_GRACE_SECONDS = 1.0
"""How long other ranks get to finish a cell after one rank reported an error. Ranks that fail together
usually write their errors within milliseconds, but up to 0.96 s apart at load ~10 on 2 cores (docs/findings.md,
2026-12-05); a grace that ends first kills the group and decides the verdict by `first_error` of the errors
written by then, so the load would pick which error decides."""
LOG_TAIL_LINES = 25
KEPT_LOG_LINES = 400
"""Lines of each log a failing cell keeps (the end of what it wrote while the cell ran)."""
LIVENESS_SECONDS = 0.1
"""How often the driver looks whether the group still lives while no rank rings (a rank killed by a signal rings
nothing; its cell ends as `crash` this much later at most)."""
LAUNCHERS = ("auto", "fork", "deepspeed")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def torch_extensions_dir() -> Path:
    """Where DeepSpeed JIT-builds its ops. One folder per DeepSpeed version: builds of different
    releases share module names, and a stale one from another release fails at import (seen here:
    `module 'deepspeed_shm_comm' has no attribute 'vector_kernel_level'`)."""
    if "TORCH_EXTENSIONS_DIR" in os.environ:
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])

    return used(cache_root() / "torch_extensions" / f"deepspeed-{version('deepspeed')}")


BUILD_GUARD = ".autotp-build.flock"


@contextmanager
def jit_build_guard(root: Path, log: Callable[[str], object] = print) -> Iterator[None]:
    """Held while a rank group starts, which is when its ranks JIT-build (or load) DeepSpeed's ops.

    torch marks a build in progress with a `lock` file under the extensions folder; a build that was
    interrupted (Ctrl-C, a killed runner) leaves it behind and every later start waits on it forever.
    Every harness start holds this flock (which the kernel releases when its holder dies), so a `lock`
    found while holding it belongs to no running harness build: it is removed at once."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / BUILD_GUARD, "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        for lock in root.glob("**/lock"):
            log(f"removing torch extension build lock left by an interrupted build: {lock}")
            lock.unlink(missing_ok=True)
        yield


def launch_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir())
    if "DS_ACCELERATOR" not in env and not _cuda_available():
        env["DS_ACCELERATOR"] = "cpu"
    return env


def _cuda_available() -> bool:
    """Whether torch sees a CUDA (or ROCm) device. A CPU build says so in its `torch/version.py` (`cuda` and `hip`
    None), read without importing torch (~8 s of a core), so the fork server starts before the driver's imports."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return False
    version_file = Path(next(iter(spec.submodule_search_locations or []), "")) / "version.py"
    constants: dict[str, object] = {}
    try:
        for node in ast.parse(version_file.read_text()).body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        constants[target.id] = node.value.value
    except (OSError, SyntaxError):
        pass  # no file to read: torch itself answers
    if "cuda" in constants and "hip" in constants and constants["cuda"] is None and constants["hip"] is None:
        return False
    # lazily: `python -m reports` and nox's own process import this module, and have no torch
    import torch

    return torch.cuda.is_available()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


SHARED_MEMORY = Path("/dev/shm")
"""Where DeepSpeed's CPU all-reduce keeps its buffers (`deepspeed_allreduce_buffer_<port>_<rank>` and the like)."""


def release_orphaned_shared_memory(
    min_age_seconds: float = 60, log: Callable[[str], object] = print, shared_memory: Path = SHARED_MEMORY
) -> None:
    """DeepSpeed all-reduce buffers in /dev/shm that no live process maps any more: left by groups
    whose driver was killed before it could release them (see RankGroup.release_shared_memory). Other processes
    of the machine (another harness run releasing its group's buffers, a /dev/shm cleaner) remove buffers while
    this looks: one gone between the listing and its age is skipped, never an error of the cell that starts."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(
                line.split(maxsplit=5)[-1].strip() for line in maps.read_text().splitlines() if "/dev/shm/" in line
            )
        except OSError:
            continue  # the process ended while we looked
    for buffer in shared_memory.glob("deepspeed_*buffer*"):
        try:
            modified = buffer.stat().st_mtime
        except FileNotFoundError:
            continue  # removed by another process since the listing
        if str(buffer) not in mapped and time.time() - modified > min_age_seconds:
            log(f"removing orphaned DeepSpeed shared-memory buffer {buffer}")
            buffer.unlink(missing_ok=True)


class LauncherProcess:
    """A group started by DeepSpeed's launcher, as users start one; the launcher leads a session of
    its own, so one killpg ends it and its ranks."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path):
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=PROJECT_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def poll(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


class RankGroup:
    def __init__(self, tp: int, start_timeout: float = 900, fork_server: ForkServer | None = None):
        self.tp = tp
        self.fork_server = fork_server
        self.start_timeout = start_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix=f"autotp-tp{tp}-"))
        doorbells.make(doorbells.events_path(self.workdir))
        for rank in range(tp):
            doorbells.make(doorbells.job_path(self.workdir, rank))
        self.events = doorbells.Listener(doorbells.events_path(self.workdir))
        self.env = launch_environment()
        # One intra-op thread pool per rank sized to its share of the cores: N ranks each spinning
        # up all cores would oversubscribe the machine N times.
        self.env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // tp)))
        self.process: LauncherProcess | ForkedGroup | None = None
        self.seq = 0
        self.info: dict[str, Any] = {}
        self.port = free_port()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def session(self) -> int:
        """The session the group's processes share: its leader (launcher or forked leader) started it."""
        if self.process is None:
            raise RuntimeError("the rank group was never started")
        return self.process.leader_pid if isinstance(self.process, ForkedGroup) else self.process.process.pid

    def start(self) -> None:
        with jit_build_guard(Path(self.env["TORCH_EXTENSIONS_DIR"])):
            self._start()

    def _start(self) -> None:
        release_orphaned_shared_memory()
        deadline = time.monotonic() + self.start_timeout
        oom_kills_at_start = oom_kills.kernel_oom_kills()
        if self.fork_server is not None:
            self.process = self.fork_server.fork_group(
                tp=self.tp,
                port=self.port,
                workdir=self.workdir,
                driver_pid=os.getpid(),
                omp_threads=self.env["OMP_NUM_THREADS"],
                timeout=self.start_timeout,
            )
        else:
            command = [
                sys.executable,
                "-m",
                "deepspeed.launcher.runner",
                "--num_gpus",
                str(self.tp),
                "--master_port",
                str(self.port),
                str(WORKER),
                "--workdir",
                str(self.workdir),
                "--driver-pid",
                str(os.getpid()),
            ]
            self.process = LauncherProcess(command, self.env, self.workdir / "launcher.log")
        while not all((self.workdir / f"ready.{r}").exists() for r in range(self.tp)):
            if not self.alive:
                died = self._died(oom_kills_at_start)
                raise GroupStartFailure(
                    died.failed_class,
                    f"rank group failed to start: {died.signature}",
                    f"rank group tp={self.tp} failed to start: {died.message}",
                )
            if time.monotonic() > deadline:
                logs = self.logs_tail()
                self.kill()
                raise GroupStartFailure(
                    "timeout",
                    f"rank group not ready within {self.start_timeout:.0f} s",
                    f"rank group tp={self.tp} was not ready after {self.start_timeout:.0f} s "
                    f"(a stuck JIT build or rendezvous?); group killed.\n{logs}",
                )
            self.events.wait(LIVENESS_SECONDS)
        self.info = json.loads((self.workdir / "ready.0").read_text())

    def log_sizes(self) -> dict[str, int]:
        """Bytes each of the group's logs holds now: where a cell's part of them starts."""
        return {path.name: path.stat().st_size for path in self.workdir.glob("*.log") if path.is_file()}

    def logs_tail(self) -> str:
        parts = [f"[launcher]\n{_tail(self.workdir / 'launcher.log')}"]
        parts += [f"[rank {r}]\n{_tail(self.workdir / f'rank{r}.log')}" for r in range(self.tp)]
        return "\n".join(parts)

    def _with_record(self, outcome: CellOutcome, seq: int) -> CellOutcome:
        """The outcome with what AutoTP did to the model, as rank 0 wrote it after sharding (none when it never got
        there)."""
        path = self.workdir / f"autotp-{seq}.json"
        if path.exists():
            outcome.autotp = read_record(AutoTPRecord, json.loads(path.read_text()))
        return outcome

    def run(self, job: Job, timeout: float) -> CellOutcome:
        """Runs one cell; never raises for what the cell does (that is its outcome)."""
        seq, self.seq = self.seq, self.seq + 1
        write_text_atomically(self.workdir / f"job-{seq}.json", json.dumps(write_record(replace(job, seq=seq))))
        for rank in range(self.tp):
            doorbells.ring(doorbells.job_path(self.workdir, rank))
        result_file = self.workdir / f"result-{seq}.json"
        deadline = time.monotonic() + timeout
        oom_kills_at_start = oom_kills.kernel_oom_kills()
        first_error_at = None
        while True:
            if result_file.exists() and all((self.workdir / f"done-{seq}.{r}").exists() for r in range(self.tp)):
                return self._with_record(read_record(CellOutcome, json.loads(result_file.read_text())), seq)
            if not self.alive:
                return self._with_record(self._died(oom_kills_at_start), seq)
            errors = sorted(self.workdir.glob(f"error-{seq}.*.json"))
            if errors and first_error_at is None:
                first_error_at = time.monotonic()
            if first_error_at is not None and time.monotonic() - first_error_at > ERROR_GRACE_SECONDS:
                # One rank failed and the others are stuck in a collective waiting for it.
                error = first_error([read_record(RankError, json.loads(path.read_text())) for path in errors])
                self.kill()
                outcome = failed(
                    error.failure_class,
                    error.signature,
                    error.message + "\n(the other ranks hung waiting for it; rank group restarted)",
                    broke_at=error.broke_at,
                )
                return self._with_record(outcome, seq)
            if time.monotonic() > deadline:
                logs = self.logs_tail()
                self.kill()
                outcome = failed(
                    "timeout",
                    f"no answer within {timeout:.0f} s",
                    f"cell exceeded its {timeout:.0f} s timeout (deadlocked collective?); rank group killed.\n{logs}",
                )
                return self._with_record(outcome, seq)
            wake_by = min(deadline, first_error_at + ERROR_GRACE_SECONDS if first_error_at is not None else deadline)
            self.events.wait(min(LIVENESS_SECONDS, wake_by - time.monotonic()))

    def _died(self, oom_kills_at_start: int | None) -> CellOutcome:
        """The group ended outside a cell's stages. A rank that raised wrote whose fault it was
        (outcome.death_record); one that wrote nothing died of a signal or an exit of DeepSpeed's/torch's
        native code: `crash`, which names the kernel's out-of-memory killer where its count rose past
        `oom_kills_at_start` (read when the cell or the group's start began)."""
        logs = self.logs_tail()
        self.kill()
        recorded = read_death_records(self.workdir, "died.*.json")
        if recorded:
            died = recorded[0]
            return failed(died.failure_class, died.signature, f"{died.message}\nrank group restarted.\n{logs}")
        # The launcher names the first rank that died: "... exits with return code = -11".
        exit_line = re.search(r"exits with return code = (-?\d+)", logs)
        code = int(exit_line.group(1)) if exit_line else self.process.returncode if self.process else None
        cause = "unknown cause" if code is None else _signal_name(-code) if code < 0 else f"exit code {code}"
        if code == -signal.SIGKILL and (killed := oom_kills.oom_killed(oom_kills_at_start, logs)) is not None:
            return killed
        return failed("crash", f"rank died: {cause}", f"a rank process died ({cause}); rank group restarted.\n{logs}")

    def kill(self) -> None:
        if self.process is None:
            return
        self.process.kill()
        self.release_shared_memory()

    def release_shared_memory(self) -> None:
        """DeepSpeed's CPU all-reduce keeps a ~66 MB /dev/shm buffer per rank, named after the master
        port, and never unlinks it, not even on a clean exit; a nightly of hundreds of launches would
        fill the machine's memory (seen here: 22 GB after a day of runs, then the OOM killer)."""
        for buffer in SHARED_MEMORY.glob(f"deepspeed_*_{self.port}_*"):
            buffer.unlink(missing_ok=True)

    def close(self) -> None:
        # Idle ranks hold no collective and no file open for writing: killing them loses nothing and
        # a graceful exit took ~5 s (process-group teardown) for every tp switch.
        self.kill()
        self.events.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class RankGroupPool:
    """At most one live group at a time (groups of different tp sizes would fight for the cores);
    a group is reused across cells until it dies or another tp size is needed.

    `launcher`: `fork` forks CPU groups from a pre-imported server (see suites/engine/fork_server.py);
    `deepspeed` starts every group with DeepSpeed's launcher; `auto` (default) forks on CPU only.
    `results`: the results folder, where each failing cell keeps the end of the logs it wrote (`logs/<cell id>/`
    in it), whether or not its group ended; the group's own folder is temporary."""

    def __init__(self, start_timeout: float = 900, launcher: str = "auto", results: Path | None = None):
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        self.start_timeout = start_timeout
        self.results = results
        self.group: RankGroup | None = None
        self.launches = 0
        env = launch_environment()
        self.fork_server = None
        if launcher == "fork" or (launcher == "auto" and env.get("DS_ACCELERATOR") == "cpu"):
            self.fork_server = ForkServer(env)
        atexit.register(self.close)

    def prepare(self) -> None:
        """Start what the first group needs (the fork server's imports) while the driver prepares the first
        cell (on a cold cache: its tiny checkpoint and reference, which take as long)."""
        if self.fork_server is not None:
            self.fork_server.start()

    def preload(self, model_types: list[str]) -> None:
        """The run's model types, whose modeling modules the fork server imports once for every group it forks."""
        if self.fork_server is not None:
            self.fork_server.preload(model_types)

    def get(self, tp: int) -> RankGroup:
        if self.group is not None and (self.group.tp != tp or not self.group.alive):
            self.group.close()
            self.group = None
        if self.group is None:
            group = RankGroup(tp, self.start_timeout, fork_server=self.fork_server)
            self.launches += 1
            try:
                group.start()
            except GroupStartFailure:
                self.group = group  # closed (and its logs kept) by run()
                raise
            self.group = group
        return self.group

    def run(self, tp: int, job: Job, timeout: float) -> CellOutcome:
        reused = self.group is not None and self.group.tp == tp and self.group.alive
        started_at = self.group.log_sizes() if reused and self.group is not None else {}
        fork_server_log = self._fork_server_log()
        server_at = fork_server_log.stat().st_size if fork_server_log and fork_server_log.is_file() else 0
        try:
            outcome = self.get(tp).run(job, timeout)
        except GroupStartFailure as error:
            outcome = failed(error.failure_class, error.signature, str(error))
            server_at = 0  # a server that could not start said why before this cell began: keep all of its log's end
        if fork_server_log is None:  # the server this run started (or failed to): its log from its first line
            fork_server_log, server_at = self._fork_server_log(), 0
        if self.group is not None and outcome.outcome == "fail":
            logs = {path: started_at.get(path.name, 0) for path in self.group.workdir.glob("*.log")}
            if fork_server_log is not None:
                logs[fork_server_log] = server_at
            outcome = self.keep_logs(job.cell_id, outcome, logs)
        return outcome

    def discard_group(self) -> None:
        """End the live group, whatever state it is in (the driver's own work raised while it ran a cell): the next
        cell starts a fresh one."""
        if self.group is not None:
            self.group.close()
            self.group = None

    def _fork_server_log(self) -> Path | None:
        log_dir = self.fork_server.log_dir if self.fork_server is not None else None
        return log_dir / "fork-server.log" if log_dir is not None else None

    def keep_logs(self, cell_id: str, outcome: CellOutcome, logs: dict[Path, int]) -> CellOutcome:
        """Keep the end of what each log (from the byte offset given: where the cell started in a reused group's
        logs) holds, in the results folder (`logs/<cell id>/`), for a failing cell whether or not its group ended;
        the folder is named in the outcome relative to the results folder (a record holds no host path), and exists
        when someone reads it."""
        if self.results is None:
            return outcome
        pointer = log_folder(cell_id)
        kept = self.results / pointer
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for source, offset in logs.items():
            if source.is_file():
                with source.open("rb") as stream:
                    stream.seek(offset)
                    lines = stream.read().decode(errors="replace").splitlines()[-KEPT_LOG_LINES:]
                # uploaded as artifacts: no secret may reach them
                write_text_atomically(kept / source.name, redact("\n".join(lines) + "\n"))
        return replace(outcome, message=f"{outcome.message}\nlogs: {pointer}", logs=pointer)

    def keep_text(self, cell_id: str, outcome: CellOutcome, name: str, text: str) -> CellOutcome:
        """A failing cell that never reached a rank group keeps what the driver knows of it (its setup's failure
        with the unsharded reference's log tail) as `logs/<cell id>/<name>` in the results folder, beside the end of
        the fork server's log (the reference is computed there: a server that cannot start says why only in it)."""
        if self.results is None:
            return outcome
        server_log = self._fork_server_log()
        outcome = self.keep_logs(cell_id, outcome, {server_log: 0} if server_log is not None else {})
        write_text_atomically(self.results / outcome.logs / name, redact(text.rstrip("\n") + "\n"))
        return outcome

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.fork_server is not None:
            self.fork_server.close()

"""CPU rank groups forked from one process that has already imported torch, DeepSpeed and
transformers.

A launch through `deepspeed --num_gpus N` costs ~8 s of imports on two cores, and a cell that kills its
group (one rank raised, the others hang in a collective) pays it again. Forking ranks from a
pre-imported server costs well under a second and runs the same worker code; the ranks still meet
through `deepspeed.init_distributed()` with the environment DeepSpeed's launcher gives them (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT).

CPU only: a process that has touched CUDA cannot be forked into CUDA ranks, so accelerator runs use
the real launcher, where a launch is small next to loading a real checkpoint.

Protocol: the driver writes one JSON line per group to the server's stdin. The server forks a group
leader, which starts a session of its own (the driver ends the group with one killpg), forks the
ranks and watches them like DeepSpeed's launcher: the first rank to exit non-zero ends the group and
is logged as "... exits with return code = C". The server writes the leader's pid to
`<workdir>/leader.pid`, and exits when its stdin closes (the driver ended).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix import PROJECT_ROOT
from matrix.json_records import write_record
from suites.base.atomic import write_text_atomically
from suites.engine import worker
from suites.engine.processes import pid_alive
from suites.verdicts.outcome import death_record, read_death_records
from suites.verdicts.vocabulary import FailureClass

if TYPE_CHECKING:  # suites.reference.unsharded imports torch: the driver starts the server before any such import
    from suites.reference.unsharded import Answer, ReferenceRequest

ServerRequest = dict[str, Any]
"""One JSON line to the server: a group's (`tp`, `port`, `workdir`, `driver_pid`, `omp_threads`), a reference
process's (`kind` REFERENCE_KIND, `workdir`, `driver_pid`), or modules to import (`kind` PRELOAD_KIND,
`model_types`)."""

SERVER_DIED = "server-died.json"
REFERENCE_KIND = "reference"
"""A request for a reference's process instead of a rank group."""
PRELOAD_KIND = "preload"
"""A request to import the modeling modules of a run's model types (`model_types`) before the next fork: forks nothing
(worker.import_modeling_modules)."""
REFERENCE_ENDED = "ended.json"
"""What a reference process's leader writes when its child has ended: `{"exit_code": C}`."""
REFERENCE_CLOSE = "close"
"""The file that tells a reference process to end once it has answered what it was asked."""
REFERENCE_POLL_S = 0.005
"""How often a reference process looks for its next request (and the driver for its answer)."""
REFERENCE_FORK_TIMEOUT_S = 900
"""How long a reference's child may wait to be forked: the server's imports, when it still runs them."""
REFERENCE_EXIT_S = 60
"""How long a reference's process may take to end once told to (after its last answer: it frees the models'
memory), before it is killed. The driver waits for that end: the memory plan counts the reference's memory as free
before the ranks load, and an exit beside a rank group's busy-waiting all-reduce slowed its cell ~0.15 s (10-20 ms
of exit; docs/findings.md)."""
REFERENCE_PROCESS_NAME = "autotp-reference"
"""The process name of a reference's leader and child (Linux keeps 15 characters: `autotp-referenc`)."""
DISTRIBUTED_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_SIZE",
    "CROSS_RANK",
    "CROSS_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""What makes a process a rank (DeepSpeed's launcher sets them, `_rank_environment` here): never in a reference's."""


class GroupStartFailure(RuntimeError):
    """A rank group did not come up; `failure_class` says whose fault (see outcome.death_record)."""

    def __init__(self, failure_class: FailureClass, signature: str, message: str):
        super().__init__(message)
        self.failure_class, self.signature = failure_class, signature


class ForkedGroup:
    """The driver's handle on one forked group: its leader process."""

    def __init__(self, leader_pid: int) -> None:
        self.leader_pid = leader_pid
        self.returncode = None  # the server reaps the leader; a rank's code is in launcher.log

    def poll(self) -> int | None:
        return None if pid_alive(self.leader_pid) else 0

    def wait_ended(self, timeout: float) -> None:
        """Until the leader has ended (a reference's leader ends after its child), killed after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while pid_alive(self.leader_pid):
            if time.monotonic() > deadline:
                self.kill()
                return
            time.sleep(0.002)

    def kill(self) -> None:
        try:
            os.killpg(self.leader_pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while pid_alive(self.leader_pid) and time.monotonic() < deadline:
            time.sleep(0.01)


class ForkServer:
    """Driver side: starts the server lazily and asks it for groups."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.log_dir: Path | None = None
        self.start_failure: GroupStartFailure | None = None

    def start(self) -> None:
        """Start the server now (it imports torch, DeepSpeed and transformers: seconds), not at the first group."""
        if self.process is None or self.process.poll() is not None:
            self._start()

    def fork_group(
        self, *, tp: int, port: int, workdir: Path, driver_pid: int, omp_threads: str, timeout: float
    ) -> ForkedGroup:
        """The new group's handle; a server that died (even between two requests) is started again once."""
        request = {
            "tp": tp,
            "port": port,
            "workdir": str(workdir),
            "driver_pid": driver_pid,
            "omp_threads": omp_threads,
        }
        return ForkedGroup(self._fork(request, workdir, timeout))

    def preload(self, model_types: list[str]) -> None:
        """Have the server import these model types' modeling modules before it forks the next group or reference
        (their ranks then inherit them); the server is started if it is not running. A server that cannot take the
        request is left alone: each cell then imports its model as before."""
        process = self.process if self.process is not None and self.process.poll() is None else self._start()
        assert process.stdin is not None  # Popen with stdin=PIPE
        try:
            process.stdin.write((json.dumps({"kind": PRELOAD_KIND, "model_types": model_types}) + "\n").encode())
            process.stdin.flush()
        except BrokenPipeError:
            pass

    def compute_reference(self, request: ReferenceRequest) -> Answer | None:
        """One unsharded reference (suites/reference/unsharded.py `answer`) computed in a process of its own forked from
        the server after its imports, which has ended when this returns: its answer, {"died": exit code, "log": path}
        when it died without one, or None when the server cannot start. Like the reference process, no time limit: a
        reference takes what its model's size takes."""
        with self.reference_series() as series:
            return series.compute_reference(request)

    @contextmanager
    def reference_series(self) -> Iterator[ReferenceSeries]:
        """A `ReferenceSeries` of this server's, ended when the block ends."""
        series = ReferenceSeries(self)
        try:
            yield series
        finally:
            series.close()

    def _fork(self, request: ServerRequest, workdir: Path, timeout: float) -> int:
        """Ask the server to fork for `request`; the leader's pid, which the server writes to `<workdir>/leader.pid`."""
        if self.start_failure is not None:  # the server's imports failed: they fail the same way every time
            raise self.start_failure
        pid_file, deadline = workdir / "leader.pid", time.monotonic() + timeout
        for _ in range(2):
            process = self.process if self.process is not None and self.process.poll() is None else self._start()
            assert process.stdin is not None  # Popen with stdin=PIPE
            try:
                process.stdin.write((json.dumps(request) + "\n").encode())
                process.stdin.flush()
            except BrokenPipeError:
                continue
            while not pid_file.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if pid_file.exists():
                return int(pid_file.read_text())
        died = read_death_records(self.log_dir, SERVER_DIED) if self.log_dir else []
        if died:
            self.start_failure = GroupStartFailure(
                died[0].failure_class, died[0].signature, "the fork server could not start: " + died[0].message
            )
            raise self.start_failure
        raise GroupStartFailure(
            "setup",
            "the fork server did not start the group",
            "the fork server did not start the group (no error recorded; see fork-server.log)",
        )

    def _start(self) -> subprocess.Popen[bytes]:
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()
        self.log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="autotp-fork-server-"))
        (self.log_dir / SERVER_DIED).unlink(missing_ok=True)
        with open(self.log_dir / "fork-server.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "suites.engine.fork_server", str(self.log_dir)],
                cwd=PROJECT_ROOT,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.process

    def close(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
            self.process = None
        if self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None


class ReferenceSeries:
    """A reference's process forked from the server that computes the references it is given one after another (a
    run's tiny references ahead of its cells, suites/run/ahead.py): one fork, one set of first-call costs, for all of
    them. It computes references as `ForkServer.compute_reference` does; its process starts at the first request,
    again after one it died in, and ends at `close`."""

    def __init__(self, server: ForkServer) -> None:
        self.server = server
        self.leader: ForkedGroup | None = None
        self.workdir: Path | None = None
        self.asked = 0

    def compute_reference(self, request: ReferenceRequest) -> Answer | None:
        """As `ForkServer.compute_reference`, in this series' process."""
        from suites.reference.unsharded import request_to_json  # the caller's module: imported by now

        if self.leader is None:
            workdir = Path(tempfile.mkdtemp(prefix="autotp-reference-"))
            try:
                self.leader = ForkedGroup(
                    self.server._fork(
                        {"kind": REFERENCE_KIND, "workdir": str(workdir), "driver_pid": os.getpid()},
                        workdir,
                        REFERENCE_FORK_TIMEOUT_S,
                    )
                )
            except GroupStartFailure:
                shutil.rmtree(workdir, ignore_errors=True)
                return None
            self.workdir, self.asked = workdir, 0
        assert self.workdir is not None
        answer_file = self.workdir / f"answer-{self.asked}.json"
        write_text_atomically(self.workdir / f"request-{self.asked}.json", json.dumps(request_to_json(request)))
        self.asked += 1
        try:
            while not answer_file.exists() and pid_alive(self.leader.leader_pid):
                time.sleep(REFERENCE_POLL_S)
        except BaseException:  # Ctrl-C, a test's timeout: the process must not outlive its driver
            self.leader.kill()
            raise
        if answer_file.exists():
            answer: Answer = json.loads(answer_file.read_text())
            return answer
        return self._died()

    def _died(self) -> Answer:
        """The answer of a request its process died in (killed by the OOM killer, a crash in native code): its exit
        code and its log, which outlives the work folder; the next request starts a new process."""
        assert self.leader is not None and self.workdir is not None
        self.leader.wait_ended(REFERENCE_EXIT_S)
        ended = self.workdir / REFERENCE_ENDED
        code = json.loads(ended.read_text())["exit_code"] if ended.exists() else None
        kept = Path(tempfile.gettempdir()) / f"autotp-reference-{os.getpid()}.log"
        with kept.open("a") as log, open(self.workdir / "reference.log", errors="replace") as written:
            log.write(written.read()[-20000:])
        self._forget()
        return {"died": code, "log": str(kept)}

    def close(self) -> None:
        """End the process once it has answered (it frees the models' memory) and wait for that end: the memory plan
        counts its memory as free before the ranks load."""
        if self.leader is not None and self.workdir is not None:
            (self.workdir / REFERENCE_CLOSE).touch()
            self.leader.wait_ended(REFERENCE_EXIT_S)
        self._forget()

    def _forget(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.leader, self.workdir = None, None


def _rank_environment(request: ServerRequest, rank: int) -> dict[str, str]:
    environment = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(request["tp"]),
        "LOCAL_SIZE": str(request["tp"]),
        "CROSS_RANK": "0",
        "CROSS_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(request["port"]),
        "OMP_NUM_THREADS": request["omp_threads"],
    }
    assert set(DISTRIBUTED_VARIABLES) <= set(environment)  # the reference's guard removes exactly these
    return environment


def _run_rank(request: ServerRequest, rank: int) -> None:
    code = 1
    try:
        os.environ.update(_rank_environment(request, rank))
        sys.argv = ["worker", "--workdir", request["workdir"], "--driver-pid", str(request["driver_pid"])]
        worker.main()
        code = 0
    except SystemExit as ended:
        code = ended.code if isinstance(ended.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever ends a rank is logged, then the group ends
        traceback.print_exc()
    finally:
        os._exit(code)


def _lead_group(request: ServerRequest) -> None:
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    ranks = {}
    for rank in range(request["tp"]):
        pid = os.fork()
        if pid == 0:
            _run_rank(request, rank)
        ranks[pid] = rank
    with open(Path(request["workdir"]) / "launcher.log", "a", buffering=1) as log:
        while ranks:
            pid, status = os.wait()
            code = os.waitstatus_to_exitcode(status)
            rank = ranks.pop(pid)
            if code != 0:
                log.write(f"rank {rank} (pid {pid}) exits with return code = {code}\n")
                os.killpg(0, signal.SIGKILL)
    os._exit(0)


def _name_process(name: str) -> None:
    """The name `ps` and /proc/<pid>/stat show: a forked process keeps its parent's command line, and benchmarks
    (benchmarks/cold_start.py) tell a reference's process from a rank by it."""
    try:
        Path("/proc/self/comm").write_text(name)
    except OSError:
        pass  # no /proc (not Linux): only the name is lost


def _lead_reference(request: ServerRequest) -> None:
    """Lead one reference's process: its own session (the driver ends it with one killpg), and its exit code
    written when it has ended (`REFERENCE_ENDED`: the driver's account of one that died without an answer)."""
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _name_process(REFERENCE_PROCESS_NAME)  # its child inherits the name
    workdir = Path(request["workdir"])
    pid = os.fork()
    if pid == 0:
        _serve_references(workdir, request["driver_pid"])
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    write_text_atomically(workdir / REFERENCE_ENDED, json.dumps({"exit_code": code}))
    os._exit(0)


def _serve_references(workdir: Path, driver_pid: int) -> None:
    """The reference process's work in a child of the server: `request-<n>.json` answered in `answer-<n>.json`, one
    after another, until `REFERENCE_CLOSE` appears or the driver (or its work folder) has gone. Nothing of a rank
    reaches it (no distributed variables; the server never initialises a process group, and `compute_reference`
    refuses one)."""
    code = 1
    try:
        for name in DISTRIBUTED_VARIABLES:
            os.environ.pop(name, None)
        log = open(workdir / "reference.log", "a", buffering=1)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        # torch behind it, which the driver's process must not import before it starts this server (TYPE_CHECKING
        # above); imported here, inside the try and after the redirect, a failed import ends in the reference's log
        from suites.reference import unsharded

        worker.run_startup_fault_hook("reference")
        asked = 0
        while True:
            request = workdir / f"request-{asked}.json"
            while not request.exists():
                if (workdir / REFERENCE_CLOSE).exists() or not workdir.exists() or not pid_alive(driver_pid):
                    code = 0
                    return
                time.sleep(REFERENCE_POLL_S)
            answer = unsharded.answer(unsharded.request_from_json(json.loads(request.read_text())))
            write_text_atomically(workdir / f"answer-{asked}.json", json.dumps(answer))
            asked += 1
    except BaseException:  # noqa: BLE001 - logged; the driver answers with the exit code
        traceback.print_exc()
    finally:
        os._exit(code)


PR_SET_CHILD_SUBREAPER = 36
"""prctl's option (linux/prctl.h) that makes a process the reaper of its orphaned descendants."""


def _adopt_orphaned_ranks() -> None:
    """Make the server the reaper of the ranks a killed group leaves (the driver kills a leader with its ranks, so
    they outlive it by an instant): reaped here, their CPU time reaches the driver's rusage instead of init's."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the orphans' CPU goes uncounted, nothing else changes


def _reap_ended(_signal: int, _frame: object) -> None:
    """Reap every ended child (leaders, adopted ranks) with waitpid: an ignored SIGCHLD would reap them too, but
    the kernel then drops their CPU time, which the atlas's slices measure through the driver's children's rusage."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(log_dir: Path) -> None:
    try:
        worker.run_startup_fault_hook("server")
        worker.import_cell_machinery()
    except Exception as error:
        write_text_atomically(
            log_dir / SERVER_DIED, json.dumps(write_record(death_record(error, "the fork server's imports")))
        )
        raise
    gc.collect()
    gc.freeze()  # forked ranks then share these pages instead of copying them on the first collection
    _adopt_orphaned_ranks()
    signal.signal(signal.SIGCHLD, _reap_ended)  # no zombies to mistake for live groups, and their CPU is counted
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("kind") == PRELOAD_KIND:
            started = time.process_time()
            not_imported = worker.import_modeling_modules(request["model_types"])
            seconds = time.process_time() - started
            print(
                f"imported {len(request['model_types'])} model types' modules in {seconds:.1f} CPU s; not imported: "
                f"{not_imported}",
                flush=True,
            )
            gc.collect()
            gc.freeze()
            continue
        pid = os.fork()
        if pid == 0:
            _lead_reference(request) if request.get("kind") == REFERENCE_KIND else _lead_group(request)
        write_text_atomically(Path(request["workdir"]) / "leader.pid", str(pid))


if __name__ == "__main__":
    serve(Path(sys.argv[1]))

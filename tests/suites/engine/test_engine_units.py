"""Units of the rank-group engine that need no rank group: the JIT build lock, orphaned shared memory."""


def test_a_build_lock_left_by_an_interrupted_build_is_removed_at_once_and_starts_take_turns(tmp_path):
    import subprocess
    import sys

    from suites.engine.rank_group import BUILD_GUARD, jit_build_guard

    left = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    left.parent.mkdir(parents=True)
    left.write_text("")  # as torch leaves it when its build is killed: fresh, but nobody builds
    messages = []
    with jit_build_guard(tmp_path, log=messages.append):
        assert not left.exists() and str(left) in messages[0]
        # Another start (another process) waits while this one holds the guard...
        other = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import fcntl; f = open({str(tmp_path / BUILD_GUARD)!r}, 'w'); "
                "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert other.wait(timeout=30) != 0 and "BlockingIOError" in other.stderr.read()
    # ...and gets it once this one is done.
    assert (
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import fcntl; f = open({str(tmp_path / BUILD_GUARD)!r}, 'w'); "
                "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
            ],
            timeout=30,
        ).returncode
        == 0
    )


def test_orphaned_shared_memory_buffer_is_removed_and_a_mapped_one_kept(tmp_path):
    import mmap
    import os
    import time
    from pathlib import Path

    from suites.engine.rank_group import release_orphaned_shared_memory

    orphan, live = (
        Path("/dev/shm/deepspeed_allreduce_buffer_0_test_1_0"),
        Path("/dev/shm/deepspeed_allreduce_buffer_0_test_2_0"),
    )
    for buffer in (orphan, live):
        buffer.write_bytes(b"\0" * 4096)
        os.utime(buffer, (time.time() - 3600, time.time() - 3600))
    with live.open("r+b") as stream, mmap.mmap(stream.fileno(), 4096):  # a live rank still maps it
        release_orphaned_shared_memory(log=lambda message: None)
        assert not orphan.exists() and live.exists()
    live.unlink()


def test_buffers_another_process_removes_while_the_orphans_are_looked_for_are_skipped(tmp_path):
    """The fault of docs/findings.md (2026-12-06): another process (another run releasing its group's buffers, a
    /dev/shm cleaner) removed a DeepSpeed buffer between the listing and its age, and the starting group raised
    FileNotFoundError in the driver: no record for the cell. A real process here creates and removes 200 old buffers
    over and over while the driver looks for orphans."""
    import subprocess
    import sys
    import time

    from suites.engine.rank_group import release_orphaned_shared_memory

    churn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, pathlib, time\n"
            f"folder = pathlib.Path({str(tmp_path)!r})\n"
            "old = time.time() - 3600\n"
            "while True:\n"
            "    buffers = [folder / f'deepspeed_allreduce_buffer_{n}_0' for n in range(200)]\n"
            "    for buffer in buffers:\n"
            "        buffer.write_bytes(b'')\n"
            "        os.utime(buffer, (old, old))\n"
            "    for buffer in buffers:\n"
            "        buffer.unlink(missing_ok=True)\n",
        ]
    )
    try:
        deadline = time.monotonic() + 5
        looked = 0
        while time.monotonic() < deadline or looked < 50:
            release_orphaned_shared_memory(log=lambda message: None, shared_memory=tmp_path)
            looked += 1
    finally:
        churn.kill()
        churn.wait()


def test_a_job_crosses_to_the_ranks_whole():
    """The job file is the only thing a rank knows of its cell: every field (the variant, tolerance, probe spec,
    meta copy, trained models) reads back as the driver wrote it, and the driver's checkpoint and the meta copy
    are two fields (a merge of dicts once overwrote one with the other)."""
    import json
    from dataclasses import FrozenInstanceError, replace

    import pytest

    from matrix.cells import expand
    from matrix.json_records import read_record, write_record
    from suites.checks.contracts import Job, MetaLoad, TrainedModel
    from suites.checks.inputs import ProbeSpec
    from suites.checks.task_probe import AccuracyTask

    cell = expand("llama", "train", "fp32", "2")[0]
    job = Job(
        cell.id,
        "/ckpt",
        None,
        cell.dtype,
        cell.variant,
        False,
        cell.model.tolerance_for(cell.dtype),
        ProbeSpec(new_tokens=3),
        trained=(TrainedModel("/ckpt", "llama", "/steps-1"), TrainedModel("/other", "opt", "/steps-2")),
        accuracy_task=AccuracyTask("world-facts", "abc"),
        faults=("tests.faults:wrong_gradient",),
        seq=4,
    )
    meta = replace(job, meta=MetaLoad("/ckpt-copy", "/ckpt-copy/ds.json", {"signature": "s", "message": "m"}))
    for sent in (job, meta):
        assert read_record(Job, json.loads(json.dumps(write_record(sent)))) == sent
    assert (meta.checkpoint, meta.loaded_checkpoint, job.loaded_checkpoint) == ("/ckpt", "/ckpt-copy", "/ckpt")
    with pytest.raises(FrozenInstanceError):
        job.checkpoint = "/elsewhere"  # type: ignore[misc]


def _fake_torch(root, cuda: str | None):
    """A `torch` package whose version.py names a CUDA build or none, and whose import says it was imported."""
    package = root / "torch"
    package.mkdir(parents=True)
    (package / "version.py").write_text(f"from typing import Optional\ncuda: Optional[str] = {cuda!r}\nhip = None\n")
    (package / "__init__.py").write_text(
        "import types\nprint('torch imported')\ncuda = types.SimpleNamespace(is_available=lambda: True)\n"
    )


def test_a_cpu_torch_is_told_from_its_version_file_without_importing_it(tmp_path):
    import os
    import subprocess
    import sys

    from matrix import PROJECT_ROOT

    check = "from suites.engine.rank_group import _cuda_available; print(_cuda_available())"
    for cuda, expected in ((None, "False"), ("12.8", "torch imported\nTrue")):
        root = tmp_path / str(cuda)
        _fake_torch(root, cuda)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(PROJECT_ROOT)])}
        answer = subprocess.run(
            [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT
        )
        assert answer.stdout.strip() == expected, answer.stderr


def test_the_driver_starts_its_fork_server_before_importing_torch():
    """conftest.py starts the pool's fork server first in pytest_configure: nothing on that path imports torch, so
    the server's imports run beside the driver's instead of after them."""
    import subprocess
    import sys

    from matrix import PROJECT_ROOT

    check = (
        "import sys, conftest\n"
        "from suites.engine.rank_group import RankGroupPool\n"
        "pool = RankGroupPool(launcher='fork')\n"
        "print(sorted(name for name in ('torch', 'transformers', 'deepspeed') if name in sys.modules))\n"
    )
    answer = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT
    )
    assert answer.stdout.strip() == "[]", answer.stderr


def test_the_fork_server_probes_deepspeeds_ops_once_for_every_rank_it_forks():
    """DeepSpeed >= 0.19.8 probes its ops (compiling test programs) on first access; done by the server's imports,
    a forked rank finds the answer in its module instead of compiling again in init_distributed."""
    import deepspeed.ops

    from suites.engine.worker import import_cell_machinery

    import_cell_machinery()
    assert "__compatible_ops__" in vars(deepspeed.ops)


def test_a_ring_wakes_its_listener_at_once_and_a_pipe_nobody_reads_is_rung_silently(tmp_path):
    """The doorbells that replaced the 20 ms polls: a wait returns as soon as another process rings (not at its
    timeout), takes every pending ring, and ringing a pipe whose listener is gone (a dead rank, an ended driver)
    neither blocks nor raises."""
    import subprocess
    import sys
    import time

    from matrix import PROJECT_ROOT
    from suites.engine import doorbells

    pipe = tmp_path / "events"
    doorbells.make(pipe)
    listener = doorbells.Listener(pipe)
    started = time.monotonic()
    listener.wait(0.05)
    assert time.monotonic() - started >= 0.05  # nobody rang: the fallback interval
    rings_twice = (
        "import pathlib; from suites.engine import doorbells\n"
        f"doorbells.ring(pathlib.Path({str(pipe)!r})); doorbells.ring(pathlib.Path({str(pipe)!r}))"
    )
    ringer = subprocess.Popen([sys.executable, "-c", rings_twice], cwd=PROJECT_ROOT)
    started = time.monotonic()
    listener.wait(60)
    assert time.monotonic() - started < 30  # woken by the ring, not by the 60 s timeout
    assert ringer.wait(timeout=60) == 0
    listener.wait(0)  # the second ring, had it come after the first wait returned
    started = time.monotonic()
    listener.wait(0.05)
    assert time.monotonic() - started >= 0.05  # every ring taken: the next wait waits
    listener.close()
    doorbells.ring(pipe)  # nobody listens any more
    doorbells.ring(tmp_path / "never-made")


SETTLE_THEN_FORK = """
import os, sys, time
import torch
from suites.base.elementwise_math import settle_elementwise_math

settle_elementwise_math()
pid = os.fork()
if pid == 0:
    torch.tanh(torch.ones(1 << 20))  # a parallel region: it hangs where the parent had started OpenMP's pool
    os._exit(0)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if os.waitpid(pid, os.WNOHANG)[0]:
        print("child finished")
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    print("child hung")
"""


def test_settling_the_elementwise_math_starts_no_thread_pool_a_forked_child_would_hang_on():
    """The fork server settles the math functions before it forks (suites/base/elementwise_math.py); a call
    that started OpenMP's thread pool there (the exact gelu's float32 kernel does, even for 64 values) would hang
    every rank and reference child at its first parallel region."""
    import os
    import subprocess
    import sys

    from matrix import PROJECT_ROOT

    done = subprocess.run(
        [sys.executable, "-c", SETTLE_THEN_FORK],
        cwd=PROJECT_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip().splitlines()[-1:] == ["child finished"], done.stdout + done.stderr


def test_rank_0_reads_the_cells_reference_once_and_only_where_a_check_runs(tmp_path, monkeypatch):
    """The checks and, on a numerics failure, the search for the module where it diverged both read the reference:
    one read a cell (the second was ~3 ms of rank 0's CPU while the verdict waits), none where a rank raised."""
    from dataclasses import replace
    from types import SimpleNamespace

    import torch

    from matrix.json_records import write_record
    from suites.engine import cell_runner
    from suites.reference import unsharded
    from suites.verdicts.outcome import RankError
    from tests.suites.checks.test_check_units import _observations
    from tests.suites.rank_summaries import inference_rank
    from tests.suites.suites_testkit import never_loaded_job

    outputs = {"model.layers.0": ((1, 24, 16), torch.ones(16))}
    reference = _observations(module_outputs=outputs)
    path = tmp_path / "reference.pt"
    torch.save(write_record(reference), path)
    job = replace(never_loaded_job()[1], reference=str(path))
    reads = []
    monkeypatch.setattr(unsharded, "load_reference", lambda read: reads.append(read) or reference)
    before = SimpleNamespace(classes={})  # the modules' classes: no module diverges, so none is looked up

    def verdict(observed, summaries):
        reads.clear()
        return cell_runner._verdict(job, observed, summaries, {}, None, None, before)

    summaries = [inference_rank(rank, reference) for rank in range(2)]
    wrong = _observations(module_outputs=outputs, logits_plain=_observations().logits_plain + 1.0)
    failing = verdict(wrong, summaries)
    assert (failing.outcome, failing.failure_class) == ("fail", "numerics") and reads == [str(path)]
    assert verdict(_observations(module_outputs=outputs), summaries).failure_class == "memory" and len(reads) == 1
    raised = RankError(1, "forward", "forward", "RuntimeError: injected", "rank 1 raised")
    assert verdict(None, [summaries[0], replace(summaries[1], error=raised)]).failure_class == "forward"
    assert reads == []

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


def test_a_job_crosses_to_the_ranks_whole():
    """The job file is the only thing a rank knows of its cell: every field (the variant, tolerance, probe spec,
    meta copy, trained models) reads back as the driver wrote it, and the driver's checkpoint and the meta copy
    are two fields (a merge of dicts once overwrote one with the other)."""
    from dataclasses import FrozenInstanceError, replace

    import pytest

    from matrix.cells import expand
    from suites.checks.inputs import ProbeSpec
    from suites.checks.task_probe import AccuracyTask
    from suites.contracts import Job, MetaLoad, TrainedModel

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
        assert Job.from_json(sent.to_json()) == sent
    assert (meta.checkpoint, meta.loaded_checkpoint, job.loaded_checkpoint) == ("/ckpt", "/ckpt-copy", "/ckpt")
    with pytest.raises(FrozenInstanceError):
        job.checkpoint = "/elsewhere"  # type: ignore[misc]

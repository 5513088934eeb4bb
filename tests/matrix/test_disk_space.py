"""Free disk space (matrix/disk_space.py): a run stops before its first cell where the cache's or the results' disk is
short, saying where, how much and what to do; a write a full disk refused is said as "disk full at <path>". A small
free space is faked through shutil.disk_usage (or a need larger than any disk, AUTOTP_MIN_FREE), the kernel's
/dev/full gives a real ENOSPC: the real disk is never filled."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import namedtuple

import pytest

from matrix import PROJECT_ROOT
from matrix.disk_space import DiskSpaceError, Need, disk_full_at, disk_full_line, require_free_space, run_needs

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("AUTOTP_CACHE", str(root))
    monkeypatch.delenv("AUTOTP_MIN_FREE", raising=False)
    return root


def test_a_disk_with_less_free_than_the_run_needs_stops_it_naming_path_bytes_and_what_to_do(
    cache, tmp_path, monkeypatch
):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 22_000_000, 22_000_000))
    with pytest.raises(DiskSpaceError) as short:
        require_free_space(run_needs(tmp_path / "results"))
    said = str(short.value)
    assert f"only 21.0 MiB (22000000 bytes) free at {cache} (the harness cache, AUTOTP_CACHE)" in said
    assert f"{tmp_path / 'results'} (the results folder)" in said  # one disk here: the needs add up
    assert "this run needs 3.2 GiB (3489660928 bytes)" in said
    assert "nox -s cache -- --prune --limit 2G" in said and "set AUTOTP_CACHE" in said


def test_enough_free_space_lets_the_run_start_and_the_need_is_an_option(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, 4 * 2**30))
    require_free_space(run_needs(tmp_path / "results"))
    monkeypatch.setenv("AUTOTP_MIN_FREE", "5G")
    with pytest.raises(DiskSpaceError, match="AUTOTP_MIN_FREE sets what a run needs free in the cache"):
        require_free_space(run_needs(tmp_path / "results"))
    monkeypatch.setenv("AUTOTP_MIN_FREE", "much")
    with pytest.raises(DiskSpaceError, match="AUTOTP_MIN_FREE='much' is not a size"):
        run_needs(tmp_path / "results")


def test_results_inside_the_evictable_cache_are_refused(cache):
    with pytest.raises(DiskSpaceError, match="is inside the harness cache .* put it elsewhere"):
        require_free_space([Need(cache / "results", "the results folder", 1)])


def test_a_run_of_the_suites_on_a_short_disk_stops_before_any_cell(cache, tmp_path):
    """The driver's own check (conftest.py): a need no disk has stops the run at once, exit 4, nothing recorded."""
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--models", "llama", "--tp", "2", "--results", str(results)],
        cwd=PROJECT_ROOT,
        env={**os.environ, "AUTOTP_CACHE": str(cache), "AUTOTP_MIN_FREE": "1000000T"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "not enough disk space to start: only" in done.stderr and f"free at {cache}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (results / "cells.jsonl").exists()


def test_a_write_the_full_disk_refused_is_named_as_disk_full_at_its_path(tmp_path):
    with pytest.raises(OSError) as refused:
        with open("/dev/full", "w") as full:  # the kernel answers every write with ENOSPC
            full.write("x" * 10_000)
            full.flush()
    assert refused.value.errno == errno.ENOSPC
    refused.value.filename = str(tmp_path / "references" / "a.pt")
    assert disk_full_at(refused.value) == str(tmp_path / "references" / "a.pt")
    wrapped = RuntimeError("the reference process failed")
    wrapped.__cause__ = refused.value
    assert disk_full_at(wrapped) == str(tmp_path / "references" / "a.pt")
    told = RuntimeError(f"Traceback ...\nOSError: [Errno 28] No space left on device: '{tmp_path}/tiny/x'")
    assert disk_full_at(told) == f"{tmp_path}/tiny/x"
    assert disk_full_at(sqlite3.OperationalError("database or disk is full")) == ""
    assert disk_full_at(OSError(errno.EACCES, "denied")) is None
    line = disk_full_line(str(tmp_path), "rerun the cell")
    assert line.startswith(f"disk full at {tmp_path} (") and " free): prune the harness cache" in line
    assert line.endswith("then rerun the cell")


def torch_refused_write() -> RuntimeError:
    """What torch.save raises when the kernel refuses its writes (/dev/full: ENOSPC on every write): its C++ stream
    writer's words, with no errno and no path."""
    import torch  # lazily: only this test needs torch, the others run without importing it

    try:
        torch.save({"w": torch.zeros(100_000)}, "/dev/full")
    except RuntimeError as error:
        return error
    raise AssertionError("torch.save wrote to /dev/full: the fault this test needs is gone")


@pytest.mark.parametrize(
    "refused",
    [
        torch_refused_write,
        lambda: RuntimeError(
            "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: file write "
            "failed"
        ),
    ],
    ids=["torch-on-dev-full", "file-write-failed"],
)
def test_torchs_refused_write_is_a_full_disk_only_when_the_disk_is_short(cache, monkeypatch, refused):
    from suites.verdicts.outcome import what_happened  # lazily: the suites' words for the harness's own failures

    error = refused()
    assert "No space left" not in str(error) and not isinstance(error, OSError)  # nothing but torch's words
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, 100 * 2**30))
    assert disk_full_at(error) is None  # 100 GiB free: another cause, not said to be a full disk
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 22_000_000, 22_000_000))
    assert disk_full_at(error) == ""
    assert what_happened(error).startswith(f"disk full at {cache} (21.0 MiB free): prune the harness cache")

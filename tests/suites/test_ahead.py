"""Tiny checkpoints written ahead (suites/ahead.py): on an empty cache, while a cell's reference computes in the fork
server, a thread of the driver writes the next checkpoints the run's cells load, in their order; each is written once,
byte for byte the one the driver would write, the thread has stopped before the cell's ranks start, and a checkpoint
it cannot write is left to its cell."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from matrix import cache_root, checkpoints
from matrix.cells import expand
from matrix.registry import ModelEntry
from suites import ahead
from suites.ahead import CheckpointsAhead
from suites.contracts import Job
from suites.driver import RunOptions, checkpoints_ahead, run_cell
from suites.engine.rank_group import RankGroupPool
from suites.outcome import CellOutcome

pytestmark = pytest.mark.autotp

CELLS = expand("llama,qwen2,mistral", "eager", "fp32", "2,3")
"""Three models, tp 2 then tp 3: each model's checkpoint is loaded by its tp-2 cell first."""
WRITER = ahead.WRITER_NAME


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[tuple[str, str]]]:
    """(model, thread) of every tiny checkpoint written, on an empty cache."""
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(checkpoints, "_HASHED", {})
    written: list[tuple[str, str]] = []
    write = checkpoints._write_tiny

    def recorded(entry: ModelEntry, folder: Path) -> None:
        write(entry, folder)
        written.append((entry.name, threading.current_thread().name))

    monkeypatch.setattr(checkpoints, "_write_tiny", recorded)
    yield written


def test_the_next_checkpoints_are_written_while_a_reference_computes(
    writes: list[tuple[str, str]], rank_pool: RankGroupPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing_ahead = checkpoints_ahead(CELLS, RunOptions())
    assert writing_ahead is not None and writing_ahead.waiting == 3
    writer_alive_at_ranks: list[bool] = []
    run = rank_pool.run

    def run_group(tp: int, job: Job, timeout: float) -> CellOutcome:
        writer_alive_at_ranks.append(any(thread.name == WRITER for thread in threading.enumerate()))
        return run(tp, job, timeout)

    monkeypatch.setattr(rank_pool, "run", run_group)
    outcomes = [run_cell(cell, rank_pool, RunOptions(), writing_ahead) for cell in CELLS]
    assert not [outcome.message for outcome in outcomes if outcome.failure_class == "setup"]
    # The first model's checkpoint is its cell's own; the next two were written while a reference computed.
    first, second, third = (cell.model.name for cell in CELLS[:3])
    assert writes == [(first, "MainThread"), (second, WRITER), (third, WRITER)]
    assert writer_alive_at_ranks == [False] * len(CELLS)  # the ranks never run beside the thread
    assert writing_ahead.waiting == 0
    # The first reference, computed while the thread wrote, left it a core; the last, with nothing left to write, not.
    sidecars = sorted((cache_root() / "references").glob("*.json"), key=lambda path: path.stat().st_mtime_ns)
    threads = [json.loads(path.read_text())["threads"] for path in sidecars]
    assert len(threads) == 3 and threads[0] == max(1, len(os.sched_getaffinity(0)) - 1), threads
    assert threads[-1] == torch.get_num_threads(), threads


def test_a_checkpoint_written_ahead_is_the_one_its_cell_would_write(
    writes: list[tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = CELLS[1].model  # qwen2
    with CheckpointsAhead([entry]).written_meanwhile():
        _until(lambda: len(writes) == 1)
    assert writes == [(entry.name, WRITER)]
    ahead_manifest = (checkpoints.tiny_folder(entry) / checkpoints.MANIFEST).read_text()
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "other-cache"))
    assert (checkpoints.tiny_checkpoint(entry) / checkpoints.MANIFEST).read_text() == ahead_manifest  # same hashes
    assert writes[1] == (entry.name, "MainThread")


def test_a_checkpoint_that_cannot_be_written_ahead_is_left_to_its_cell(writes: list[tuple[str, str]]) -> None:
    llama, qwen2 = CELLS[0].model, CELLS[1].model
    broken = replace(llama, name="llama.broken", tiny={**llama.tiny, "hidden_act": "no_such_activation"})
    with CheckpointsAhead([broken, qwen2]).written_meanwhile():
        _until(lambda: len(writes) == 1)
    assert writes == [(qwen2.name, WRITER)]  # the broken one raised in the thread; the next one was written
    assert checkpoints.cached_tiny_checkpoint(broken) is None
    with pytest.raises(KeyError, match="no_such_activation"):  # its cell writes it and gets the error (`setup`)
        checkpoints.tiny_checkpoint(broken)


def test_the_thread_stops_with_the_wait_having_finished_the_checkpoint_it_writes(
    writes: list[tuple[str, str]],
) -> None:
    entries = [cell.model for cell in CELLS if cell.tp == 2]
    writing_ahead = CheckpointsAhead(entries)
    with writing_ahead.written_meanwhile():
        pass  # a reference already cached: the wait ends at once
    assert not [thread for thread in threading.enumerate() if thread.name == WRITER]
    assert len(writes) <= 1
    assert all(checkpoints.cached_tiny_checkpoint(entry) is not None for entry in entries[: len(writes)])


def _until(condition: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)

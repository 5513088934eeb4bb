"""A cold run's work done ahead (suites/run/ahead.py): on an empty cache, when the first cell asks for a reference, its
checkpoints and references are done together, one worker per core; each checkpoint is written once, byte for byte
the one the driver would write; each cell is prepared once; no worker runs beside a rank group; and what the work
ahead cannot do is left to its cell, which does it again and reports it."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from suites_testkit import live_processes_named

from matrix import cache_root, checkpoints
from matrix.cells import Cell, expand
from matrix.registry import ModelEntry
from suites.checks.contracts import Job
from suites.engine.fork_server import REFERENCE_PROCESS_NAME
from suites.engine.rank_group import RankGroupPool
from suites.reference.cache import ComputesReferences
from suites.reference.memory_plan import Runner
from suites.reference.unsharded import Answer, ObservationsRequest, ReferenceRequest
from suites.run import ahead, driver
from suites.run.ahead import RunAhead
from suites.run.driver import RunOptions, run_ahead, run_cell
from suites.run.prepared import PreparedCell
from suites.verdicts.outcome import CellOutcome

pytestmark = pytest.mark.autotp

CELLS = expand("llama,qwen2,mistral", "eager", "fp32", "2,3")
"""Three models, tp 2 then tp 3: each model's checkpoint is loaded by its tp-2 cell first."""
CORES = len(os.sched_getaffinity(0))


def _ahead_thread() -> bool:
    return threading.current_thread().name.startswith(ahead.WORKER_NAME)


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


class CountingForker:
    """Counts how many references the pool's fork server computes at once (each in a series of its own, or many in
    one: `reference_series`, which this replaces on the server, `counting`). `hold_first`:
    the first reference starts only once a second one has (or after a minute), so a batch that computed one at a
    time fails the count however fast the first one is. `dies_ahead`: every reference a worker ahead asks for after
    the first dies instead (as if its process was killed)."""

    def __init__(self, series: Callable[[], AbstractContextManager[ComputesReferences]], **options: bool) -> None:
        self.series = series
        self.hold_first, self.dies_ahead = options.get("hold_first", False), options.get("dies_ahead", False)
        self.running = self.most = self.died = 0
        self.asked: list[str] = []
        self.changed = threading.Condition()

    @contextmanager
    def reference_series(self) -> Iterator[ComputesReferences]:
        with self.series() as series:
            yield CountedSeries(self, series)

    def counted(self, request: ReferenceRequest, computes: ComputesReferences) -> Answer | None:
        with self.changed:
            self.asked.append(request.path)
            first = len(self.asked) == 1
            if self.dies_ahead and _ahead_thread() and not first:
                self.died += 1
                return {"died": -9, "log": os.devnull}
            self.running += 1
            self.most = max(self.most, self.running)
            self.changed.notify_all()
            if first and self.hold_first:
                self.changed.wait_for(lambda: self.running > 1, timeout=60)
        try:
            return computes.compute_reference(request)
        finally:
            with self.changed:
                self.running -= 1


@dataclass(frozen=True)
class CountedSeries:
    counter: CountingForker
    series: ComputesReferences

    def compute_reference(self, request: ReferenceRequest) -> Answer | None:
        return self.counter.counted(request, self.series)


def counting(rank_pool: RankGroupPool, monkeypatch: pytest.MonkeyPatch, **options: bool) -> CountingForker:
    server = rank_pool.fork_server
    assert server is not None
    counter = CountingForker(server.reference_series, **options)
    monkeypatch.setattr(server, "reference_series", counter.reference_series)
    return counter


@dataclass
class Seen:
    """What the cells did, seen from the ranks' side and the driver's."""

    workers_at_ranks: list[bool] = field(default_factory=list)
    """Whether a worker ahead was alive, each time a rank group ran."""
    reference_processes_at_ranks: list[int] = field(default_factory=list)
    """The reference processes alive then."""
    references_at_ranks: list[int] = field(default_factory=list)
    """How many reference files there were then."""
    prepared: Counter[str] = field(default_factory=Counter)
    """How often each cell was prepared."""


@pytest.fixture
def counted(rank_pool: RankGroupPool, monkeypatch: pytest.MonkeyPatch) -> Iterator[Seen]:
    seen = Seen()
    run, prepare = rank_pool.run, driver.prepare_cell

    def run_group(tp: int, job: Job, timeout: float) -> CellOutcome:
        seen.workers_at_ranks.append(any(thread.name.startswith(ahead.WORKER_NAME) for thread in threading.enumerate()))
        seen.reference_processes_at_ranks += live_processes_named(REFERENCE_PROCESS_NAME)
        seen.references_at_ranks.append(len(list((cache_root() / "references").glob("*.pt"))))
        return run(tp, job, timeout)

    def prepared(cell: Cell, options: RunOptions, runner: Runner) -> PreparedCell:
        seen.prepared.update([cell.id])
        return prepare(cell, options, runner)

    monkeypatch.setattr(rank_pool, "run", run_group)
    monkeypatch.setattr(driver, "prepare_cell", prepared)
    yield seen


def _sidecar_threads() -> list[int]:
    sidecars = sorted((cache_root() / "references").glob("*.json"), key=lambda path: path.stat().st_mtime_ns)
    return [json.loads(path.read_text())["threads"] for path in sidecars]


def test_the_first_reference_brings_the_runs_checkpoints_and_references_before_any_ranks(
    writes: list[tuple[str, str]],
    rank_pool: RankGroupPool,
    counted: Seen,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forker = counting(rank_pool, monkeypatch, hold_first=True)
    run_ahead_ = run_ahead(CELLS, RunOptions())
    assert run_ahead_ is not None and run_ahead_.pending
    outcomes = [run_cell(cell, rank_pool, RunOptions(), run_ahead_) for cell in CELLS]
    assert not [outcome.message for outcome in outcomes if outcome.failure_class == "setup"]
    # The first model's checkpoint is its cell's own; the next two were written by the workers ahead.
    first, second, third = (cell.model.name for cell in CELLS[:3])
    assert [model for model, _ in writes] == [first, second, third]
    assert writes[0][1] == "MainThread" and all(name.startswith(ahead.WORKER_NAME) for _, name in writes[1:]), writes
    # Every reference was there before the first ranks ran; no worker, nor a reference's process, was alive when any
    # ranks ran.
    assert counted.references_at_ranks == [3] * len(CELLS)
    assert counted.workers_at_ranks == [False] * len(CELLS)
    assert counted.reference_processes_at_ranks == []
    # Each cell prepared once: the two later tp-2 cells by the workers, handed to their turns; the rest in turn.
    assert counted.prepared == Counter(cell.id for cell in CELLS), counted.prepared
    # Computed one per core at once, each on one thread.
    assert _sidecar_threads() == [1, 1, 1]
    assert min(CORES, 2) <= forker.most <= CORES, forker.most


def test_a_reference_the_work_ahead_loses_is_computed_by_its_cell(
    writes: list[tuple[str, str]],
    rank_pool: RankGroupPool,
    counted: Seen,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forker = counting(rank_pool, monkeypatch, dies_ahead=True)
    cells = [cell for cell in CELLS if cell.tp == 2]
    run_ahead_ = run_ahead(cells, RunOptions())
    outcomes = [run_cell(cell, rank_pool, RunOptions(), run_ahead_) for cell in cells]
    assert [outcome.outcome for outcome in outcomes] == ["pass"] * 3, [outcome.message for outcome in outcomes]
    # The first cell's reference was computed ahead (one thread); the two the workers lost were computed by their
    # cells' turns, each asked once more, with the process's own threads; each cell still prepared once.
    assert forker.died == 2 and len(forker.asked) == 5 and forker.asked[1:3] == forker.asked[3:], forker.asked
    assert len(_sidecar_threads()) == 3 and _sidecar_threads()[0] == 1
    assert counted.references_at_ranks == [1, 2, 3]
    assert counted.prepared == Counter(cell.id for cell in cells)


@dataclass(frozen=True)
class Preparing:
    """The driver's `CellWork`, without a rank pool (these tests compute no reference)."""

    def runner(self) -> Runner:
        return Runner.detect()

    def prepare(self, cell: Cell, runner: Runner) -> PreparedCell:
        return driver.prepare_cell(cell, RunOptions(), runner)

    def reference_request(self, prepared: PreparedCell) -> ObservationsRequest:
        return driver.plain_reference_request(prepared, RunOptions())


class Answering:
    """A forker that answers every request at once without computing it."""

    def __init__(self) -> None:
        self.asked: list[ReferenceRequest] = []

    def reference_series(self) -> AbstractContextManager[ComputesReferences]:
        return nullcontext(self)

    def compute_reference(self, request: ReferenceRequest) -> Answer | None:
        self.asked.append(request)
        return {"path": request.path}


def _work_ahead(cells: list[Cell]) -> tuple[RunAhead, Answering]:
    """The work ahead of `cells`, run as the first asks for its reference (its checkpoint written by its turn)."""
    first = driver.prepare_cell(cells[0], RunOptions(), Runner.detect())
    run_ahead_ = RunAhead(cells, [True] * len(cells))
    assert run_ahead_.take(cells[0]) is None
    forker = Answering()
    answer = run_ahead_.compute_with(driver.plain_reference_request(first, RunOptions()), forker, Preparing())
    assert answer is not None and forker.asked[0].threads == 1
    return run_ahead_, forker


def test_a_checkpoint_written_ahead_is_the_one_its_cell_would_write(
    writes: list[tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama, qwen2 = CELLS[0], CELLS[1]
    run_ahead_, forker = _work_ahead([llama, qwen2])
    assert [model for model, _ in writes] == [llama.model.name, qwen2.model.name] and _ahead_thread() is False
    assert writes[1][1].startswith(ahead.WORKER_NAME)
    assert len(forker.asked) == 2  # the first cell's reference, then qwen2's
    prepared = run_ahead_.take(qwen2)  # handed to its turn, once
    assert prepared is not None and prepared.checkpoint.folder == str(checkpoints.tiny_folder(qwen2.model))
    assert run_ahead_.take(qwen2) is None
    ahead_manifest = (checkpoints.tiny_folder(qwen2.model) / checkpoints.MANIFEST).read_text()
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "other-cache"))
    assert (checkpoints.tiny_checkpoint(qwen2.model) / checkpoints.MANIFEST).read_text() == ahead_manifest
    assert writes[2] == (qwen2.model.name, "MainThread")


def test_a_checkpoint_that_cannot_be_written_ahead_is_left_to_its_cell(writes: list[tuple[str, str]]) -> None:
    llama, qwen2 = CELLS[0], CELLS[1]
    broken_entry = replace(llama.model, name="llama.broken", tiny={**llama.model.tiny, "hidden_act": "no_such"})
    broken = replace(llama, model=broken_entry)
    run_ahead_, forker = _work_ahead([llama, broken, qwen2])
    assert [model for model, _ in writes] == [llama.model.name, qwen2.model.name]  # the broken one raised
    assert run_ahead_.take(broken) is None  # not prepared: its turn prepares it
    assert len(forker.asked) == 2
    assert checkpoints.cached_tiny_checkpoint(broken_entry) is None
    with pytest.raises(KeyError, match="no_such"):  # its cell writes it and gets the error (`setup`)
        checkpoints.tiny_checkpoint(broken_entry)


def test_a_harness_error_in_the_work_ahead_fails_the_asking_cell_as_setup(
    writes: list[tuple[str, str]], rank_pool: RankGroupPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of the work itself (outside a task) ends its worker: the others stop instead of waiting for it, and the
    cell that asked fails as `setup` with it."""

    def broken(self: object, task: object) -> None:
        raise RuntimeError("the work ahead broke")

    monkeypatch.setattr(ahead._Batch, "_finished", broken)
    cells = [cell for cell in CELLS if cell.tp == 2]
    outcomes: list[CellOutcome] = []
    asking = threading.Thread(
        target=lambda: outcomes.append(run_cell(cells[0], rank_pool, RunOptions(), run_ahead(cells, RunOptions())))
    )
    asking.start()
    asking.join(timeout=300)
    assert not asking.is_alive(), "the work ahead hung"
    assert outcomes[0].failure_class == "setup", outcomes[0].message
    assert outcomes[0].signature.startswith("RuntimeError: the work ahead broke"), outcomes[0].signature


def test_a_reference_that_needs_the_machine_to_itself_is_left_to_its_cell(writes: list[tuple[str, str]]) -> None:
    """Computed ahead, references run one per core at once: one whose plan does not fit that many times beside the
    rank group is left to its cell's turn (which computes it alone)."""
    llama, qwen2 = CELLS[0], CELLS[1]
    reference_bytes = driver.prepare_cell(qwen2, RunOptions(), Runner.detect()).plan.reference.host_bytes
    host = 1 << 40
    tight = Runner(host, "test", "cpu", (), live_group_bytes=host - (reference_bytes * CORES - 1))

    @dataclass(frozen=True)
    class Tight(Preparing):
        def runner(self) -> Runner:
            return tight

    first = driver.prepare_cell(llama, RunOptions(), Runner.detect())
    run_ahead_, forker = RunAhead([llama, qwen2], [True, True]), Answering()
    run_ahead_.take(llama)
    run_ahead_.compute_with(driver.plain_reference_request(first, RunOptions()), forker, Tight())
    prepared = run_ahead_.take(qwen2)
    assert prepared is not None and prepared.skip is None  # prepared, and it runs
    assert [request.path for request in forker.asked] == [driver.plain_reference_request(first, RunOptions()).path]

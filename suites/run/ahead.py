"""A cold run's work done ahead of its cells: the tiny checkpoints they load and the unsharded references they compare
with, all at once when the first cell needs a reference.

On an empty cache each model's first cell used to write its tiny checkpoint, then wait while its reference computed
in a process forked for it alone, then run its ranks. A fork per reference cost 37 % more CPU than the same references
computed one after another in one process (the fork, first-call costs and copy-on-write each time; docs/findings.md).
`RunAhead` does the run's cold work together instead, when the first cell asks for a reference: one worker per core
takes the next task in cell order, a reference whose checkpoint is written (in the worker's one reference process,
suites/engine/fork_server.py `ReferenceSeries`, on one thread) or else the next checkpoint. The driver waits for all
of it, so nothing of it runs beside a rank group, whose busy-waiting all-reduce a third process slows out of
proportion. A harness error in the work itself is raised to the cell that asked, whose setup it fails.

Each cell the batch prepared (suites/run/prepared.py `PreparedCell`, to ask for its reference) is handed to its cell, so
a cell is still prepared once. What the batch cannot do (a checkpoint that does not write, a reference that fails,
a cell planned to offload) is left to its cell, which does it again and reports it as it always did.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from matrix.checkpoints import cached_tiny_checkpoint, tiny_checkpoint, tiny_folder
from matrix.registry import ModelEntry

if TYPE_CHECKING:
    from matrix.cells import Cell
    from suites.reference.cache import ComputesReferences, ReferenceForker
    from suites.reference.memory_plan import Runner
    from suites.reference.unsharded import Answer, ObservationsRequest, ReferenceRequest
    from suites.run.prepared import PreparedCell

WORKER_NAME = "autotp-ahead"
"""The workers' thread names start with it."""


class CellWork(Protocol):
    """What the batch asks of the driver (suites/run/driver.py), which knows how a cell is prepared and what it asks."""

    def runner(self) -> Runner:
        """What the cells the batch prepares are planned against (detected once, when the batch starts)."""
        ...

    def prepare(self, cell: Cell, runner: Runner) -> PreparedCell:
        """The cell prepared, as its own turn would prepare it (suites/run/driver.py `prepare_cell`)."""
        ...

    def reference_request(self, prepared: PreparedCell) -> ObservationsRequest:
        """The plain reference the prepared cell compares with, as its own turn would ask for it."""
        ...


@dataclass(frozen=True, eq=False)
class _Task:
    """One piece of the batch: a checkpoint to write (`entry` alone), or a reference: a later cell's (`entry` and
    `cell`), or the one the driver asked for (`request` alone, its checkpoint written)."""

    entry: ModelEntry | None = None
    cell: Cell | None = None
    request: ReferenceRequest | None = None

    @property
    def writes(self) -> bool:
        return self.cell is None and self.request is None


class RunAhead:
    """The run's cells that run, in order: their tiny checkpoints, and the plain references of those for which
    `computes_reference` (no training, no quantization: those compute references of their own)."""

    def __init__(self, cells: Iterable[Cell], computes_reference: Iterable[bool]) -> None:
        self._cells = [(cell, computes) for cell, computes in zip(cells, computes_reference, strict=True)]
        self._taken: set[str] = set()
        self._prepared: dict[str, PreparedCell] = {}
        self._done = False

    @property
    def pending(self) -> bool:
        """The batch has not run yet (it runs once, at the first reference a cell asks for)."""
        return not self._done

    def take(self, cell: Cell) -> PreparedCell | None:
        """The cell as the batch prepared it (None: its turn prepares it); from now on the cell is its turn's."""
        self._taken.add(cell.id)
        return self._prepared.pop(cell.id, None)

    def compute_with(self, request: ReferenceRequest, forker: ReferenceForker, work: CellWork) -> Answer | None:
        """`request`'s answer (`ReferenceForker.compute_reference`), computed first among the run's cold work: every
        checkpoint and plain reference of the cells after it, one worker per core."""
        self._done = True
        first = _Task(request=request)
        batch = _Batch(first, [cell for cell, computes in self._cells if computes and cell.id not in self._taken])
        batch.run(self._entries(), forker, work)
        self._prepared.update(batch.prepared)
        for error in (batch.worker_error, batch.first_error):
            if error is not None:
                raise error
        return batch.first_answer

    def _entries(self) -> list[ModelEntry]:
        """The run's tiny checkpoints in the order its cells load them, each once."""
        in_order: dict[Path, ModelEntry] = {}
        for cell, _ in self._cells:
            in_order.setdefault(tiny_folder(cell.model), cell.model)
        return list(in_order.values())


class _Batch:
    """The tasks and the workers that take them."""

    def __init__(self, first: _Task, cells: list[Cell]) -> None:
        self.references = deque([first, *(_Task(entry=cell.model, cell=cell) for cell in cells)])
        self.writes: deque[_Task] = deque()
        self.unwritten: set[Path] = set()
        self.asked = {first.request.path} if first.request is not None else set()
        """The cache files of the references asked for so far (later cells share one: tp 2, 3 and 4 of a model)."""
        self.prepared: dict[str, PreparedCell] = {}
        self.first_answer: Answer | None = None
        self.first_error: Exception | None = None
        self.worker_error: Exception | None = None
        """What ended a worker outside its tasks (a harness bug): the others stop, and the cell that asked fails with
        it as `setup`."""
        self.changed = threading.Condition()

    def run(self, entries: list[ModelEntry], forker: ReferenceForker, work: CellWork) -> None:
        unwritten = [entry for entry in entries if cached_tiny_checkpoint(entry) is None]
        self.writes = deque(_Task(entry=entry) for entry in unwritten)
        self.unwritten = {tiny_folder(entry) for entry in unwritten}
        workers = len(os.sched_getaffinity(0))
        runner = work.runner()
        threads = [
            threading.Thread(
                target=self._work, args=(forker, work, runner, workers), name=f"{WORKER_NAME}-{index}", daemon=True
            )
            for index in range(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _work(self, forker: ReferenceForker, work: CellWork, runner: Runner, workers: int) -> None:
        try:
            with forker.reference_series() as references:  # one process for all this worker's references
                while (task := self._next()) is not None:
                    try:
                        if task.writes:
                            assert task.entry is not None
                            if cached_tiny_checkpoint(task.entry) is None:
                                tiny_checkpoint(task.entry)
                        else:
                            self._reference(task, references, work, runner, workers)
                    except Exception as error:  # noqa: BLE001 - left to the cell, which does it again and reports it
                        if task.request is not None:
                            self.first_error = error
                    finally:
                        self._finished(task)
        except Exception as error:  # a harness bug outside a task: without it, the other workers would wait forever
            with self.changed:
                self.worker_error = self.worker_error or error
                self.changed.notify_all()

    def _next(self) -> _Task | None:
        """The first reference whose checkpoint is written, else the next checkpoint to write (two workers writing
        make their weights one after the other, matrix/checkpoints.py `_WRITING`); None when nothing is left."""
        with self.changed:
            while self.worker_error is None:
                for task in self.references:
                    if task.entry is None or tiny_folder(task.entry) not in self.unwritten:
                        self.references.remove(task)
                        return task
                if self.writes:
                    return self.writes.popleft()
                if not self.references and not self.writes:
                    return None
                self.changed.wait()
            return None

    def _finished(self, task: _Task) -> None:
        with self.changed:
            if task.writes:
                assert task.entry is not None
                self.unwritten.discard(tiny_folder(task.entry))
            self.changed.notify_all()

    def _reference(
        self, task: _Task, references: ComputesReferences, work: CellWork, runner: Runner, workers: int
    ) -> None:
        if task.request is not None:  # the cell that asked: computed as asked, on one thread like the rest
            self.first_answer = references.compute_reference(replace(task.request, threads=1))
            return
        assert task.cell is not None and task.entry is not None
        if cached_tiny_checkpoint(task.entry) is None:
            return  # its checkpoint did not write: its cell writes it again and fails as `setup`
        prepared = work.prepare(task.cell, runner)
        self.prepared[task.cell.id] = prepared
        plan = prepared.plan.reference
        if prepared.skip or plan.offload != "none" or plan.host_bytes * workers > prepared.runner.beside_group_bytes:
            return  # it does not run, or its reference needs the machine to itself: its turn computes it
        request = work.reference_request(prepared)
        with self.changed:
            if request.path in self.asked or Path(request.path).exists():
                return
            self.asked.add(request.path)
        references.compute_reference(replace(request, threads=1))


class AheadForker:
    """A `ReferenceForker` that computes the first reference it is asked for together with the run's cold work
    (`RunAhead`), and every later one as its forker does."""

    def __init__(self, forker: ReferenceForker, ahead: RunAhead, work: CellWork) -> None:
        self.forker, self.ahead, self.work = forker, ahead, work

    def reference_series(self) -> AbstractContextManager[ComputesReferences]:
        return self.forker.reference_series()

    def compute_reference(self, request: ReferenceRequest) -> Answer | None:
        if not self.ahead.pending:
            return self.forker.compute_reference(request)
        return self.ahead.compute_with(request, self.forker, self.work)

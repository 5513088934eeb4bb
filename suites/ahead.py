"""Tiny checkpoints written ahead of their cells, while the driver waits for an unsharded reference.

On an empty cache the first cell of each model writes its tiny checkpoint in the driver (one core), then waits while
its reference computes in a process of its own, then while its ranks run. `WritingAhead` puts the wait to work: while
a reference computes, a thread of the driver writes the next tiny checkpoints the run's cells will load, in their
order, so the next cell finds its checkpoint written. It writes only while the driver waits on a reference's process
(nothing else of the driver runs then, so nothing races the thread for torch's global random generator, which a
checkpoint's seeded init uses) and has finished its checkpoint before the driver goes on: it never runs beside a rank
group, whose busy-waiting all-reduce a third process slows out of proportion.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from matrix.checkpoints import cached_tiny_checkpoint, tiny_checkpoint, tiny_folder
from matrix.registry import ModelEntry

if TYPE_CHECKING:
    from suites.reference import Answer, ReferenceForker, ReferenceRequest

WRITER_NAME = "autotp-checkpoints-ahead"
"""The writing thread's name."""


class CheckpointsAhead:
    """The tiny checkpoints a run's cells will load, in the order they will load them, each written once."""

    def __init__(self, entries: Iterable[ModelEntry]) -> None:
        in_order: dict[object, ModelEntry] = {}
        for entry in entries:
            in_order.setdefault(tiny_folder(entry), entry)
        self._waiting = deque(in_order.values())
        self._stop = threading.Event()

    @property
    def waiting(self) -> int:
        """How many are not known to be written yet."""
        return len(self._waiting)

    @contextmanager
    def written_meanwhile(self) -> Iterator[None]:
        """While the block runs, write the next unwritten checkpoints one after another in a thread; at its end, let
        the thread finish the one it writes and stop."""
        if not self._waiting:
            yield
            return
        self._stop.clear()
        writer = threading.Thread(target=self._write_until_stopped, name=WRITER_NAME, daemon=True)
        writer.start()
        try:
            yield
        finally:
            self._stop.set()
            writer.join()

    def _write_until_stopped(self) -> None:
        while self._waiting and not self._stop.is_set():
            entry = self._waiting.popleft()
            try:
                if cached_tiny_checkpoint(entry) is None:
                    tiny_checkpoint(entry)
            except Exception:  # noqa: BLE001 - the cell that loads it writes it again, and fails as `setup` with this
                pass


class WritingAhead:
    """A `ReferenceForker` that writes checkpoints ahead (`CheckpointsAhead`) while its forker's reference computes."""

    def __init__(self, forker: ReferenceForker, ahead: CheckpointsAhead) -> None:
        self.forker, self.ahead = forker, ahead

    def compute_reference(self, request: ReferenceRequest) -> Answer | None:
        if not self.ahead.waiting:
            return self.forker.compute_reference(request)
        # One core is the writing thread's: the reference's own threads on the others (on 2 cores 1 thread took 10 %
        # longer than 2, at 60 % of their CPU: their tiny operations leave a second thread mostly waiting).
        threads = max(1, len(os.sched_getaffinity(0)) - 1)
        with self.ahead.written_meanwhile():
            return self.forker.compute_reference(replace(request, threads=threads))

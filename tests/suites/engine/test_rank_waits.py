"""How an oversubscribing rank waits (suites/engine/rank_waits.py): each strategy's naps, measured on this thread with
the kernel's own counters (voluntary context switches, schedstat), and the one switch that picks a strategy."""

import os
import re
import time
from pathlib import Path

import pytest

from suites.engine.rank_waits import (
    DEFAULT_WAIT,
    RANK_WAIT_ENV,
    WAIT_STRATEGIES,
    Naps,
    naps_for,
    wait_strategy,
)

NAPPING = [name for name, strategy in WAIT_STRATEGIES.items() if strategy.period_seconds is not None]


def voluntary_switches() -> int:
    status = Path("/proc/thread-self/status").read_text()
    found = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.MULTILINE)
    assert found
    return int(found.group(1))


def spin_in_native_code() -> None:
    """~0.3 s of a core in C holding the GIL, as DeepSpeed's shm all-reduce spins: a regular expression backtracking."""
    re.match(r"(a+)+b", "a" * 22)


class Window:
    """This thread's naps (voluntary context switches) and seconds asleep (wall less on-core less waiting for a core,
    from /proc/thread-self/schedstat) over a block."""

    def __enter__(self) -> "Window":
        self._switches, self._wall, self._cpu = voluntary_switches(), time.perf_counter(), time.thread_time()
        self._scheduled = self._schedstat()
        return self

    def __exit__(self, *_: object) -> None:
        on_core, waiting = (now - then for now, then in zip(self._schedstat(), self._scheduled))
        self.naps = voluntary_switches() - self._switches
        self.cpu_seconds = time.thread_time() - self._cpu
        self.asleep_seconds = time.perf_counter() - self._wall - (on_core + waiting) / 1e9

    @staticmethod
    def _schedstat() -> tuple[int, int]:
        on_core, waiting, _ = Path("/proc/thread-self/schedstat").read_text().split()
        return int(on_core), int(waiting)


@pytest.mark.parametrize("name", NAPPING)
def test_armed_naps_hand_the_core_over_even_inside_native_code_and_disarmed_ones_never(name):
    """A rank of an oversubscribing group naps while a cell runs, also while it spins in native code holding the GIL
    (DeepSpeed's shm all-reduce), at least once a period; disarmed, never."""
    strategy = WAIT_STRATEGIES[name]
    assert strategy.period_seconds is not None
    naps = Naps(strategy)
    naps.arm()
    with Window() as armed:
        spin_in_native_code()
    naps.disarm()
    with Window() as disarmed:
        spin_in_native_code()
    expected = armed.cpu_seconds / strategy.period_seconds
    assert armed.naps >= expected / 2 and disarmed.naps <= 5, (armed.naps, expected, disarmed.naps)


def test_wall_clock_naps_come_also_while_the_rank_sleeps():
    """`naps` time the period in wall time: a rank that sleeps (off-core) is still interrupted every millisecond, so
    one that wakes into a spin naps within a period."""
    naps = Naps(WAIT_STRATEGIES[DEFAULT_WAIT])
    naps.arm()
    with Window() as asleep:
        time.sleep(0.05)
    naps.disarm()
    assert 20 <= asleep.naps <= 1000, asleep.naps


def test_the_switch_picks_the_strategy_and_a_name_that_is_none_fails_with_the_choices(monkeypatch):
    monkeypatch.delenv(RANK_WAIT_ENV, raising=False)
    assert wait_strategy().name == DEFAULT_WAIT == "naps"
    monkeypatch.setenv(RANK_WAIT_ENV, " ")
    assert wait_strategy().name == DEFAULT_WAIT
    cores = len(os.sched_getaffinity(0))
    assert isinstance(naps_for(cores + 1), Naps) and naps_for(cores) is None  # a rank with a core of its own: none
    monkeypatch.setenv(RANK_WAIT_ENV, "spin")
    assert wait_strategy() is WAIT_STRATEGIES["spin"] and naps_for(cores + 1) is None
    monkeypatch.setenv(RANK_WAIT_ENV, "yield")
    with pytest.raises(ValueError, match=f"{RANK_WAIT_ENV}='yield' names no rank wait strategy.*naps, spin"):
        naps_for(cores)  # also where no rank would nap: the run's every group is told, not only the oversubscribing

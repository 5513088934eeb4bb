"""How a rank of a group with more ranks than cores waits for its peers: the strategies, and the one switch that
picks one (`RANK_WAIT_ENV`).

DeepSpeed's CPU all-reduce (csrc/cpu/comm/shm.cpp `wait_buffer_state_until_2`) busy-waits for the other ranks. With
tp 3 or 4 on 2 cores the rank it waits for is often off-core, and the waiter keeps its core until the scheduler's
next tick (4 ms at HZ=250): ~125 all-reduces a cell (docs/findings.md, "#29 warm default matrix" and "#58 where a warm
cell's time goes"). Every strategy here changes only when a rank runs, never what it computes: DeepSpeed is not
patched, the all-reduce's bytes are the same, so a cell's observations, verdict and signature are too.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from dataclasses import dataclass

RANK_WAIT_ENV = "AUTOTP_RANK_WAIT"
"""Names the strategy (a key of WAIT_STRATEGIES) the ranks of an oversubscribing group wait with; unset: DEFAULT_WAIT.
Read by `wait_strategy` alone; it reaches the ranks through the fork server's (and the launcher's) environment."""

CLOCK_MONOTONIC = 1


@dataclass(frozen=True)
class WaitStrategy:
    """How an oversubscribing rank's naps are timed while a cell runs."""

    name: str
    """Its key in WAIT_STRATEGIES (what RANK_WAIT_ENV names)."""
    period_seconds: float | None
    """A nap every this many seconds of wall time; None: never a nap (the rank spins as DeepSpeed wrote it)."""
    summary: str = ""
    """One line for `--help`-like listings and the benchmark's table."""


WAIT_STRATEGIES = {
    strategy.name: strategy
    for strategy in (
        WaitStrategy("naps", 0.001, summary="a ~64 us nap every 1 ms of wall time (the #29 default)"),
        WaitStrategy("spin", None, summary="no naps: DeepSpeed's busy wait alone (before #29)"),
    )
}
"""The strategies RANK_WAIT_ENV may name: the default, and the control a benchmark measures it against. Others were
measured on a quiet machine and lost (docs/findings.md, "#58 how a rank waits, measured quietly"): a CPU-time clock
(it fires only at the tick), longer naps, and 0.5 or 2 ms periods."""

DEFAULT_WAIT = "naps"
"""What the ranks use when RANK_WAIT_ENV is unset or empty (measured on a quiet machine: docs/findings.md)."""


def wait_strategy() -> WaitStrategy:
    """The strategy RANK_WAIT_ENV names, or DEFAULT_WAIT's; a name that is none raises with the choices."""
    name = os.environ.get(RANK_WAIT_ENV, "").strip() or DEFAULT_WAIT
    if name not in WAIT_STRATEGIES:
        raise ValueError(
            f"{RANK_WAIT_ENV}={name!r} names no rank wait strategy: unset it (default {DEFAULT_WAIT!r}) or name one "
            f"of {', '.join(WAIT_STRATEGIES)}"
        )
    return WAIT_STRATEGIES[name]


class Naps:
    """While armed, the calling thread naps every period of wall time for ~64 us, so a rank
    of a group with more ranks than cores gives its core to the rank it waits for within a period.

    A nap, not a `sched_yield`: measured 6x slower (not profiled; likely the core often went to another spinner).

    How: a POSIX timer aimed at this thread (SIGEV_THREAD_ID; no other thread of the rank sees the signal) raises
    SIGALRM, whose handler is libc's `usleep` itself, so it runs inside native code that holds the GIL, where a
    Python handler never would. A handler gets the signal number as its argument: the nap is SIGALRM's number (14)
    in microseconds plus the thread's timer slack (the kernel's default 50 us). glibc's `signal` installs it with
    SA_RESTART, so a system call it interrupts is restarted (Python's own calls retry anyway, PEP 475)."""

    SIGEV_THREAD_ID = 4

    def __init__(self, strategy: WaitStrategy):
        assert strategy.period_seconds is not None, f"{strategy.name} takes no naps"

        class SigEvent(ctypes.Structure):  # glibc's struct sigevent (64 bytes), its thread-id member
            _fields_ = [
                ("value", ctypes.c_void_p),
                ("signo", ctypes.c_int),
                ("notify", ctypes.c_int),
                ("thread_id", ctypes.c_int),
                ("padding", ctypes.c_int * 11),
            ]

        class TimeSpec(ctypes.Structure):
            _fields_ = [("seconds", ctypes.c_long), ("nanoseconds", ctypes.c_long)]

        class IntervalTimerSpec(ctypes.Structure):
            _fields_ = [("interval", TimeSpec), ("value", TimeSpec)]

        self._byref = ctypes.byref
        self._libc = libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signal.SIGALRM, ctypes.cast(libc.usleep, ctypes.c_void_p).value)
        event = SigEvent(None, signal.SIGALRM, self.SIGEV_THREAD_ID, threading.get_native_id())
        self._timer = ctypes.c_void_p()
        if libc.timer_create(CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(self._timer)) != 0:
            raise OSError(ctypes.get_errno(), f"timer_create failed for rank wait strategy {strategy.name}")
        nanoseconds = round(strategy.period_seconds * 1e9)
        period = TimeSpec(nanoseconds // 1_000_000_000, nanoseconds % 1_000_000_000)
        self._armed, self._disarmed = IntervalTimerSpec(period, period), IntervalTimerSpec()

    def arm(self) -> None:
        self._libc.timer_settime(self._timer, 0, self._byref(self._armed), None)

    def disarm(self) -> None:
        self._libc.timer_settime(self._timer, 0, self._byref(self._disarmed), None)


def naps_for(world_size: int) -> Naps | None:
    """Naps of RANK_WAIT_ENV's strategy for a rank of a group with more ranks than this process may use cores; None
    otherwise (a rank with a core of its own waits on a rank that runs: a nap would only slow it) or for a strategy
    without naps."""
    strategy = wait_strategy()  # a misspelt name fails every group, oversubscribing or not
    if world_size <= len(os.sched_getaffinity(0)) or strategy.period_seconds is None:
        return None
    return Naps(strategy)

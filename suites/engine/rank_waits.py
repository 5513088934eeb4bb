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
CLOCK_THREAD_CPUTIME_ID = 3
PR_SET_TIMERSLACK = 29
PR_GET_TIMERSLACK = 30


@dataclass(frozen=True)
class WaitStrategy:
    """How an oversubscribing rank's naps are timed while a cell runs."""

    name: str
    """Its key in WAIT_STRATEGIES (what RANK_WAIT_ENV names)."""
    period_seconds: float | None
    """A nap every this many seconds of `clock`; None: never a nap (the rank spins as DeepSpeed wrote it)."""
    clock: int = CLOCK_MONOTONIC
    """CLOCK_MONOTONIC: every period of wall time, even right after the rank was scheduled. CLOCK_THREAD_CPUTIME_ID:
    after the thread has run that long; the kernel checks CPU-time timers at its tick, so they fire at most once a
    tick (4 ms at HZ=250) whatever the period."""
    nap_slack_seconds: float | None = None
    """The thread's timer slack while armed (prctl PR_SET_TIMERSLACK): a nap lasts 14 us (SIGALRM's number, see
    `Naps`) plus up to this; None keeps the kernel's default 50 us (naps of ~64 us)."""
    summary: str = ""
    """One line for `--help`-like listings and the benchmark's table."""


WAIT_STRATEGIES = {
    strategy.name: strategy
    for strategy in (
        WaitStrategy("naps", 0.001, summary="a ~64 us nap every 1 ms of wall time (the #29 default)"),
        WaitStrategy("spin", None, summary="no naps: DeepSpeed's busy wait alone (before #29)"),
        WaitStrategy(
            "cpu-naps",
            0.001,
            clock=CLOCK_THREAD_CPUTIME_ID,
            summary="a ~64 us nap once the thread has run 1 ms of CPU (fires at the tick: ~every 4 ms of CPU)",
        ),
        WaitStrategy("long-naps", 0.001, nap_slack_seconds=250e-6, summary="a nap of up to ~264 us every 1 ms"),
        WaitStrategy("naps-500us", 0.0005, summary="a ~64 us nap every 500 us of wall time"),
        WaitStrategy("naps-2ms", 0.002, summary="a ~64 us nap every 2 ms of wall time"),
    )
}
"""The strategies RANK_WAIT_ENV may name."""

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
    """While armed, the calling thread naps every period of its clock for ~64 us (longer with a nap slack), so a rank
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
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        libc.signal(signal.SIGALRM, ctypes.cast(libc.usleep, ctypes.c_void_p).value)
        event = SigEvent(None, signal.SIGALRM, self.SIGEV_THREAD_ID, threading.get_native_id())
        self._timer = ctypes.c_void_p()
        if libc.timer_create(strategy.clock, ctypes.byref(event), ctypes.byref(self._timer)) != 0:
            raise OSError(ctypes.get_errno(), f"timer_create failed for rank wait strategy {strategy.name}")
        nanoseconds = round(strategy.period_seconds * 1e9)
        period = TimeSpec(nanoseconds // 1_000_000_000, nanoseconds % 1_000_000_000)
        self._armed, self._disarmed = IntervalTimerSpec(period, period), IntervalTimerSpec()
        slack = strategy.nap_slack_seconds
        self._nap_slack = None if slack is None else round(slack * 1e9)
        self._default_slack = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)

    def arm(self) -> None:
        if self._nap_slack is not None:  # this thread's only: the rank's other threads and its idle waits keep theirs
            self._libc.prctl(PR_SET_TIMERSLACK, self._nap_slack, 0, 0, 0)
        self._libc.timer_settime(self._timer, 0, self._byref(self._armed), None)

    def disarm(self) -> None:
        self._libc.timer_settime(self._timer, 0, self._byref(self._disarmed), None)
        if self._nap_slack is not None:
            self._libc.prctl(PR_SET_TIMERSLACK, self._default_slack, 0, 0, 0)


def naps_for(world_size: int) -> Naps | None:
    """Naps of RANK_WAIT_ENV's strategy for a rank of a group with more ranks than this process may use cores; None
    otherwise (a rank with a core of its own waits on a rank that runs: a nap would only slow it) or for a strategy
    without naps."""
    strategy = wait_strategy()  # a misspelt name fails every group, oversubscribing or not
    if world_size <= len(os.sched_getaffinity(0)) or strategy.period_seconds is None:
        return None
    return Naps(strategy)

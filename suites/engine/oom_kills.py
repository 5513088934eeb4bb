"""The kernel's out-of-memory kills, counted by Linux for the whole machine: a rank that died by SIGKILL while the
count rose was killed for memory (seen: a training cell killed while the tests ran beside the matrix, reported as a bare
SIGKILL that read as AutoTP's)."""

from __future__ import annotations

from pathlib import Path

from suites.verdicts.outcome import CellOutcome, failed

VMSTAT = Path("/proc/vmstat")
"""Linux's kernel counters; its `oom_kill` line counts the processes the out-of-memory killer has killed since boot,
every memory cgroup's kills included (Linux 4.13 and later)."""


def kernel_oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot; None where Linux does not say."""
    try:
        for line in VMSTAT.read_text().splitlines():
            name, _, count = line.partition(" ")
            if name == "oom_kill":
                return int(count)
    except (OSError, ValueError):
        pass
    return None


def oom_killed(kills_at_start: int | None, logs: str) -> CellOutcome | None:
    """The crash of a rank killed by SIGKILL while the kernel's count of out-of-memory kills rose past
    `kills_at_start` (read when the cell or the group's start began), saying what to do; None where it did not rise
    or the kernel does not say."""
    kills_now = kernel_oom_kills()
    if kills_at_start is None or kills_now is None or kills_now <= kills_at_start:
        return None
    return failed(
        "crash",
        "rank died: SIGKILL by the kernel's out-of-memory killer",
        "a rank process was killed by the kernel's out-of-memory killer (the machine's count of OOM kills rose from "
        f"{kills_at_start} to {kills_now} while the cell ran): memory ran out, the host's or its container's limit. If "
        "other work shared the machine, rerun the cell alone; if it dies again on a quiet machine, the cell's own "
        f"memory use is the suspect. Rank group restarted.\n{logs}",
    )

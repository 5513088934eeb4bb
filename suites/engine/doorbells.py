"""Named pipes that wake a waiting process at once instead of a poll interval later.

The driver rings a rank's `job.<rank>` pipe after writing a job file; a rank rings the group's `events` pipe after
writing a ready, error, result, done or died file. The files stay the only truth: a ring says "look now", a lost one
costs the waiter's fallback interval, never a verdict. Polling every 20 ms cost ~10 ms a cell on each side (the
job's pickup, then the driver seeing the last `done`), ~6 s of a warm default matrix (docs/findings.md).
"""

from __future__ import annotations

import errno
import os
import select
from pathlib import Path


def events_path(workdir: Path) -> Path:
    return workdir / "events"


def job_path(workdir: Path, rank: int) -> Path:
    return workdir / f"job.{rank}"


def make(path: Path) -> None:
    os.mkfifo(path, 0o600)


class Listener:
    """The one reader of a pipe. Opened read-write, so the open never blocks and the pipe never reads as closed
    while ringers come and go."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)

    def wait(self, timeout: float) -> None:
        """Until a ring (then every pending ring is taken) or `timeout` seconds."""
        readable, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if readable:
            try:
                while os.read(self.fd, 4096):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self.fd)


def ring(path: Path) -> None:
    """One byte into the pipe, never blocking: a full pipe has rings pending anyway, and a pipe whose reader is gone
    (a dead rank, an ended driver) has nobody to wake."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno in (errno.ENXIO, errno.ENOENT):
            return
        raise
    try:
        os.write(fd, b"!")
    except (BlockingIOError, BrokenPipeError):
        pass
    finally:
        os.close(fd)

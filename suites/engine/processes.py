"""Whether a process still runs: the driver, fork server and ranks each watch the process they serve."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (a leader whose server died, left to an init that does not
    reap) counts as ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (not Linux) or it just ended: the signal check is all there is
    return state != "Z"

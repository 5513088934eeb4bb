"""Free disk space: the check where a run starts (the harness cache's and the results' file systems must have what a
run needs, or the run stops at once saying where, how much and what to do), and the words for a write a full disk
refused ("disk full at <path>") instead of a traceback."""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from matrix import cache_root
from matrix.harness_cache import CacheLimitError, human, parse_size

NEEDED_VARIABLE = "AUTOTP_MIN_FREE"
DEFAULT_NEEDED = 3 * 2**30
"""3 GiB free where the harness cache is: a cold default matrix wrote 2.2 GB there (docs/measured.md)."""
RESULTS_NEEDED = 256 * 2**20
"""256 MiB free where the results go: a default matrix's results folder is ~16 MB (junit, logs, repro scripts)."""
PRUNE_COMMAND = "nox -s cache -- --prune --limit 2G"

_NO_SPACE_TEXT = re.compile(r"\[Errno 28\] No space left on device: '([^']+)'")
_NO_SPACE_WORDS = ("No space left on device", "os error 28", "StorageFull", "database or disk is full")
_TORCH_WRITE_FAILED = re.compile(
    r"PytorchStreamWriter failed writing file .*: file write failed|inline_container\.cc:\d+\] \. unexpected pos \d+ vs"
    r"|basic_ios::clear: iostream error"
)
"""torch.save's words for a write its C++ stream writer could not finish (no errno, no path): a full disk among other
causes, so one is a full disk only when the disk really is short when it is read (`short_of_space`)."""


class DiskSpaceError(RuntimeError):
    """A run that cannot start: too little free space, or results inside the evictable cache."""


@dataclass(frozen=True)
class Need:
    """Free space a run needs on the file system of one folder."""

    path: Path
    what: str
    """What the folder is, in words ("the harness cache, AUTOTP_CACHE")."""
    size: int
    """Bytes it needs free there."""


def existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists (a results folder a run creates lives on its parent's disk)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Bytes free for this user on the file system that holds (or will hold) `path`."""
    return shutil.disk_usage(existing(path)).free


def needed_in_cache() -> int:
    """What a run needs free where the cache is: AUTOTP_MIN_FREE when set, else DEFAULT_NEEDED."""
    text = os.environ.get(NEEDED_VARIABLE)
    try:
        return DEFAULT_NEEDED if text is None else parse_size(text, NEEDED_VARIABLE)
    except CacheLimitError as error:
        raise DiskSpaceError(str(error)) from None


def run_needs(results: Path) -> list[Need]:
    """What a run of the suites writing into `results` needs free."""
    return [
        Need(cache_root(), "the harness cache, AUTOTP_CACHE", needed_in_cache()),
        Need(results, "the results folder", RESULTS_NEEDED),
    ]


def require_free_space(needs: list[Need]) -> None:
    """Raise DiskSpaceError naming each file system with less free than `needs` ask of it (needs on one file system
    add up) and what to do; a results folder inside the harness cache is refused (the cache's entries are evicted)."""
    cache = cache_root().absolute()
    for need in needs:
        if need.path.absolute().is_relative_to(cache) and need.path.absolute() != cache:
            raise DiskSpaceError(
                f"{need.what} {need.path} is inside the harness cache {cache}, whose entries are evicted when it is "
                "over its limit: put it elsewhere (--results DIR), or set AUTOTP_CACHE to another folder"
            )
    by_disk: dict[int, list[Need]] = {}
    for need in needs:
        by_disk.setdefault(existing(need.path).stat().st_dev, []).append(need)
    problems = []
    for same_disk in by_disk.values():
        wanted, free = sum(need.size for need in same_disk), free_bytes(same_disk[0].path)
        if free < wanted:
            where = " and ".join(f"{need.path} ({need.what})" for need in same_disk)
            problems.append(
                f"only {human(free)} ({free} bytes) free at {where}; this run needs {human(wanted)} ({wanted} bytes)"
            )
    if problems:
        raise DiskSpaceError(
            "not enough disk space to start: "
            + "; ".join(problems)
            + f". Prune the harness cache (`{PRUNE_COMMAND}`, or `python -m matrix.harness_cache --prune --limit 2G`)"
            ", free space there, or set AUTOTP_CACHE (and --results) to a folder on a larger disk; "
            f"{NEEDED_VARIABLE} sets what a run needs free in the cache (now {needed_in_cache()} bytes)"
        )


def disk_full_at(error: BaseException) -> str | None:
    """Where a full disk refused a write, when that is what `error` (or an exception it came from) says: the file's
    path when known, "" when not; None when the error is something else."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return str(seen.filename or "")
        if isinstance(seen, sqlite3.OperationalError) and "disk is full" in str(seen):
            return ""
        if found := _NO_SPACE_TEXT.search(str(seen)):
            return found.group(1)
        if any(words in str(seen) for words in _NO_SPACE_WORDS):
            return ""
        if _TORCH_WRITE_FAILED.search(str(seen)) and short_of_space(cache_root()):
            return ""
        seen = seen.__cause__ or seen.__context__
    return None


def short_of_space(path: Path) -> bool:
    """The disk of `path` has less free now than a run needs there to start (`needed_in_cache`): a write that failed
    for no reason it names failed for that one."""
    try:
        needed = needed_in_cache()
    except DiskSpaceError:  # a malformed AUTOTP_MIN_FREE is the start's to report
        needed = DEFAULT_NEEDED
    try:
        return free_bytes(path) < needed
    except OSError:
        return False


def disk_full_line(path: str, then: str) -> str:
    """What a reader of a refused write needs: where, how much is free there, what to do, then `then`."""
    where = Path(path) if path else cache_root()
    try:
        free = f"{human(free_bytes(where))} free"
    except OSError:
        free = "free space unknown"
    return (
        f"disk full at {where} ({free}): prune the harness cache (`{PRUNE_COMMAND}`) or free space there, "
        f"or set AUTOTP_CACHE to a folder on a larger disk, then {then}"
    )

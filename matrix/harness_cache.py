"""The harness cache's bound: its regenerable entries (tiny checkpoints, unsharded references and training steps,
remembered config answers, JIT builds, remedy checkouts) are evicted least recently used first once the cache is over
its limit (AUTOTP_CACHE_LIMIT, default DEFAULT_LIMIT), while a run goes on (`RunPruning`, at most every
PRUNE_EVERY_SECONDS), at the end of a run and by `python -m matrix.harness_cache --prune` (`nox -s cache`); an evicted
entry is only ever computed again. Entries a live run uses are never evicted: each run that uses the cache holds a
lock of its own under `.runs/` while it runs, and an entry used since the oldest live run began (or in the last
GUARD_SECONDS, for a process that holds none) is kept. A run pruning while it goes on is protected from itself by the
guard alone: its own entries used longest ago go first, or a run whose working set outgrows the disk (train-all's
unsharded steps, up to GBs a model) would fill it before its end. Nothing else under the cache is
touched: PyPI release data (`releases/`, fetched from the network), temporary folders, files the harness does not
know. Results, the history store and the archive never live here (`--results` inside the cache is refused)."""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from matrix import cache_root

LIMIT_VARIABLE = "AUTOTP_CACHE_LIMIT"
DEFAULT_LIMIT = 10 * 2**30
"""10 GiB: a default matrix's working set (tiny checkpoints and references: docs/measured.md) several times over, and
under a hosted runner's ~14 GB of free disk."""

EVICTABLE_KINDS = (
    "tiny",
    "references",
    "training",
    "fresh-process",
    "tiny-layers",
    "tiny-shapes",
    "torch_extensions",
    "remedies/checkouts",
    "remedies/sdists",
    "render",
)
"""The cache's folders whose entries (each file or folder directly inside) the harness computes again when missing."""

GUARD_SECONDS = 600.0
"""An entry used this recently is never evicted, even when no live run holds a lock (a tool run outside the suites)."""

RUNS_FOLDER = ".runs"
RUN_LOCK_VARIABLE = "AUTOTP_CACHE_RUN_LOCK"
"""The lock file of the live run this process belongs to, set by `live_run` (a pytest-xdist worker inherits it), so
that pruning during that run leaves the run's own lock out of what protects entries."""
PRUNE_EVERY_SECONDS = 60.0
"""How often at most a run prunes its cache while it goes on: listing the cache costs a walk of every entry."""
UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class CacheLimitError(ValueError):
    """A cache limit that is not a size."""


def parse_size(text: str, source: str) -> int:
    """Bytes from `12G`, `500M`, `64k` or a plain count (binary units, case-insensitive); `source` names where the
    text came from in the error."""
    number, unit = text.strip().lower().rstrip("ib"), ""
    if number and number[-1] in UNITS:
        number, unit = number[:-1], number[-1]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if value < 0:
        raise CacheLimitError(f"{source}={text!r} is not a size: write bytes or a number with K, M, G or T (10G)")
    return int(value * UNITS[unit])


def cache_limit() -> int:
    """The cache's limit in bytes: AUTOTP_CACHE_LIMIT when set, else DEFAULT_LIMIT."""
    text = os.environ.get(LIMIT_VARIABLE)
    return DEFAULT_LIMIT if text is None else parse_size(text, LIMIT_VARIABLE)


def used(path: Path) -> Path:
    """`path` (a cache entry, or a file or folder inside one), marked used now for the least-recently-used order: its
    access time is set, its modification time kept (what was written when stays readable, e.g. to sessions/atlas.py).
    Returns `path`, so a reader wraps the path it builds."""
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except OSError:
        pass  # not written yet (its writer makes it now), or a read-only cache: nothing to order
    return path


def human(size: int) -> str:
    """`size` bytes as a person reads them (binary units)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{size} B"
        value /= 1024
    return f"{value:.1f} TiB"


@dataclass(frozen=True)
class CacheEntry:
    """One regenerable entry of the cache."""

    path: Path
    """The file or folder directly inside its kind's folder."""
    kind: str
    """Its folder under the cache root (EVICTABLE_KINDS)."""
    size: int
    """Bytes it takes on disk (allocated blocks, every file inside a folder)."""
    last_used: float
    """When it was last written or marked used (`used`): the later of its modification and access times."""


def disk_bytes(path: Path) -> int:
    """Bytes `path` takes on disk: its blocks, and every file's under it (symbolic links not followed)."""
    stat = path.lstat()
    total = stat.st_blocks * 512
    if path.is_dir() and not path.is_symlink():
        for folder, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_blocks * 512
                except OSError:
                    continue  # removed while counted (a concurrent writer's staging file)
    return total


def cache_entries(root: Path) -> list[CacheEntry]:
    """Every regenerable entry under `root`, least recently used first; dot-named ones (staging files, locks) are
    a writer's own and never listed."""
    entries = []
    for kind in EVICTABLE_KINDS:
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if path.name.startswith(".") or any(path == root / other for other in EVICTABLE_KINDS):
                continue
            try:
                stat = path.lstat()
                size = disk_bytes(path)
                if path.is_dir():  # reading a folder sets its access time: counting it is not a use
                    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns), follow_symlinks=False)
                entries.append(CacheEntry(path, kind, size, max(stat.st_mtime, stat.st_atime)))
            except OSError:
                continue  # evicted or renamed by another process meanwhile
    return sorted(entries, key=lambda entry: entry.last_used)


@contextmanager
def live_run(root: Path | None = None) -> Iterator[None]:
    """Hold a lock under the cache's `.runs/` while the body runs: entries used since this began are not evicted
    by any other process (`oldest_live_run`). The lock ends with the process, so a killed run never pins the cache."""
    runs = (root or cache_root()) / RUNS_FOLDER
    runs.mkdir(parents=True, exist_ok=True)
    lock = runs / f"{os.getpid()}-{time.time_ns()}.lock"
    outer = os.environ.get(RUN_LOCK_VARIABLE)
    with lock.open("w") as stream:
        fcntl.flock(stream, fcntl.LOCK_EX)
        os.environ[RUN_LOCK_VARIABLE] = str(lock)
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
            if outer is None:
                os.environ.pop(RUN_LOCK_VARIABLE, None)
            else:
                os.environ[RUN_LOCK_VARIABLE] = outer


def oldest_live_run(root: Path, besides: str | None = None) -> float | None:
    """When the oldest run that holds a lock under `root/.runs/` began, the lock at path `besides` left out; a lock no
    process holds (its run was killed) is removed."""
    starts = []
    for lock in sorted((root / RUNS_FOLDER).glob("*.lock")):
        if str(lock) == besides:
            continue
        try:
            with lock.open("r+") as stream:
                try:
                    fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    starts.append(lock.stat().st_mtime)
                    continue
                lock.unlink(missing_ok=True)
        except OSError:
            continue  # its run ended meanwhile
    return min(starts, default=None)


@dataclass(frozen=True)
class Pruned:
    """What one pruning did."""

    root: Path
    limit: int
    evicted: tuple[CacheEntry, ...]
    """The entries removed, least recently used first."""
    kept: int
    """Bytes of regenerable entries left."""
    protected: int
    """Bytes of those in use (by a live run, or used within `guard` seconds): never evicted, even over the limit."""
    guard: float = GUARD_SECONDS
    """How recently an entry no live run holds was used and still stays."""

    def line(self) -> str:
        """One line for the end of a run ("" when nothing was evicted and the cache is within its limit)."""
        freed = sum(entry.size for entry in self.evicted)
        if not self.evicted and self.kept <= self.limit:
            return ""
        recently = f" or in the last {self.guard / 60:.0f} minutes" if self.guard else ""
        over = f"; {human(self.protected)} used by a live run{recently} stays" if self.kept > self.limit else ""
        return (
            f"cache {self.root}: evicted {len(self.evicted)} least recently used entries ({human(freed)}), "
            f"{human(self.kept)} kept of a {human(self.limit)} limit ({LIMIT_VARIABLE}){over}"
        )


def prune(
    root: Path | None = None,
    limit: int | None = None,
    now: float | None = None,
    during_own_run: bool = False,
    guard: float = GUARD_SECONDS,
) -> Pruned:
    """Evict regenerable entries of the cache, least recently used first, until it is within `limit` (default:
    `cache_limit()`); an entry used since the oldest live run began, or within `guard` seconds of `now`, is kept.
    `during_own_run`: the caller's own live run (RUN_LOCK_VARIABLE) protects nothing, only other runs and the guard.
    A caller whose own runs of the suites are over and that knows no lockless tool uses the cache (the atlas between
    two transformers versions) passes `guard` 0: only the live runs' locks keep entries then."""
    root, limit, now = root or cache_root(), cache_limit() if limit is None else limit, now or time.time()
    live = oldest_live_run(root, os.environ.get(RUN_LOCK_VARIABLE) if during_own_run else None)
    since = now - guard if live is None else min(live, now - guard)
    entries = cache_entries(root)
    total = sum(entry.size for entry in entries)
    evicted = []
    for entry in entries:
        if total <= limit or entry.last_used >= since:
            break  # the rest are newer still
        _remove(entry.path)
        evicted.append(entry)
        total -= entry.size
    protected = sum(entry.size for entry in entries if entry.last_used >= since)
    return Pruned(root, limit, tuple(evicted), total, protected, guard)


@dataclass
class RunPruning:
    """A run's pruning while its cells go on: after a cell, at most every PRUNE_EVERY_SECONDS, the cache is pruned
    to its limit with only other live runs and the guard protecting entries."""

    last: float = 0.0
    """When this process last pruned (0: not yet)."""
    evicted: list[CacheEntry] = field(default_factory=list)
    """Every entry it evicted, for the run's closing line."""

    def after_cell(self, now: float | None = None) -> None:
        """Prune if the last pruning is PRUNE_EVERY_SECONDS old (nothing when no cache exists)."""
        now = now or time.time()
        root = cache_root()
        if now - self.last < PRUNE_EVERY_SECONDS or not root.is_dir():
            return
        self.last = now
        self.evicted.extend(prune(root, now=now, during_own_run=True).evicted)

    def line(self) -> str:
        """One line for the end of the run ("" when it evicted nothing)."""
        if not self.evicted:
            return ""
        freed = human(sum(entry.size for entry in self.evicted))
        count = len(self.evicted)
        return f"cache {cache_root()}: evicted {count} least recently used entries ({freed}) while the run went on"


def _remove(path: Path) -> None:
    """Remove an entry: a folder is first renamed aside (atomically), so no reader ever sees it half removed."""
    if path.is_dir() and not path.is_symlink():
        aside = path.with_name(f".evicting-{path.name}-{os.getpid()}")
        try:
            path.rename(aside)
        except OSError:
            return  # removed or renamed by another process meanwhile
        shutil.rmtree(aside, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def show(root: Path, limit: int) -> list[str]:
    """What the cache holds: each kind's entries and bytes, the total against the limit, and what is never evicted."""
    entries = cache_entries(root)
    lines = [f"harness cache {root} (AUTOTP_CACHE), limit {human(limit)} ({LIMIT_VARIABLE})"]
    for kind in EVICTABLE_KINDS:
        mine = [entry for entry in entries if entry.kind == kind]
        if mine:
            lines.append(f"  {kind + '/':22} {len(mine):6} entries {human(sum(entry.size for entry in mine)):>12}")
    total = sum(entry.size for entry in entries)
    lines.append(f"  {'regenerable, in all':22} {len(entries):6} entries {human(total):>12}")
    tops = {kind.split("/")[0] for kind in EVICTABLE_KINDS} | {RUNS_FOLDER}
    others = [path for path in root.iterdir() if path.name not in tops]
    if others:
        kept = sum(disk_bytes(path) for path in others)
        names = ", ".join(sorted(path.name for path in others))
        lines.append(f"  never evicted: {names} ({human(kept)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.harness_cache", description=__doc__)
    parser.add_argument("--prune", action="store_true", help="evict least recently used entries down to the limit")
    parser.add_argument("--limit", help=f"a size (10G, 500M; 0: every entry not in use) instead of {LIMIT_VARIABLE}")
    args = parser.parse_args(argv)
    try:
        limit = parse_size(args.limit, "--limit") if args.limit is not None else cache_limit()
    except CacheLimitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    root = cache_root()
    if not root.is_dir():
        print(f"harness cache {root} (AUTOTP_CACHE) does not exist yet: nothing to show or prune")
        return 0
    if args.prune:
        print(prune(root, limit).line() or f"cache {root}: within its {human(limit)} limit, nothing evicted")
    print("\n".join(show(root, limit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

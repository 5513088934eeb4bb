"""Files other processes read while they are written: ranks poll for jobs and results, parallel
drivers (pytest-xdist workers) fill the same caches."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(staging)` fills a sibling named after this process, which then replaces `path`: a reader
    never sees a partial file and two writers never share a staging file."""
    staging = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(staging)
    staging.replace(path)


def write_text_atomically(path: Path, text: str) -> None:
    write_atomically(path, lambda staging: staging.write_text(text))

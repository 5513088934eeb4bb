"""Writing one command's outputs together: into a folder of their own first, then moved into place all at once, so
an output that cannot be written (a folder in its way, a full disk) leaves every earlier output as it was, never
some files new and others old; and an output that cannot be written is one line naming it."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reports import ReportsError

_PREVIOUS = ".previous"  # inside the staging folder: the files the move replaced, until it is done


@contextmanager
def writing_to(out_dir: Path) -> Iterator[None]:
    """An output that cannot be written (--out names a file, a folder without permission, a full disk) is one line."""
    try:
        yield
    except OSError as exc:
        raise ReportsError(
            f"--out {out_dir}: cannot write {exc.filename or out_dir} ({exc.strerror}); pass a "
            "folder that can be created or written"
        ) from None


@contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A folder (inside `out_dir`, so a move is a rename) to write one command's outputs into, at the paths they
    have under `out_dir`. When the block ends, every file written there replaces its namesake under `out_dir`: each
    destination is checked before any moves, and a move that fails puts back what the others replaced. When the
    block raises, nothing under `out_dir` changes."""
    with writing_to(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))
    try:
        yield stage
        with writing_to(out_dir):
            _move_all(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _move_all(stage: Path, out_dir: Path) -> None:
    previous = stage / _PREVIOUS
    moves = [
        (source, out_dir / source.relative_to(stage))
        for source in sorted(stage.rglob("*"))
        if source.is_file() and previous not in source.parents
    ]
    for _, target in moves:  # a folder in the way, or a file where a folder must be: nothing has moved yet
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, "a folder is in the way", str(target))
        target.parent.mkdir(parents=True, exist_ok=True)
    done: list[tuple[Path, Path | None]] = []
    try:
        for source, target in moves:
            kept = None
            if target.exists():
                kept = previous / source.relative_to(stage)
                kept.parent.mkdir(parents=True, exist_ok=True)
                os.link(target, kept)
            os.replace(source, target)
            done.append((target, kept))
    except OSError:
        for target, kept in reversed(done):  # back to what was there
            if kept is None:
                target.unlink(missing_ok=True)
            else:
                os.replace(kept, target)
        raise

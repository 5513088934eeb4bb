"""An archive's files read as hostile input: whoever can push to the data branch (or serve a `render --history` URL)
chooses what the checkout holds, and git materialises symlinks. Nothing but regular files is opened (never through a
link, never a FIFO or a device: `O_NOFOLLOW | O_NONBLOCK`, then `fstat`), each read at most to its bound, and a gzip'd
tar's members are inflated at most to a bound of their own (a small entry of zeros would otherwise unpack to
gigabytes). Every refusal is an EntryRefused naming the path and why, so a command names it and goes on."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

# An entry's gzip'd tar is read whole into memory: one far larger than any run's records is refused unread.
MAX_ENTRY_BYTES = 64 * 1024 * 1024
# What its members may unpack to, all of them together: far more than any run's records as JSON.
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
# An archived answer (one bisection or triage attempt as JSON): a few KB.
MAX_ANSWER_BYTES = 1024 * 1024


class EntryRefused(Exception):
    """A file of the archive that is not read: not a regular file, over its bound, or inflating past it."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Listed:
    """The regular files of one listing, and a line for each thing in their place that is not one."""

    files: tuple[Path, ...]
    refused: tuple[EntryRefused, ...]


def regular_files(folder: Path, suffix: str, depth: int) -> Listed:
    """The regular files named `*<suffix>` `depth` folders below `folder` (1: in it), found without following a link:
    a link, FIFO, socket or device of that name, and a linked folder on the way, is refused (named), never opened."""
    files: list[Path] = []
    refused: list[EntryRefused] = []
    folders = [folder]
    for level in range(depth):
        below: list[Path] = []
        for parent in folders:
            try:
                children = sorted(os.scandir(parent), key=lambda child: child.name)
            except OSError as exc:
                refused.append(EntryRefused(parent, f"cannot be listed ({exc.strerror})"))
                continue
            for child in children:
                path = Path(child.path)
                if level < depth - 1:
                    if child.is_symlink() and os.path.isdir(path):
                        refused.append(EntryRefused(path, "is a link to a folder, not a folder of the archive"))
                    elif child.is_dir(follow_symlinks=False) and not child.name.startswith("."):
                        below.append(path)
                elif child.name.endswith(suffix) and not child.name.startswith("."):
                    if child.is_file(follow_symlinks=False):
                        files.append(path)
                    else:
                        refused.append(EntryRefused(path, f"is {_kind(path)}, not a regular file"))
        folders = below if level < depth - 1 else folders
    return Listed(tuple(files), tuple(refused))


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most `limit` of them; EntryRefused for anything else (never blocks on a FIFO,
    never follows a link, never reads a device)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        reason = f"is {_kind(path)}, not a regular file" if os.path.islink(path) else f"cannot be read ({exc.strerror})"
        raise EntryRefused(path, reason) from None
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise EntryRefused(path, f"is {_kind(path)}, not a regular file")
        if status.st_size > limit:
            raise EntryRefused(path, f"holds {status.st_size} bytes, more than the {limit} any of its kind holds")
        content = file.read(limit + 1)
    if len(content) > limit:  # grew while being read
        raise EntryRefused(path, f"holds more than the {limit} bytes any of its kind holds")
    return content


def tar_members(path: Path, content: bytes, wanted: tuple[str, ...]) -> dict[str, bytes]:
    """The `wanted` regular members of a gzip'd tar, its members inflated at most to MAX_UNPACKED_BYTES all
    together; EntryRefused when it does not open or inflates past that."""
    stream = _Bounded(gzip.GzipFile(fileobj=io.BytesIO(content), mode="rb"), MAX_UNPACKED_BYTES, path)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # a stream: every byte passes the bound once
            found = {}
            for member in tar:
                if member.size > MAX_UNPACKED_BYTES:
                    raise EntryRefused(path, f"its member {member.name[:100]!r} holds {member.size} bytes")
                if member.isfile() and member.name in wanted:
                    if member.name in found:
                        raise EntryRefused(path, f"holds the member {member.name!r} twice")
                    extracted = tar.extractfile(member)
                    found[member.name] = extracted.read() if extracted else b""
            return found
    except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
        raise EntryRefused(path, f"not a readable archive entry ({exc})") from None


class _Bounded(io.RawIOBase):
    """A stream that raises EntryRefused once more than `limit` bytes were read from it."""

    def __init__(self, inner: gzip.GzipFile, limit: int, path: Path):
        self._inner, self._left, self._path = inner, limit, path

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        wanted = self._left + 1 if size < 0 else min(size, self._left + 1)
        data = self._inner.read(wanted)
        self._left -= len(data)
        if self._left < 0:
            raise EntryRefused(self._path, f"inflates to more than {MAX_UNPACKED_BYTES} bytes")
        return data


def _kind(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "gone"
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISDIR, "a folder"),
    )
    return next((name for test, name in kinds if test(mode)), "a regular file")

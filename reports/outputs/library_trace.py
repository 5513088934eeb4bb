"""What a draft shows of a failure's traceback: the frames inside installed packages only, with paths a reader can
follow (`library_trace`), and their last lines without torch's module-call plumbing (`trace_tail`)."""

from __future__ import annotations

import re

LOG_LINES = 40  # the end of the failing cell's message: the traceback's last frames, the rank logs' tail

_PLUMBING = re.compile(r'File "torch/nn/modules/module\.py", line \d+, in (_wrapped_call_impl|_call_impl|inner)$')


def trace_tail(trace: list[str]) -> list[str]:
    """The trace's last LOG_LINES lines without torch's module-call frames and the `^^^` marker lines, cut at a
    frame's start, its first line (`Traceback …`) kept."""
    lines: list[str] = []
    plumbing = False
    for line in trace:
        if line.lstrip().startswith("File "):
            plumbing = bool(_PLUMBING.search(line.strip()))
        elif not line.startswith(" "):
            plumbing = False
        if not plumbing and not _MARKERS.fullmatch(line):
            lines.append(line)
    if len(lines) <= LOG_LINES:
        return lines
    tail = lines[-LOG_LINES:]
    start = next((i for i, line in enumerate(tail) if line.lstrip().startswith("File ")), 0)
    return [lines[0], "  ...", *tail[start:]] if lines[0].startswith("Traceback") else tail[start:]


_MARKERS = re.compile(r"\s*[\^~]+\s*")
_FRAME_LINE = re.compile(r'^\s*File "([^"]+)", line \d+')
# A frame's path up to its package: the host's (`/work/envs/x/lib/python3.11/site-packages/`) or, as records keep it
# (matrix/redaction.py `without_host_paths`), without the host's folders (`site-packages/`).
_PACKAGE_PATH = re.compile(r"(?:(?:[A-Za-z]:)?[\\/][^\s\"']*?[\\/]|(?<![^\s\"']))(?:site|dist)-packages[\\/]")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")


def library_trace(message: str) -> list[str]:
    """A failure's message as a user may see it: the traceback's frames inside installed packages only (the harness's
    own frames, which call init_inference or the forward, dropped), their paths from the package (`deepspeed/…`),
    any other absolute path cut to its file name, the harness's `logs:` and rank lines dropped."""
    kept: list[str] = []
    in_dropped_frame = False
    for line in message.rstrip("\n").splitlines():
        frame = _FRAME_LINE.match(line)
        if frame:
            in_dropped_frame = not _PACKAGE_PATH.search(frame[1])
        elif not line.startswith(" "):
            in_dropped_frame = False
        if in_dropped_frame or line.startswith("logs:") or re.match(r"rank \d+ raised in ", line):
            continue
        kept.append(_ABSOLUTE_PATH.sub(r"\1", _PACKAGE_PATH.sub("", line)))
    return kept

"""Reading a transformers config, and what becomes of one architecture whose config the harness cannot read.

The harness reads configs by attribute name (matrix/derive.py shrinks them, matrix/shapes/ reads the sizes
AutoTP splits). A new architecture can lack a name a reader relies on (deepseek_v4 has `qk_rope_head_dim` but no
`v_head_dim`). Read through `ConfigValues`, such a config raises `UnreadableConfig` naming the reader (file and
function) and the key, and each per-architecture step of expanding the matrix turns it into that architecture's
named skip; any other exception a step raises for one architecture is a harness bug, recorded as an
`ExpansionError` that fails that architecture's cells as `setup`. Either way the other architectures' cells run.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from matrix import PROJECT_ROOT, is_harness_file

UNREADABLE_CONFIG = "unreadable config"
"""How the skip reason of an architecture whose config a reader cannot read begins (the summary lists them)."""


def _where(filename: str, function: str) -> str:
    """`matrix/shapes/real_shape.py:read_shape`: a harness file relative to the project, any other by its name."""
    path = Path(filename).resolve()
    shown = path.relative_to(PROJECT_ROOT) if is_harness_file(filename) else Path(path.name)
    return f"{shown.as_posix()}:{function}"


def _reader(frame: FrameType | None) -> str:
    return _where(frame.f_code.co_filename, frame.f_code.co_name) if frame else "an unknown reader"


class UnreadableConfig(Exception):
    """A config lacks a value a reader of the harness needs, or holds one the reader cannot use."""

    def __init__(self, config: str, key: str, reader: str, value: Any = None, present: bool = False):
        found = f"{config}'s {key!r} is {value!r}, not an integer" if present else f"{config} has no {key!r}"
        super().__init__(f"{found} (read by {reader})")
        self.config, self.key, self.reader = config, key, reader


class ConfigValues(dict[str, Any]):
    """A config's values (`to_dict()`); a key a reader indexes that the config lacks raises UnreadableConfig naming
    that reader (the calling function, found from the frame that indexed) and the key, not a bare KeyError."""

    def __init__(self, values: Mapping[str, Any], config: str):
        super().__init__(values)
        self.config = config
        """The config class's name, for messages."""

    def __missing__(self, key: str) -> Any:
        raise UnreadableConfig(self.config, key, _reader(sys._getframe(1)))

    def integer(self, key: str) -> int:
        """The value of `key`, which must be an integer (not a bool, not None)."""
        reader = _reader(sys._getframe(1))
        if key not in self:
            raise UnreadableConfig(self.config, key, reader)
        value = self[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise UnreadableConfig(self.config, key, reader, value, present=True)
        return value


@dataclass(frozen=True)
class ExpansionError:
    """A harness exception in one architecture's step of expanding the matrix (a harness bug): its cells fail as
    `setup` with it, the other architectures' cells run."""

    step: str
    """The step that raised: `derive` (its tiny config, matrix/derive.py) or `shapes` (its faithful shape,
    matrix/shapes/)."""
    error_type: str
    """The exception's type name."""
    message: str
    """The exception's first line."""
    where: str
    """The deepest harness frame that raised (`matrix/shapes/faithful_rule.py:faithful_sizes`), else the deepest
    frame."""

    @classmethod
    def of(cls, step: str, error: BaseException) -> ExpansionError:
        frames = list(traceback.extract_tb(error.__traceback__))
        own = [frame for frame in frames if is_harness_file(frame.filename)]
        raised = own or frames
        return cls(
            step=step,
            error_type=type(error).__name__,
            message=(str(error).strip().splitlines() or [""])[0][:300],
            where=_where(raised[-1].filename, raised[-1].name) if raised else "",
        )

    def describe(self) -> str:
        return f"expanding the matrix ({self.step}) raised {self.error_type}: {self.message} at {self.where}"


def refusal(error: Exception, limit: int = 300) -> str:
    """`<exception type>: <message>` on one line, at most `limit` characters of the message: why a config class
    refused a config, as a skip reason says it. Every line is kept (a dataclass validator's first line only names
    the validator; the reason is the next one)."""
    return f"{type(error).__name__}: {' '.join(str(error).split())[:limit]}"

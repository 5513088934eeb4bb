"""A failed cell's cause, the record that crosses from the ranks to the cell's record (cells.jsonl, JUnit properties,
the history store) and on to the reports, which group failed cells by it (reports.analysis `CauseGroup`).
suites/verdicts/mechanism.py `cause_of` finds it from what AutoTP did and where the cell broke."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from matrix.json_records import renamed

STORED_NAMES = {"mechanism_key": "key"}
"""A cause's fields stored under another name: every stored cause (cells.jsonl, JUnit properties, the store's
texts, whose ids hash them) names its mechanism key `key`."""
FIELD_NAMES = {stored: name for name, stored in STORED_NAMES.items()}


@dataclass(frozen=True)
class Cause:
    """A failed cell's cause: what AutoTP did where it broke. Cells whose causes have one
    `mechanism_key` are one cause (reports.analysis `CauseGroup`)."""

    mechanism_key: str
    """What groups cells into one cause: the mechanism and where (`router|LinearLayer`, `left whole|norm`), or for a
    failure no mechanism explains, its class and text. Stored as `key` (cells.jsonl, JUnit properties, the store)."""
    words: str
    """The mechanism said for a reader."""
    whose: str
    """Whose bug it is: a key of suites/verdicts/mechanism.py WHOSE (an `Owner`)."""
    evidence: str = ""
    """The source line that makes it that owner's ("" for AutoTP's own bugs located by what AutoTP did, and the
    harness's)."""

    def json_shape(self, written: dict[str, Any]) -> dict[str, Any]:
        """Its stored form (matrix.json_records.write_record): the mechanism key under its stored name, `key`."""
        return renamed(written, STORED_NAMES)

    @staticmethod
    def own_shape(stored: dict[str, Any]) -> dict[str, Any]:
        """`json_shape`'s inverse: a stored cause read back (every history stores `key`)."""
        return renamed(stored, FIELD_NAMES)

"""What every view of a cause states, once: the failed cells that share one cause (`CauseGroup`), written into each
view's own report.json object (`group_in_place`, `group_apart`), and its cells in a few words (`cells_text`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from matrix.json_records import renamed, split_keys
from reports.store import CellKey, JSONObject


@dataclass(frozen=True)
class CauseGroup:
    """The failed cells that share one cause (suites/verdicts/cause.py `Cause`, or for failures recorded before causes
    were kept, one class and masked signature): what every view of a cause states (a root cause, a cause failing now,
    a change since the previous run, reports.analysis `DeltaCause.group`). A view holds it as `group`; report.json
    writes its fields in the view's own object, in the group's place (`group_in_place`)."""

    failure_class: str
    """The class its cells fail with; a cause failing now names every class among its cells, the most cells first
    ("forward, numerics"): a cause keyed by mechanism may hold cells of two classes."""
    masked_signature: str
    """Its first (or example) cell's signature with numbers masked (`mask_signature`); report.json's `cause`."""
    count: int
    """How many cells."""
    cells: tuple[str, ...]
    """The cells' ids, sorted."""
    cells_text: str
    """The cells in a few words (`cells_text`: models with their tp sizes, per variant and dtype)."""

    def json_shape(self, written: JSONObject) -> JSONObject:
        return renamed(written, GROUP_STORED_NAMES)

    @staticmethod
    def own_shape(stored: JSONObject) -> JSONObject:
        return renamed(stored, {stored: name for name, stored in GROUP_STORED_NAMES.items()})


GROUP_STORED_NAMES = {"masked_signature": "cause"}
"""CauseGroup's fields that report.json names otherwise (its key since before the field was renamed)."""
GROUP_KEYS = ("failure_class", "cause", "count", "cells", "cells_text")
"""CauseGroup's fields as report.json names them, which `group_apart` takes out of a view's object."""


def cause_group(failure_class: str, masked_signature: str, cells: list[CellKey]) -> CauseGroup:
    """The group of `cells` (sorted), with their count and text."""
    ordered = sorted(cells)
    return CauseGroup(failure_class, masked_signature, len(ordered), tuple(c.id for c in ordered), cells_text(ordered))


def group_in_place(written: JSONObject) -> JSONObject:
    """A cause view's report.json object (its `json_shape`): its group's fields where the group stands."""
    return {
        key: item
        for name, value in written.items()
        for key, item in (value if name == "group" else {name: value}).items()
    }


def group_apart(stored: JSONObject) -> JSONObject:
    """`group_in_place`'s inverse (a view's `own_shape`)."""
    group, rest = split_keys(stored, GROUP_KEYS)
    return {**rest, "group": group}


def cells_text(cells: list[CellKey]) -> str:
    """`eager fp32: llama tp2/3, qwen2 tp2` — models with their tp sizes, per variant and dtype."""
    tps: dict[tuple[str, str], dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for cell in cells:
        tps[cell.variant, cell.dtype][cell.model].add(cell.tp)
    return "; ".join(
        f"{variant} {dtype}: "
        + ", ".join(f"{model} tp{'/'.join(map(str, sorted(sizes)))}" for model, sizes in sorted(models.items()))
        for (variant, dtype), models in sorted(tps.items())
    )

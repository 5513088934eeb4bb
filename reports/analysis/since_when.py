"""Since when a cause fails, from the points its example cell was run at: the versions that differ from the latest
ones on one axis only (the others at the latest versions), whoever ran them — `nox -s since-when` on a first night
(reports/search/since_when.py), a backfill, a nightly. The answer is read from the history like any other result:

    works at DeepSpeed 0.18.9 / transformers 4.57.6; fails from transformers 5.0.0, at DeepSpeed 0.19.8

"works at" names the newest point of each axis where the cell passes; "fails from" the first failing release a
bisection found above it (reports.search), else the next point tried above it, said so ("fails from transformers
5.25.0, the next release tried": the releases between were not run); an axis whose every tried point fails with the
same cause is "fails at every point tried"; a point where the cell failed otherwise (the model not in that release,
another error) or did not run is "not comparable at". The axis a cause moved on is the one with a working point: the
first night's hint names it (failing_now)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from reports.analysis.history import History
from reports.analysis.signatures import failure_key
from reports.store import AXES, CellKey, Versions

AXIS_NAMES = {"deepspeed": "DeepSpeed", "transformers": "transformers", "torch": "torch"}
"""How an axis is named in text a DeepSpeed maintainer reads."""


@dataclass(frozen=True)
class PointTried:
    """The example cell at one earlier version of one axis, the other axes at the latest versions."""

    axis: str
    version: str
    """The axis's label there (a DeepSpeed git build as 0.19.8@abc1234567)."""
    verdict: str
    """works (passes), fails (the cause's own failure), other (another failure, or flaky) or skip (no verdict)."""


@dataclass(frozen=True)
class SinceWhen:
    """Since when a cause fails, as far as its example cell's earlier points tell."""

    text: str
    """"works at DeepSpeed 0.18.9 / transformers 4.57.6; fails from transformers 5.0.0"; "" where no earlier point
    on one axis was run."""
    moved: tuple[str, ...]
    """The axes with a point where the cell works: the change that broke it lies on them."""
    tried: tuple[PointTried, ...]


NOT_TRIED = SinceWhen("", (), ())

NEXT_TRIED = ", the next release tried"
"""Said after "fails from <release>" where no bisection placed it: the first failing release may lie between."""


def points_tried(history: History, cell: CellKey, key: str) -> list[PointTried]:
    """The cell's points that differ from the latest versions on exactly one axis, oldest first on each axis (the
    history's version order), judged against the cause `key` it fails with at the latest versions."""
    latest = history.latest
    found = []
    for versions in history.version_sets:
        axis = _single_axis(versions, latest)
        status = history.statuses.get((cell, versions))
        if axis is None or status is None:
            continue
        if status.status == "pass":
            verdict = "works"
        elif status.status == "fail" and failure_key(status.failure_class, status.signature, status.cause) == key:
            verdict = "fails"
        else:
            verdict = "skip" if status.status == "skip" else "other"
        found.append(PointTried(axis, versions.label(axis), verdict))
    return found


def since_when(history: History, cell: CellKey, key: str) -> SinceWhen:
    """The text and the axes that moved for a cause shown on `cell` (NOT_TRIED where no earlier point was run)."""
    tried = points_tried(history, cell, key)
    if not tried:
        return NOT_TRIED
    by_axis: dict[str, list[PointTried]] = defaultdict(list)
    for point in tried:
        by_axis[point.axis].append(point)
    works, fails, every, other = [], [], [], []
    for axis in (axis for axis in AXES if axis in by_axis):
        points, name = by_axis[axis], AXIS_NAMES.get(axis, axis)
        working = [point for point in points if point.verdict == "works"]
        if working:
            newest = working[-1]
            works.append(f"{name} {newest.version}")
            fails.append(_failing_above(history, cell, axis, newest.version))
        elif failing := [point.version for point in points if point.verdict == "fails"]:
            every.append(f"{name} {', '.join(failing)}")
        if odd := [point.version for point in points if point.verdict in ("other", "skip")]:
            other.append(f"{name} {', '.join(odd)}")
    parts = []
    if works:
        parts.append(f"works at {' / '.join(works)}; {', '.join(fails)}")
    if every:
        parts.append(f"fails at every point tried: {'; '.join(every)}")
    if other:
        parts.append(f"not comparable at {'; '.join(other)} (another failure or no verdict)")
    moved = tuple(axis for axis in AXES if any(p.verdict == "works" for p in by_axis.get(axis, ())))
    return SinceWhen("; ".join(parts), moved, tuple(tried))


def _failing_above(history: History, cell: CellKey, axis: str, working: str) -> str:
    """ "fails from transformers 5.0.0" (the first bad release a bisection of the transition above the working point
    found) or "fails from transformers 5.25.0, the next release tried" (the releases between neither run nor
    bisected, so the first failing one may be earlier: said, never implied)."""
    name = AXIS_NAMES.get(axis, axis)
    latest = history.latest
    for t in history.transitions:
        if (
            t.cell == cell
            and t.axis == axis
            and t.kind != "fixed"
            and t.before.label(axis) == working
            and t.held_fixed == latest.pins(tuple(a for a in AXES if a != axis))
        ):
            if t.bisection is not None and t.bisection.after:
                return f"fails from {name} {t.bisection.after}"
            return f"fails from {name} {t.after.label(axis)}{NEXT_TRIED}"
    return f"fails from {name} {latest.label(axis)}{NEXT_TRIED}"


def _single_axis(versions: Versions, latest: Versions) -> str | None:
    """The one axis on which versions differ from the latest ones (None: the same, or more than one differs)."""
    differing = [axis for axis in AXES if versions.label(axis) != latest.label(axis)]
    if len(differing) != 1 or versions.python != latest.python:
        return None
    return differing[0]

"""What each page of the atlas shows, computed from the model: a row's newest verdicts and since when, its grids
(DeepSpeed × transformers per torch and python), its transitions grouped; a cause's version sets; a DeepSpeed
release's fixes and breaks by cause; the index's heat map data (run-length encoded, drawn by the page's script)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from packaging.version import InvalidVersion, Version

from reports.analysis import NO_VERDICT_STATUSES, cells_text, count_text
from reports.atlas.model import Atlas, AtlasTransition, Row, Verdict, VersionSet, label_slug
from reports.store import CellKey, JSONObject

STATE_CODES = {"pass": "p", "fail": "f", "flaky": "k", "skip": "s", "unsupported": "u"}
"""A verdict's letter in the heat map; `m` is a family whose cells there both pass and fail, `.` nothing ran."""
MAX_TRANSITION_GROUPS = 120
"""A page lists this many groups of transitions, the rest are counted (atlas.json has every one)."""


def channel(cell: CellKey) -> str:
    return f"{cell.variant} {cell.dtype} tp{cell.tp}"


@dataclass(frozen=True)
class Grid:
    """The version sets of one torch and python as a table: a row per DeepSpeed value, a column per transformers."""

    platform: str
    deepspeed: tuple[str, ...]
    transformers: tuple[str, ...]
    sets: dict[tuple[str, str], VersionSet]


def grids(version_sets: Iterable[VersionSet]) -> list[Grid]:
    by_platform: dict[str, list[VersionSet]] = defaultdict(list)
    for vs in version_sets:
        by_platform[vs.platform].append(vs)
    return [
        Grid(
            platform=platform,
            deepspeed=tuple(dict.fromkeys(vs.deepspeed for vs in members)),
            transformers=tuple(sorted({vs.transformers for vs in members}, key=version_key)),
            sets={(vs.deepspeed, vs.transformers): vs for vs in members},
        )
        for platform, members in by_platform.items()
    ]


def version_key(text: str) -> tuple[int, Version] | tuple[int, str]:
    """Releases by PEP 440, anything else after them."""
    try:
        return (0, Version(text))
    except InvalidVersion:
        return (1, text)


@dataclass(frozen=True)
class Since:
    cell: CellKey
    verdict: Verdict
    at: VersionSet
    deepspeed: str
    """The oldest DeepSpeed value, at the newest version set's transformers, from which on the verdict holds."""
    transformers: str
    """The oldest transformers value, at its DeepSpeed, from which on the verdict holds."""


def newest_verdicts(atlas: Atlas, row: Row) -> list[Since]:
    """Each cell's verdict at the newest version set it has one at, and since which release it holds on each axis."""
    position = {vs.id: index for index, vs in enumerate(atlas.version_sets)}
    found = []
    for cell in row.cells:
        ran = [vs for vs in atlas.version_sets if (cell, vs.id) in atlas.verdicts]
        if not ran:
            continue
        newest = max(ran, key=lambda vs: (version_key(vs.transformers), position[vs.id]))
        verdict = atlas.verdicts[cell, newest.id]
        found.append(
            Since(
                cell,
                verdict,
                newest,
                _since(atlas, cell, verdict, newest, "deepspeed"),
                _since(atlas, cell, verdict, newest, "transformers"),
            )
        )
    return found


def _since(atlas: Atlas, cell: CellKey, verdict: Verdict, at: VersionSet, axis: str) -> str:
    held = [a for a in ("deepspeed", "transformers", "torch", "python") if a != axis]
    line = [vs for vs in atlas.version_sets if all(getattr(vs, a) == getattr(at, a) for a in held)]
    if axis == "transformers":
        line.sort(key=lambda vs: version_key(vs.transformers))
    since = str(getattr(at, axis))
    for vs in reversed(line[: line.index(at)]):
        other = atlas.verdicts.get((cell, vs.id))
        if other is None or other.status in NO_VERDICT_STATUSES:
            continue
        if other != verdict:
            break
        since = str(getattr(vs, axis))
    return since


@dataclass(frozen=True)
class TransitionGroup:
    kind: str
    axis: str
    before: str
    after: str
    cause: str
    cells: str
    held: str
    """The other axes' values it was seen at (transformers for a DeepSpeed change, DeepSpeed for a transformers one)."""
    answers: tuple[str, ...]
    count: int


def transition_groups(transitions: Sequence[AtlasTransition], atlas: Atlas) -> tuple[list[TransitionGroup], int]:
    """Transitions of one kind, axis, range and cause as one line; at most MAX_TRANSITION_GROUPS (and how many more)."""
    sets = {vs.id: vs for vs in atlas.version_sets}
    grouped: dict[tuple[str, str, str, str, str], list[AtlasTransition]] = defaultdict(list)
    for t in transitions:
        grouped[t.kind, t.axis, t.before, t.after, t.cause].append(t)
    groups = []
    for (kind, axis, before, after, cause), members in grouped.items():
        other = "transformers" if axis == "deepspeed" else "deepspeed"
        held = sorted({getattr(sets[t.at], other) for t in members})
        groups.append(
            TransitionGroup(
                kind=kind,
                axis=axis,
                before=before,
                after=after,
                cause=cause,
                cells=cells_text(sorted({t.cell for t in members})),
                held=f"{other} {', '.join(held)}",
                answers=tuple(sorted({t.answer for t in members})),
                count=len(members),
            )
        )
    groups.sort(key=lambda g: (-g.count, g.axis, g.before, g.kind))
    return groups[:MAX_TRANSITION_GROUPS], max(0, len(groups) - MAX_TRANSITION_GROUPS)


@dataclass(frozen=True)
class Release:
    deepspeed: str
    slug: str
    counts: dict[str, int]
    """Cells whose verdict changed into this release from the previous one (at any transformers), by kind."""
    by_cause: list[tuple[str, str, int, str]]
    """(kind, cause id, cells, which cells at which transformers), most cells first."""


def releases(atlas: Atlas) -> list[Release]:
    """Each DeepSpeed value of the atlas with the transitions along DeepSpeed that end at it."""
    values = list(dict.fromkeys(vs.deepspeed for vs in atlas.version_sets))
    sets = {vs.id: vs for vs in atlas.version_sets}
    into: dict[str, list[AtlasTransition]] = defaultdict(list)
    for t in atlas.transitions:
        if t.axis == "deepspeed":
            into[t.after].append(t)
    found = []
    for value in values:
        members = into.get(value, [])
        per_cause: dict[tuple[str, str], list[AtlasTransition]] = defaultdict(list)
        for t in members:
            per_cause[t.kind, t.cause].append(t)
        by_cause = sorted(
            (
                (kind, cause, len({t.cell for t in found}), _cells_at(found, sets))
                for (kind, cause), found in per_cause.items()
            ),
            key=lambda entry: (entry[0], -entry[2], entry[1]),
        )
        counts = {kind: len({t.cell for t in members if t.kind == kind}) for kind in ("fixed", "broke", "class-change")}
        found.append(Release(value, release_slug(value), counts, by_cause))
    return found


def _cells_at(transitions: list[AtlasTransition], sets: dict[str, VersionSet]) -> str:
    return (
        f"{cells_text(sorted({t.cell for t in transitions}))} "
        f"(transformers {', '.join(sorted({sets[t.at].transformers for t in transitions}, key=version_key))})"
    )


def release_slug(deepspeed: str) -> str:
    return label_slug(deepspeed)


def release_text(release: Release) -> str:
    counts = release.counts
    return (
        f"fixed {count_text(counts.get('fixed', 0), 'cell')}, broke {counts.get('broke', 0)}, "
        f"{counts.get('class-change', 0)} changed class"
    )


# ---- The index's heat map ----------------------------------------------------------------------------------------


class HeaderGroup(TypedDict):
    """A DeepSpeed version over the heat map, spanning the version sets in a row that hold it."""

    label: str
    count: int


def heatmap_data(atlas: Atlas) -> JSONObject:
    """Per family and channel (variant, dtype, tp) a run-length string of its state at each version set (the
    atlas's order): `p12f3.40` = 12 version sets pass, 3 fail, 40 not run. The page's script combines the channels
    a filter keeps and draws them; the whole atlas in a few characters per family and channel."""
    channels = sorted({channel(cell) for row in atlas.rows for cell in row.cells})
    index = {name: position for position, name in enumerate(channels)}
    families = []
    for family, rows in atlas.rows_of_family().items():
        per_channel: dict[int, list[CellKey]] = defaultdict(list)
        for row in rows:
            for cell in row.cells:
                per_channel[index[channel(cell)]].append(cell)
        encoded = {
            str(position): run_length([_state(atlas, cells, vs.id) for vs in atlas.version_sets])
            for position, cells in sorted(per_channel.items())
        }
        families.append({"name": family, "page": f"checkpoint/{rows[0].slug}.html", "channels": encoded})
    groups: list[HeaderGroup] = []
    for vs in atlas.version_sets:
        if groups and groups[-1]["label"] == vs.deepspeed:
            groups[-1]["count"] += 1
        else:
            groups.append(HeaderGroup(label=vs.deepspeed, count=1))
    return {
        "sets": [f"DeepSpeed {vs.deepspeed}, transformers {vs.transformers}" for vs in atlas.version_sets],
        "groups": groups,
        "channels": channels,
        "families": families,
    }


def _state(atlas: Atlas, cells: list[CellKey], set_id: str) -> str:
    codes = {STATE_CODES[v.status] for cell in cells if (v := atlas.verdicts.get((cell, set_id))) is not None}
    if not codes:
        return "."
    if "k" in codes:
        return "k"
    if {"p", "f"} <= codes:
        return "m"
    return "f" if "f" in codes else "p" if "p" in codes else "s"


def run_length(states: list[str]) -> str:
    runs: list[tuple[str, int]] = []
    for state in states:
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1] + 1)
        else:
            runs.append((state, 1))
    return "".join(f"{state}{count if count > 1 else ''}" for state, count in runs)

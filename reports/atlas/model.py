"""What the atlas says: every cell's verdict at every version set of the archive, by real checkpoint (faithful
cells: the hub ids their records carry), architecture (faithful cells at config-class defaults) and stress shapes;
every cause (failure class and cause, as "Failing now" and publish's issues group them: the same id); every
transition along each axis with the archived answer; every DeepSpeed release's fixes and breaks. Built from the
history of the archive alone (reports/atlas/reading.py), so the same archive gives the same atlas.

`atlas_json` is its form for tools (atlas.json): keyed by stable ids, so a new version set adds entries and changes
nothing else; the pages (reports/atlas/pages.py) render the same model."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from matrix.known_failures import KnownFailure
from matrix.registry import load_models
from reports.analysis import (
    Transition,
    answer_words,
    cause_id,
    frame_files,
    mask_signature,
    plain_link,
    repro_command,
    shape_of,
)
from reports.atlas.reading import ArchiveHistory
from reports.outputs import transition_entry
from reports.store import AXES, GITHUB_REPOSITORY, CellKey, JSONObject, Versions
from suites.verdicts.vocabulary import FAILURE_CLASSES

FORMAT = "autotp-atlas/1"
AXIS_PREFIX = {"deepspeed": "ds", "transformers": "tf", "torch": "pt", "python": "py"}


# A part of a name its slug spells as it is: letters, digits, `_`, and `.`/`-` inside (never first or last, no `--`).
_PLAIN_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?", re.ASCII)
# A version label its slug spells as it is: the same without `-` (a version set's id joins its labels with `-`).
_PLAIN_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._+]*[A-Za-z0-9_])?", re.ASCII)


def slug(text: str) -> str:
    """A file-name-safe, stable spelling of a name, one per name: `meta-llama/Meta-Llama-3-8B` ->
    `meta-llama--Meta-Llama-3-8B`. A name that spelling would lose something of (a `-`, `.` or `/` first or last,
    `--`, any other character) is escaped whole (`_escaped`), so `X/Y-` never shares `X/Y`'s page."""
    parts = text.split("/")
    if all(_PLAIN_PART.fullmatch(part) and "--" not in part for part in parts):
        return "--".join(parts)
    return _escaped(text)


def label_slug(label: str) -> str:
    """A version label's slug: `0.19.8` and `2.13.0+cpu` as they are; anything else (`0.19.8-`,
    `0.19.9+abc@abc1234567`) escaped, so no two labels, and no two version sets, share an id."""
    return label if _PLAIN_LABEL.fullmatch(label) else _escaped(label)


def _escaped(text: str) -> str:
    """`~`, then the name's UTF-8 bytes: letters, digits and `_` as they are, every other byte as `~` and two hex
    digits. No plain slug holds a `~`, and no escaped one a `-` or `.`: distinct names, distinct slugs."""
    kept = {ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"}
    return "~" + "".join(chr(byte) if byte in kept else f"~{byte:02x}" for byte in text.encode())


@dataclass(frozen=True)
class VersionSet:
    id: str
    """`ds0.19.8-tf5.24.0-pt2.13.0-py3.11.7`: its labels, each with its axis's prefix."""
    deepspeed: str
    """DeepSpeed's label: a release, or a git build as `0.19.9+abc@abc1234567`."""
    transformers: str
    torch: str
    python: str

    @classmethod
    def of(cls, versions: Versions) -> VersionSet:
        labels = {axis: versions.label(axis) for axis in AXES}
        return cls(id="-".join(AXIS_PREFIX[axis] + label_slug(labels[axis]) for axis in AXES), **labels)

    @property
    def platform(self) -> str:
        """What every version set of one grid shares: torch and python."""
        return f"torch {self.torch}, python {self.python}"


@dataclass(frozen=True)
class Verdict:
    status: str
    """pass, fail, flaky (passed and failed at these versions) or skip."""
    failure_class: str = ""
    cause: str = ""
    """The cause's id where it failed."""


@dataclass(frozen=True)
class Row:
    """A page: a real checkpoint, an architecture at config-class defaults, or an architecture under stress shapes."""

    slug: str
    title: str
    family: str
    """The model type the registry files it under (llama_large is llama); a derived architecture is its own."""
    kind: str
    """checkpoint | architecture | stress."""
    cells: tuple[CellKey, ...]


@dataclass(frozen=True)
class AtlasCause:
    """One cause as the atlas shows it: its failing cells at every version set they fail at (atlas.json's
    "causes", a cause page)."""

    id: str
    failure_class: str
    masked_signature: str
    """The signature with numbers masked (reports.analysis.mask_signature); atlas.json's `cause`."""
    mechanism: str
    upstream: str
    """The issue or PR tracking it: its known failure's, else the PR an archived answer names (first bad or first
    good, in that axis's repository); "" if none."""
    known: str
    """The known failure (matrix/known_failures.toml) covering it, or ""."""
    cells: tuple[CellKey, ...]
    version_sets: tuple[str, ...]
    """The version sets it fails at, in the atlas's order."""
    rows: tuple[str, ...]
    example: CellKey
    example_at: str
    """A version set of the example's failure: the newest."""


@dataclass(frozen=True)
class AtlasTransition:
    kind: str
    """broke, fixed or class-change."""
    cell: CellKey
    axis: str
    before: str
    after: str
    at: str
    """The version set after the change."""
    cause: str
    """The failing end's cause id."""
    answer: str
    """The narrowest range and the commit/PR found (reports.analysis.answer_words), or why there is none."""
    pr: int | None
    commit: str


@dataclass(frozen=True)
class Atlas:
    version_sets: tuple[VersionSet, ...]
    """Oldest first, in the history's version order."""
    rows: tuple[Row, ...]
    verdicts: Mapping[tuple[CellKey, str], Verdict]
    """By cell and version set id."""
    causes: Mapping[str, AtlasCause]
    transitions: tuple[AtlasTransition, ...]
    runs: int
    newest_started: str

    def rows_of_family(self) -> dict[str, list[Row]]:
        families: dict[str, list[Row]] = defaultdict(list)
        for row in self.rows:
            families[row.family].append(row)
        return dict(sorted(families.items()))


def build_atlas(archived: ArchiveHistory, known: Mapping[str, KnownFailure]) -> Atlas:
    history = archived.history
    sets = {versions: VersionSet.of(versions) for versions in history.version_sets}
    rows = _rows(history.cells, archived.checkpoints)
    cells_rows: dict[CellKey, list[str]] = defaultdict(list)
    for row in rows:
        for cell in row.cells:
            cells_rows[cell].append(row.slug)
    verdicts: dict[tuple[CellKey, str], Verdict] = {}
    failing: dict[tuple[str, str], list[tuple[CellKey, Versions]]] = defaultdict(list)
    for (cell, versions), status in history.statuses.items():
        if status.status == "fail":
            masked_signature = mask_signature(status.signature)
            failing[status.failure_class, masked_signature].append((cell, versions))
            verdicts[cell, sets[versions].id] = Verdict(
                "fail", status.failure_class, cause_id(status.failure_class, masked_signature)
            )
        else:
            verdicts[cell, sets[versions].id] = Verdict(status.status)
    order = {versions: index for index, versions in enumerate(history.version_sets)}
    transitions = tuple(_transition(t, sets) for t in history.transitions)
    answered = {t.cause: _pr_url(t.axis, t.pr) for t in transitions if t.pr}
    causes = {}
    for (failure_class, masked_signature), points in sorted(failing.items()):
        identity = cause_id(failure_class, masked_signature)
        newest = max(points, key=lambda point: (order[point[1]], point[0]))
        covering = _known(known, failure_class, masked_signature, points)
        upstream = covering.upstream if covering else answered.get(identity, "")
        causes[identity] = AtlasCause(
            id=identity,
            failure_class=failure_class,
            masked_signature=masked_signature,
            mechanism=mechanism(failure_class, masked_signature, covering),
            upstream=upstream,
            known=covering.name if covering else "",
            cells=tuple(sorted({cell for cell, _ in points})),
            version_sets=tuple(sets[v].id for v in sorted({v for _, v in points}, key=order.__getitem__)),
            rows=tuple(sorted({row for cell, _ in points for row in cells_rows[cell]})),
            example=newest[0],
            example_at=sets[newest[1]].id,
        )
    return Atlas(
        version_sets=tuple(sets[versions] for versions in history.version_sets),
        rows=rows,
        verdicts=verdicts,
        causes=causes,
        transitions=transitions,
        runs=archived.runs,
        newest_started=archived.newest_started,
    )


def _rows(cells: list[CellKey], checkpoints: Mapping[CellKey, tuple[str, ...]]) -> tuple[Row, ...]:
    registry = load_models()
    members: dict[tuple[str, str, str], list[CellKey]] = defaultdict(list)
    for cell in cells:
        entry, shape = shape_of(cell.model)
        family = registry[entry].model_type if entry in registry else entry
        hub_ids = checkpoints.get(cell, ()) if shape == "faithful" else ()
        for hub_id in hub_ids:
            members["checkpoint", hub_id, family].append(cell)
        if not hub_ids:
            members["architecture" if shape == "faithful" else "stress", entry, family].append(cell)
    rows = [
        Row(
            slug=slug(name) if kind == "checkpoint" else f"{kind}-{slug(name)}",
            title=name
            if kind == "checkpoint"
            else f"{name} ({'config-class defaults' if kind == 'architecture' else 'stress shapes'})",
            family=family,
            kind=kind,
            cells=tuple(sorted(found, key=lambda c: (c.variant, c.dtype, c.tp, c.model))),
        )
        for (kind, name, family), found in members.items()
    ]
    return tuple(sorted(rows, key=lambda row: (row.family, row.kind != "checkpoint", row.title.lower())))


def _transition(transition: Transition, sets: Mapping[Versions, VersionSet]) -> AtlasTransition:
    failing = transition.failing_end
    answer = transition.bisection
    return AtlasTransition(
        kind=transition.kind,
        cell=transition.cell,
        axis=transition.axis,
        before=transition.before.label(transition.axis),
        after=transition.after.label(transition.axis),
        at=sets[transition.after].id,
        cause=cause_id(failing.failure_class, mask_signature(failing.signature)),
        answer=answer_words(transition_entry(transition), plain_link),
        pr=answer.pr if answer else None,
        commit=answer.commit if answer else "",
    )


def _known(
    known: Mapping[str, KnownFailure], failure_class: str, text: str, points: list[tuple[CellKey, Versions]]
) -> KnownFailure | None:
    """The known failure covering the most of a cause's failing points, or None."""
    covered = {
        name: sum(
            entry.covers(failure_class, text, cell.model, cell.variant, {a: getattr(v, a) for a in AXES})
            for cell, v in points
        )
        for name, entry in known.items()
    }
    best = max(covered, key=lambda name: (covered[name], name), default=None)
    return known[best] if best is not None and covered[best] else None


def _pr_url(axis: str, pr: int) -> str:
    return f"https://github.com/{GITHUB_REPOSITORY[axis]}/pull/{pr}" if axis in GITHUB_REPOSITORY else ""


def mechanism(failure_class: str, text: str, known: KnownFailure | None) -> str:
    """The cause in words: what the class means, what was raised or differed, where; the known failure's note."""
    what, _, where = text.partition(" @ ")
    files = frame_files(text)
    words = f"{FAILURE_CLASSES.get(failure_class, failure_class)}: {what.strip()}"
    if where:
        words += f", at {where.strip()}" + (
            " (DeepSpeed's code)" if files and files[0].startswith("deepspeed/") else ""
        )
    return f"{words}. {known.note}" if known and known.note else words


def cause_repro(example: CellKey, at: VersionSet) -> str:
    """The command that runs the cause's example cell at the version set it failed at."""
    pins = f"deepspeed={at.deepspeed.split('@')[0]},transformers={at.transformers}"
    return f"AUTOTP_PINS={pins} {repro_command(example)}"


def verdict_code(verdict: Verdict) -> str:
    """atlas.json's spelling of a verdict: `pass`, `flaky`, `skip`, or `fail <class> <cause id>`."""
    return f"fail {verdict.failure_class} {verdict.cause}" if verdict.status == "fail" else verdict.status


def atlas_json(atlas: Atlas) -> JSONObject:
    """atlas.json: every entry keyed by a stable id, lists in a stable order (a new version set adds entries)."""
    return {
        "format": FORMAT,
        "archive": {"runs": atlas.runs, "newest_run_started": atlas.newest_started},
        "version_sets": {
            vs.id: {"deepspeed": vs.deepspeed, "transformers": vs.transformers, "torch": vs.torch, "python": vs.python}
            for vs in atlas.version_sets
        },
        "rows": {
            row.slug: {
                "title": row.title,
                "family": row.family,
                "kind": row.kind,
                "page": f"checkpoint/{row.slug}.html",
                "verdicts": {
                    cell.id: {
                        vs.id: verdict_code(verdict)
                        for vs in atlas.version_sets
                        if (verdict := atlas.verdicts.get((cell, vs.id))) is not None
                    }
                    for cell in row.cells
                },
            }
            for row in atlas.rows
        },
        "causes": {
            c.id: {
                "failure_class": c.failure_class,
                "cause": c.masked_signature,
                "mechanism": c.mechanism,
                "upstream": c.upstream,
                "known": c.known,
                "page": f"cause/{c.id}.html",
                "cells": [cell.id for cell in c.cells],
                "version_sets": list(c.version_sets),
            }
            for c in atlas.causes.values()
        },
        "transitions": sorted(
            (
                {
                    "kind": t.kind,
                    "cell": t.cell.id,
                    "axis": t.axis,
                    "before": t.before,
                    "after": t.after,
                    "at": t.at,
                    "cause": t.cause,
                    "answer": t.answer,
                }
                for t in atlas.transitions
            ),
            key=lambda t: (t["at"], t["cell"], t["axis"]),
        ),
    }

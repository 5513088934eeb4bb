"""Failing now, by cause: the first section of every report when cells fail at the latest versions.

The failing cells at the latest versions are grouped by failure class and cause (reports.analysis.signatures.cause: the
signature with every number masked, so "rank 0 holds 6.75 of 6.75 MiB" and "4.5 of 4.5 MiB" are one cause).
Each cause says since when it fails (the oldest version set in the history where the same cause appears, or
"since the first run"), the answer triage found for the transitions that brought it into the latest versions,
whether it is known upstream (matrix/known_failures.toml: "known" with the link, else "new"), and the one
command that reproduces a representative cell. An open known failure whose cells pass at the latest versions
is listed as "fixed at <version>: close <link>"; a fixed one that fails again at or after its fix as "reopen".

Built into the report model (reports.outputs.model.build_report) as report.json's form of the section, and rendered from
the Report, so report.md, report.html and the step summary say the same; `cause_id` is the one publish's issues
carry for the same class and cause."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

from matrix.cells import replay_name
from matrix.registry import KnownFailure, RegistryError, load_models, load_popularity
from reports.store import AXES, Aggregates, CellKey, ResultGroup, Versions, release, started_order
from reports.analysis.causes import RootCause, by_kind, cause_id, cells_text, typed_members
from reports.analysis.checkpoints import cell_checkpoints
from reports.analysis.history import History, Transition
from reports.analysis.signatures import cause

_UPSTREAM = re.compile(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)")
_UPSTREAM_PAGE = re.compile(r"https://github\.com/([^/]+/[^/]+)/blob/[0-9a-f]+/(?:[^#]+/)?([^/#]+)\.md(?:#.*)?")
STATUS_ORDER = ("new", "known", "unsupported")
"""A cause's status: no known failure covers it, an upstream issue tracks it, or DeepSpeed documents the model as
unsupported by AutoTP (matrix/registry.py KNOWN_FAILURE_STATES): listed in this order."""


def log_folder(cell: str) -> str:
    """Where a results folder keeps a failing cell's rank logs, relative to it (and to the report beside it)."""
    return f"logs/{cell}/"


def repro_file(cell: str) -> str:
    """Where a results folder keeps a failing cell's standalone repro script, relative to it."""
    return f"repro/repro_{cell}.py"


def draft_file(failure_class: str, cause: str) -> str:
    """Where a cause's draft issue for DeepSpeed's tracker is written, relative to the results folder."""
    return f"draft-issue/{failure_class}-{cause}.md"


@dataclass(frozen=True)
class ResultFiles:
    """What the results folder the report is written to holds for the cells failing at the latest versions
    (log_folder, repro_file, draft_file): a report names a file only when it is there."""

    logs: frozenset[str] = frozenset()
    """Cells whose rank logs are kept."""
    repro: frozenset[str] = frozenset()
    """Cells whose repro script is written."""

    def log(self, cell: str) -> str:
        return log_folder(cell) if cell in self.logs else ""

    def script(self, cell: str) -> str:
        return repro_file(cell) if cell in self.repro else ""


def example_cell(
    cells: list[CellKey], checkpoints: dict[CellKey, tuple[str, ...]], popularity: tuple[str, ...]
) -> CellKey:
    """The cell a cause is shown on: the one standing for the checkpoint users run most (the registry's
    popularity order), then one whose architecture's checkpoints rank highest, then the smallest tp."""
    rank = {hub_id: place for place, hub_id in enumerate(popularity)}
    hub_ids = registry_hub_ids()

    def best(ids: tuple[str, ...]) -> int:
        return min((rank.get(hub_id, len(rank)) for hub_id in ids), default=len(rank) + 1)

    return min(
        cells,
        key=lambda c: (
            best(checkpoints.get(c, ())),
            best(hub_ids.get(c.model.split(".", 1)[0], ())),
            c.tp,
            c.model,
            c.variant,
            c.dtype,
        ),
    )


def registry_hub_ids() -> dict[str, tuple[str, ...]]:
    """Each registry entry's hub ids ({} where the registry cannot be read: then no entry ranks above another)."""
    try:
        return {name: entry.hub_ids for name, entry in load_models().items()}
    except RegistryError:
        return {}


def repro_command(cell: CellKey) -> str:
    """The one command that runs this cell alone, with its verdict and a standalone repro script."""
    return (
        f"nox -s repro -- --models {replay_name(cell.model)} --variants {cell.variant} --dtypes {cell.dtype} "
        f"--tp {cell.tp}"
    )


def upstream_label(url: str) -> str:
    """ "deepspeedai/DeepSpeed#8185" for an issue or pull request URL, "deepspeedai/DeepSpeed
    automatic-tensor-parallelism page" for a documentation page."""
    match = _UPSTREAM.fullmatch(url)
    if match:
        return f"{match[1]}#{match[2]}"
    page = _UPSTREAM_PAGE.fullmatch(url)
    return f"{page[1]} {page[2]} page" if page else url


# ---- The section (report.json "failing_now": asdict of FailingNow) ------------------------------------------------


@dataclass(frozen=True)
class FirstSeen:
    """Since when a cause fails: the text a report prints, and the run and versions where it was first seen."""

    text: str
    run: str
    started: str
    versions: str


@dataclass(frozen=True)
class Repro:
    """The cell a cause is shown on (example_cell), the command that runs it alone, and its files in the results
    folder (ResultFiles; "" where it holds none)."""

    cell: str
    command: str
    logs: str
    """Its rank logs' folder, relative to the report."""
    script: str = ""
    """Its standalone repro script, relative to the report."""
    checkpoints: tuple[str, ...] = ()
    """The real checkpoints it stands for (faithful shapes; none for stress or config-default sizes)."""


@dataclass(frozen=True)
class CellFiles:
    """One failing cell of a cause with what the results folder holds for it (relative to the report; "" none)."""

    cell: str
    logs: str
    script: str
    checkpoints: tuple[str, ...]
    """The real checkpoints it stands for."""


@dataclass(frozen=True)
class KnownMatch:
    """The known failure (matrix/known_failures.toml) that covers cells of a cause, and which of them."""

    name: str
    upstream: str
    label: str  # "deepspeedai/DeepSpeed#8185"
    state: str
    fixed_in: str
    note: str
    cells: tuple[str, ...]
    # A fix upstream that the latest versions include, yet the cells fail: the issue needs reopening.
    fails_after_fix: bool


@dataclass(frozen=True)
class FailingCause:
    """The cells failing at the latest versions with one failure class and cause."""

    id: str
    failure_class: str
    cause: str
    count: int
    cells: tuple[str, ...]
    cells_text: str
    since: FirstSeen
    root_causes: tuple[str, ...]  # the ids of the root causes that brought these cells into the latest versions
    status: str  # one of STATUS_ORDER: "known"/"unsupported" when a known failure covers some of its cells
    known: KnownMatch | None
    repro: Repro
    members: tuple[CellFiles, ...] = ()
    """Each of its cells with its files (cells's order)."""
    draft: str = ""
    """Its draft issue for DeepSpeed's tracker, relative to the report ("" where none is written: render writes one
    per cause DeepSpeed can fix, reports.outputs.cell_files)."""


@dataclass(frozen=True)
class FixedKnown:
    """An open known failure whose cells pass at the latest versions: the upstream issue can be closed."""

    name: str
    upstream: str
    label: str
    state: str
    fixed_in: str
    note: str
    cells: tuple[str, ...]
    fails_after_fix: bool
    cells_text: str
    failure_class: str
    fixed_at: str  # "deepspeed 0.19.6": where the fix transitions land (the bisected release when triaged)
    last_failing: str  # "" where no transition places it
    bisected: bool


@dataclass(frozen=True)
class FailingNow:
    cells: int
    causes: tuple[FailingCause, ...]  # new ones first, then the most cells first
    fixed_known: tuple[FixedKnown, ...]
    backfill: str = ""
    """On a first night (one version set, every cause since the first run): the command that gives the history
    since when each cause fails and which change broke it, for the cells this run had; "" otherwise."""

    @classmethod
    def from_json(cls, section: dict) -> FailingNow:
        return cls(
            backfill=section["backfill"],
            cells=section["cells"],
            causes=tuple(
                FailingCause(
                    **{
                        **c,
                        "cells": tuple(c["cells"]),
                        "since": FirstSeen(**c["since"]),
                        "root_causes": tuple(c["root_causes"]),
                        "known": _known_from_json(c["known"]) if c["known"] else None,
                        "repro": Repro(**{**c["repro"], "checkpoints": tuple(c["repro"]["checkpoints"])}),
                        "members": tuple(
                            CellFiles(**{**m, "checkpoints": tuple(m["checkpoints"])}) for m in c["members"]
                        ),
                    }
                )
                for c in section["causes"]
            ),
            fixed_known=tuple(FixedKnown(**{**f, "cells": tuple(f["cells"])}) for f in section["fixed_known"]),
        )


def _known_from_json(known: dict) -> KnownMatch:
    return KnownMatch(**{**known, "cells": tuple(known["cells"])})


def build_failing_now(
    root_causes: tuple[RootCause, ...],
    history: History,
    aggregates: Aggregates,
    known: dict[str, KnownFailure],
    files: ResultFiles = ResultFiles(),
) -> FailingNow:
    """report.json "failing_now": the causes of the cells failing at the latest versions (new ones first, then
    the most cells first) and the open known failures whose cells pass there now; `files`: what the results folder
    holds for them."""
    latest = history.latest
    failing: dict[tuple[str, str], list[CellKey]] = defaultdict(list)
    for (cell, versions), status in history.statuses.items():
        if versions == latest and status.status == "fail":
            failing[status.failure_class, cause(status.signature)].append(cell)
    first_seen = _first_seen(aggregates, history)
    transitions = by_kind(history.transitions)
    first_run = aggregates.first_run.run_id
    at_latest = _versions(latest)
    causes: list[FailingCause] = []
    checkpoints = cell_checkpoints(aggregates, history)
    popularity = _popularity()
    for (failure_class, text), cells in failing.items():
        cells = sorted(cells)
        representative = example_cell(cells, checkpoints, popularity)
        match = _known_for(known, failure_class, text, cells, at_latest)
        identity = cause_id(failure_class, text)
        causes.append(
            FailingCause(
                id=identity,
                failure_class=failure_class,
                cause=text,
                count=len(cells),
                cells=tuple(cell.id for cell in cells),
                cells_text=cells_text(cells),
                since=_since(first_seen[failure_class, text], first_run, latest),
                root_causes=tuple(_root_causes(root_causes, transitions, latest, failure_class, text, set(cells))),
                status=_status(match, len(cells)),
                known=match,
                repro=Repro(
                    cell=representative.id,
                    command=repro_command(representative),
                    logs=files.log(representative.id),
                    script=files.script(representative.id),
                    checkpoints=checkpoints.get(representative, ()),
                ),
                members=tuple(
                    CellFiles(cell.id, files.log(cell.id), files.script(cell.id), checkpoints.get(cell, ()))
                    for cell in cells
                ),
            )
        )
    causes.sort(key=lambda c: (STATUS_ORDER.index(c.status), -c.count, c.failure_class, c.cause))
    first_night = len(history.version_sets) == 1 and all(c.since.run == first_run for c in causes)
    return FailingNow(
        cells=sum(c.count for c in causes),
        causes=tuple(causes),
        fixed_known=tuple(_fixed_known(history, aggregates, known)),
        backfill=backfill_command([cell for cell, versions in history.statuses if versions == latest])
        if first_night and causes
        else "",
    )


BACKFILL_AXIS = "deepspeed"


def backfill_command(cells: list[CellKey]) -> str:
    """`nox -s backfill` for these cells along DeepSpeed from its oldest supported release (matrix/versions.toml
    `min`): the selection options name what differs from the default matrix's (every registry entry, faithful
    shapes, eager fp32), the tp sizes always."""
    from matrix.versions import load_config  # the axes' rules live with the version axes

    rule = load_config().axes[BACKFILL_AXIS]
    entries = sorted({cell.model.split(".", 1)[0] for cell in cells})
    shapes = sorted({"faithful" if "." in cell.model else "stress" for cell in cells})
    variants, dtypes = sorted({cell.variant for cell in cells}), sorted({cell.dtype for cell in cells})
    options = [f"--axis {BACKFILL_AXIS}", f"--since {rule.min}" if rule.min else ""]
    registry = set(registry_hub_ids())
    options.append("" if registry and set(entries) == registry else f"--models {','.join(entries)}")
    options.append("" if shapes == ["faithful"] else f"--shapes {','.join(shapes)}")
    options.append("" if variants == ["eager"] else f"--variants {','.join(variants)}")
    options.append("" if dtypes == ["fp32"] else f"--dtypes {','.join(dtypes)}")
    options.append(f"--tp {','.join(map(str, sorted({cell.tp for cell in cells})))}")
    return "nox -s backfill -- " + " ".join(option for option in options if option)


def _versions(versions: Versions) -> dict[str, str]:
    return {axis: getattr(versions, axis) for axis in AXES}


def _status(match: KnownMatch | None, cells: int) -> str:
    """new, known (an upstream issue covers some of the cells) or unsupported (DeepSpeed documents every one of its
    models as unsupported; a cause with other cells too is new for them)."""
    if match is None:
        return "new"
    if match.state != "unsupported":
        return "known"
    return "unsupported" if len(match.cells) == cells else "new"


def _popularity() -> tuple[str, ...]:
    try:
        return load_popularity()
    except RegistryError:  # the example is then the smallest tp's cell
        return ()


def _first_seen(aggregates: Aggregates, history: History) -> dict[tuple[str, str], ResultGroup]:
    """Per failure class and cause, its failures at the oldest version set of the history (in the history's version
    order) that hold the earliest run there (of two as early, the smaller run id, then the first cell)."""
    order = {versions: index for index, versions in enumerate(history.version_sets)}
    first: dict[tuple[str, str], tuple[tuple, ResultGroup]] = {}
    for group in aggregates.groups:
        if group.outcome != "fail":
            continue
        key = group.failure_class, cause(group.signature)
        rank = order[group.versions], *started_order(group.earliest), group.cell
        known = first.get(key)
        if known is None or rank < known[0]:
            first[key] = rank, group
    return {key: group for key, (_, group) in first.items()}


def _since(first: ResultGroup, first_run: str, latest: Versions) -> FirstSeen:
    """Since when a cause fails: "the first run", the versions where it first appears where they differ from the
    latest ones, or the day it first appeared at the latest versions."""
    run = first.earliest
    if run.run_id == first_run:
        text = "since the first run"
    elif first.versions != latest:
        changed = [
            f"{axis} {first.versions.label(axis)}" for axis in AXES if first.versions.label(axis) != latest.label(axis)
        ]
        text = f"since {', '.join(changed)} (first seen {run.started[:10]})"
    else:
        text = f"since {run.started[:10]} (session {run.session})"
    return FirstSeen(text=text, run=run.run_id, started=run.started, versions=first.versions.describe())


def _root_causes(
    root_causes: tuple[RootCause, ...],
    transitions: dict[str, list[Transition]],
    latest: Versions,
    failure_class: str,
    text: str,
    cells: set[CellKey],
) -> list[str]:
    """The root causes (reports.analysis.causes) whose transitions (`transitions`: the history's, by kind) brought these cells
    into the latest versions failing this way: broke, or changed failure class, on one axis with the others at the
    latest versions."""
    ids = []
    for root in root_causes:
        if root.kind == "fixed":
            continue
        for t in typed_members(transitions, root):
            failing = t.failing_end
            if (
                t.cell in cells
                and failing.failure_class == failure_class
                and cause(failing.signature) == text
                and t.after.label(t.axis) == latest.label(t.axis)
                and t.held_fixed == latest.pins(tuple(a for a in AXES if a != t.axis))
            ):
                ids.append(root.id)
                break
    return ids


def _known_match(entry: KnownFailure, cells: list[CellKey], latest: dict[str, str]) -> KnownMatch:
    axis, _, fixed_version = entry.fixed_in.partition(" ")
    here = release(latest.get(axis, "")) if entry.fixed_in else None
    return KnownMatch(
        name=entry.name,
        upstream=entry.upstream,
        label=upstream_label(entry.upstream),
        state=entry.state,
        fixed_in=entry.fixed_in,
        note=entry.note,
        cells=tuple(cell.id for cell in cells),
        fails_after_fix=bool(here is not None and (fixed := release(fixed_version)) is not None and here >= fixed),
    )


def _known_for(
    known: dict[str, KnownFailure], failure_class: str, text: str, cells: list[CellKey], latest: dict[str, str]
) -> KnownMatch | None:
    """The known failure that covers the most of these cells at the latest versions, or None: a new cause."""
    covered = {
        entry.name: [c for c in cells if entry.covers(failure_class, text, c.model, c.variant, latest)]
        for entry in known.values()
    }
    best = max(covered, key=lambda name: len(covered[name]), default=None)
    return _known_match(known[best], covered[best], latest) if best and covered[best] else None


def _fixed_known(history: History, aggregates: Aggregates, known: dict[str, KnownFailure]) -> list[FixedKnown]:
    """Open known failures seen in the history whose cells all pass where they ran at the latest versions: fixed at
    the version where their cells' fix transitions land (the bisected release when triage answered), or at the
    latest versions when no transition places it. A cell that fails there in any way keeps the entry open."""
    latest = history.latest
    fixed = []
    for entry in known.values():
        if entry.state != "open":
            continue
        seen = sorted(
            {
                group.cell
                for group in aggregates.groups
                if group.outcome == "fail"
                and entry.covers(
                    group.failure_class,
                    cause(group.signature),
                    group.cell.model,
                    group.cell.variant,
                    _versions(group.versions),
                )
            }
        )
        now = [history.statuses.get((cell, latest)) for cell in seen]
        if not seen or any(s is not None and s.status in ("fail", "flaky") for s in now):
            continue
        passing = [cell for cell, s in zip(seen, now) if s is not None and s.status == "pass"]
        if not passing:
            continue  # not run at the latest versions: nothing says it is fixed
        places: Counter[tuple[str, str, bool]] = Counter()
        for t in history.transitions:
            if t.kind == "fixed" and t.cell in passing and t.after == latest:
                b = t.bisection
                places[
                    (f"{b.axis} {b.after}", f"{b.axis} {b.before}", True)
                    if b
                    else (f"{t.axis} {t.after.label(t.axis)}", f"{t.axis} {t.before.label(t.axis)}", False)
                ] += 1
        (fixed_at, last_failing, bisected), _ = (
            places.most_common(1)[0] if places else ((latest.describe(), "", False), 0)
        )
        fixed.append(
            FixedKnown(
                **asdict(_known_match(entry, passing, _versions(latest))),
                cells_text=cells_text(passing),
                failure_class=entry.failure_class,
                fixed_at=fixed_at,
                last_failing=last_failing,
                bisected=bisected,
            )
        )
    return fixed

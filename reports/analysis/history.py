"""Per-cell status at each version set, and transitions along each version axis."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import TypeVar

from packaging.version import Version

from reports import ReportsError
from reports.analysis.signatures import failure_key
from reports.analysis.statuses import (
    CellStatus,
    harness_ranks_of_groups,
    keep_earliest,
    listed,
    point_status_of_groups,
)
from reports.clones import GitRepo, commits_between, deepspeed_order
from reports.store import (
    AXES,
    Aggregates,
    Bisection,
    BisectMode,
    CellKey,
    Commit,
    Observation,
    Pins,
    ResultGroup,
    TransitionKind,
    TriageAttempt,
    Versions,
    aggregate,
    release,
    started_order,
)


@dataclass(frozen=True)
class Transition:
    kind: TransitionKind
    cell: CellKey
    axis: str
    before: Versions  # last good (broke), last bad (fixed) or last with the old class
    after: Versions
    before_status: CellStatus
    after_status: CellStatus
    commits: tuple[Commit, ...] = ()  # only for DeepSpeed transitions, when a clone is given
    bisection: Bisection | None = None  # the newest `reports.search.bisect` answer inside this transition's range
    attempt: TriageAttempt | None = None  # without an answer: why triage could not find one, if it tried

    @property
    def mode(self) -> BisectMode:
        """The bisection that answers this transition: broken (broke, and a class change: where the new
        failure broke in, the old one standing for "good") or fixed (fixed)."""
        return _BISECTION_MODE[self.kind]

    @property
    def held_fixed(self) -> Pins:
        """The other axes' versions (the same at both ends)."""
        return self.after.pins(tuple(axis for axis in AXES if axis != self.axis))

    @property
    def failing_end(self) -> CellStatus:
        """The end that carries the failure this transition is about: before for a fix, else after (a class
        change's new failure). The one rule: causes, triage, publish and the report ask here."""
        return self.before_status if self.kind == "fixed" else self.after_status

    @property
    def failing_versions(self) -> Versions:
        return self.before if self.kind == "fixed" else self.after

    @property
    def failure_class_text(self) -> str:
        """The failing end's class; a class change names both ("numerics → shard")."""
        failing = self.failing_end.failure_class
        return f"{self.before_status.failure_class} → {failing}" if self.kind == "class-change" else failing

    @property
    def cause_key(self) -> tuple[str, str, str, str, str, str]:
        """What makes transitions one root cause (reports/analysis/causes.py): kind, axis, range (before → after),
        failure class and the failure's cause key (reports.analysis.signatures.failure_key). The versions held fixed are
        not part of it: the same fix seen at two transformers releases is one cause."""
        failing = self.failing_end
        return (
            self.kind,
            self.axis,
            self.before.label(self.axis),
            self.after.label(self.axis),
            self.failure_class_text,
            failure_key(failing.failure_class, failing.signature, failing.cause),
        )


@dataclass(frozen=True)
class History:
    version_sets: list[Versions]  # oldest to newest
    cells: list[CellKey]
    statuses: dict[tuple[CellKey, Versions], CellStatus]
    transitions: list[Transition]
    bisections: list[Bisection] = field(default_factory=list)
    # The harness commits that recorded runs at each version set, first seen first (none in old files).
    harness: dict[Versions, tuple[str, ...]] = field(default_factory=dict)

    @property
    def latest(self) -> Versions:
        return self.version_sets[-1]

    @property
    def flaky(self) -> list[tuple[CellKey, Versions, CellStatus]]:
        return self._points(lambda status: status.status == "flaky")

    @property
    def harness_changes(self) -> list[tuple[CellKey, Versions, CellStatus]]:
        """Cells whose verdict changed at the same versions when the harness commit changed."""
        return self._points(lambda status: status.harness_change is not None)

    def _points(self, chosen: Callable[[CellStatus], bool]) -> list[tuple[CellKey, Versions, CellStatus]]:
        """The points whose status is chosen, version set by version set (oldest first), cell by cell: the few
        chosen are ordered, instead of looking up every cell at every version set."""
        points = [(cell, versions, status) for (cell, versions), status in self.statuses.items() if chosen(status)]
        set_rank = {versions: rank for rank, versions in enumerate(self.version_sets)}
        cell_rank = {cell: rank for rank, cell in enumerate(self.cells)}
        return sorted(points, key=lambda point: (set_rank[point[1]], cell_rank[point[0]]))


OrderKey = tuple[object, ...]
"""Where a version lies along its axis (VersionOrder.key): releases (0, Version[, first seen]) before other labels
(1, first seen, label); compared only with the keys of the same axis, whose shapes compare."""


class VersionOrder:
    """Orders values on each axis: releases by PEP 440, DeepSpeed commits topologically when a clone is given;
    labels that are not releases (an install failure at pr/1234, master, local-DeepSpeed) come after all
    releases of their axis, by when first seen."""

    def __init__(self, groups: list[ResultGroup], deepspeed_repo: GitRepo | None):
        self._repo = deepspeed_repo
        # Without a clone, builds of the same version from different commits are ordered by when first seen.
        self._first_seen: dict[tuple[str, str, str], str] = {}
        # computed once per version set, not once per cell
        self._keys: dict[tuple[str, Versions], OrderKey] = {}
        # A version set's earliest start first (a year has ~75 k groups at a few hundred version sets), then its axes.
        earliest: dict[Versions, str] = {}
        for group in groups:
            started = group.earliest.started
            known = earliest.get(group.versions)
            if known is None or started < known:
                earliest[group.versions] = started
        self.version_sets = list(earliest)  # every version set of the groups
        for versions, started in earliest.items():
            for axis in AXES:
                key = self._seen_key(axis, versions)
                self._first_seen[key] = min(self._first_seen.get(key, started), started)

    @staticmethod
    def _seen_key(axis: str, versions: Versions) -> tuple[str, str, str]:
        return axis, getattr(versions, axis), versions.deepspeed_git if axis == "deepspeed" else ""

    def key(self, axis: str, versions: Versions) -> OrderKey:
        known = self._keys.get((axis, versions))
        if known is None:
            known = self._keys[axis, versions] = self._key(axis, versions)
        return known

    def _key(self, axis: str, versions: Versions) -> OrderKey:
        value = getattr(versions, axis)
        version = release(value)
        if version is None:
            return (1, self._first_seen[self._seen_key(axis, versions)], value)
        if axis != "deepspeed":
            return (0, version)
        if self._repo is not None:
            return (0, deepspeed_order(self._repo, versions))
        return (0, version, self._first_seen[self._seen_key(axis, versions)])

    def set_key(self, versions: Versions) -> tuple[OrderKey, ...]:
        return tuple(self.key(axis, versions) for axis in AXES)


class VersionLines:
    """Where each version set lies along each axis (in AXES' order): the line it is on — a number for the values of
    every other version field, which the line holds fixed — and its rank on that line (VersionOrder.key's order;
    equal keys, equal ranks). Computed once per version set: each cell's transitions then look a point up once
    instead of once per axis and comparison (~0.7 M lookups at a year), and sort by plain numbers."""

    def __init__(self, version_sets: list[Versions], order: VersionOrder):
        places: dict[Versions, list[tuple[int, int]]] = {versions: [] for versions in version_sets}
        for axis in AXES:
            others = [name for name in Versions.__dataclass_fields__ if not _on_axis(name, axis)]
            line_ids: dict[tuple[str, ...], int] = {}
            keys = {versions: order.key(axis, versions) for versions in version_sets}
            ranks = {key: rank for rank, key in enumerate(sorted(set(keys.values())))}
            for versions in version_sets:
                held = tuple(getattr(versions, name) for name in others)
                places[versions].append((line_ids.setdefault(held, len(line_ids)), ranks[keys[versions]]))
        self.places = {versions: tuple(place) for versions, place in places.items()}


def _as_of(status: CellStatus, newest: int, ranks: dict[str, int]) -> CellStatus:
    """The status a harness no newer than rank `newest` recorded: where the verdict changed with the harness,
    the older harness commits' one unless a harness commit of the newer ones is no newer than that."""
    if status.harness_change is None or min(ranks[commit] for commit in status.harness) <= newest:
        return status
    return status.harness_change


def _compared(before: CellStatus, after: CellStatus, ranks: dict[str, int]) -> tuple[CellStatus, CellStatus]:
    """Two points' statuses as the same harness saw them, as far as the history tells: each as of the newest
    harness commit that recorded both (the older of their newest), so a verdict that changed with the harness
    at one point is not taken for a change of the libraries between the two."""
    newest = min(max(ranks[commit] for commit in status.harness) for status in (before, after))
    return _as_of(before, newest, ranks), _as_of(after, newest, ranks)


def analyse(
    observations: list[Observation],
    deepspeed_repo: GitRepo | None = None,
    bisections: Sequence[Bisection] = (),
    attempts: Sequence[TriageAttempt] = (),
) -> History:
    """The history of results held in memory (`analyse_aggregates` of their aggregates)."""
    return analyse_aggregates(aggregate(observations), deepspeed_repo, bisections, attempts)


def analyse_aggregates(
    aggregates: Aggregates,
    deepspeed_repo: GitRepo | None = None,
    bisections: Sequence[Bisection] = (),
    attempts: Sequence[TriageAttempt] = (),
) -> History:
    groups = aggregates.groups
    if not groups:
        raise ReportsError("the history store holds no results; import JUnit files with `python -m reports merge`")
    order = VersionOrder(groups, deepspeed_repo)
    ranks = harness_ranks_of_groups(groups)
    # Each cell's points, in the order their first results are listed (the order its transitions are found in).
    grouped: dict[CellKey, dict[Versions, list[ResultGroup]]] = defaultdict(lambda: defaultdict(list))
    for group in listed(groups):
        grouped[group.cell][group.versions].append(group)
    statuses: dict[tuple[CellKey, Versions], CellStatus] = {}
    # Skips carry no verdict and flaky points no deterministic one; transitions step over both.
    verdicts_by_cell: dict[CellKey, dict[Versions, CellStatus]] = {}
    for cell, points in grouped.items():
        verdicts = verdicts_by_cell[cell] = {}
        for versions, members in points.items():
            status = statuses[cell, versions] = point_status_of_groups(members, aggregates.metrics, ranks)
            if status.status in ("pass", "fail"):
                verdicts[versions] = status
    version_sets = sorted(order.version_sets, key=order.set_key)
    cells = sorted(grouped)
    lines = VersionLines(version_sets, order)
    transitions = [t for cell in cells for t in _transitions(cell, verdicts_by_cell[cell], lines, ranks)]
    if deepspeed_repo is not None:
        transitions = [_attribute(t, deepspeed_repo) for t in transitions]
    transitions = [replace(t, bisection=_bisection_for(t, bisections)) for t in transitions]
    transitions = [t if t.bisection else replace(t, attempt=_attempt_for(t, attempts)) for t in transitions]
    first_seen: dict[Versions, dict[str, tuple[str, str]]] = defaultdict(dict)
    for group in groups:
        if group.harness_git:
            keep_earliest(first_seen[group.versions], group.harness_git, started_order(group.earliest))
    harness = {versions: tuple(sorted(seen, key=seen.__getitem__)) for versions, seen in first_seen.items()}
    return History(version_sets, cells, statuses, transitions, list(bisections), harness)


def _transitions(
    cell: CellKey, points: dict[Versions, CellStatus], lines: VersionLines, ranks: dict[str, int]
) -> list[Transition]:
    """The transitions of one cell: along each axis, between neighbours on each line (the other axes held fixed)."""
    # Per axis, the points of each line as (rank on the line, versions, status), lines in the order first seen.
    on_lines: list[dict[int, list[tuple[int, Versions, CellStatus]]]] = [defaultdict(list) for _ in AXES]
    for versions, status in points.items():
        for by_line, (line_id, rank) in zip(on_lines, lines.places[versions]):
            by_line[line_id].append((rank, versions, status))
    found = []
    for axis, by_line in zip(AXES, on_lines):
        for line in by_line.values():
            line.sort(key=_rank)  # stable: points of equal rank stay in the order they were listed
            for (_, before, before_status), (_, after, after_status) in pairwise(line):
                statuses = before_status, after_status
                if before_status.harness_change is not None or after_status.harness_change is not None:
                    statuses = _compared(*statuses, ranks)  # otherwise each is as of any harness commit
                if kind := _kind(*statuses):
                    found.append(Transition(kind, cell, axis, before, after, *statuses))
    return found


def _rank(point: tuple[int, Versions, CellStatus]) -> int:
    return point[0]


def _on_axis(field_name: str, axis: str) -> bool:
    return field_name == axis or (axis == "deepspeed" and field_name == "deepspeed_git")


def _kind(before: CellStatus, after: CellStatus) -> TransitionKind | None:
    if before.status == "pass" and after.status == "fail":
        return "broke"
    if before.status == "fail" and after.status == "pass":
        return "fixed"
    if before.status == after.status == "fail" and before.failure_class != after.failure_class:
        return "class-change"
    return None


def _attribute(transition: Transition, repo: GitRepo) -> Transition:
    if transition.axis != "deepspeed":
        return transition
    if any(release(v.deepspeed) is None and not v.deepspeed_git for v in (transition.before, transition.after)):
        return transition  # a label such as pr/1234 names no commit the clone could place
    return replace(transition, commits=commits_between(repo, transition.before, transition.after))


_BISECTION_MODE: dict[str, BisectMode] = {"broke": "broken", "fixed": "fixed", "class-change": "broken"}


@dataclass(frozen=True)
class AxisRange:
    """A question's range on one axis: the value at its older and newer end, and DeepSpeed's commit at each
    end where it was built from git."""

    axis: str
    older: str
    newer: str
    older_commit: str = ""
    newer_commit: str = ""

    @classmethod
    def of(cls, transition: Transition) -> AxisRange:
        commits = (
            (transition.before.deepspeed_git, transition.after.deepspeed_git)
            if transition.axis == "deepspeed"
            else ("", "")
        )
        return cls(
            transition.axis,
            getattr(transition.before, transition.axis),
            getattr(transition.after, transition.axis),
            *commits,
        )

    def holds(self, older: str, newer: str) -> bool:
        """Whether the range from older to newer (releases, tags like v0.16.4, or commits) lies inside this
        one: a release end between this range's releases, a commit end one of this range's ends' commits
        (without a clone a commit cannot be placed between them)."""
        ends = (_release_of(older), _release_of(newer))
        if ends[0] is not None and ends[1] is not None:
            return self._inside(ends[0]) and self._inside(ends[1]) and ends[0] < ends[1]
        commits = [commit for commit in (self.older_commit, self.newer_commit) if commit]
        return older != newer and all(
            self._inside(end) if end is not None else any(_same_commit(text, c) for c in commits)
            for end, text in zip(ends, (older, newer))
        )

    def _inside(self, version: Version) -> bool:
        low, high = release(self.older), release(self.newer)
        return low is not None and high is not None and low <= version <= high


def _release_of(value: str) -> Version | None:
    """A release, or a tag naming one (v0.16.4); None for a commit."""
    return release(value.removeprefix("v")) if value else None


def _same_commit(text: str, commit: str) -> bool:
    return len(text) >= 7 and (commit.startswith(text) or text.startswith(commit))


def _bisection_for(transition: Transition, bisections: Sequence[Bisection]) -> Bisection | None:
    return answer_for(
        bisections,
        transition.cell,
        kind=transition.kind,
        failure_class=transition.failing_end.failure_class,
        span=AxisRange.of(transition),
        held_fixed=transition.held_fixed,
    )


def answer_for(
    bisections: Sequence[Bisection],
    cell: CellKey,
    *,
    kind: str,
    failure_class: str | None,
    span: AxisRange,
    held_fixed: Pins,
) -> Bisection | None:
    """The one rule for "does this bisection answer this question": the newest bisection of this cell and axis,
    for this kind of transition (broke, fixed or class-change), about this failure class (the failing end's:
    the new failure of a class change; None: any), run with every other axis it pinned at the versions
    held_fixed names, whose answer lies inside the range.

    An answer whose ends are commits (a commit-only bisection) lies inside when the ends its search ran
    between do; an answer recorded without them cannot be placed, so it answers nothing."""
    matching = [
        b
        for b in bisections
        if (b.cell, b.axis) == (cell, span.axis)
        and _answers_kind(b, kind)
        and failure_class in (None, b.failure_class)
        # The bisection pins the installable axes ("transformers 5.24.0, torch 2.13.0"); a transition
        # also names python: each pin must be the question's.
        and _pins(b.held_fixed) <= _pins(held_fixed)
        and (
            span.holds(b.before, b.after)
            if None not in (_release_of(b.before), _release_of(b.after))
            else bool(b.searched_older) and span.holds(b.searched_older, b.searched_newer)
        )
    ]
    return _newest(matching)


def _answers_kind(bisection: Bisection, kind: str) -> bool:
    """Whether a bisection was run for this kind of transition; one stored before kinds were kept says its
    mode only (broken answered a broke or a class change)."""
    return bisection.kind == kind if bisection.kind else bisection.mode == _BISECTION_MODE[kind]


def _pins(held_fixed: Pins) -> set[tuple[str, str]]:
    """The pins as a set to compare; torch's local build label (+cpu, +cu124), which an installed torch reports
    and a pin leaves out, names the same torch release."""
    pins = set()
    for axis, value in held_fixed:
        version = release(value) if axis == "torch" else None
        pins.add((axis, version.public if version else value))
    return pins


def _attempt_for(transition: Transition, attempts: Sequence[TriageAttempt]) -> TriageAttempt | None:
    """The newest unanswered triage question about exactly this transition."""
    matching = [
        a
        for a in attempts
        if (a.cell, a.axis, a.mode, a.before, a.after)
        == (
            transition.cell,
            transition.axis,
            transition.mode,
            getattr(transition.before, transition.axis),
            getattr(transition.after, transition.axis),
        )
        and _pins(a.held_fixed) <= _pins(transition.held_fixed)
    ]
    return _newest(matching)


Answer = TypeVar("Answer", Bisection, TriageAttempt)


def _newest(records: list[Answer]) -> Answer | None:
    """The most recently recorded of records in store order: recorded_at has one-second resolution, so of
    two answers recorded in the same second the one stored later wins (a refinement over its release answer)."""
    return sorted(records, key=lambda record: record.recorded_at)[-1] if records else None

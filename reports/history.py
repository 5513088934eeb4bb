"""Per-cell status at each version set, and transitions along each version axis."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from itertools import pairwise

from packaging.version import InvalidVersion, Version

from reports import ReportsError
from reports.attribution import commits_between, deepspeed_order
from reports.git import GitRepo
from reports.records import AXES, Bisection, CellKey, Commit, Observation, TriageAttempt, Versions, release


@dataclass(frozen=True)
class CellStatus:
    """All observations of one cell at one exact version set."""

    status: str  # pass | fail | flaky (mixed pass and fail) | skip (nothing but skips)
    passes: int
    fails: int
    skips: int
    failure_class: str = ""  # most common class among the failures
    signature: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # from the most recent run that produced any


@dataclass(frozen=True)
class Transition:
    kind: str  # broke | fixed | class-change
    cell: CellKey
    axis: str
    before: Versions  # last good (broke), last bad (fixed) or last with the old class
    after: Versions
    before_status: CellStatus
    after_status: CellStatus
    commits: tuple[Commit, ...] = ()  # only for DeepSpeed transitions, when a clone is given
    bisection: Bisection | None = None  # the newest `reports.bisect` answer inside this transition's range
    attempt: TriageAttempt | None = None  # without an answer: why triage could not find one, if it tried

    @property
    def mode(self) -> str:
        """The bisection that answers this transition: broken (broke, and a class change: where the new
        failure broke in, the old one standing for "good") or fixed (fixed)."""
        return _BISECTION_MODE[self.kind]

    @property
    def held_fixed(self) -> str:
        return self.after.describe(tuple(axis for axis in AXES if axis != self.axis))


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
        return [
            (cell, versions, self.statuses[cell, versions])
            for versions in self.version_sets
            for cell in self.cells
            if (cell, versions) in self.statuses and self.statuses[cell, versions].status == "flaky"
        ]


class VersionOrder:
    """Orders values on each axis: releases by PEP 440, DeepSpeed commits topologically when a clone is given;
    labels that are not releases (an install failure at pr/1234, master, local-DeepSpeed) come after all
    releases of their axis, by when first seen."""

    def __init__(self, observations: list[Observation], deepspeed_repo: GitRepo | None):
        self._repo = deepspeed_repo
        # Without a clone, builds of the same version from different commits are ordered by when first seen.
        self._first_seen: dict[tuple[str, str, str], str] = {}
        for obs in sorted(observations, key=lambda o: o.run.started):
            for axis in AXES:
                self._first_seen.setdefault(self._seen_key(axis, obs.versions), obs.run.started)

    @staticmethod
    def _seen_key(axis: str, versions: Versions) -> tuple[str, str, str]:
        return axis, getattr(versions, axis), versions.deepspeed_git if axis == "deepspeed" else ""

    def key(self, axis: str, versions: Versions) -> tuple:
        value = getattr(versions, axis)
        version = release(value)
        if version is None:
            return (1, self._first_seen[self._seen_key(axis, versions)], value)
        if axis != "deepspeed":
            return (0, version)
        if self._repo is not None:
            return (0, deepspeed_order(self._repo, versions))
        return (0, version, self._first_seen[self._seen_key(axis, versions)])

    def set_key(self, versions: Versions) -> tuple:
        return tuple(self.key(axis, versions) for axis in AXES)


def summarise(observations: list[Observation]) -> CellStatus:
    outcomes = Counter(obs.result.outcome for obs in observations)
    passes, fails, skips = outcomes["pass"], outcomes["fail"], outcomes["skip"]
    status = "flaky" if passes and fails else "pass" if passes else "fail" if fails else "skip"
    failures = [obs.result for obs in observations if obs.result.outcome == "fail"]
    failure_class = signature = ""
    if failures:
        failure_class = Counter(r.failure_class for r in failures).most_common(1)[0][0]
        signature = next(r.signature for r in failures if r.failure_class == failure_class)
    measured = [obs for obs in observations if obs.result.metrics]
    metrics = max(measured, key=lambda o: o.run.started).result.metrics if measured else {}
    return CellStatus(status, passes, fails, skips, failure_class, signature, metrics)


def analyse(observations: list[Observation], deepspeed_repo: GitRepo | None = None,
            bisections: list[Bisection] = (), attempts: list[TriageAttempt] = ()) -> History:
    if not observations:
        raise ReportsError("the history store holds no results; import JUnit files with `python -m reports merge`")
    order = VersionOrder(observations, deepspeed_repo)
    grouped: dict[tuple[CellKey, Versions], list[Observation]] = defaultdict(list)
    for obs in observations:
        grouped[obs.cell, obs.versions].append(obs)
    statuses = {key: summarise(group) for key, group in grouped.items()}
    version_sets = sorted({versions for _, versions in statuses}, key=order.set_key)
    cells = sorted({cell for cell, _ in statuses})
    # Skips carry no verdict and flaky points no deterministic one; transitions step over both.
    verdicts_by_cell: dict[CellKey, dict[Versions, CellStatus]] = defaultdict(dict)
    for (cell, versions), status in statuses.items():
        if status.status in ("pass", "fail"):
            verdicts_by_cell[cell][versions] = status
    transitions = [t for cell in cells for t in _transitions(cell, verdicts_by_cell[cell], order)]
    if deepspeed_repo is not None:
        transitions = [_attribute(t, deepspeed_repo) for t in transitions]
    transitions = [replace(t, bisection=_bisection_for(t, bisections)) for t in transitions]
    transitions = [t if t.bisection else replace(t, attempt=_attempt_for(t, attempts)) for t in transitions]
    harness: dict[Versions, dict[str, None]] = defaultdict(dict)
    for obs in sorted(observations, key=lambda o: o.run.started):
        if obs.run.harness_git:
            harness[obs.versions].setdefault(obs.run.harness_git)
    return History(version_sets, cells, statuses, transitions, list(bisections),
                   {versions: tuple(commits) for versions, commits in harness.items()})


def _transitions(cell: CellKey, points: dict[Versions, CellStatus], order: VersionOrder) -> list[Transition]:
    found = []
    for axis in AXES:
        lines: dict[tuple, list[Versions]] = defaultdict(list)
        for versions in points:
            held_fixed = tuple(getattr(versions, f) for f in Versions.__dataclass_fields__ if not _on_axis(f, axis))
            lines[held_fixed].append(versions)
        for line in lines.values():
            line.sort(key=lambda v: order.key(axis, v))
            for before, after in pairwise(line):
                kind = _kind(points[before], points[after])
                if kind:
                    found.append(Transition(kind, cell, axis, before, after, points[before], points[after]))
    return found


def _on_axis(field_name: str, axis: str) -> bool:
    return field_name == axis or (axis == "deepspeed" and field_name == "deepspeed_git")


def _kind(before: CellStatus, after: CellStatus) -> str:
    if before.status == "pass" and after.status == "fail":
        return "broke"
    if before.status == "fail" and after.status == "pass":
        return "fixed"
    if before.status == after.status == "fail" and before.failure_class != after.failure_class:
        return "class-change"
    return ""


def _attribute(transition: Transition, repo: GitRepo) -> Transition:
    if transition.axis != "deepspeed":
        return transition
    if any(release(v.deepspeed) is None and not v.deepspeed_git for v in (transition.before, transition.after)):
        return transition  # a label such as pr/1234 names no commit the clone could place
    return replace(transition, commits=commits_between(repo, transition.before, transition.after))


_BISECTION_MODE = {"broke": "broken", "fixed": "fixed", "class-change": "broken"}


def _bisection_for(transition: Transition, bisections: list[Bisection]) -> Bisection | None:
    return answer_for(bisections, transition.cell, transition.axis, transition.mode,
                      getattr(transition.before, transition.axis), getattr(transition.after, transition.axis),
                      transition.held_fixed)


def answer_for(bisections: list[Bisection], cell: CellKey, axis: str, mode: str, low: str, high: str,
               held_fixed: str) -> Bisection | None:
    """The one rule for "does this bisection answer this question": the newest bisection of this cell, axis
    and mode, run with every other axis it pinned at the version held_fixed names, whose answer lies inside
    low .. high (the older and newer value on the axis).

    An answer that is not a release (a commit sha from a commit-only bisection) cannot be placed on the
    release line, so it is taken as inside."""
    matching = [
        b for b in bisections
        if (b.cell, b.axis, b.mode) == (cell, axis, mode)
        # The bisection pins the installable axes ("transformers 5.24.0, torch 2.13.0"); a transition
        # also names python: each pin must be the question's.
        and _pins(b.held_fixed) <= _pins(held_fixed)
        and _within(low, b.before, b.after, high)
    ]
    return _newest(matching)


def _pins(held_fixed: str) -> set[str]:
    """"transformers 5.24.0, torch 2.13.0+cpu" as pins; torch's local build label (+cpu, +cu124), which an
    installed torch reports and a pin leaves out, names the same torch release."""
    pins = set()
    for pin in filter(None, held_fixed.split(", ")):
        axis, _, value = pin.partition(" ")
        version = release(value) if axis == "torch" else None
        pins.add(f"{axis} {version.public}" if version else pin)
    return pins


def _within(low: str, before: str, after: str, high: str) -> bool:
    try:
        return Version(low) <= Version(before.removeprefix("v")) < Version(after.removeprefix("v")) <= Version(high)
    except InvalidVersion:
        return True


def _attempt_for(transition: Transition, attempts: list[TriageAttempt]) -> TriageAttempt | None:
    """The newest unanswered triage question about exactly this transition."""
    matching = [a for a in attempts
                if (a.cell, a.axis, a.mode, a.before, a.after) == (
                    transition.cell, transition.axis, transition.mode, getattr(transition.before, transition.axis),
                    getattr(transition.after, transition.axis))
                and _pins(a.held_fixed) <= _pins(transition.held_fixed)]
    return _newest(matching)


def _newest(records: list):
    """The most recently recorded of records in store order: recorded_at has one-second resolution, so of
    two answers recorded in the same second the one stored later wins (a refinement over its release answer)."""
    return sorted(records, key=lambda record: record.recorded_at)[-1] if records else None

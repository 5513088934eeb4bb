"""What the analysis and the report read from the history: per-point aggregates, not every result.

A point is one cell at one version set recorded by one harness commit. The report needs, per point, how many results
had each outcome, failure class and signature, the first of them in store order (which class and signature a point
shows), the earliest and the newest run (since when, the newest run, the version order without a clone) and the
newest metrics; and for "since the previous run" the results of the two newest runs of each session. A year of
nightlies is ~72 k points instead of 1.46 M results: `HistoryStore.aggregates` computes them in SQL,
`aggregate` from results already in memory (gate, publish, tests); a test holds the two to the same answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from reports.store.records import CellKey, CellResult, Observation, Run, Versions
from suites.verdicts.cause import Cause

PointKey = tuple[CellKey, Versions, str]
"""A point: cell, version set, harness commit ("" for runs recorded before it was kept)."""


@dataclass(frozen=True)
class ResultGroup:
    """The results at one point with one outcome, failure class and signature."""

    cell: CellKey
    versions: Versions
    harness_git: str
    outcome: str
    failure_class: str
    signature: str
    count: int
    first_listed: str  # the smallest run id among them: store order, the order a point's results are counted in
    earliest: Run  # the run that started first (of two that started together, the smaller run id)
    newest: Run  # the run that started last (of two that started together, the larger run id)
    cause: Cause | None = None  # the cause its newest result was recorded with; None before causes were kept


@dataclass(frozen=True)
class PointMetrics:
    """The metrics of a point's newest result that has any (of two that started together, the smaller run id)."""

    started: str
    run_id: str
    metrics: dict[str, float]


@dataclass(frozen=True)
class Aggregates:
    groups: list[ResultGroup]
    metrics: dict[PointKey, PointMetrics]
    # The results of the two newest runs of each session (reports.analysis.causes: since the previous run).
    recent: list[Observation]
    # The hub ids a faithful cell's result stands for, by (run id, cell): only results that carry any.
    checkpoints: dict[tuple[str, CellKey], tuple[str, ...]] = field(default_factory=dict)

    @property
    def first_run(self) -> Run:
        """The run that started first (of two that started together, the smaller run id)."""
        return min((group.earliest for group in self.groups), key=started_order)


def started_order(run: Run) -> tuple[str, str]:
    return run.started, run.run_id


def newer_metrics(candidate: PointMetrics, known: PointMetrics) -> bool:
    """Whether candidate is the newer (started later; started together: the smaller run id)."""
    return (candidate.started, known.run_id) > (known.started, candidate.run_id)


def recent_runs(runs: list[Run], per_session: int = 2) -> set[str]:
    """The run ids of the `per_session` newest runs of each session (by start, then run id)."""
    by_session: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_session[run.session].append(run)
    return {run.run_id for session in by_session.values() for run in sorted(session, key=started_order)[-per_session:]}


GroupKey = tuple[CellKey, str, str, str]
"""A result group within its point: cell, outcome, failure class, signature."""


@dataclass(slots=True)
class _Tally:
    """A result group while results are added (ResultGrouping.add): mutable, one per group, updated in place."""

    count: int
    first_listed: str
    earliest: Run
    newest: Run
    cause: Cause | None  # the newest result's


class ResultGrouping:
    """The result groups and each point's newest metrics of results added a run at a time (the atlas adds an archive's
    entries one by one, never holding every result): what `group_results` computes for results held in memory."""

    def __init__(self, keep_metrics: bool = True) -> None:
        self._keep_metrics = keep_metrics
        # (versions, harness commit) -> group -> its tally; a run's results share the outer key, so it is looked up
        # once per run
        self._groups: dict[tuple[Versions, str], dict[GroupKey, _Tally]] = {}
        self.measured: dict[PointKey, PointMetrics] = {}

    def add(self, run: Run, results: Iterable[CellResult]) -> None:
        groups = self._groups.setdefault((run.versions, run.harness_git), {})
        order = started_order(run)
        for result in results:
            key = (result.cell, result.outcome, result.failure_class, result.signature)
            known = groups.get(key)
            if known is None:
                groups[key] = _Tally(1, run.run_id, run, run, result.cause)
            else:
                known.count += 1
                if run.run_id < known.first_listed:
                    known.first_listed = run.run_id
                if order < started_order(known.earliest):
                    known.earliest = run
                if order >= started_order(known.newest):
                    known.newest, known.cause = run, result.cause
            if self._keep_metrics and result.metrics:
                point = (result.cell, run.versions, run.harness_git)
                candidate = PointMetrics(run.started, run.run_id, result.metrics)
                measured = self.measured.get(point)
                if measured is None or newer_metrics(candidate, measured):
                    self.measured[point] = candidate

    def groups(self) -> list[ResultGroup]:
        """Point by point in the order their first results were added."""
        return [
            ResultGroup(
                cell=cell,
                versions=versions,
                harness_git=harness_git,
                outcome=outcome,
                failure_class=failure_class,
                signature=signature,
                count=tally.count,
                first_listed=tally.first_listed,
                earliest=tally.earliest,
                newest=tally.newest,
                cause=tally.cause,
            )
            for (versions, harness_git), groups in self._groups.items()
            for (cell, outcome, failure_class, signature), tally in groups.items()
        ]


def group_results(observations: list[Observation]) -> tuple[list[ResultGroup], dict[PointKey, PointMetrics]]:
    """The result groups and each point's newest metrics of results held in memory."""
    grouping = ResultGrouping()
    for obs in observations:
        grouping.add(obs.run, (obs.result,))
    return grouping.groups(), grouping.measured


def aggregate(observations: list[Observation]) -> Aggregates:
    """The aggregates of results held in memory, as HistoryStore.aggregates computes them from the store."""
    groups, measured = group_results(observations)
    recent = recent_runs(list({obs.run.run_id: obs.run for obs in observations}.values()))
    return Aggregates(
        groups,
        measured,
        [obs for obs in observations if obs.run.run_id in recent],
        {(obs.run.run_id, obs.cell): obs.result.checkpoints for obs in observations if obs.result.checkpoints},
    )


def without_remedies(
    groups: list[ResultGroup],
    metrics: dict[PointKey, PointMetrics],
    runs: Iterable[Run],
    observations: Callable[[Collection[str]], list[Observation]],
) -> tuple[list[ResultGroup], dict[PointKey, PointMetrics]]:
    """The groups and metrics of the runs without a remedy (`Run.remedied`), from those of every run: a point only
    remedied runs recorded (a patched DeepSpeed's commit) is left out, and one a remedied run shares with others (a
    workaround runs at the release's versions) is grouped again from the others' `observations` (by run id)."""
    runs = list(runs)
    touched = {(run.versions, run.harness_git) for run in runs if run.remedied}
    if not touched:
        return groups, metrics
    again = {run.run_id for run in runs if not run.remedied and (run.versions, run.harness_git) in touched}
    regrouped, remeasured = group_results(observations(again) if again else [])
    kept = [group for group in groups if (group.versions, group.harness_git) not in touched]
    measured = {point: value for point, value in metrics.items() if point[1:] not in touched}
    return [*kept, *regrouped], {**measured, **remeasured}

"""A cell's status at one version set from its results: pass, fail, flaky, skip or unsupported, its failure, its
metrics, and where the verdict changed with the harness commit rather than with the libraries."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from itertools import pairwise

from reports.clones import harness_order
from reports.store import (
    Observation,
    PointKey,
    PointMetrics,
    ResultGroup,
    group_results,
    newer_metrics,
    short_commit,
    started_order,
)
from suites.verdicts.cause import Cause

NO_VERDICT_STATUSES = ("skip", "unsupported")
"""Statuses that say nothing of AutoTP: the harness did not run the cell, or DeepSpeed refused what it asks for."""


@dataclass(frozen=True)
class CellStatus:
    """All observations of one cell at one exact version set."""

    # pass | fail | flaky (mixed pass and fail) | unsupported (DeepSpeed refused it, nothing ran) |
    # skip (nothing but skips)
    status: str
    passes: int
    fails: int
    skips: int  # results without a verdict on AutoTP: skipped, or refused by DeepSpeed (unsupported)
    failure_class: str = ""  # most common class among the failures
    signature: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # from the most recent run that produced any
    harness: tuple[str, ...] = ()  # the harness commits whose runs these are, first seen first ("" unknown)
    # Where the verdict changed at these versions when the harness commit did: the status under the older
    # harness commits (this status is the newer ones'), shown as a harness change, never as flaky.
    harness_change: CellStatus | None = None
    cause: Cause | None = None  # the cause its failure was recorded with (None before causes were kept)


def summarise_groups(groups: list[ResultGroup], measured: dict[PointKey, PointMetrics]) -> CellStatus:
    """The status of the results in groups (of one cell at one version set, in the order their results are listed:
    by run id, or harness commit by harness commit): flaky where they passed and failed; the failure class most of
    the failures had (of two as common, the one listed first) with the signature of its first failure; the metrics
    of the newest result that has any."""
    if len(groups) == 1:  # most points at a year: one group, so no counting, ranking or choosing among groups
        return _summarise_group(groups[0], measured)
    outcomes: Counter[str] = Counter()
    for group in groups:
        outcomes[group.outcome] += group.count
    passes, fails, skips = outcomes["pass"], outcomes["fail"], outcomes["skip"] + outcomes["unsupported"]
    status = (
        "flaky"
        if passes and fails
        else "pass"
        if passes
        else "fail"
        if fails
        else "unsupported"
        if outcomes["unsupported"]
        else "skip"
    )
    failure_class = signature = ""
    cause = None
    failures = [group for group in groups if group.outcome == "fail"]
    if failures:
        classes: Counter[str] = Counter()
        for group in failures:
            classes[group.failure_class] += group.count
        failure_class = classes.most_common(1)[0][0]
        chosen = next(group for group in failures if group.failure_class == failure_class)
        signature, cause = chosen.signature, chosen.cause
    points = {(group.cell, group.versions, group.harness_git) for group in groups}
    newest = None
    for point in points:
        candidate = measured.get(point)
        if candidate is not None and (newest is None or newer_metrics(candidate, newest)):
            newest = candidate
    first_seen: dict[str, tuple[str, str]] = {}
    for group in groups:
        keep_earliest(first_seen, group.harness_git, started_order(group.earliest))
    harness = tuple(sorted(first_seen, key=first_seen.__getitem__))
    metrics = newest.metrics if newest else {}
    return CellStatus(
        status=status,
        passes=passes,
        fails=fails,
        skips=skips,
        failure_class=failure_class,
        signature=signature,
        metrics=metrics,
        harness=harness,
        cause=cause,
    )


def _summarise_group(group: ResultGroup, measured: dict[PointKey, PointMetrics]) -> CellStatus:
    """`summarise_groups` of a single group."""
    count, outcome = group.count, group.outcome
    newest = measured.get((group.cell, group.versions, group.harness_git))
    metrics = newest.metrics if newest else {}
    if outcome == "fail":
        return CellStatus(
            status="fail",
            passes=0,
            fails=count,
            skips=0,
            failure_class=group.failure_class,
            signature=group.signature,
            metrics=metrics,
            harness=(group.harness_git,),
            cause=group.cause,
        )
    passes, skips = (count, 0) if outcome == "pass" else (0, count)
    return CellStatus(
        status=outcome,  # pass, skip or unsupported
        passes=passes,
        fails=0,
        skips=skips,
        failure_class="",
        signature="",
        metrics=metrics,
        harness=(group.harness_git,),
    )


def harness_ranks_of_groups(groups: list[ResultGroup]) -> dict[str, int]:
    """Harness commits in the order of the harness's own git history, where its checkout holds them all (never a
    runner's clock: one run dated in the past would make the newer harness the older); otherwise in the order their
    first run started, each start in UTC and bounded at the door (reports.store.validation: not before 2000, not a
    day after it was imported)."""
    first: dict[str, tuple[str, str]] = {}
    for group in groups:
        keep_earliest(first, group.harness_git, started_order(group.earliest))
    by_git = harness_order([commit for commit in first if commit])
    if by_git is not None:
        return {commit: rank for rank, commit in enumerate(sorted(first, key=lambda c: by_git.get(c, -1)))}
    return {commit: rank for rank, commit in enumerate(sorted(first, key=first.__getitem__))}


def keep_earliest(first: dict[str, tuple[str, str]], commit: str, started: tuple[str, str]) -> None:
    """Note a run of a harness commit that started at `started` (start, run id): first keeps each commit's
    earliest."""
    known = first.get(commit)
    if known is None or started < known:
        first[commit] = started


def point_status_of_groups(
    groups: list[ResultGroup], measured: dict[PointKey, PointMetrics], ranks: dict[str, int]
) -> CellStatus:
    """The status of one cell at one version set, the harness commit that recorded each run taken into
    account: pass and fail there are flaky, unless every harness commit's runs agree and the verdict changed
    once, from one harness commit to the next (a harness fix that turns a false pass into a fail, or back):
    then the status is the newer harness commits' verdict, with the older ones' as its harness_change. Runs
    whose harness commit is unknown (files from before it was kept) prove no such change."""
    if len(groups) == 1:  # most points at a year: one outcome, never flaky
        return _summarise_group(groups[0], measured)
    overall = summarise_groups(groups, measured)
    if overall.status != "flaky":
        return overall
    by_commit: dict[str, list[ResultGroup]] = defaultdict(list)
    for group in groups:
        by_commit[group.harness_git].append(group)
    commits = sorted(by_commit, key=ranks.__getitem__)
    verdicts = [(commit, summarise_groups(by_commit[commit], measured).status) for commit in commits]
    verdicts = [(commit, status) for commit, status in verdicts if status not in NO_VERDICT_STATUSES]
    changes = [n for n, (a, b) in enumerate(pairwise(verdicts), start=1) if a[1] != b[1]]
    if "" in by_commit or any(status == "flaky" for _, status in verdicts) or len(changes) != 1:
        return overall
    first_newer = ranks[verdicts[changes[0]][0]]
    older = [group for commit in commits if ranks[commit] < first_newer for group in by_commit[commit]]
    newer = [group for commit in commits if ranks[commit] >= first_newer for group in by_commit[commit]]
    return replace(summarise_groups(newer, measured), harness_change=summarise_groups(older, measured))


def summarise(observations: list[Observation]) -> CellStatus:
    """`summarise_groups` of results held in memory."""
    groups, measured = group_results(observations)
    return summarise_groups(listed(groups), measured)


def harness_ranks(observations: list[Observation]) -> dict[str, int]:
    return harness_ranks_of_groups(group_results(observations)[0])


def point_status(observations: list[Observation], ranks: dict[str, int]) -> CellStatus:
    """`point_status_of_groups` of results held in memory."""
    groups, measured = group_results(observations)
    return point_status_of_groups(listed(groups), measured, ranks)


def listed(groups: list[ResultGroup]) -> list[ResultGroup]:
    """Groups in the order the store lists their results (by run id): the order summarise_groups counts them in."""
    return sorted(groups, key=lambda group: group.first_listed)


def harness_change_text(status: CellStatus) -> str:
    """ "pass ×2 at harness abc1234567 → fail ×1 at harness def4567890", or "" where the harness changed nothing."""
    if status.harness_change is None:
        return ""
    return " → ".join(
        f"{s.status} ×{s.passes + s.fails} at harness {', '.join(short_commit(c) for c in s.harness)}"
        for s in (status.harness_change, status)
    )

"""The search itself: a binary search over candidates (releases or commits, oldest first) for where a cell's
verdict changes, skipping candidates that cannot be tested like `git bisect skip`, each end run more than once."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reports import ReportsError

GOOD, BAD, SKIP = "good", "bad", "skip"
END_REPEATS = 2  # runs of each end before a bisection trusts it (--end-repeats)


class BisectError(ReportsError):
    """The bisection cannot start or cannot conclude; the message says what to change."""


class Untestable(Exception):
    """This candidate cannot be tested (install failure, no result): the search skips it."""


@dataclass(frozen=True)
class Verdict:
    kind: str  # good | bad | skip
    detail: str = ""  # failure class and signature, or why the step could not be tested


@dataclass(frozen=True)
class Step:
    candidate: str
    verdict: str
    detail: str
    seconds: float


@dataclass(frozen=True)
class Answer:
    before: str  # last good (broken) / last bad (fixed)
    after: str  # first bad (broken) / first good (fixed)
    untestable: tuple[str, ...]  # skipped candidates between the two: the change may be in any of them too
    steps: tuple[Step, ...]


def search(
    candidates: Sequence[str],
    probe: Callable[[str], Verdict],
    *,
    start: str = GOOD,
    on_step: Callable[[Step], None] = lambda step: None,
    end_repeats: int = 1,
) -> Answer:
    """Binary search over candidates (oldest first) for the change from `start` (the verdict at
    candidates[0]) to the other verdict (at candidates[-1]).

    Both ends are probed first, end_repeats times each, the failing end first so its failure becomes the
    reference; an end whose verdicts differ is flaky and nothing is concluded (transformers' daily CI re-runs
    a new failure at both ends before it bisects). Then at most ceil(log2(N - 1)) steps when nothing is
    skipped. A skipped candidate is replaced by the untested one nearest the middle, like `git bisect skip`.
    """
    if len(candidates) < 2:
        raise BisectError(f"need at least two candidates to bisect, got {list(candidates)}")
    if end_repeats < 1:
        raise BisectError(f"--end-repeats {end_repeats}: each end must run at least once")
    end = BAD if start == GOOD else GOOD
    steps: list[Step] = []

    def run(index: int) -> str:
        began = time.monotonic()
        verdict = probe(candidates[index])
        step = Step(candidates[index], verdict.kind, verdict.detail, time.monotonic() - began)
        steps.append(step)
        on_step(step)
        return verdict.kind

    ends = [(0, start), (len(candidates) - 1, end)]
    for index, expected in ends if start == BAD else ends[::-1]:
        kinds = [run(index) for _ in range(end_repeats)]
        if len(set(kinds)) > 1:
            details = "; ".join(
                f"{step.verdict}" + (f" ({step.detail})" if step.detail else "") for step in steps[-end_repeats:]
            )
            raise BisectError(
                f"{candidates[index]} is flaky: {details} in {end_repeats} runs; a bisection needs "
                "ends whose verdict repeats"
            )
        if (kind := kinds[0]) != expected:
            detail = f" ({steps[-1].detail})" if steps[-1].detail else ""
            raise BisectError(
                f"{candidates[index]} should be {expected} but is {kind}{detail}: "
                f"the ends of the range must differ; check the versions and --mode"
            )
    low, high, skipped = 0, len(candidates) - 1, set()
    while untested := [i for i in range(low + 1, high) if i not in skipped]:
        middle = (low + high) / 2
        index = min(untested, key=lambda i: (abs(i - middle), i))
        kind = run(index)
        if kind == SKIP:
            skipped.add(index)
        elif kind == start:
            low = index
        else:
            high = index
    return Answer(candidates[low], candidates[high], tuple(candidates[low + 1 : high]), tuple(steps))

"""Task accuracy of the sharded model against the unsharded reference, judged by a paired test.

Both models answer the same items, so the comparison is paired: only items one model gets right and
the other wrong (the discordant pairs) carry evidence. The exact McNemar test asks whether the
sharded model loses significantly more items than it gains; a fixed epsilon on the two accuracies
would be too strict for small tasks and too lax for large ones. Wilson intervals are recorded so a
reader sees how precise each accuracy is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from suites.checks.interface import Check, CheckInputs
from suites.checks.result import CheckResult, Finding

ALPHA = 0.01  # a cell fails when the sharded model is worse with p < ALPHA (two-sided exact McNemar)
CONFIDENCE = 0.95  # of the recorded Wilson intervals


def wilson_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (no continuity correction)."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"wilson_interval: need 0 <= successes ({successes}) <= trials ({trials}) and trials > 0")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half_width = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half_width), min(1.0, centre + half_width)


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (binomial test of b vs c at 1/2)."""
    if only_first < 0 or only_second < 0:
        raise ValueError(f"mcnemar_exact: discordant counts must be >= 0, got {only_first} and {only_second}")
    discordant = only_first + only_second
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(min(only_first, only_second) + 1))
    outcomes: int = 2**discordant
    return min(1.0, 2 * tail / outcomes)  # int / int: exact up to the final rounding, no underflow


@dataclass(frozen=True)
class PairedAccuracy:
    items: int
    reference_correct: int
    sharded_correct: int
    reference_only: int  # items the reference gets right and the sharded model wrong
    sharded_only: int
    p_value: float

    @property
    def reference_accuracy(self) -> float:
        return self.reference_correct / self.items

    @property
    def sharded_accuracy(self) -> float:
        return self.sharded_correct / self.items


def paired_accuracy(reference: list[bool], sharded: list[bool]) -> PairedAccuracy:
    if len(reference) != len(sharded) or not reference:
        raise ValueError(
            f"paired_accuracy: need the same non-zero number of items, got {len(reference)} "
            f"reference and {len(sharded)} sharded results"
        )
    reference_only = sum(r and not s for r, s in zip(reference, sharded))
    sharded_only = sum(s and not r for r, s in zip(reference, sharded))
    return PairedAccuracy(
        items=len(reference),
        reference_correct=sum(reference),
        sharded_correct=sum(sharded),
        reference_only=reference_only,
        sharded_only=sharded_only,
        p_value=mcnemar_exact(reference_only, sharded_only),
    )


def check(reference: list[bool], sharded: list[bool], alpha: float = ALPHA) -> CheckResult:
    """Fail only when the sharded model answers significantly worse; doing better is not a TP bug to flag."""
    paired = paired_accuracy(reference, sharded)
    ref_low, ref_high = wilson_interval(paired.reference_correct, paired.items)
    tp_low, tp_high = wilson_interval(paired.sharded_correct, paired.items)
    metrics = {
        "acc_items": float(paired.items),
        "acc_ref": paired.reference_accuracy,
        "acc_tp": paired.sharded_accuracy,
        "acc_ref_low": ref_low,
        "acc_ref_high": ref_high,
        "acc_tp_low": tp_low,
        "acc_tp_high": tp_high,
        "acc_ref_only": float(paired.reference_only),
        "acc_tp_only": float(paired.sharded_only),
        "acc_mcnemar_p": paired.p_value,
    }
    passed = not (paired.p_value < alpha and paired.reference_only > paired.sharded_only)
    return CheckResult.judged(
        "accuracy",
        "numerics",
        metrics,
        None
        if passed
        else Finding(
            f"accuracy {paired.sharded_accuracy:.3f} [{tp_low:.3f}, {tp_high:.3f}] vs reference "
            f"{paired.reference_accuracy:.3f} [{ref_low:.3f}, {ref_high:.3f}] on {paired.items} items: "
            f"{paired.reference_only} lost, {paired.sharded_only} gained, "
            f"exact McNemar p={paired.p_value:.2g} < {alpha:g}"
        ),
    )


def _paired(inputs: CheckInputs) -> list[CheckResult]:
    if inputs.accuracy_reference is None or inputs.task_correct is None:
        raise ValueError("a cell has an accuracy reference but its ranks answered no task (a harness bug)")
    return [check(list(inputs.accuracy_reference), list(inputs.task_correct))]


CHECK = Check(("accuracy",), "variant", lambda inputs: inputs.accuracy_reference is not None, _paired)

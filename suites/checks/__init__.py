"""The checks a cell runs on rank 0, each comparing sharded observations with the reference.

Every check returns a `CheckResult`; a cell's failure class is the class of its first failing
check, in the order of `run_all`, and every check's metrics are recorded either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from matrix.registry import Tolerance


@dataclass
class CheckResult:
    name: str
    passed: bool
    failure_class: str
    """The class the cell fails with when this check fails."""
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""


def logits_allowance(tolerance: Tolerance, scale: float) -> float:
    """Largest forgiven absolute difference for logits whose largest magnitude is `scale`."""
    return tolerance.atol + tolerance.rtol * scale


def run_all(reference, sharded, rank_last_logits, rank_bytes_by_name, tolerance: Tolerance) -> list[CheckResult]:
    """`sharded` is rank 0's observations; the `rank_*` lists hold one entry per rank."""
    from suites.checks import generation, logits, memory, perplexity

    shapes = logits.check_shapes(reference, sharded, rank_last_logits)
    if not shapes.passed:
        return [shapes]  # nothing else can be compared
    return [
        logits.check(reference, sharded, tolerance),
        logits.check_ranks_agree(rank_last_logits, tolerance),
        generation.check(reference, sharded, tolerance),
        perplexity.check(reference, sharded, tolerance),
        memory.check(reference, rank_bytes_by_name),
    ]

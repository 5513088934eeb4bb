"""What every check returns, and the logits allowance the logits and generation checks share."""

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
    return tolerance.logits_rel * scale

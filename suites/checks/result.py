"""What every check returns, and the logits allowance the logits and generation checks share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from matrix.registry import Tolerance
from suites.verdicts.check_names import CheckName, judged_signature
from suites.verdicts.vocabulary import FailureClass


@dataclass(frozen=True)
class Finding:
    """One thing a check found wrong, in the two parts it is written in where it is found: `short`, the same
    wherever the same failure recurs (after the check's name it is the cell's signature, which groups identical
    failures), and `detail`, this occurrence's figures (it starts with its parenthesis: `(allowed 1e-05)`)."""

    short: str
    detail: str = ""

    @property
    def text(self) -> str:
        return f"{self.short} {self.detail}" if self.detail else self.short

    def prefixed(self, prefix: str) -> Finding:
        return Finding(prefix + self.short, self.detail)


def joined(findings: Sequence[Finding], prefix: str = "") -> Finding:
    """Several findings reported as one (`; `-separated): its short part runs up to the first detail, so findings
    without figures before it stay part of what groups the failure."""
    first_detailed = next((index for index, finding in enumerate(findings) if finding.detail), len(findings))
    short = "; ".join(
        [finding.text for finding in findings[:first_detailed]]
        + [finding.short for finding in findings[first_detailed : first_detailed + 1]]
    )
    detail = "; ".join(
        [finding.detail for finding in findings[first_detailed : first_detailed + 1]]
        + [finding.text for finding in findings[first_detailed + 1 :]]
    )
    return Finding(prefix + short, detail)


@dataclass
class CheckResult:
    name: CheckName
    """One of suites/verdicts/check_names.py's: the reports tell its signature from a raised exception's by it."""
    passed: bool
    failure_class: FailureClass
    """The class the cell fails with when this check fails."""
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    """What it found, for a reader (a passing check's notes included)."""
    signature: str = ""
    """A failing check's `Finding.short`: with the check's name, the cell's signature."""

    def __post_init__(self) -> None:
        if not self.passed and not self.signature:
            raise ValueError(f"check {self.name} failed without a signature: build it with CheckResult.failing")

    @classmethod
    def failing(
        cls, name: CheckName, failure_class: FailureClass, metrics: dict[str, float], finding: Finding
    ) -> CheckResult:
        return cls(
            name=name,
            passed=False,
            failure_class=failure_class,
            metrics=metrics,
            reason=finding.text,
            signature=finding.short,
        )

    @classmethod
    def judged(
        cls,
        name: CheckName,
        failure_class: FailureClass,
        metrics: dict[str, float],
        finding: Finding | None,
        notes: str = "",
    ) -> CheckResult:
        """Passed when there is no finding (then `notes` is its reason)."""
        if finding is None:
            return cls(name, True, failure_class, metrics, notes)
        return cls.failing(name, failure_class, metrics, finding)

    @property
    def cell_signature(self) -> str:
        return judged_signature(self.name, self.signature)


def logits_allowance(tolerance: Tolerance, scale: float) -> float:
    """Largest forgiven absolute difference for logits whose largest magnitude is `scale`."""
    return tolerance.logits_rel * scale

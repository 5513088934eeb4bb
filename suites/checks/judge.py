"""How rank 0 judges a cell: every check of `CHECKS` that applies, in order; the cell fails with the class of the
first failing one, and every check's metrics are recorded either way. Inference, variant and training checks alike
are entries here (suites/checks/interface.py)."""

from __future__ import annotations

from suites.checks import accuracy, generation, logits, memory, meta_load, perplexity, quantization, training
from suites.checks.interface import Check, CheckInputs
from suites.checks.result import CheckResult

CHECKS: tuple[Check, ...] = (
    logits.REFERENCE,
    logits.SHAPES,
    logits.LOGITS,
    logits.RANKS_AGREE,
    generation.CHECK,
    perplexity.CHECK,
    memory.CHECK,
    quantization.CHECK,
    meta_load.CHECK,
    accuracy.CHECK,
    training.CHECK,
)
"""Every check, in the order a cell's first failing one decides its class and signature."""


def judge(inputs: CheckInputs) -> list[CheckResult]:
    """The results of every check that applies; after a failing gate, the `compare` checks are skipped (nothing
    else can be compared), the variants' own checks still run."""
    results: list[CheckResult] = []
    gate_failed = False
    for check in CHECKS:
        if not check.applies(inputs) or (gate_failed and check.role != "variant"):
            continue
        found = check.run(inputs)
        results += found
        gate_failed = gate_failed or (check.role == "gate" and not all(result.passed for result in found))
    return results

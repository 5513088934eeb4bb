"""Perplexity through the `labels=` loss path: the sharded model must score the corpus like the
reference (window and stride are recorded with the metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matrix.registry import Tolerance
from suites.checks.interface import Check, CheckInputs, inference
from suites.checks.result import CheckResult, Finding

if TYPE_CHECKING:
    from suites.checks.probes import Observations


def check(reference: Observations, sharded: Observations, tolerance: Tolerance, skipped: str = "") -> CheckResult:
    """`skipped`: why the model cannot run the probe (suites/checks/inputs.py ProbeSpec.perplexity_skipped): then
    neither side scored a token, and the check passes naming the reason."""
    if skipped:
        return CheckResult("perplexity", True, "numerics", {}, f"perplexity not probed: {skipped}")
    ppl_ref, ppl_tp = reference.perplexity, sharded.perplexity
    delta = abs(ppl_tp - ppl_ref) / ppl_ref
    metrics = {"ppl_ref": ppl_ref, "ppl_tp": ppl_tp, "ppl_rel_delta": delta, "ppl_tokens": float(reference.nll_tokens)}
    finding = (
        None
        if delta <= tolerance.ppl_rel
        else Finding(
            f"perplexity {ppl_tp:.6g} vs reference {ppl_ref:.6g}",
            f"(relative delta {delta:.3g} > {tolerance.ppl_rel:g})",
        )
    )
    return CheckResult.judged("perplexity", "numerics", metrics, finding)


def _compared(inputs: CheckInputs) -> list[CheckResult]:
    reference, sharded = inputs.inference()
    return [check(reference, sharded, inputs.tolerance, inputs.perplexity_skipped)]


CHECK = Check(("perplexity",), "compare", inference, _compared)

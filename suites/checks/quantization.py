"""Quantized variants, relaxed check: the sharded quantized model against the fp32 baseline
(the unquantized, unsharded model). Quantization moves logits by far more than any tolerance,
so this asks only what a user would: are the greedy tokens mostly the same and is perplexity
close? Thresholds are per model and dtype (`quant_token_match`, `quant_ppl_rel` in Tolerance).
The strict check (the usual checks against the *unsharded quantized* reference) runs as well."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matrix.registry import Tolerance
from suites.checks.interface import Check, CheckInputs
from suites.checks.result import CheckResult, Finding

if TYPE_CHECKING:
    from suites.checks.probes import Observations


def check(baseline: Observations, sharded: Observations, tolerance: Tolerance) -> list[CheckResult]:
    match = (baseline.gen_tokens == sharded.gen_tokens).float().mean().item()
    ppl_delta = abs(sharded.perplexity - baseline.perplexity) / baseline.perplexity
    tokens_ok = match >= tolerance.quant_token_match
    ppl_ok = ppl_delta <= tolerance.quant_ppl_rel
    return [
        CheckResult.judged(
            "quant_tokens",
            "numerics",
            {"quant_token_match": match},
            None
            if tokens_ok
            else Finding(
                f"only {match:.0%} of greedy tokens match the fp32 baseline",
                f"(need {tolerance.quant_token_match:.0%})",
            ),
        ),
        CheckResult.judged(
            "quant_perplexity",
            "numerics",
            {"ppl_fp32": baseline.perplexity, "quant_ppl_rel_delta": ppl_delta},
            None
            if ppl_ok
            else Finding(
                f"perplexity {sharded.perplexity:.6g} vs fp32 baseline {baseline.perplexity:.6g}",
                f"(relative delta {ppl_delta:.3g} > {tolerance.quant_ppl_rel:g})",
            ),
        ),
    ]


def _against_baseline(inputs: CheckInputs) -> list[CheckResult]:
    if inputs.baseline is None or inputs.sharded is None:
        raise ValueError("a quantized cell was judged without its baseline or its observations (a harness bug)")
    return check(inputs.baseline, inputs.sharded, inputs.tolerance)


CHECK = Check(
    ("quant_tokens", "quant_perplexity"), "variant", lambda inputs: inputs.baseline is not None, _against_baseline
)

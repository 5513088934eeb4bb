"""Greedy generation with the KV cache: the sharded model must choose the reference's tokens.

A divergence is forgiven only when it is a genuine near-tie in the reference (its top two
candidates closer than the logits tolerance) and every decode step before it matched the
reference logits; tiny random models have flat distributions, so ties do happen. At the first
divergence we also record whether each side's token is in the other's top-k (vLLM's criterion).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from matrix.registry import Tolerance
from suites.checks.interface import Check, CheckInputs, inference
from suites.checks.result import CheckResult, Finding, logits_allowance

if TYPE_CHECKING:
    import torch

    from suites.checks.probes import Observations

TOP_K = 5


def check(reference: Observations, sharded: Observations, tolerance: Tolerance) -> CheckResult:
    """The single prompt, then each row of the padded batch decoded together (row 1 left-padded: the
    attention-mask and position paths of batched decoding)."""
    single = _sequence(
        ref_tokens=reference.gen_tokens,
        tp_tokens=sharded.gen_tokens,
        ref_logits=reference.gen_logits,
        tp_logits=sharded.gen_logits,
        tolerance=tolerance,
        label="",
    )
    if not single.passed:
        return single
    metrics = dict(single.metrics)
    for row in range(reference.gen_padded_tokens.shape[0]):
        padded = _sequence(
            ref_tokens=reference.gen_padded_tokens[row],
            tp_tokens=sharded.gen_padded_tokens[row],
            ref_logits=reference.gen_padded_logits[row],
            tp_logits=sharded.gen_padded_logits[row],
            tolerance=tolerance,
            label=f"batched decoding row {row}{', left-padded' if row else ''}: ",
        )
        metrics[f"gen_padded{row}_tokens_equal"] = padded.metrics["gen_tokens_equal"]
        metrics[f"gen_padded{row}_logits_max_abs"] = padded.metrics["gen_logits_max_abs"]
        metrics[f"gen_padded{row}_logits_max_rel"] = padded.metrics["gen_logits_max_rel"]
        if not padded.passed:
            return CheckResult(
                name="generation",
                passed=False,
                failure_class="generation",
                metrics=metrics,
                reason=padded.reason,
                signature=padded.signature,
            )
    return CheckResult("generation", True, "generation", metrics, single.reason)


def _sequence(
    *,
    ref_tokens: torch.Tensor,
    tp_tokens: torch.Tensor,
    ref_logits: torch.Tensor,
    tp_logits: torch.Tensor,
    tolerance: Tolerance,
    label: str,
) -> CheckResult:
    differs = (ref_tokens != tp_tokens).nonzero()
    divergence = int(differs[0]) if len(differs) else -1
    compared_steps = len(ref_tokens) if divergence < 0 else divergence + 1
    ref_steps, tp_steps = ref_logits[:compared_steps], tp_logits[:compared_steps]
    step_max_abs = (tp_steps - ref_steps).abs().max().item()
    scale = ref_steps.abs().max().item()
    allowed = logits_allowance(tolerance, scale)
    metrics = {
        "gen_tokens_equal": float(divergence < 0),
        "gen_first_divergence": float(divergence),
        "gen_logits_max_abs": step_max_abs,
        "gen_logits_max_rel": step_max_abs / scale if scale else step_max_abs,
    }
    if not step_max_abs <= allowed:  # also NaN decode logits, which compare false both ways
        where = "up to the first divergent token" if divergence >= 0 else "over all steps"
        return CheckResult.failing(
            "generation",
            "generation",
            metrics,
            Finding(f"{label}decode-step logits differ by {step_max_abs:.3g} {where}", f"(allowed {allowed:.3g})"),
        )
    if divergence < 0:
        return CheckResult("generation", True, "generation", metrics)
    step_ref, step_tp = ref_logits[divergence], tp_logits[divergence]
    ref_token, tp_token = int(ref_tokens[divergence]), int(tp_tokens[divergence])
    metrics["gen_tp_token_in_ref_topk"] = float(tp_token in step_ref.topk(TOP_K).indices.tolist())
    metrics["gen_ref_token_in_tp_topk"] = float(ref_token in step_tp.topk(TOP_K).indices.tolist())
    gap = (step_ref[ref_token] - step_ref[tp_token]).item()
    metrics["gen_tie_gap"] = gap
    if gap <= allowed:
        return CheckResult(
            "generation",
            True,
            "generation",
            metrics,
            f"{label}near-tie at token {divergence}: reference prefers {ref_token} over {tp_token} by {gap:.3g}",
        )
    return CheckResult.failing(
        "generation",
        "generation",
        metrics,
        Finding(
            f"{label}greedy tokens diverge at step {divergence}: reference {ref_token}, sharded {tp_token}",
            f"(reference margin {gap:.3g} > allowed {allowed:.3g})",
        ),
    )


def _compared(inputs: CheckInputs) -> list[CheckResult]:
    reference, sharded = inputs.inference()
    return [check(reference, sharded, inputs.tolerance)]


CHECK = Check(("generation",), "compare", inference, _compared)

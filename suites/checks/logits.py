"""Prefill logits: the sharded model must reproduce the reference logits within tolerance, and
every rank must hold the same logits (the all-reduce joins the shards on all ranks)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from matrix.registry import Tolerance
from suites.checks.interface import Check, CheckInputs, inference
from suites.checks.result import CheckResult, Finding, joined, logits_allowance

if TYPE_CHECKING:
    from suites.checks.probes import Observations


def check_shapes(reference: Observations, sharded: Observations, rank_last_logits: list[torch.Tensor]) -> CheckResult:
    """The sharded model's outputs have the reference's shapes on every rank (e.g. a vocab-sharded lm_head
    whose slices were never gathered gives a fraction of the vocabulary). Wrong outputs of the model,
    not a harness failure: the other checks could not even compare them."""
    problems = [
        Finding(name, f"{tuple(getattr(sharded, name).shape)} vs unsharded {tuple(getattr(reference, name).shape)}")
        for name in (
            "logits_masked",
            "logits_plain",
            "gen_tokens",
            "gen_logits",
            "gen_padded_tokens",
            "gen_padded_logits",
        )
        if getattr(sharded, name).shape != getattr(reference, name).shape
    ]
    problems += [
        Finding(f"rank {rank} last logits", f"{tuple(last.shape)} vs rank 0 {tuple(rank_last_logits[0].shape)}")
        for rank, last in enumerate(rank_last_logits)
        if last.shape != rank_last_logits[0].shape
    ]
    return CheckResult.judged(
        "shapes", "numerics", {}, joined(problems, "sharded outputs have the wrong shape: ") if problems else None
    )


REFERENCE_OUTPUTS = ("logits_masked", "logits_plain", "gen_logits", "gen_padded_logits")


def check_reference(reference: Observations) -> CheckResult:
    """The unsharded reference must be finite: NaN there is the model's (or the checkpoint's) own, and
    comparing with it would blame the sharded model. The cell cannot judge AutoTP: `setup`."""
    bad = [name for name in REFERENCE_OUTPUTS if not torch.isfinite(getattr(reference, name)).all().item()]
    if not math.isfinite(reference.nll_sum):
        bad.append("perplexity loss")
    return CheckResult.judged(
        "reference",
        "setup",
        {},
        Finding(
            f"the unsharded reference is not finite: {', '.join(bad)} hold NaN/inf",
            "(the model computes them without AutoTP; fix the checkpoint or its dtype)",
        )
        if bad
        else None,
    )


MAX_ROUTING_FLIP_SHARE = 1 / 16
"""Largest share of prefill tokens whose MoE routing may flip between the unsharded and the sharded model. A flip
is a near-tie between two experts' router scores that rounding of another summation order decides the other way
(qwen3_moe bf16: 1 of 68 tokens, in the left-padded prompt, at tp 2, 3 and 4); a wrong shard feeding the routers
moves many."""


def routing_flips(reference_routing: torch.Tensor, sharded_routing: torch.Tensor, tokens: int) -> torch.Tensor:
    """[tokens] True where any router chose other experts for the token on the sharded model; all False when
    either side recorded no routing for these tokens (no MoE routers found: every token is compared)."""
    if reference_routing.shape != sharded_routing.shape or reference_routing.shape[:1] != (tokens,):
        return torch.zeros(tokens, dtype=torch.bool)
    return (reference_routing != sharded_routing).any(dim=1)


def check(reference: Observations, sharded: Observations, tolerance: Tolerance) -> CheckResult:
    """Every prefill token is compared at the bound except those whose expert routing flipped (`routing_flips`):
    a token routed to other experts computes another function, at most MAX_ROUTING_FLIP_SHARE of them."""
    flipped_masked = routing_flips(reference.routing_masked, sharded.routing_masked, reference.logits_masked.shape[0])
    flipped_plain = routing_flips(reference.routing_plain, sharded.routing_plain, reference.logits_plain.shape[1])
    flipped, tokens = int(flipped_masked.sum() + flipped_plain.sum()), len(flipped_masked) + len(flipped_plain)
    scale = max(reference.logits_masked.abs().max().item(), reference.logits_plain.abs().max().item())
    metrics = {"routing_flipped_tokens": float(flipped)} if flipped else {}
    if flipped > MAX_ROUTING_FLIP_SHARE * tokens:
        return CheckResult.failing(
            "logits",
            "numerics",
            metrics,
            Finding(
                f"expert routing differs from the unsharded model's on {flipped} of {tokens} prefill tokens",
                f"(more than {MAX_ROUTING_FLIP_SHARE:.3g} of them: not near-ties)",
            ),
        )
    kept = [
        (reference.logits_masked[~flipped_masked], sharded.logits_masked[~flipped_masked]),
        (reference.logits_plain[:, ~flipped_plain], sharded.logits_plain[:, ~flipped_plain]),
    ]
    # torch's max keeps NaN; Python's max over floats would drop a NaN that is not the first.
    max_abs = torch.stack([(tp - ref).abs().max() for ref, tp in kept]).max().item()
    finite = all(torch.isfinite(tp).all().item() for tp in (sharded.logits_masked, sharded.logits_plain))
    if flipped:
        metrics["routing_flipped_logits_max_rel"] = (
            max(
                (tp[flips] - ref[flips]).abs().max().item() if flips.any() else 0.0
                for ref, tp, flips in (
                    (reference.logits_masked, sharded.logits_masked, flipped_masked),
                    (reference.logits_plain[0], sharded.logits_plain[0], flipped_plain),
                )
            )
            / scale
        )
    allowed = logits_allowance(tolerance, scale)
    excluded = f"{flipped} of {tokens} tokens whose expert routing flipped not compared" if flipped else ""
    finding = (
        None
        if finite and max_abs <= allowed
        else Finding("sharded logits contain NaN/inf")
        if not finite
        else Finding(
            f"prefill logits differ by {max_abs:.3g}",
            f"(allowed {allowed:.3g} at logit scale {scale:.3g}" + (f"; {excluded})" if excluded else ")"),
        )
    )
    return CheckResult.judged(
        "logits",
        "numerics",
        {"logits_max_abs": max_abs, "logits_max_rel": max_abs / scale if scale else 0.0, **metrics},
        finding,
        notes=excluded,
    )


RANKS_AGREE_ULPS = 4
"""Ranks hold the result of one all-reduce or all-gather, so correct ranks agree bit for bit (measured: spread 0.0 in
all 139 default-matrix cells that reached the comparison, 2026-12-03); a few float32 ulps of the logit scale leave room
for a final cast and nothing else (a bf16 logit's own spacing is 2^-8 of its size, 16,000x more)."""


def check_ranks_agree(rank_last_logits: list[torch.Tensor]) -> CheckResult:
    """Each rank's last-position logits of the unmasked prompt must equal rank 0's."""
    first = rank_last_logits[0]
    # torch's max keeps NaN (Python's max would drop a NaN rank and pass it).
    spread = torch.stack([(other - first).abs().max() for other in rank_last_logits]).max().item()
    allowed = RANKS_AGREE_ULPS * torch.finfo(torch.float32).eps * first.abs().max().item()
    finding = (
        None
        if spread <= allowed
        else Finding(f"ranks disagree: logits differ across ranks by {spread:.3g}", f"(allowed {allowed:.3g})")
    )
    return CheckResult.judged("ranks_agree", "numerics", {"rank_logits_spread": spread}, finding)


def _shapes(inputs: CheckInputs) -> list[CheckResult]:
    reference, sharded = inputs.inference()
    return [check_shapes(reference, sharded, inputs.last_logits())]


def _compared(inputs: CheckInputs) -> list[CheckResult]:
    reference, sharded = inputs.inference()
    return [check(reference, sharded, inputs.tolerance)]


REFERENCE = Check(("reference",), "gate", inference, lambda inputs: [check_reference(inputs.inference()[0])])
SHAPES = Check(("shapes",), "gate", inference, _shapes)
LOGITS = Check(("logits",), "compare", inference, _compared)
RANKS_AGREE = Check(("ranks_agree",), "compare", inference, lambda inputs: [check_ranks_agree(inputs.last_logits())])

"""Prefill logits: the sharded model must reproduce the reference logits within tolerance, and
every rank must hold the same logits (the all-reduce joins the shards on all ranks)."""

from __future__ import annotations

import math

import torch

from matrix.registry import Tolerance
from suites.checks.result import CheckResult, Finding, joined, logits_allowance


def check_shapes(reference, sharded, rank_last_logits: list[torch.Tensor]) -> CheckResult:
    """The sharded model's outputs have the reference's shapes on every rank (e.g. a vocab-sharded lm_head
    whose slices were never gathered gives a fraction of the vocabulary). Wrong outputs of the model,
    not a harness failure: the other checks could not even compare them."""
    problems = [Finding(name, f"{tuple(getattr(sharded, name).shape)} vs unsharded {tuple(getattr(reference, name).shape)}")
                for name in ("logits_masked", "logits_plain", "gen_tokens", "gen_logits", "gen_padded_tokens",
                             "gen_padded_logits")
                if getattr(sharded, name).shape != getattr(reference, name).shape]
    problems += [Finding(f"rank {rank} last logits", f"{tuple(last.shape)} vs rank 0 {tuple(rank_last_logits[0].shape)}")
                 for rank, last in enumerate(rank_last_logits) if last.shape != rank_last_logits[0].shape]
    return CheckResult.judged("shapes", "numerics", {},
                              joined(problems, "sharded outputs have the wrong shape: ") if problems else None)


REFERENCE_OUTPUTS = ("logits_masked", "logits_plain", "gen_logits", "gen_padded_logits")


def check_reference(reference) -> CheckResult:
    """The unsharded reference must be finite: NaN there is the model's (or the checkpoint's) own, and
    comparing with it would blame the sharded model. The cell cannot judge AutoTP: `setup`."""
    bad = [name for name in REFERENCE_OUTPUTS if not torch.isfinite(getattr(reference, name)).all().item()]
    if not math.isfinite(reference.nll_sum):
        bad.append("perplexity loss")
    return CheckResult.judged("reference", "setup", {}, Finding(
        f"the unsharded reference is not finite: {', '.join(bad)} hold NaN/inf",
        "(the model computes them without AutoTP; fix the checkpoint or its dtype)") if bad else None)


def check(reference, sharded, tolerance: Tolerance) -> CheckResult:
    pairs = [(reference.logits_masked, sharded.logits_masked), (reference.logits_plain, sharded.logits_plain)]
    # torch's max keeps NaN; Python's max over floats would drop a NaN that is not the first.
    max_abs = torch.stack([(tp - ref).abs().max() for ref, tp in pairs]).max().item()
    scale = max(ref.abs().max().item() for ref, _ in pairs)
    finite = all(torch.isfinite(tp).all().item() for _, tp in pairs)
    allowed = logits_allowance(tolerance, scale)
    finding = (None if finite and max_abs <= allowed
               else Finding("sharded logits contain NaN/inf") if not finite
               else Finding(f"prefill logits differ by {max_abs:.3g}", f"(allowed {allowed:.3g} at logit scale {scale:.3g})"))
    return CheckResult.judged("logits", "numerics",
                              {"logits_max_abs": max_abs, "logits_max_rel": max_abs / scale if scale else 0.0}, finding)


RANKS_AGREE_ULPS = 4
"""Ranks hold the result of one all-reduce or all-gather, so correct ranks agree bit for bit (measured: spread 0.0
in all 139 default-matrix cells that reached the comparison, 2026-12-03); a few float32 ulps of the logit scale leave room for a
final cast and nothing else (a bf16 logit's own spacing is 2^-8 of its size, 16,000x more)."""


def check_ranks_agree(rank_last_logits: list[torch.Tensor]) -> CheckResult:
    """Each rank's last-position logits of the unmasked prompt must equal rank 0's."""
    first = rank_last_logits[0]
    # torch's max keeps NaN (Python's max would drop a NaN rank and pass it).
    spread = torch.stack([(other - first).abs().max() for other in rank_last_logits]).max().item()
    allowed = RANKS_AGREE_ULPS * torch.finfo(torch.float32).eps * first.abs().max().item()
    finding = None if spread <= allowed else Finding(f"ranks disagree: logits differ across ranks by {spread:.3g}",
                                                     f"(allowed {allowed:.3g})")
    return CheckResult.judged("ranks_agree", "numerics", {"rank_logits_spread": spread}, finding)

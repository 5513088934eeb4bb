"""Memory per rank: a sharded model must actually be smaller on each rank.

A model AutoTP leaves whole still computes the right numbers, so only this check notices it. It
looks at the linear layers, the part AutoTP splits: embeddings and norms may stay whole, and they
dominate tiny models. The bound is loose on purpose (uneven head splits, replicated kv heads).
"""

from __future__ import annotations

from suites.checks import CheckResult


def allowed_linear_ratio(tp: int) -> float:
    """Largest per-rank share of the unsharded linear bytes: halfway between a perfect split and none."""
    return (1 + 1 / tp) / 2


def check(reference, rank_param_bytes: list[int]) -> CheckResult:
    tp = len(rank_param_bytes)
    largest = max(rank_param_bytes)
    unsplit_rest = reference.param_bytes - reference.linear_bytes
    linear_ratio = max(largest - unsplit_rest, 0) / reference.linear_bytes
    metrics = {"shard_ratio": largest / reference.param_bytes, "linear_shard_ratio": linear_ratio,
               "rank_param_bytes_max": float(largest)}
    bound = allowed_linear_ratio(tp)
    passed = linear_ratio <= bound
    reason = "" if passed else (f"a rank holds {linear_ratio:.0%} of the unsharded linear-layer bytes on tp {tp} "
                                f"(at most {bound:.0%} expected): the model was not sharded")
    return CheckResult("memory", passed, "memory", metrics, reason)

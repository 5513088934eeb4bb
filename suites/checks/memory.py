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


META_LOAD_MIN_MODEL_BYTES = 100 << 20
"""Below this model size, import and allocator noise in a rank's RSS (tens of MB) hides the model."""


def check_meta_load(reference, rank_peak_growth: float) -> CheckResult:
    """`meta` load: no rank may materialise the full model. Its peak RSS growth from before loading
    to the end of sharding must stay below the unsharded model's bytes (eager grows by more than them)."""
    full = reference.param_bytes
    metrics = {"meta_load_growth_ratio": rank_peak_growth / full}
    if full < META_LOAD_MIN_MODEL_BYTES:
        return CheckResult("meta_memory", True, "memory", metrics)
    passed = rank_peak_growth < full
    reason = "" if passed else (f"a rank's peak RSS grew by {rank_peak_growth / 2**20:.0f} MiB while loading on the meta device "
                                f"(full model {full / 2**20:.0f} MiB): the full model was materialised")
    return CheckResult("meta_memory", passed, "memory", metrics, reason)

"""Memory per rank: a sharded model must actually be smaller on each rank.

A model AutoTP leaves whole still computes the right numbers, so only this check notices it. Every
parameter and buffer counts, by kind (suites/checks/probes.py `tensor_kinds`): attention/MLP linears and MoE
experts must be split; embeddings + lm_head and the rest (norms, rotary tables) may stay whole and are
only recorded. Kinds come from the unsharded model's modules and are joined to each rank's tensors by
name (AutoTP keeps the names of the layers it replaces). The bound is loose on purpose (uneven head
splits, replicated kv heads, routers left whole).
"""

from __future__ import annotations

from suites.checks.result import CheckResult
from suites.checks.probes import KINDS

SPLIT_KINDS = ("linears", "experts")
MIN_KIND_BYTES = 1 << 10
"""A kind smaller than this (e.g. one router's bias) is too small to judge."""


def allowed_ratio(tp: int) -> float:
    """Largest per-rank share of an unsharded kind's bytes: halfway between a perfect split and none."""
    return (1 + 1 / tp) / 2


def kind_totals(bytes_by_name: dict[str, int], kinds: dict[str, str]) -> dict[str, int]:
    totals = dict.fromkeys(KINDS, 0)
    for name, size in bytes_by_name.items():
        totals[kinds.get(name, "rest")] += size
    return totals


def check(reference, rank_bytes_by_name: list[dict[str, int]]) -> CheckResult:
    tp = len(rank_bytes_by_name)
    unsharded = kind_totals(reference.bytes_by_name, reference.kinds)
    ranks = [kind_totals(by_name, reference.kinds) for by_name in rank_bytes_by_name]
    largest = max(sum(totals.values()) for totals in ranks)
    metrics = {"shard_ratio": largest / reference.param_bytes, "rank_param_bytes_max": float(largest)}
    bound, problems = allowed_ratio(tp), []
    for kind in KINDS:
        if not unsharded[kind]:
            continue
        rank, held = max(enumerate(totals[kind] for totals in ranks), key=lambda pair: pair[1])
        metrics[f"{kind.removesuffix('s')}_shard_ratio"] = held / unsharded[kind]
        if kind in SPLIT_KINDS and unsharded[kind] >= MIN_KIND_BYTES and held / unsharded[kind] > bound:
            problems.append(f"{kind} not sharded: rank {rank} holds {held / 2**20:.3g} of {unsharded[kind] / 2**20:.3g} MiB "
                            f"({held / unsharded[kind]:.0%}; at most {bound:.0%} expected on tp {tp})")
    return CheckResult("memory", not problems, "memory", metrics, "; ".join(problems))


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

"""Memory per rank: every weight AutoTP must split is split, on every rank.

A model AutoTP leaves whole, or half whole (attention left whole, MLP split), still computes the right
numbers, so only this check notices it. Every weight (a parameter of two or more dimensions) of a split kind
(attention/MLP linears and MoE experts, suites/checks/probes.py `tensor_kinds`) is judged on its own, joined
to each rank's tensors by name (AutoTP keeps the names of the layers it replaces):
- split: the largest rank's share may be at most ceil(u/tp)/u, u being the pieces the split allows (whole
  heads, 64-wide grains: the greatest common divisor of what the ranks hold), so a split exactly as uneven as
  the model's counts force passes (6 heads on 4 ranks: 2/6) and a more uneven one fails;
- left whole on every rank: a failure, unless AutoTP keeps that weight whole by design, which is a named rule
  (`whole_by_design`) reported with the cell, never slack in a bound.
Every tensor a rank holds must exist in the unsharded model: a renamed or re-wrapped layer would otherwise
never be judged. Totals per kind are recorded (`<kind>_shard_ratio`): embeddings + lm_head, convolution
kernels and the rest (norms, rotary tables) may stay whole.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from suites.checks.probes import KINDS, SPLIT_KINDS, Footprint, SplitCounts, TensorKind
from suites.checks.result import CheckResult, Finding, joined

SHARE_EPSILON = 1e-6
"""Float slack on a share computed from integer byte counts."""
DESIGN_WHOLE_NAMES = ("q_a_proj", "kv_a_proj_with_mqa", "shared_expert_gate")
"""Weights DeepSpeed's auto_tp.py `_replace` skips by name: DeepSeek's low-rank projections, qwen2_moe's shared
expert gate (its MoE routers are matched by their output features, `SplitCounts.experts`)."""


@dataclass(frozen=True)
class WeightShare:
    """One weight of a split kind as the ranks hold it."""

    name: str
    kind: str
    share: float
    """Largest rank's bytes of it / the unsharded bytes."""
    allowed: float
    """ceil(u/tp)/u for the u pieces the ranks' split allows; 1.0 when every rank holds it whole."""
    rank: int
    """The rank holding the largest share."""
    whole: bool
    """Every rank holds all of it."""


def kind_totals(bytes_by_name: dict[str, int], kinds: dict[str, TensorKind]) -> dict[str, int]:
    totals: dict[str, int] = dict.fromkeys(KINDS, 0)
    for name, size in bytes_by_name.items():
        totals[kinds.get(name, "rest")] += size
    return totals


def weight_shares(unsharded: Footprint, rank_bytes_by_name: list[dict[str, int]]) -> list[WeightShare]:
    tp = len(rank_bytes_by_name)
    shares = []
    for name, shape in unsharded.shapes_by_name.items():
        kind, full = unsharded.kinds.get(name), unsharded.bytes_by_name.get(name)
        if kind not in SPLIT_KINDS or len(shape) < 2 or not full:
            continue  # biases follow their weight; a tied alias is judged under its first name
        held = [by_name.get(name, 0) for by_name in rank_bytes_by_name]
        rank = max(range(tp), key=held.__getitem__)
        pieces = full // math.gcd(full, *held)
        shares.append(
            WeightShare(
                name, kind, held[rank] / full, math.ceil(pieces / tp) / pieces, rank, all(size == full for size in held)
            )
        )
    return shares


def whole_by_design(name: str, shape: tuple[int, ...], counts: SplitCounts, tp: int) -> str:
    """Why AutoTP keeps this weight whole on every rank by design, or "" when it should have split it."""
    layer = name.removesuffix(".weight").rsplit(".", 1)[-1]
    if len(shape) != 2:
        return ""  # the rules are about single linear layers; fused experts must always split
    if layer in DESIGN_WHOLE_NAMES:
        return "skipped by name in DeepSpeed's auto_tp.py"
    if counts.experts and shape[0] == counts.experts:
        return f"MoE router ({counts.experts} experts): AutoTP keeps routers whole"
    attention = any(part in name for part in ("attn", "attention"))
    if attention and 0 < counts.kv_heads < tp and shape[0] == counts.kv_heads * counts.head_dim:
        return f"{counts.kv_heads} kv heads < tp {tp}: each rank holds whole kv heads"
    return ""


def layer_groups(names: list[str]) -> str:
    """`model.layers.*.self_attn.{q_proj,k_proj}` for the weights of every layer index, in first-seen order."""
    grouped: dict[str, list[str]] = {}
    for name in names:
        parent, _, leaf = re.sub(r"\.\d+(?=\.)", ".*", name.removesuffix(".weight")).rpartition(".")
        leaves = grouped.setdefault(parent, [])
        if leaf not in leaves:
            leaves.append(leaf)
    return ", ".join(
        f"{parent}.{leaves[0] if len(leaves) == 1 else '{' + ','.join(leaves) + '}'}".lstrip(".")
        for parent, leaves in grouped.items()
    )


def _unknown_names(unsharded: Footprint, rank_bytes_by_name: list[dict[str, int]]) -> list[Finding]:
    for rank, by_name in enumerate(rank_bytes_by_name):
        unknown = [name for name in by_name if name not in unsharded.kinds]
        if unknown:
            return [
                Finding(
                    f"tensors the unsharded model does not have: {layer_groups(unknown)}",
                    f"(rank {rank}; a renamed or re-wrapped layer cannot be judged)",
                )
            ]
    return []


def check(unsharded: Footprint, rank_bytes_by_name: list[dict[str, int]]) -> CheckResult:
    tp = len(rank_bytes_by_name)
    unsharded_totals = kind_totals(unsharded.bytes_by_name, unsharded.kinds)
    ranks = [kind_totals(by_name, unsharded.kinds) for by_name in rank_bytes_by_name]
    largest = max(sum(totals.values()) for totals in ranks)
    metrics = {"shard_ratio": largest / unsharded.param_bytes, "rank_param_bytes_max": float(largest)}
    for kind in KINDS:
        if unsharded_totals[kind]:
            metrics[f"{kind.removesuffix('s')}_shard_ratio"] = (
                max(totals[kind] for totals in ranks) / unsharded_totals[kind]
            )
    problems, notes = _unknown_names(unsharded, rank_bytes_by_name), []
    shares = weight_shares(unsharded, rank_bytes_by_name)
    for kind in SPLIT_KINDS:
        judged = [share for share in shares if share.kind == kind]
        designed = {
            share.name: whole_by_design(share.name, unsharded.shapes_by_name[share.name], unsharded.counts, tp)
            for share in judged
            if share.whole
        }
        whole = [share.name for share in judged if share.whole and not designed[share.name]]
        if whole:
            problems.append(
                Finding(
                    f"{kind} left whole: {layer_groups(whole)}",
                    f"({len(judged) - len(whole)} of {len(judged)} {kind} split on tp {tp})",
                )
            )
        for reason in dict.fromkeys(reason for reason in designed.values() if reason):
            kept = [name for name, why in designed.items() if why == reason]
            notes.append(f"{kind} kept whole by design: {layer_groups(kept)} ({reason})")
        uneven = [share for share in judged if not share.whole and share.share > share.allowed + SHARE_EPSILON]
        if uneven:
            worst = max(uneven, key=lambda share: share.share - share.allowed)
            problems.append(
                Finding(
                    f"{kind} split unevenly: {layer_groups([share.name for share in uneven])}",
                    f"(rank {worst.rank} holds {worst.share:.0%} of {worst.name}; at most "
                    f"{worst.allowed:.0%} on tp {tp})",
                )
            )
    return CheckResult.judged("memory", "memory", metrics, joined(problems) if problems else None, "; ".join(notes))


META_LOAD_MIN_MODEL_BYTES = 100 << 20
"""Below this model size, import and allocator noise in a rank's RSS (tens of MB) hides the model."""


def check_meta_load(unsharded: Footprint, rank_peak_growth: float) -> CheckResult:
    """`meta` load: no rank may materialise the full model. Its peak RSS growth from before loading
    to the end of sharding must stay below the unsharded model's bytes (eager grows by more than them)."""
    full = unsharded.param_bytes
    metrics = {"meta_load_growth_ratio": rank_peak_growth / full}
    if full < META_LOAD_MIN_MODEL_BYTES:
        return CheckResult("meta_memory", True, "memory", metrics)
    return CheckResult.judged(
        "meta_memory",
        "memory",
        metrics,
        None
        if rank_peak_growth < full
        else Finding(
            f"a rank's peak RSS grew by {rank_peak_growth / 2**20:.0f} MiB while loading on the meta device",
            f"(full model {full / 2**20:.0f} MiB): the full model was materialised",
        ),
    )

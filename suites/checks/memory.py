"""Memory per rank: every weight AutoTP must split is split, on every rank.

A model AutoTP leaves whole, or half whole (attention left whole, MLP split), still computes the right
numbers, so only this check notices it. Every weight (a parameter of two or more dimensions) of a split kind
(attention/MLP linears and MoE experts, suites/checks/probes.py `tensor_kinds`) is judged on its own, joined
to each rank's tensors by name (AutoTP keeps the names of the layers it replaces):
- split: the largest rank's share may be at most ceil(u/tp)/u, u being the pieces the weight's split is made of,
  from the model's counts, never from what the ranks hold (`allowance`): its heads (query heads; kv heads, whose
  groups of query heads stay together; with fewer kv heads than tp the query heads still spread over the ranks),
  experts, or 64-wide grains. A split exactly as uneven as the counts force passes (6 heads on 4 ranks: 2/6), a
  more uneven one fails, and so does a weight one rank holds all of while the others hold none (DeepSpeed splits
  attention in kv-head units: with one kv head, rank 0 gets every query head);
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
PACKED_HALVES = ("gate_up_proj", "dense_h_to_4h")
"""Packed gate and up projections, which DeepSpeed splits half by half (layers.py `GateUpPack_LinearLayer`)."""
TP_GRAIN = 64
"""DeepSpeed's `tensor_parallel.tp_grain_size` (>= 0.16.2): a dimension that is not heads splits in pieces this wide."""
DESIGN_WHOLE_NAMES = ("q_a_proj", "kv_a_proj_with_mqa", "shared_expert_gate")
"""Weights DeepSpeed's auto_tp.py `_replace` skips by name: DeepSeek's low-rank projections, qwen2_moe's shared
expert gate (its MoE routers are matched by their output features, `SplitCounts.experts`)."""


@dataclass(frozen=True)
class Allowance:
    """The largest share of a weight one rank may hold, from the pieces its split is made of."""

    share: float
    units: int
    unit: str
    """What a piece is: `query heads`, `kv heads`, `kv head groups`, `experts`, `64-wide grains`, ..."""
    rule: str = ""
    """The design rule that sets the pieces, where one does (`1 kv head < tp 2`)."""


def _even(units: int, tp: int, unit: str, rule: str = "") -> Allowance:
    return Allowance(math.ceil(units / tp) / units, units, unit, rule)


def allowance(name: str, shape: tuple[int, ...], dim: int, counts: SplitCounts, tp: int) -> Allowance:
    """The pieces a weight split along `dim` is made of, from the model's counts: an attention weight's heads (kv
    head groups when there are at least tp kv heads; query heads otherwise, every kv head held whole where it is
    needed), a fused expert weight's experts, otherwise 64-wide grains (DeepSpeed's tp_grain_size; of each half of a
    packed gate and up projection, which DeepSpeed splits half by half). A dimension the kv-head count divides may
    also be split in kv-head units (tp_shard.py `get_shard_size`), except the query heads of too few kv heads."""
    size, heads, kv, head_dim = shape[dim], counts.heads, counts.kv_heads, counts.head_dim
    if len(shape) >= 3 and dim == 0 and counts.experts and size == counts.experts:
        return _even(size, tp, "experts")
    attention = any(part in name for part in ("attn", "attention"))
    if attention and heads and head_dim and size % head_dim == 0:
        count, few = size // head_dim, f"{kv} kv head{'s' if kv > 1 else ''} < tp {tp}"
        if 0 < kv < heads and count == kv:  # a key or value projection
            return Allowance(1 / kv, kv, "kv heads", few) if kv < tp else _even(kv, tp, "kv heads")
        if count in (heads, heads + 2 * kv) and 0 < kv < tp:
            query = math.ceil(heads / tp)
            return Allowance((query + count - heads) / count, heads, "query heads", few)
        if count in (heads, heads + 2 * kv) and kv and heads % kv == 0:
            return _even(kv, tp, "kv head groups")
        by_pieces = _even(count, tp, "heads")
    else:
        halves = 2 if any(packed in name for packed in PACKED_HALVES) and size % 2 == 0 else 1
        half = size // halves
        grains = half // TP_GRAIN
        by_pieces = (
            Allowance(
                (math.ceil(grains / tp) * TP_GRAIN + half % TP_GRAIN) / half,
                grains,
                f"{TP_GRAIN}-wide grains{' of each half' if halves == 2 else ''}",
            )
            if grains
            else _even(half, tp, "rows")
        )
    if kv >= tp and size % kv == 0 and (by_kv := _even(kv, tp, "kv-head units")).share > by_pieces.share:
        return by_kv
    return by_pieces


@dataclass(frozen=True)
class WeightShare:
    """One weight of a split kind as the ranks hold it."""

    name: str
    kind: str
    share: float
    """Largest rank's bytes of it / the unsharded bytes."""
    allowed: Allowance | None
    """The largest share the pieces of its split allow; None when every rank holds it whole."""
    rank: int
    """The rank holding the largest share."""
    held: tuple[int, ...]
    """Each rank's bytes of it."""
    full: int

    @property
    def whole(self) -> bool:
        """Every rank holds all of it."""
        return all(size == self.full for size in self.held)

    @property
    def uneven(self) -> bool:
        return self.allowed is not None and self.share > self.allowed.share + SHARE_EPSILON

    def finding(self, tp: int) -> str:
        """`(q_proj: rank 0 holds all 8 query heads, the others none — 1 kv head < tp 2)` for a weight one rank holds
        all of, else the largest share against the allowed one."""
        assert self.allowed is not None
        allowed, rule = self.allowed, f" — {self.allowed.rule}" if self.allowed.rule else ""
        leaf = self.name.removesuffix(".weight").rsplit(".", 1)[-1]
        if self.held[self.rank] == self.full and sum(self.held) == self.full:
            return f"({leaf}: rank {self.rank} holds all {allowed.units} {allowed.unit}, the others none{rule})"
        return (
            f"(rank {self.rank} holds {self.share:.0%} of {self.name}; at most {allowed.share:.0%} on tp {tp}: "
            f"{allowed.units} {allowed.unit}{rule})"
        )


def kind_totals(bytes_by_name: dict[str, int], kinds: dict[str, TensorKind]) -> dict[str, int]:
    totals: dict[str, int] = dict.fromkeys(KINDS, 0)
    for name, size in bytes_by_name.items():
        totals[kinds.get(name, "rest")] += size
    return totals


def split_dim(full: tuple[int, ...], held: list[tuple[int, ...] | None], held_bytes: list[int], whole: int) -> int:
    """The dimension the ranks' shapes split; without shapes (a training rank reports bytes), the first dimension
    whose slices the held bytes are whole numbers of."""
    for shape in held:
        if shape is not None and len(shape) == len(full):
            differing = [dim for dim, (a, b) in enumerate(zip(shape, full)) if a != b]
            if differing:
                return differing[0]
    for dim, size in enumerate(full):
        if whole % size == 0 and all(size_held % (whole // size) == 0 for size_held in held_bytes):
            return dim
    return 0


def weight_shares(
    unsharded: Footprint,
    rank_bytes_by_name: list[dict[str, int]],
    rank_shapes_by_name: list[dict[str, tuple[int, ...]]] | None = None,
) -> list[WeightShare]:
    tp = len(rank_bytes_by_name)
    shares = []
    for name, shape in unsharded.shapes_by_name.items():
        kind, full = unsharded.kinds.get(name), unsharded.bytes_by_name.get(name)
        if kind not in SPLIT_KINDS or len(shape) < 2 or not full:
            continue  # biases follow their weight; a tied alias is judged under its first name
        held = [by_name.get(name, 0) for by_name in rank_bytes_by_name]
        rank = max(range(tp), key=held.__getitem__)
        allowed = None
        if not all(size == full for size in held):
            shapes = [by_name.get(name) for by_name in rank_shapes_by_name] if rank_shapes_by_name else [None] * tp
            allowed = allowance(name, shape, split_dim(shape, shapes, held, full), unsharded.counts, tp)
        share = WeightShare(
            name=name,
            kind=kind,
            share=held[rank] / full,
            allowed=allowed,
            rank=rank,
            held=tuple(held),
            full=full,
        )
        shares.append(share)
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


def check(
    unsharded: Footprint,
    rank_bytes_by_name: list[dict[str, int]],
    rank_shapes_by_name: list[dict[str, tuple[int, ...]]] | None = None,
) -> CheckResult:
    """`rank_shapes_by_name`: the shapes each rank holds, which tell the dimension a weight was split along (without
    them it is read from the bytes)."""
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
    shares = weight_shares(unsharded, rank_bytes_by_name, rank_shapes_by_name)
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
        uneven = [share for share in judged if share.uneven]
        if uneven:
            worst = max(uneven, key=lambda share: share.share - (share.allowed.share if share.allowed else 0))
            problems.append(
                Finding(f"{kind} split unevenly: {layer_groups([share.name for share in uneven])}", worst.finding(tp))
            )
        for rule in dict.fromkeys(share.allowed.rule for share in judged if share.allowed and share.allowed.rule):
            held = [share.name for share in judged if share.allowed and share.allowed.rule == rule and not share.uneven]
            if held:
                notes.append(f"{kind} split by design: {layer_groups(held)} ({rule})")
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

"""Memory per rank: every weight AutoTP must split is split, on every rank.

A model AutoTP leaves whole, or half whole (attention left whole, MLP split), still computes the right
numbers, so only this check notices it. Every weight (a parameter of two or more dimensions) of a split kind
(attention/MLP linears and MoE experts, suites/checks/probes.py `tensor_kinds`) is judged on its own, joined
to each rank's tensors by name (AutoTP keeps the names of the layers it replaces):
- split: the largest rank's share may be at most ceil(u/tp)/u, u being the pieces the weight's split is made of,
  from the model's counts, never from what the ranks hold (`allowance`): its heads (query heads; kv heads, whose
  groups of query heads stay together; with fewer kv heads than tp the query heads still spread over the ranks;
  differential attention's kv-head pairs), experts, or 64-wide grains. A split exactly as uneven as the counts
  force passes (6 heads on 4 ranks: 2/6), a more uneven one fails, and so does a weight one rank holds all of while
  the others hold none (DeepSpeed splits attention in kv-head units: with one kv head, rank 0 gets every query head);
- left whole on every rank: a failure, unless AutoTP keeps that weight whole by design, which is a named rule
  (`whole_by_design`) reported with the cell, never slack in a bound.
A faithful cell (matrix/shapes.py) stands for a real checkpoint whose counts its tiny ones only share the split
pattern with: its weights are judged with the real checkpoint's counts (`real` of `allowance`), a split passing that
is exactly the even split of the tiny counts (the image of the real checkpoint's even split). The output head is
judged like a split weight where DeepSpeed's design splits it (`output_head`); a head tied to the input embedding
that DeepSpeed splits by a copy is a note (it runs right, each rank holding the whole embedding besides).
Every tensor a rank holds must exist in the unsharded model: a renamed or re-wrapped layer would otherwise
never be judged. Totals per kind are recorded (`<kind>_shard_ratio`): embeddings, convolution kernels and the rest
(norms, rotary tables) may stay whole.
The standalone repro script judges by this code, copied in (`RULES`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from suites.checks.interface import Check, CheckInputs, inference
from suites.checks.probes import KINDS, SPLIT_KINDS, Footprint, SplitCounts, TensorKind
from suites.checks.probes import PAIRED_HEADS as PAIRED_HEADS  # a rule constant (RULE_CONSTANTS)
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


OUTPUT_HEADS = {
    "lm_head": ((0, 12, 0), (0, 16, 3)),
    "embed_out": ((0, 12, 0), (0, 16, 3)),
    "language_model.lm_head": ((0, 16, 0), (0, 16, 3)),
}
"""The output heads DeepSpeed's inference AutoTP splits (replace_module.py `set_lm_head`, an `nn.Linear` under one of
these names, as `LmHeadLinearAllreduce`: row-parallel in 64-wide grains of the hidden width) and the release each
name is split from: (when `init_inference` loads a checkpoint json, without one). `set_lm_head` ran only on the
checkpoint-loading path (`lm_head`/`embed_out` since #3962, 0.12.0; `language_model.lm_head` since 0.16.0) until
#6812 ("Support pure meta model lm_head tp", 0.16.3) ran it on every AutoTP path. Before that release, in training
(`deepspeed.initialize`, whose output head follows its own partition config) and under any other name, the output
head stays whole by design."""


@dataclass(frozen=True)
class Allowance:
    """The largest share of a weight one rank may hold, from the pieces its split is made of."""

    share: float
    units: int
    unit: str
    """What a piece is: `query heads`, `kv heads`, `kv head groups`, `experts`, `64-wide grains`, ..."""
    rule: str = ""
    """The design rule that sets the pieces, where one does (`1 kv head < tp 2`)."""
    least: float = 0.0
    """The smallest share the even split of the pieces gives a rank: a split between `least` and `share` on every
    rank is that even split."""


def _even(units: int, tp: int, unit: str, rule: str = "") -> Allowance:
    return Allowance(math.ceil(units / tp) / units, units, unit, rule, units // tp / units)


def _is_output_head(name: str) -> bool:
    """DeepSpeed's own test (tp_shard.py `get_shard_size`): an output head never splits in kv-head units."""
    return "lm_head" in name or "embed_out" in name


def real_shape(name: str, shape: tuple[int, ...], dim: int, counts: SplitCounts, real: SplitCounts) -> tuple[int, ...]:
    """The weight's shape in the real checkpoint a faithful cell stands for, along the split dimension where it is
    made of counted pieces (query heads, query+key+value heads, kv heads, experts); any other dimension (64-wide
    grains) keeps the tiny size, which the faithful shape made split like the real one."""
    size, heads, kv, head_dim = shape[dim], counts.heads, counts.kv_heads, counts.head_dim
    real_size = size
    if len(shape) >= 3 and dim == 0 and counts.experts and size == counts.experts:
        real_size = real.experts
    elif any(part in name for part in ("attn", "attention")) and heads and head_dim and size % head_dim == 0:
        by_count = {  # a query projection first where the kv heads are as many
            kv: real.kv_heads,
            heads + 2 * kv: real.heads + 2 * real.kv_heads,
            heads: real.heads,
        }
        real_size = by_count.get(size // head_dim, size // head_dim) * real.head_dim
    return (*shape[:dim], real_size or size, *shape[dim + 1 :])


def allowance(name: str, shape: tuple[int, ...], dim: int, counts: SplitCounts, tp: int) -> Allowance:
    """The pieces a weight split along `dim` is made of, from the model's counts: an attention weight's heads (kv
    head groups when there are at least tp kv heads; query heads otherwise, every kv head held whole where it is
    needed; differential attention's kv-head pairs, `SplitCounts.head_pairs`), a fused expert weight's experts,
    otherwise 64-wide grains (DeepSpeed's tp_grain_size; of each half of a packed gate and up projection, which
    DeepSpeed splits half by half). A dimension the kv-head count divides may also be split in kv-head units
    (tp_shard.py `get_shard_size`), except the query heads of too few kv heads."""
    size, heads, kv, head_dim = shape[dim], counts.heads, counts.kv_heads, counts.head_dim
    if len(shape) >= 3 and dim == 0 and counts.experts and size == counts.experts:
        return _even(size, tp, "experts")
    attention = any(part in name for part in ("attn", "attention"))
    if attention and heads and head_dim and size % head_dim == 0:
        count, few = size // head_dim, f"{kv} kv head{'s' if kv > 1 else ''} < tp {tp}"
        if counts.head_pairs and kv % 2 == 0 and count in (kv, heads, heads + 2 * kv):
            return _even(kv // 2, tp, "kv-head pairs")  # differential attention: a pair is the smallest piece
        if 0 < kv < heads and count == kv:  # a key or value projection
            return Allowance(1 / kv, kv, "kv heads", few, 1 / kv) if kv < tp else _even(kv, tp, "kv heads")
        if count in (heads, heads + 2 * kv) and 0 < kv < tp:
            most, least = math.ceil(heads / tp), heads // tp
            return Allowance((most + count - heads) / count, heads, "query heads", few, (least + count - heads) / count)
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
                least=grains // tp * TP_GRAIN / half,
            )
            if grains
            else _even(half, tp, "rows")
        )
    kv_units = kv >= tp and size % kv == 0 and not _is_output_head(name)
    if kv_units and (by_kv := _even(kv, tp, "kv-head units")).share > by_pieces.share:
        return by_kv
    return by_pieces


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


@dataclass(frozen=True)
class WeightShare:
    """One weight of a split kind (or the output head DeepSpeed splits) as the ranks hold it."""

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
    real: Allowance | None = None
    """A faithful cell's allowance at the counts of the real checkpoint it stands for (`allowance` of `real_shape`);
    None for a stress cell, or where the tiny pieces are the real ones."""

    @property
    def whole(self) -> bool:
        """Every rank holds all of it."""
        return all(size == self.full for size in self.held)

    @property
    def even(self) -> bool:
        """Every rank holds what the even split of the (tiny) pieces gives it: the image of the real checkpoint's
        even split, whatever share that is of the tiny weight."""
        return self.allowed is not None and all(
            self.allowed.least - SHARE_EPSILON <= size / self.full <= self.allowed.share + SHARE_EPSILON
            for size in self.held
        )

    @property
    def uneven(self) -> bool:
        bound = self.real or self.allowed
        return bound is not None and self.share > bound.share + SHARE_EPSILON and not self.even

    def finding(self, tp: int) -> str:
        """`(q_proj: rank 0 holds all 8 query heads, the others none — 1 kv head < tp 2)` for a weight one rank holds
        all of, else the largest share against the allowed one (a faithful cell's: the real checkpoint's)."""
        assert self.allowed is not None
        allowed = self.real or self.allowed
        rule = f" — {allowed.rule}" if allowed.rule else ""
        leaf = self.name.removesuffix(".weight").rsplit(".", 1)[-1]
        if self.held[self.rank] == self.full and sum(self.held) == self.full:
            return (
                f"({leaf}: rank {self.rank} holds all {self.allowed.units} {self.allowed.unit}, the others none{rule})"
            )
        pieces = f"{allowed.units} {allowed.unit}{' of the real checkpoint' if self.real else ''}"
        return (
            f"(rank {self.rank} holds {self.share:.0%} of {self.name}; at most {allowed.share:.0%} on tp {tp}: "
            f"{pieces}{rule})"
        )


def weight_share(
    name: str,
    kind: str,
    shape: tuple[int, ...],
    full: int,
    held: list[int],
    held_shapes: list[tuple[int, ...] | None],
    counts: SplitCounts,
    real: SplitCounts | None = None,
) -> WeightShare:
    """One weight as `tp` ranks hold it (`held`: each rank's bytes; `held_shapes`: its shape there, None unknown),
    judged by the pieces of its split: the model's counts, and a faithful cell's real checkpoint's (`real`)."""
    tp = len(held)
    rank = max(range(tp), key=held.__getitem__)
    allowed, at_real = None, None
    if not all(size == full for size in held):
        dim = split_dim(shape, held_shapes, held, full)
        allowed = allowance(name, shape, dim, counts, tp)
        if real is not None and real != counts:
            at_real = allowance(name, real_shape(name, shape, dim, counts, real), dim, real, tp)
    return WeightShare(name, kind, held[rank] / full, allowed, rank, tuple(held), full, at_real)


def output_head(shapes_by_name: dict[str, tuple[int, ...]], release: tuple[int, ...], checkpoint_json: bool) -> str:
    """The name of the output head weight DeepSpeed splits at `release` (`OUTPUT_HEADS`; `checkpoint_json`: whether
    `init_inference` loaded a checkpoint json), or ""."""
    for head, (with_json, without) in OUTPUT_HEADS.items():
        since = with_json if checkpoint_json else without
        if len(shapes_by_name.get(f"{head}.weight", ())) == 2 and release >= since:
            return f"{head}.weight"
    return ""


def tied_partner(name: str, bytes_by_name: dict[str, int], shapes_by_name: dict[str, tuple[int, ...]]) -> str:
    """The first name of the weight `name` is tied to (`bytes_by_name` lists a tied weight under its first name
    only), or "" when it is not tied."""
    if name in bytes_by_name:
        return ""
    shape = shapes_by_name[name]
    return next((other for other in bytes_by_name if other != name and shapes_by_name.get(other) == shape), "")


def head_note(share: WeightShare, partner: str, partner_held: list[int]) -> str:
    """A tied output head split by a copy: each rank holds the whole embedding and its share of the head."""
    if share.whole or not all(size == share.full for size in partner_held):
        return ""
    held = 1 + share.share
    return (
        f"output head tied to {partner} split by a copy: rank {share.rank} holds {held:.2f}x the tied weight's "
        f"unsharded bytes (the embedding whole and {share.share:.0%} of the head) — it runs correctly but saves less "
        "memory; "
        "DeepSpeed's design: LmHeadLinearAllreduce clones the tied weight and leaves the embedding whole"
    )


def kind_totals(bytes_by_name: dict[str, int], kinds: dict[str, TensorKind]) -> dict[str, int]:
    totals: dict[str, int] = dict.fromkeys(KINDS, 0)
    for name, size in bytes_by_name.items():
        totals[kinds.get(name, "rest")] += size
    return totals


def weight_shares(
    unsharded: Footprint,
    rank_bytes_by_name: list[dict[str, int]],
    rank_shapes_by_name: list[dict[str, tuple[int, ...]]] | None = None,
    real: SplitCounts | None = None,
) -> list[WeightShare]:
    tp = len(rank_bytes_by_name)
    shares = []
    for name, shape in unsharded.shapes_by_name.items():
        kind, full = unsharded.kinds.get(name), unsharded.bytes_by_name.get(name)
        if kind not in SPLIT_KINDS or len(shape) < 2 or not full:
            continue  # biases follow their weight; a tied alias is judged under its first name
        held = [by_name.get(name, 0) for by_name in rank_bytes_by_name]
        shapes = [by_name.get(name) for by_name in rank_shapes_by_name] if rank_shapes_by_name else [None] * tp
        shares.append(weight_share(name, kind, shape, full, held, shapes, unsharded.counts, real))
    return shares


def judge_head(
    shapes_by_name: dict[str, tuple[int, ...]],
    bytes_by_name: dict[str, int],
    rank_bytes_by_name: list[dict[str, int]],
    rank_shapes_by_name: list[dict[str, tuple[int, ...]]] | None,
    counts: SplitCounts,
    release: tuple[int, ...],
    checkpoint_json: bool,
) -> tuple[str, str, str]:
    """The output head where DeepSpeed's design splits it at `release` (`checkpoint_json`: whether `init_inference`
    loaded a checkpoint json), as (finding, its figures, note): left whole or split unevenly is a finding; a tied head
    split by a copy a note; ("", "", "") when there is nothing to say."""
    name = output_head(shapes_by_name, release, checkpoint_json)
    partner = tied_partner(name, bytes_by_name, shapes_by_name) if name else ""
    full = bytes_by_name.get(partner or name, 0)
    if not full:
        return "", "", ""
    shape, tp = shapes_by_name[name], len(rank_bytes_by_name)
    partner_held = [by_name.get(partner, 0) for by_name in rank_bytes_by_name] if partner else []
    # A rank that lists no head of its own while holding the whole tied weight holds the head as that weight.
    held = [
        by_name.get(name, full if partner and by_name.get(partner) == full else 0) for by_name in rank_bytes_by_name
    ]
    shapes = [by_name.get(name) for by_name in rank_shapes_by_name] if rank_shapes_by_name else [None] * tp
    share = weight_share(name, "output head", shape, full, held, shapes, counts)
    head = name.removesuffix(".weight")
    if share.whole:
        since = ".".join(map(str, OUTPUT_HEADS[head][0 if checkpoint_json else 1]))
        loaded = "loading a checkpoint json" if checkpoint_json else "without a checkpoint json"
        return (
            f"output head left whole: {head}",
            f"(every rank holds all {shape[0]}x{shape[1]} of it; DeepSpeed >= {since} splits an nn.Linear {head} "
            f"as LmHeadLinearAllreduce {loaded})",
            "",
        )
    if share.uneven:
        return f"output head split unevenly: {head}", share.finding(tp), ""
    return "", "", head_note(share, partner, partner_held) if partner else ""


def check(
    unsharded: Footprint,
    rank_bytes_by_name: list[dict[str, int]],
    rank_shapes_by_name: list[dict[str, tuple[int, ...]]] | None = None,
    *,
    real: SplitCounts | None = None,
    deepspeed_release: tuple[int, ...] | None = None,
    checkpoint_json: bool = False,
) -> CheckResult:
    """The memory check's result: `memory_findings` with each kind's largest rank share as metrics."""
    unsharded_totals = kind_totals(unsharded.bytes_by_name, unsharded.kinds)
    ranks = [kind_totals(by_name, unsharded.kinds) for by_name in rank_bytes_by_name]
    largest = max(sum(totals.values()) for totals in ranks)
    metrics = {"shard_ratio": largest / unsharded.param_bytes, "rank_param_bytes_max": float(largest)}
    for kind in KINDS:
        if unsharded_totals[kind]:
            metrics[f"{kind.removesuffix('s')}_shard_ratio"] = (
                max(totals[kind] for totals in ranks) / unsharded_totals[kind]
            )
    problems, notes = memory_findings(
        unsharded, rank_bytes_by_name, rank_shapes_by_name, real, deepspeed_release, checkpoint_json
    )
    return CheckResult.judged("memory", "memory", metrics, joined(problems) if problems else None, "; ".join(notes))


def memory_findings(
    unsharded: Footprint,
    rank_bytes_by_name: list[dict[str, int]],
    rank_shapes_by_name: list[dict[str, tuple[int, ...]]] | None,
    real: SplitCounts | None,
    deepspeed_release: tuple[int, ...] | None,
    checkpoint_json: bool,
) -> tuple[list[Finding], list[str]]:
    """What is wrong with how the ranks hold the weights, and the design rules that kept or split some (notes).
    `rank_shapes_by_name`: the shapes each rank holds, which tell the dimension a weight was split along (without
    them it is read from the bytes). `real`: a faithful cell's real checkpoint counts. `deepspeed_release`: the
    DeepSpeed release of an inference cell, whose design decides whether the output head splits (None: no head rule,
    as in training), with `checkpoint_json`: whether its `init_inference` loaded a checkpoint json."""
    tp = len(rank_bytes_by_name)
    problems, notes = _unknown_names(unsharded, rank_bytes_by_name), []
    shares = weight_shares(unsharded, rank_bytes_by_name, rank_shapes_by_name, real)
    for kind in SPLIT_KINDS:
        judged = [share for share in shares if share.kind == kind]
        designed = {
            share.name: whole_by_design(share.name, unsharded.shapes_by_name[share.name], unsharded.counts, tp)
            for share in judged
            if share.whole
        }
        whole = [share.name for share in judged if share.whole and not designed[share.name]]
        if whole:
            units = {share.name: _units(share.name, unsharded.shapes_by_name[share.name], kind, unsharded.counts)
                     for share in judged}  # fmt: skip
            every, left = set().union(*units.values()), set().union(*(units[name] for name in whole))
            problems.append(
                Finding(
                    f"{kind} left whole: {layer_groups(whole)}",
                    f"({len(every - left)} of {len(every)} {kind} split on tp {tp})",
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
    if deepspeed_release is not None:
        head, figures, note = judge_head(
            unsharded.shapes_by_name,
            unsharded.bytes_by_name,
            rank_bytes_by_name,
            rank_shapes_by_name,
            unsharded.counts,
            deepspeed_release,
            checkpoint_json,
        )
        problems += [Finding(head, figures)] if head else []
        notes += [note] if note else []
    return problems, notes


def _units(name: str, shape: tuple[int, ...], kind: TensorKind, counts: SplitCounts) -> set[str]:
    """What a weight holds, counted as its kind counts: an experts weight fused into 3-D parameters holds every expert
    of its layer (`<layer>.experts#i`), one of an expert's own module that expert; any other weight is one."""
    if kind != "experts":
        return {name}
    if len(shape) >= 3 and shape[0] == counts.experts:
        return {f"{name.rpartition('.')[0]}#{index}" for index in range(shape[0])}
    owner = re.search(r"^(.*\.experts\.\d+)\.", name)
    return {owner[1] if owner else name}


RULE_CONSTANTS = "SHARE_EPSILON PACKED_HALVES TP_GRAIN DESIGN_WHOLE_NAMES OUTPUT_HEADS PAIRED_HEADS SPLIT_KINDS".split()
"""The constants the rules read: the standalone repro script gets them as literals."""
RULES = """SplitCounts Footprint Finding Allowance _even _is_output_head real_shape allowance whole_by_design
layer_groups _unknown_names split_dim WeightShare weight_share output_head tied_partner head_note weight_shares
judge_head memory_findings _units""".split()
"""The memory rules (names in this module), pure Python on plain values from `SplitCounts` to `memory_findings`: the
standalone repro script (suites/records/repro.py) embeds their source as they are when it is written, so a script
judges memory by the harness's own code (tests/suites/records/test_repro.py)."""


def _inference_cell(inputs: CheckInputs) -> list[CheckResult]:
    return [
        check(
            inputs.inference()[0].unsharded_footprint(),
            inputs.bytes_by_name(),
            [rank.shapes_by_name or {} for rank in inputs.ranks],
            real=inputs.real_counts,
            deepspeed_release=inputs.deepspeed_release,
            checkpoint_json=inputs.meta_load,
        )
    ]


CHECK = Check(("memory",), "compare", inference, _inference_cell)

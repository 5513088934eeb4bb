"""What AutoTP did to a cell's model, where the cell broke, and the cause the two make: the typed records that cross
from the ranks to the cell's record (cells.jsonl, JUnit, the history store) and on to the reports.

A cause is a bug, so it is keyed by what AutoTP did and where the cell broke (`cause_of`), never by an error's text
alone: two architectures hit by the same mechanism are one cause, two mechanisms under one error text are two, and
one model whose mechanism crashes at one tp and miscomputes at another is one cause. The error text only names
failures nothing was located for (the parser refusing a model, the harness's own failures).

Paths are module paths with layer indices masked (`model.layers.*.self_attn.q_proj`, `mask_indices`); a role is the
part inside the decoder layer (`self_attn.q_proj`, `role`), the same in every architecture that names it alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from suites.verdicts import policy
from suites.verdicts.cause import Cause
from suites.verdicts.check_names import judged_signature
from suites.verdicts.statements import (
    DESIGN_LIMITS,
    KV_IDLE_EVIDENCE,
    KV_SPLIT_IN_MODEL,
    KV_UNIT_EVIDENCE,
    LAYOUT_MECHANISMS,
    LEFT_WHOLE_EVIDENCE,
    MECHANISMS_BY_NAME,
    MODEL_MECHANISMS,
    NORM_OVER_SPLIT_WIDTH,
    PARSER_EVIDENCE,
    PARSER_RULE,
    POLICY_PROBE,
    ModelMechanism,
    Owner,
)
from suites.verdicts.vocabulary import FailureClass

GENERIC_LAYER_CLASSES = ("LinearLayer", "LinearAllreduce", "LmHeadLinearAllreduce")
"""DeepSpeed's layer classes for a plain column- or row-parallel linear; every other class (fused qkv, Yuan's shared
QK, gate-up packing, conv) is a model-specific layout AutoTP chose from the module's name."""
LEFT_WHOLE_KINDS = ("norm", "per-head", "per-channel")
"""What a tensor left whole next to a split is: a norm's weight over the projection's width (its statistic spans the
width, so sharding the weight alone would not do), a tensor with one entry per head, or another per-channel tensor
(a multiplier, a convolution kernel, a state-space parameter) over the width."""
WHOSE: dict[str, str] = {
    "autotp": "AutoTP bug (DeepSpeed's)",
    "transformers": "a transformers change AutoTP does not follow",
    "design-limit": "a documented AutoTP design limit",
    "unsupported": "unsupported by design (DeepSpeed says so)",
    "harness": "the harness's bug",
    "environment": "the environment's (it could not be installed)",
}
"""Each owner of a cause, as a reader sees it. Every cell's unsharded reference is computed and checked finite before
the sharded model is compared with it, so a failure past that point is AutoTP's wherever its exception surfaced (a
transformers frame is where it surfaced, not whose it is) unless the source read at the failing line says otherwise:
a transformers change AutoTP does not follow (`MODEL_MECHANISMS`), a limit DeepSpeed documents (`DESIGN_LIMITS`), or
a refusal DeepSpeed documents (matrix/known_failures.toml state = "unsupported", set by the reports that read it);
the harness's own failures are `setup`, an environment that could not be installed `install`."""


_CONTAINERS = " @ deepspeed/module_inject/containers/"
LEFT_WHOLE_TEXT = re.compile(r"`([^`]+)` \(\w+ of the split `([^`]+)`")  # LeftWhole.text

_INDEX = re.compile(r"\.\d+(?=\.|$)")


def mask_indices(path: str) -> str:
    """`model.layers.3.mlp.experts.7.w1` → `model.layers.*.mlp.experts.*.w1`."""
    return _INDEX.sub(".*", path)


def role(path: str) -> str:
    """The part of a (masked) path inside its decoder layer: `model.layers.*.self_attn.q_norm` → `self_attn.q_norm`;
    a path outside the layers (`lm_head`) is its own role."""
    masked = mask_indices(path)
    return masked.split(".*.", 1)[1] if ".*." in masked else masked


def parent(path: str) -> str:
    return path.rpartition(".")[0]


@dataclass(frozen=True)
class Replaced:
    """A module AutoTP replaced, once for every layer of the same path with indices masked."""

    path: str
    was: str
    """The class it had (`Linear`)."""
    layer_class: str
    """DeepSpeed's class that replaced it (`LinearLayer`, `LinearAllreduce`, `fused_LinearLayer`, ...)."""
    shape: tuple[int, ...]
    """The unsharded weight's shape."""
    dim: int
    """The dimension its class splits: 0, the output rows (column-parallel), or 1, the input columns (`*Allreduce`)."""
    held: int
    """Rank 0's size along `dim`: `shape[dim]` when rank 0 holds all of it."""
    layout: str = ""
    """A fused qkv weight's layout as DeepSpeed chose it from the decoder layer's name (fusedqkv_utils.py
    `get_fused_qkv_type`: `bloomtype`, `glmtype`, ...); "" for any other layer."""

    @property
    def layer_text(self) -> str:
        return f"{self.layer_class}({self.layout})" if self.layout else self.layer_class


@dataclass(frozen=True)
class LeftWhole:
    """A parameter or buffer AutoTP left whole next to a split: one of its dimensions is the full output width (or
    head count) of a projection AutoTP split in the same block."""

    tensor: str
    kind: str
    """One of LEFT_WHOLE_KINDS."""
    size: int
    """The matching dimension's size."""
    beside: str
    """The split projection whose width or head count it has."""
    over: str
    """`width` or `heads`."""

    @property
    def block(self) -> str:
        return parent(self.beside)

    @property
    def text(self) -> str:
        return f"`{role(self.tensor)}` ({self.over} of the split `{role(self.beside)}`, {self.size}) left whole"


@dataclass(frozen=True)
class AutoTPRecord:
    """What AutoTP did to one cell's model, seen on rank 0 (suites/checks/sharding.py `sharding_record`)."""

    tp: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    policies: tuple[policy.Policy, ...]
    """The parser's choice per decoder-layer class; empty when it raised or was not asked (a policy passed in)."""
    unparsed: tuple[str, ...]
    """Decoder-layer kinds the parser gave no policy: a class it found no row-parallel linear in, or layers of a
    parsed class whose linears differ from the one instance it parsed (a hybrid model's second kind)."""
    replaced: tuple[Replaced, ...]
    left_whole: tuple[LeftWhole, ...]
    complete: bool = True
    """False when init_inference raised: then only the parser's choice is known."""
    inferred: tuple[policy.InferredBlock, ...] = ()
    """The policy the model needs, per block class; `disagreements`, `inference_note`: suites/verdicts/policy.py."""
    disagreements: tuple[policy.PolicyDisagreement, ...] = ()
    inference_note: str = ""

    def in_block(self, block: str) -> list[Replaced]:
        return [r for r in self.replaced if parent(r.path) == block]

    def starved_query(self, block: str | None = None) -> list[Replaced]:
        """Query-bearing projections (of the block, or anywhere) DeepSpeed split in kv-head units although the model
        has fewer kv heads than ranks: tp_shard.py `get_shard_size` gives each of the first `kv_heads` ranks one
        kv head's share and the others none, so those ranks hold no query head at all."""
        if not (0 < self.kv_heads < self.tp and self.head_dim):
            return []
        query = {self.heads, self.heads + 2 * self.kv_heads}
        return [
            r
            for r in (self.replaced if block is None else self.in_block(block))
            if any(part in r.path for part in ("attn", "attention"))
            and r.shape[r.dim] % self.head_dim == 0
            and r.shape[r.dim] // self.head_dim in query
        ]

    def text(self) -> str:
        """Several lines for a reader: the policy, the replacements, the layer kinds left unparsed, what was left
        whole next to a split."""
        lines = policy.policy_lines(self.policies)
        lines += [f"no policy for {kind}" for kind in self.unparsed]
        by_class: dict[str, list[str]] = {}
        for r in self.replaced:
            by_class.setdefault(r.layer_text, []).append(r.path)
        lines += [f"{layer}: {', '.join(paths)}" for layer, paths in by_class.items()]
        lines += [w.text for w in self.left_whole]
        lines += policy.record_lines(self.inferred, self.disagreements, self.inference_note)
        if not self.complete:
            lines.append("init_inference raised before replacing every module")
        return "\n".join(lines)


@dataclass(frozen=True)
class BreakPoint:
    """Where a cell broke: the module whose forward raised (the innermost module of the exception's traceback), the
    module AutoTP was replacing when init_inference raised, or the first module whose output diverged from the
    unsharded model's; and the module whose own computation went wrong (`origin`)."""

    path: str
    module_class: str
    """The class the module had before AutoTP (`Linear` for a layer it replaced)."""
    layer_class: str
    """DeepSpeed's layer class when AutoTP replaced the module (or was building one for it), else ""."""
    how: str
    """`raised`, `replacing` or `diverged`."""
    origin: str
    """The module whose own computation went wrong: `path`, except that a row-parallel layer (`*Allreduce`) which
    raised on its input or diverged only joins the partial results its block computed: then its parent."""
    origin_class: str
    detail: str = ""
    """The divergence's figures, for `diverged`."""

    @property
    def text(self) -> str:
        classes = ", ".join(c for c in (self.module_class, self.layer_class) if c)
        verb = {
            "raised": "raised in",
            "replacing": "init_inference raised replacing",
            "diverged": "first divergence at",
        }
        found = f"{verb[self.how]} `{self.path}` ({classes})"
        if self.origin != self.path:
            found += f", computed from its block `{self.origin}` ({self.origin_class})"
        return found + (f" {self.detail}" if self.detail else "")


def origin_of(path: str, layer_class: str, how: str) -> str:
    """See `BreakPoint.origin`."""
    return parent(path) if "Allreduce" in layer_class and how != "replacing" else path


@dataclass(frozen=True)
class Failure:
    """What `cause_of` reads of a failed cell."""

    failure_class: FailureClass
    signature: str
    autotp: AutoTPRecord | None = None
    broke_at: BreakPoint | None = None


def class_and_finding(failure_class: str, signature: str) -> str:
    """ "memory: linears split unevenly …", the class said once: a judged failure's signature starts with its check's
    name (suites/verdicts/check_names.py `judged_signature`), which for `memory` is the class too."""
    return f"{failure_class}: {signature.removeprefix(f'{failure_class}: ')}"


def whose(failure_class: str) -> Owner:
    """The owner a failure class alone gives (before the source read at the failing line says more)."""
    owners: dict[str, Owner] = {"setup": "harness", "install": "environment"}
    return owners.get(failure_class, "autotp")


FRAME = re.compile(r" @ \S+$")
_NUMBER_RUN = re.compile(r"N(?:\s*(?:,|x|\*)\s*N)+")


def failure_text(signature: str) -> str:
    """A signature (its numbers already masked, suites/verdicts/outcome.py `mask_numbers`) without the frame it surfaced
    in and with runs of masked numbers as one: the same failure reads the same whatever the function it surfaced in is
    called (a library renamed it) and at every tp (`[N, N]` at tp 2, `[N, N, N]` at tp 3)."""
    return _NUMBER_RUN.sub("N…", FRAME.sub("", signature))


def _block(origin: str, record: AutoTPRecord) -> str:
    """The block a located failure belongs to: the origin itself when AutoTP replaced modules directly inside it,
    else its parent (a norm or a replaced linear inside the attention)."""
    masked = mask_indices(origin)
    return masked if record.in_block(masked) else parent(masked)


def _involved(record: AutoTPRecord, origin: str) -> list[LeftWhole]:
    """Tensors left whole next to a split in the block of the failure (or inside the module that failed)."""
    block, masked = _block(origin, record), mask_indices(origin)
    return [w for w in record.left_whole if w.block == block or w.block.startswith(masked + ".")]


def cause_of(failure: Failure) -> Cause:
    """The cause of a failed cell, from the most specific evidence of what AutoTP did where it broke (in order): a
    MoE router it replaced (it must stay whole), query heads starved by a kv-unit split, tensors left whole next to a
    split, a model-specific layout AutoTP chose, the module where it broke; a memory finding; else the failure's
    text."""
    whose_bug = whose(failure.failure_class)
    record, broke = failure.autotp, failure.broke_at
    if failure.failure_class == "shard" and _CONTAINERS in failure.signature:
        return _known(f"no policy|{failure_text(failure.signature)}", POLICY_PROBE, failure.signature)
    if failure.failure_class == "memory":  # a training cell records no AutoTPRecord: its findings are the same causes
        return _memory_cause(failure, record, whose_bug)
    if failure.failure_class in ("setup", "install") or record is None:
        return _by_text(failure, whose_bug)
    if broke is None:
        return _by_text(failure, whose_bug)
    origin = broke.origin
    block = _block(origin, record)
    where = f"; {broke.text}"
    if known := MODEL_MECHANISMS.get(broke.origin_class):
        return _known(f"model|{known.name}", known, broke.text)
    router = {r.path: r for r in record.replaced}.get(mask_indices(broke.path))
    if record.experts and router is not None and router.shape[0] == record.experts:
        return Cause(
            f"router|{router.layer_class}",
            f"the MoE router `{role(router.path)}` ({record.experts} experts) made {router.layer_class} by the parser"
            + where,
            whose_bug,
            PARSER_EVIDENCE,
        )
    if found := record.disagreements:  # after a router: the parser makes it row-parallel, a mistake of its own kind
        if not any(d.chosen_by == policy.PARSER for d in found):  # an injection_policy the cell passed chose them
            return Cause(policy.policy_key(found), policy.disagreement_words(found) + where, whose_bug)
        rule = f" ({PARSER_RULE}; {_chosen(record)})"
        return Cause(
            policy.policy_key(found), policy.disagreement_words(found) + where + rule, whose_bug, PARSER_EVIDENCE
        )
    if starved := record.starved_query(block):
        crash = KV_SPLIT_IN_MODEL.get(broke.origin_class)
        return _starved(record, starved, f"; {crash}{where}" if crash else where, whose_bug)
    if involved := _involved(record, origin):
        kinds = sorted({w.kind for w in involved}, key=LEFT_WHOLE_KINDS.index)
        return Cause(
            f"left whole|{','.join(kinds)}",
            "; ".join(w.text for w in involved) + (f"; {NORM_OVER_SPLIT_WIDTH}" if "norm" in kinds else "") + where,
            whose_bug,
            "; ".join(LEFT_WHOLE_EVIDENCE[kind] for kind in kinds),
        )
    if missed := _row_parallel_missed(record, broke, block):
        return missed
    layouts = [r for r in record.in_block(block) if r.layer_class not in GENERIC_LAYER_CLASSES]
    if broke.how == "replacing" and broke.layer_class not in GENERIC_LAYER_CLASSES:
        return _layout(record, role(broke.path), broke.layer_class, broke.text, whose_bug)
    if layouts:
        first = layouts[0]
        return _layout(record, role(first.path), first.layer_text, broke.text, whose_bug)
    own = origin == broke.path
    return Cause(f"at|{role(origin)}|{broke.origin_class}|{broke.layer_class if own else ''}", broke.text, whose_bug)


DOT = "."


def _row_parallel_missed(record: AutoTPRecord, broke: BreakPoint, block: str) -> Cause | None:
    """A column-parallel linear that raised on its input in a block where the parser made no linear row-parallel:
    it reads the block's split output, so it needed to be the block's row-parallel linear (ctrl's attention
    `dense`)."""
    if broke.how != "raised" or broke.layer_class != "LinearLayer" or broke.origin != broke.path:
        return None
    if any("Allreduce" in r.layer_class for r in record.in_block(block)):
        return None
    name = role(broke.path)
    return Cause(
        f"column-parallel|{name}",
        f"the parser left `{name}` column-parallel (LinearLayer) although it reads its block's split output: no "
        f"linear of `{role(block)}` was made row-parallel ({PARSER_RULE}; {_chosen(record)}); " + broke.text,
        "autotp",
        PARSER_EVIDENCE,
    )


def _chosen(record: AutoTPRecord) -> str:
    """What the parser's policies all-reduce, per layer class: "for EncoderLayer it all-reduces `ffn.2`"."""
    chosen = "; ".join(
        f"for {p.layer_class} it all-reduces "
        f"{', '.join(f'`{linear.lstrip(DOT)}`' for linear in p.allreduce) or 'nothing'}"
        for p in record.policies
    )
    return chosen or "no policy recorded"


def _layout(record: AutoTPRecord, name: str, layer: str, where: str, whose_bug: str) -> Cause:
    """A model-specific layout AutoTP chose for `name`: the mechanism where a name match chose it
    (LAYOUT_MECHANISMS), else the layout alone."""
    key = f"layout|{name}|{layer}"
    if read := LAYOUT_MECHANISMS.get(layer):
        block = " / ".join(p.layer_class for p in record.policies) or "the decoder layer"
        return Cause(key, f"{read.words.format(block=block)}; {where}", whose_bug, read.evidence)
    return Cause(key, f"AutoTP split `{name}` as {layer}; {where}", whose_bug)


def cause_sentence(mechanism_key: str, words: Sequence[str]) -> str:
    """What one cause says of all its cells: their words where every cell's are the same, else a sentence from what
    the cells share, the cause's `mechanism_key` (`cause_of` writes each cell's words from its own model: head counts,
    tp, the module it broke in, which differ between the cells of one cause), per model where they differ."""
    if len(set(words)) == 1:
        return words[0]
    kind, _, rest = mechanism_key.partition("|")
    parts = rest.split("|")
    if kind == "model" and parts[0] in MECHANISMS_BY_NAME:
        return MECHANISMS_BY_NAME[parts[0]].words
    if kind == "router":
        return f"the MoE router (one output per expert: it must stay whole) made {parts[0]} by the parser"
    if kind == "policy":
        return policy.policy_title(parts, sentence=True)
    if kind == "kv-unit split" and parts[0] == IDLE_RANKS:
        return f"{KV_UNIT_SENTENCE}; {KV_SPLIT_SEPARATE}"
    if kind == "kv-unit split":
        crashes = [why for name, why in KV_SPLIT_IN_MODEL.items() if any(f"({name})" in w for w in words)]
        return "; ".join([KV_UNIT_SENTENCE, *crashes])
    if kind == "left whole":
        kinds = parts[0].split(",")
        split = f"a {' or '.join(kinds)} tensor left whole next to a projection AutoTP split"
        return f"{split}; {NORM_OVER_SPLIT_WIDTH}" if "norm" in kinds else split
    if kind == "layout":
        shared = _shared_clauses(words)
        return shared or f"AutoTP split `{parts[0]}` as {parts[1]}"
    if kind == "at":
        classes = ", ".join(c for c in parts[1:] if c)
        return f"broke in `{parts[0]}` ({classes})"
    return rest  # a memory finding or a failure's text: what the cells share already


def _shared_clauses(words: Sequence[str]) -> str:
    """The leading clauses (`; `-separated) every cell's words share: the mechanism before each cell's own
    location."""
    split = [w.split("; ") for w in words]
    shared = []
    for clauses in zip(*split, strict=False):
        if len(set(clauses)) > 1:
            break
        shared.append(clauses[0])
    return "; ".join(shared)


KV_UNIT_SENTENCE = (
    "DeepSpeed splits attention in kv-head units (tp_shard.py get_shard_size): with fewer kv heads than ranks, the "
    "ranks past the kv-head count hold no query head"
)
KV_SPLIT_SEPARATE = (
    "the numbers stay right, those ranks idle and the first ranks hold every query head (DeepSpeed warns and "
    "documents it)"
)
IDLE_RANKS = "ranks idle"
"""The kv-unit split's memory-only cells: a documented design limit, where a crash is AutoTP's bug."""


def _starved(record: AutoTPRecord, starved: list[Replaced], where: str, whose_bug: str) -> Cause:
    """Query heads starved by a kv-unit split: ranks DeepSpeed documents as idle with the numbers right (memory only,
    a design limit), or a crash where the model's attention cannot run on them (AutoTP's bug: the documented result
    is a correct one)."""
    names = ", ".join(f"`{role(r.path)}`" for r in starved)
    idle = not where
    return Cause(
        f"kv-unit split|{IDLE_RANKS if idle else 'query heads starved'}",
        f"DeepSpeed splits attention in kv-head units (tp_shard.py get_shard_size): {record.kv_heads} kv "
        f"head{'s' if record.kv_heads > 1 else ''} < tp {record.tp}, so {_ranks_hold(record.kv_heads, record.tp - 1)} "
        f"no query head of {names}{f'; {KV_SPLIT_SEPARATE}' if idle else where}",
        "design-limit" if idle else whose_bug,
        KV_IDLE_EVIDENCE if idle else KV_UNIT_EVIDENCE,
    )


def _ranks_hold(first: int, last: int) -> str:
    """ "rank 1 holds", "ranks 1..3 hold"."""
    return f"rank {first} holds" if first == last else f"ranks {first}..{last} hold"


def _memory_cause(failure: Failure, record: AutoTPRecord | None, whose_bug: str) -> Cause:
    finding = failure.signature.removeprefix(judged_signature("memory", ""))
    starved = record.starved_query() if record else []
    if (
        record
        and starved
        and "split unevenly" in finding
        and any(role(r.path).rpartition(".")[2] in finding for r in starved)
    ):
        return _starved(record, starved, "", whose_bug)
    kind = finding.partition(": ")[0]
    if kind in DESIGN_LIMITS:
        return Cause(f"memory|{_leaf_groups(finding)}", finding, "design-limit", DESIGN_LIMITS[kind])
    return Cause(f"memory|{_leaf_groups(finding)}", finding, whose_bug)


def _known(key: str, known: ModelMechanism, where: str) -> Cause:
    return Cause(key, f"{known.words}; {where}", known.whose, known.evidence)


_GROUP = re.compile(r"[\w.*]+(?:\{[^}]*\})?")


def _leaf_groups(finding: str) -> str:
    """A memory finding with each layer group cut to its last part and leaves (suites/checks/memory.py `layer_groups`):
    `model.layers.*.mlp.experts.{w1,w2}` and `model.layers.*.block_sparse_moe.experts.{w1,w2}` are one finding."""

    def leaf(group: re.Match[str]) -> str:
        head, brace, leaves = group[0].partition("{")
        parts = head.rstrip(".").split(".")
        return ".".join(parts[-1 if brace else -2 :]) + (f".{{{leaves}" if brace else "")

    what, _, groups = finding.partition(": ")
    return f"{what}: {_GROUP.sub(leaf, groups)}" if groups else what


def _by_text(failure: Failure, whose_bug: str) -> Cause:
    return Cause(f"{failure.failure_class}|{failure_text(failure.signature)}", failure.signature, whose_bug)

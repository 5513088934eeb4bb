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
from pathlib import Path
from typing import Literal

from matrix.remedies import RemedyResult, read_results
from suites import policy
from suites.checks.names import judged_signature
from suites.verdicts import FailureClass

GENERIC_LAYER_CLASSES = ("LinearLayer", "LinearAllreduce", "LmHeadLinearAllreduce")
"""DeepSpeed's layer classes for a plain column- or row-parallel linear; every other class (fused qkv, Yuan's shared
QK, gate-up packing, conv) is a model-specific layout AutoTP chose from the module's name."""
LEFT_WHOLE_KINDS = ("norm", "per-head", "per-channel")
"""What a tensor left whole next to a split is: a norm's weight over the projection's width (its statistic spans the
width, so sharding the weight alone would not do), a tensor with one entry per head, or another per-channel tensor
(a multiplier, a convolution kernel, a state-space parameter) over the width."""
Owner = Literal["autotp", "transformers", "design-limit", "unsupported", "harness", "environment"]
"""Whose a cause is, from a closed set; each cause carries the evidence line for it (`Cause.evidence`)."""
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


@dataclass(frozen=True)
class ModelMechanism:
    """A mechanism read at the failing lines of DeepSpeed's and transformers' source for one module class, which the
    generic evidence (the layout AutoTP chose, the module where the cell broke) only locates."""

    title: str
    """The mechanism in a bug report's title (a few words)."""
    words: str
    whose: Owner
    evidence: str
    """The source lines that show it, as `file Class.function: what the line does`."""


MODEL_MECHANISMS = {
    "BloomAttention": ModelMechanism(
        "the mask-less forward builds ALiBi for every head, bypassing the head-sliced build_alibi_tensor",
        "the fused query_key_value split is right (with an attention mask the sharded logits match); the crash is the "
        "forward without a mask, where `BloomModel.forward` builds the ALiBi bias inline from the full head count and "
        "so bypasses DeepSpeed's head-sliced `build_alibi_tensor` patch: each rank's attention meets every head's bias",
        "transformers",
        "transformers/models/bloom/modeling_bloom.py BloomModel.forward: without an attention mask, slopes = "
        "_get_alibi_slopes(self.num_heads, ...) instead of self.build_alibi_tensor, the method "
        "deepspeed/inference/engine.py InferenceEngine.build_alibi_tensor replaces with a head-sliced one (the first "
        "transformers release with that path is not measured here)",
    ),
    "Phi3Attention": ModelMechanism(
        "attention slices qkv at config.num_attention_heads, which AutoTP does not rescale",
        "every rank gets the right [q, k, v] slice of the fused `qkv_proj`; `Phi3Attention.forward` then slices the "
        "qkv output at `config.num_attention_heads * head_dim`, a config value AutoTP does not rescale, so the query "
        "takes the rank's whole slice and `o_proj` meets the wrong width",
        "autotp",
        "transformers/models/phi3/modeling_phi3.py Phi3Attention.forward: query_pos = "
        "self.config.num_attention_heads * self.head_dim; deepspeed/module_inject/auto_tp.py "
        "AutoTP.update_mp_params divides the modules' head attributes, never model.config",
    ),
}
"""Model-specific mechanisms by the class of the module whose own computation went wrong (`BreakPoint.origin_class`)."""
POLICY_PROBE = ModelMechanism(
    "building the parser's no-policy assert message raises in a kernel-injection policy",
    "the parser found no linear to all-reduce, so its no-policy assert refuses the model (auto_tp.py `tp_parser`, as "
    "for a model with no nn.Linear); building that assert's message instantiates every kernel-injection policy over "
    "this model's config, and one of them raises first",
    "autotp",
    "deepspeed/module_inject/auto_tp.py AutoTP.tp_parser: assert len(policy_list), (... if "
    "AutoTP.kernel_supported(module_list) else 'Not able to determine model policy automatically. ...'); "
    "AutoTP.kernel_supported: _ = plcy(None) for every replace policy (containers/opt.py HFOPTLayerPolicy raises "
    "'Unsupported activation function')",
)
"""A kernel-injection container (`deepspeed/module_inject/containers/`) raising while AutoTP shards: AutoTP never
uses a container, only the parser's assert message builds them."""
DESIGN_LIMITS = {
    "experts left whole": 'deepspeed/module_inject/auto_tp.py AutoTP.update_mp_params: "AutoTP does not shard '
    "high-dimensional weights\" (a MoE block's experts fused into 3-D parameters, as transformers >= 5 keeps them)",
}
"""Memory findings AutoTP documents as its design (the finding's kind → the documenting line)."""
_CONTAINERS = " @ deepspeed/module_inject/containers/"
_LEFT_WHOLE_TEXT = re.compile(r"`([^`]+)` \(\w+ of the split `([^`]+)`")  # LeftWhole.text

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
    """The policy the model needs, per block class; `disagreements`, `inference_note`: suites/policy.py."""
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
class Cause:
    """A failed cell's cause: `key` groups cells into one cause, `words` says the mechanism for a reader, `whose`
    is a key of WHOSE (an `Owner`), `evidence` the source line that makes it that owner's ("" for AutoTP's own
    bugs located by what AutoTP did, and the harness's)."""

    key: str
    words: str
    whose: str
    evidence: str = ""


@dataclass(frozen=True)
class Failure:
    """What `cause_of` reads of a failed cell."""

    failure_class: FailureClass
    signature: str
    autotp: AutoTPRecord | None = None
    broke_at: BreakPoint | None = None


def class_and_finding(failure_class: str, signature: str) -> str:
    """ "memory: linears split unevenly …", the class said once: a judged failure's signature starts with its check's
    name (suites/checks/names.py `judged_signature`), which for `memory` is the class too."""
    return f"{failure_class}: {signature.removeprefix(f'{failure_class}: ')}"


def whose(failure_class: str) -> Owner:
    """The owner a failure class alone gives (before the source read at the failing line says more)."""
    owners: dict[str, Owner] = {"setup": "harness", "install": "environment"}
    return owners.get(failure_class, "autotp")


_FRAME = re.compile(r" @ \S+$")
_NUMBER_RUN = re.compile(r"N(?:\s*(?:,|x|\*)\s*N)+")


def failure_text(signature: str) -> str:
    """A signature (its numbers already masked, suites/outcome.py `mask_numbers`) without the frame it surfaced in and
    with runs of masked numbers as one: the same failure reads the same whatever the function it surfaced in is
    called (a library renamed it) and at every tp (`[N, N]` at tp 2, `[N, N, N]` at tp 3)."""
    return _NUMBER_RUN.sub("N…", _FRAME.sub("", signature))


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
    if failure.failure_class in ("setup", "install") or record is None:
        return _by_text(failure, whose_bug)
    if failure.failure_class == "memory":
        return _memory_cause(failure, record, whose_bug)
    if broke is None:
        return _by_text(failure, whose_bug)
    origin = broke.origin
    block = _block(origin, record)
    where = f"; {broke.text}"
    if known := MODEL_MECHANISMS.get(broke.origin_class):
        return _known(f"model|{broke.origin_class}", known, broke.text)
    router = {r.path: r for r in record.replaced}.get(mask_indices(broke.path))
    if record.experts and router is not None and router.shape[0] == record.experts:
        return Cause(
            f"router|{router.layer_class}",
            f"the MoE router `{role(router.path)}` ({record.experts} experts) made {router.layer_class} by the parser"
            + where,
            whose_bug,
        )
    if found := record.disagreements:  # after a router: the parser makes it row-parallel, a mistake of its own kind
        return Cause(policy.policy_key(found), policy.disagreement_words(found) + where, whose_bug)
    if starved := record.starved_query(block):
        return _starved(record, starved, where, whose_bug)
    if involved := _involved(record, origin):
        kinds = sorted({w.kind for w in involved}, key=LEFT_WHOLE_KINDS.index)
        return Cause(f"left whole|{','.join(kinds)}", "; ".join(w.text for w in involved) + where, whose_bug)
    layouts = [r for r in record.in_block(block) if r.layer_class not in GENERIC_LAYER_CLASSES]
    if broke.how == "replacing" and broke.layer_class not in GENERIC_LAYER_CLASSES:
        return Cause(f"layout|{role(broke.path)}|{broke.layer_class}", broke.text, whose_bug)
    if layouts:
        first = layouts[0]
        return Cause(
            f"layout|{role(first.path)}|{first.layer_text}",
            f"AutoTP split `{role(first.path)}` as {first.layer_text}" + where,
            whose_bug,
        )
    own = origin == broke.path
    return Cause(f"at|{role(origin)}|{broke.origin_class}|{broke.layer_class if own else ''}", broke.text, whose_bug)


def cause_sentence(key: str, words: Sequence[str]) -> str:
    """What one cause says of all its cells: their words where every cell's are the same, else a sentence from what
    the cells share, the cause's `key` (`cause_of` writes each cell's words from its own model: head counts, tp, the
    module it broke in, which differ between the cells of one cause)."""
    if len(set(words)) == 1:
        return words[0]
    kind, _, rest = key.partition("|")
    parts = rest.split("|")
    if kind == "router":
        return f"the MoE router (one output per expert: it must stay whole) made {parts[0]} by the parser"
    if kind == "policy":
        return policy.policy_title(parts, sentence=True)
    if kind == "kv-unit split":
        return (
            "DeepSpeed splits attention in kv-head units (tp_shard.py get_shard_size): with fewer kv heads than ranks, "
            "the ranks past the kv-head count hold no query head"
        )
    if kind == "left whole":
        return f"a {' or '.join(parts[0].split(','))} tensor left whole next to a projection AutoTP split"
    if kind == "layout":
        return f"AutoTP split `{parts[0]}` as {parts[1]}"
    if kind == "at":
        classes = ", ".join(c for c in parts[1:] if c)
        return f"broke in `{parts[0]}` ({classes})"
    return rest  # a memory finding or a failure's text: what the cells share already


def _starved(record: AutoTPRecord, starved: list[Replaced], where: str, whose_bug: str) -> Cause:
    names = ", ".join(f"`{role(r.path)}`" for r in starved)
    return Cause(
        "kv-unit split|query heads starved",
        f"DeepSpeed splits attention in kv-head units (tp_shard.py get_shard_size): {record.kv_heads} kv "
        f"head{'s' if record.kv_heads > 1 else ''} < tp {record.tp}, so {_ranks_hold(record.kv_heads, record.tp - 1)} "
        f"no query head of {names}{where}",
        whose_bug,
    )


def _ranks_hold(first: int, last: int) -> str:
    """ "rank 1 holds", "ranks 1..3 hold"."""
    return f"rank {first} holds" if first == last else f"ranks {first}..{last} hold"


def _memory_cause(failure: Failure, record: AutoTPRecord, whose_bug: str) -> Cause:
    finding = failure.signature.removeprefix(judged_signature("memory", ""))
    starved = record.starved_query()
    if starved and "split unevenly" in finding and any(role(r.path).rpartition(".")[2] in finding for r in starved):
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


def cause_title(key: str, words: str) -> str:
    """A cause in a few words for a bug report's title, from its key (`cause_of` writes both); whole, never cut."""
    kind, _, rest = key.partition("|")
    parts = rest.split("|")
    known = MODEL_MECHANISMS.get(parts[0]) if kind == "model" else POLICY_PROBE if kind == "no policy" else None
    if known:
        return known.title
    if kind == "router":
        return f"MoE router made {parts[0]} by the parser"
    if kind == "policy":
        return policy.policy_title(parts, sentence=False)
    if kind == "kv-unit split":
        return "fewer kv heads than ranks leaves ranks without query heads"
    if kind == "left whole":
        found = _LEFT_WHOLE_TEXT.match(words)
        return f"`{found[1].removesuffix('.weight')}` left whole beside the split `{found[2]}`" if found else kind
    if kind == "layout":
        return f"`{parts[0]}` split as {parts[1]}"
    if kind == "at":
        return f"`{parts[0]}` ({parts[2] or parts[1]}) fails after the split"
    if kind == "memory":
        return f"{parts[0].partition(': ')[0]} on every rank"
    return _FRAME.sub("", words).partition(". ")[0]


def verified_remedies(results_file: Path) -> dict[str, tuple[RemedyResult, ...]]:
    """The hook a cause's statement and its draft issue read: the remedies `nox -s remedy` verified (its
    results/remedies.json), by the cause's model id (`ctrl.faithful`). A cause with none here claims no workaround
    and no fix: its mechanism is not proven by one."""
    verified: dict[str, list[RemedyResult]] = {}
    for result in read_results(results_file):
        if result.status == "verified":
            for model in result.cause_models:
                verified.setdefault(model, []).append(result)
    return {model: tuple(results) for model, results in verified.items()}

"""Mechanisms read at the failing lines of DeepSpeed's (0.19.8) and transformers' (5.25.0) source, which the generic
evidence of what AutoTP did (suites/verdicts/mechanism.py `cause_of`) only locates, and how a cause states its
mechanism.

A mechanism is stated as proven only by a remedy that turned every cell of its cause green and changed no other
verdict (issue #56; `nox -s remedy`'s results, merged into the history store, read by `proof_of`): until one is
verified for a cause, its sentence ends "(mechanism not proven: <what was tried>)", and a verified remedy's own
sentence (`Proof.verified`) replaces it, ending "(verified: N of N cells pass with <the change, in words>; at
DeepSpeed <release>, transformers <release>)", the report's cause line adding the harness revision the proof was
taken by. `stated` is the one place that says either.

The proofs live with the history (`python -m reports merge` takes remedies.json into the store and the archive), so a
proof may have been taken at another DeepSpeed than the one the cause's cells fail at now: it still counts (the same
cells fail with the same mechanism, and the remedy turned each of them green), and its clause says so ("at DeepSpeed
0.19.8 …, not the 0.20.0 these cells fail at") so a reader knows to re-run `nox -s remedy`. A proof always names the
harness revision it was taken by (the report's line, not the sentence: a draft's reader knows no harness); a later
harness is not flagged (every commit is one).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from matrix.remedies import RemedyResult

Owner = Literal["autotp", "transformers", "design-limit", "unsupported", "harness", "environment"]
"""Whose a cause is, from a closed set; each cause carries the evidence line for it (`Cause.evidence`)."""

READ_ONLY = "read at the failing lines of DeepSpeed's and transformers' source; no remedy run yet"
"""What was tried for a mechanism nothing else was tried for."""


@dataclass(frozen=True)
class ModelMechanism:
    """A mechanism read at the failing lines of DeepSpeed's and transformers' source for one or more module classes,
    which the generic evidence (the layout AutoTP chose, the module where the cell broke) only locates."""

    name: str
    """The mechanism's part of its cause key (`model|<name>`): one name for every class it covers."""
    title: str
    """The mechanism in a bug report's title (a few words)."""
    words: str
    """One sentence true for every cell of the cause, per model where the models differ."""
    whose: Owner
    evidence: str
    """The source lines that show it, as `file Class.function: what the line does`."""
    tried: str = READ_ONLY
    """What was done to prove it, short of a verified remedy."""


@dataclass(frozen=True)
class Proof:
    """What stands behind a cause's mechanism sentence."""

    tried: str
    """What was tried, short of a verified remedy."""
    by: tuple[RemedyResult, ...] = ()
    """The remedies `nox -s remedy` verified that turned every cell of the cause green with no other verdict changed
    (merged into the history store: the newest result of each remedy), by remedy name; () while none is."""
    cells: int = 0
    """The cause's cells, every one of which passes with each of `by`."""
    cells_deepspeed: str = ""
    """The DeepSpeed release the cause's cells fail at ("" when not known): a proof taken at another says so."""

    @property
    def verified(self) -> str:
        """The mechanism the first verified remedy proves (matrix/remedies.toml `mechanism`); "" while none is."""
        return self.by[0].mechanism if self.by else ""


def stated(sentence: str, proof: Proof) -> str:
    """A cause's mechanism as every output gives it: a verified remedy's sentence with its proof ("… (verified: 3 of 3
    cells pass with this proposed DeepSpeed change: AutoTP …; at DeepSpeed 0.19.8, transformers 5.25.0)"), else the
    sentence read at the failing lines with what was tried."""
    if proof.by:
        changes = " and with ".join(f"this {_kind_words(result)}: {result.change}" for result in proof.by)
        taken = "; ".join(f"at {_taken_words(result, proof.cells_deepspeed)}" for result in proof.by)
        passing = f"{proof.cells} of {proof.cells} cells pass"
        return f"{proof.verified.rstrip('.')} (verified: {passing} with {changes}; {taken})"
    return f"{sentence} (mechanism not proven: {proof.tried})"


def _kind_words(result: RemedyResult) -> str:
    return "workaround" if result.kind == "workaround" else "proposed DeepSpeed change"


def _taken_words(result: RemedyResult, cells_deepspeed: str) -> str:
    """Where a proof was taken, and that the cells fail at another DeepSpeed where they do."""
    taken = result.taken_at
    if not taken.named:  # a result merged before taken_at existed cannot reach a store: the door reads or refuses it
        return "versions not recorded"
    other = cells_deepspeed and cells_deepspeed != taken.deepspeed
    return taken.words() + (f", not the DeepSpeed {cells_deepspeed} these cells fail at" if other else "")


_MAMBA_PACKED = ModelMechanism(
    "mamba mixer packed projections",
    "a mamba mixer's packed projections are split as plain linears",
    "the mamba mixer's packed projections are split as plain column-parallel linears, so a rank holds a contiguous "
    "slice of the packed output instead of its share of each part, and the mixer's per-channel state stays whole "
    "(falcon_h1: `in_proj` packs gate | x, B, C | dt and is scaled by the whole `mup_vector`; jamba: `in_proj` packs "
    "x | gate and `x_proj` packs dt | B | C, beside the whole `conv1d`, `A_log` and `D`)",
    "autotp",
    "transformers/models/falcon_h1/modeling_falcon_h1.py FalconH1Mixer.forward: projected_states * self.mup_vector, "
    "then projected_states.split([intermediate, conv_dim, num_heads]); transformers/models/jamba/modeling_jamba.py "
    "JambaMambaMixer.forward: projected_states.chunk(2) and torch.split(self.x_proj(...), [time_step_rank, "
    "ssm_state_size, ssm_state_size]); deepspeed/module_inject/auto_tp.py AutoTP._replace: in_proj, x_proj -> "
    "LinearLayer (a contiguous row split)",
)
MODEL_MECHANISMS = {
    "BloomAttention": ModelMechanism(
        "BloomAttention",
        "the mask-less forward builds ALiBi for every head, bypassing the head-sliced build_alibi_tensor",
        "the fused query_key_value split is right (with an attention mask the sharded logits match); the crash is the "
        "forward without a mask, where `BloomModel.forward` builds the ALiBi bias inline from the full head count "
        "and so bypasses DeepSpeed's head-sliced `build_alibi_tensor` patch: each rank's attention meets every head's "
        "bias",
        "transformers",
        "transformers/models/bloom/modeling_bloom.py BloomModel.forward: without an attention mask, slopes = "
        "_get_alibi_slopes(self.num_heads, ...) instead of self.build_alibi_tensor, the method "
        "deepspeed/inference/engine.py InferenceEngine.build_alibi_tensor replaces with a head-sliced one (the first "
        "transformers release with that path is not measured here)",
        "by hand, the tp 2 cell's forward given an attention mask matched the unsharded logits; no remedy run on "
        "every cell yet",
    ),
    "Phi3Attention": ModelMechanism(
        "Phi3Attention",
        "attention slices qkv at config.num_attention_heads, which AutoTP does not rescale",
        "every rank gets the right [q, k, v] slice of the fused `qkv_proj`; `Phi3Attention.forward` then slices the "
        "qkv output at `config.num_attention_heads * head_dim`, a config value AutoTP does not rescale, so the query "
        "takes the rank's whole slice and `o_proj` meets the wrong width",
        "autotp",
        "transformers/models/phi3/modeling_phi3.py Phi3Attention.forward: query_pos = "
        "self.config.num_attention_heads * self.head_dim; deepspeed/module_inject/auto_tp.py "
        "AutoTP.update_mp_params divides the modules' head attributes, never model.config",
    ),
    "DiffLlamaAttention": ModelMechanism(
        "DiffLlamaAttention",
        "a contiguous head split re-pairs differential attention's head halves",
        "differential attention pairs head i with head i + heads/2 (`DiffLlamaAttention.forward` chunks the values "
        "and the output in two halves along the head axis); DeepSpeed gives each rank a contiguous run of heads, so "
        "the rank pairs the two halves of its own run instead: wrong numbers where its run halves evenly, a size "
        "mismatch where it does not",
        "autotp",
        "transformers/models/diffllama/modeling_diffllama.py DiffLlamaAttention.forward: torch.chunk(value_states, 2, "
        "dim=1) and torch.chunk(attn_output, 2, dim=2) over the heads the rank holds; "
        "deepspeed/module_inject/tp_shard.py get_shard_size: contiguous head units per rank",
    ),
    "PersimmonAttention": ModelMechanism(
        "PersimmonAttention",
        "the catch-all DecoderLayer key applies the glm qkv layout to a per-head interleaved qkv",
        "DeepSpeed picks the fused qkv layout by the decoder layer's class name, and PersimmonDecoderLayer matches "
        "only the catch-all key `DecoderLayer`, which maps to glmtype ([all q | all k | all v]); persimmon's "
        "`query_key_value` is interleaved per head ([q, k, v] of head 1, of head 2, ...), so the rows are cut as if "
        "they were q, k and v blocks and a rank's query, key and value rows are other heads' rows mixed: wrong "
        "numbers, no error",
        "autotp",
        "deepspeed/module_inject/fusedqkv_utils.py get_fused_qkv_type: the longest key of FUSED_QKV_TYPE_DICT in "
        "str(module), 'DecoderLayer' -> 'glmtype'; transformers/models/persimmon/modeling_persimmon.py "
        "PersimmonAttention._split_heads: fused_qkv.view(batch, seq, self.num_heads, 3, self.head_dim)",
    ),
    "Qwen3NextGatedDeltaNet": ModelMechanism(
        "Qwen3NextGatedDeltaNet",
        "the gated delta-net's fused in_proj_qkvz/in_proj_ba split as plain linears",
        "the gated delta-net's fused `in_proj_qkvz` and `in_proj_ba` are split as plain column-parallel linears, "
        "while `fix_query_key_value_ordering` reshapes their output with the full `num_k_heads` and `num_v_heads` "
        "(attributes AutoTP does not divide), so the rank's slice cannot take that shape",
        "autotp",
        "transformers/models/qwen3_next/modeling_qwen3_next.py Qwen3NextGatedDeltaNet.fix_query_key_value_ordering: "
        "mixed_qkvz.view(..., self.num_k_heads, 2 * head_k_dim + 2 * head_v_dim * num_v_heads // num_k_heads); "
        "deepspeed/module_inject/auto_tp.py AutoTP.update_mp_params: its attribute list has no num_k_heads or "
        "num_v_heads",
    ),
    "FalconH1Mixer": _MAMBA_PACKED,
    "JambaMambaMixer": _MAMBA_PACKED,
}
"""Model-specific mechanisms by the class of the module whose own computation went wrong (`BreakPoint.origin_class`)."""
MECHANISMS_BY_NAME = {mechanism.name: mechanism for mechanism in MODEL_MECHANISMS.values()}
KV_SPLIT_IN_MODEL = {
    "FalconAttention": "`FalconAttention.forward` hard-codes its kv split, cutting its fused `query_key_value` output "
    "as [num_heads, 1, 1] (one key and one value head on every rank), which the kv-unit slices do not match, so the "
    "attention crashes",
    "GPTBigCodeAttention": "`GPTBigCodeAttention.forward` hard-codes its kv split, cutting its fused `c_attn` output "
    "as (embed_dim, kv_dim, kv_dim) (the full query width and one kv head on every rank), which the kv-unit slices "
    "do not match, so the attention crashes",
}
"""Attention classes that hard-code their kv split, by class: why their starved ranks crash where separate
projections only idle (transformers/models/falcon/modeling_falcon.py FalconAttention.forward: fused_qkv.split(
[self.num_heads, 1, 1]); transformers/models/gpt_bigcode/modeling_gpt_bigcode.py GPTBigCodeAttention.forward:
c_attn(...).split((self.embed_dim, self.kv_dim, self.kv_dim)))."""
KV_UNIT_EVIDENCE = (
    "deepspeed/module_inject/tp_shard.py get_shard_size: my_slices = num_kv_heads // mp_size + (1 if rank < "
    "num_kv_heads % mp_size else 0), so ranks >= num_kv_heads get no rows; DeepSpeed documents those idle ranks as "
    "giving a correct result (docs/_tutorials/autotp-training.md, Limitations 1; layers.py "
    "_subparam_shard_widths: 'the result stays correct'), which these crashes contradict"
)
KV_IDLE_EVIDENCE = (
    "DeepSpeed's AutoTP training page, Limitations 1: 'With more ranks than key/value heads ... the surplus ranks "
    "receive no attention weights at all. The result is still correct ... AutoTP logs a warning instead of "
    "replicating heads' (deepspeed/module_inject/layers.py _subparam_shard_widths logs it: 'some ranks hold none of "
    "it and stay idle')"
)
POLICY_PROBE = ModelMechanism(
    "no policy",
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
LAYOUT_MECHANISMS = {
    "Yuan_LinearLayer": ModelMechanism(
        "Yuan_LinearLayer",
        "a class name containing 'Yuan' gets Yuan2's shared-QK value layout",
        "DeepSpeed takes {block} for Yuan2 (`'Yuan' in str(module)` in auto_tp.py `AutoTP._replace` matches the "
        "class name) and gives `v_proj` and `o_proj` Yuan's shared-QK layout (Yuan_LinearLayer, "
        "Yuan_LinearAllreduce): a rank gets other heads' values (wrong numbers), and where tp does not divide the "
        "heads `shard_value_with_share_qk` asserts",
        "autotp",
        "deepspeed/module_inject/auto_tp.py AutoTP._replace: if 'Yuan' in str(self.module): v_proj -> "
        "Yuan_LinearLayer, o_proj -> Yuan_LinearAllreduce; deepspeed/module_inject/fusedqkv_utils.py "
        "shard_value_with_share_qk: assert num_heads % world_size == 0",
    ),
}
"""Layer classes AutoTP chose by a name match, by class (`words`: `{block}` is the decoder layer's class)."""
PARSER_RULE = (
    "auto_tp.py `tp_parser` makes row-parallel the linear registered just before each LayerNorm and the linears "
    "named o_proj, out_proj, down_proj and a few model-specific names"
)
PARSER_EVIDENCE = (
    "deepspeed/module_inject/auto_tp.py AutoTP.tp_parser: if layer == 'ln': gem_list += [layer_list[i - 1]] (the "
    "linear registered before a LayerNorm), elif 'out_proj' / 'o_proj' / 'down_proj' in layer, ...; every other "
    "linear becomes LinearLayer (column-parallel)"
)
LEFT_WHOLE_EVIDENCE = {
    "norm": "deepspeed/module_inject/auto_tp.py AutoTP._replace_module: only nn.Linear and nn.Embedding children "
    "are split, so a norm keeps its full-width weight and computes its statistic over the rank's slice; DeepSpeed's "
    "AutoTP pages (inference and training) document no limit for norms over a split width",
    "per-head": "deepspeed/module_inject/auto_tp.py AutoTP._replace_module: a block's own parameters and buffers "
    "are never split",
    "per-channel": "deepspeed/module_inject/auto_tp.py AutoTP._replace_module: a block's own parameters, buffers "
    "and convolutions are never split",
}
"""The evidence of a tensor left whole next to a split, by its kind (suites/verdicts/mechanism.py LEFT_WHOLE_KINDS)."""
NORM_OVER_SPLIT_WIDTH = (
    "slicing the norm's weight would not fix it: its statistic (the variance) spans the full width, so each rank "
    "needs the other ranks' share of it, a reduction across ranks AutoTP does not do"
)
TRIED = {
    "column-parallel": "by hand, injection_policy={EncoderLayer: ('multi_head_attention.dense', 'ffn.2')} made "
    "ctrl's tp 2 cell match; no remedy run on every cell yet",
}
"""What was tried for a cause beyond reading its source, by its key's kind (a model's or a layout's mechanism: its
`tried`)."""
DESIGN_LIMITS = {
    "experts left whole": 'deepspeed/module_inject/auto_tp.py AutoTP.update_mp_params: "AutoTP does not shard '
    "high-dimensional weights\" (a MoE block's experts fused into 3-D parameters, as transformers >= 5 keeps them)",
}
"""Memory findings AutoTP documents as its design (the finding's kind → the documenting line)."""


def proof_of(
    key: str, cells: Collection[str] = (), remedies: Sequence[RemedyResult] = (), deepspeed: str = ""
) -> Proof:
    """What stands behind a cause's sentence, by its key (suites/verdicts/mechanism.py `cause_of`), its cells and the
    remedies `nox -s remedy` ran (the history store's, merged from its remedies.json): a verified remedy proves it only
    where every one of the cause's cells passes with it; the remedies run on some of its cells, verified or not, are
    what was tried. `deepspeed`: the release the cells fail at, which a proof taken at another names."""
    kind, _, rest = key.partition("|")
    parts = rest.split("|")
    known = (
        MECHANISMS_BY_NAME.get(parts[0])
        if kind == "model"
        else LAYOUT_MECHANISMS.get(parts[-1])
        if kind == "layout"
        else None
    )
    mine = set(cells)
    ran = [result for result in remedies if mine & set(result.cause_cells)]
    proving = tuple(result for result in ran if result.status == "verified" and mine <= set(result.fixed))
    if proving:
        return Proof("", proving, len(mine), deepspeed)
    if ran:
        return Proof("; ".join(attempt_text(result, mine) for result in ran))
    return Proof(known.tried if known else TRIED.get(kind, READ_ONLY))


def attempt_text(result: RemedyResult, cells: set[str]) -> str:
    """A remedy run on some of a cause's cells that does not prove it: "workaround (Pass …): 1 of 3 cells pass"."""
    named = f"{_kind_words(result)} ({result.change})"
    if result.status == "not applied":
        return f"{named} not applied"
    passed = f"{len(cells & set(result.fixed))} of {len(cells)} cells pass"
    if result.changed:
        return f"{named}: {passed}, {len(result.changed)} other verdicts changed"
    return f"{named}: {passed}"

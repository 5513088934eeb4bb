"""Cell shapes: the sizes of a cell's tiny checkpoint, and the real checkpoints' sizes they are derived from.

A verdict is read as a statement about the checkpoints named in `hub_ids` ("qwen2 tp 3 passes" = "Qwen2-7B
works at tp 3"), so by default a tiny checkpoint must split under AutoTP exactly like its real checkpoint.
AutoTP splits attention by whole (kv-)heads and every other dim in 64-element grains (DeepSpeed's
`tp_shard.get_shard_size`): at tp N a count C of heads or grains gives C // N to every rank and one more to the
first C % N ranks. Two shapes split alike at tp N when every such count has the same remainder mod N and is
below N on both or on neither (a rank left empty), and every dim has the same sub-grain rest. DeepSpeed's
`get_shard_size` splits a non-MLP dim that divides by the kv head count in kv-head units instead of grains, so
whether the hidden and attention widths divide by the kv heads is kept too (and whether there are exactly 2 kv
heads, where DeepSpeed cuts a glm-type fused qkv apart); and an entry's `split_rules`
(matrix/models.toml: architecture-specific conditions such as codegen's kv heads % (4 x tp) == 0) hold for the
tiny config at a tp exactly where they hold for the real checkpoint.

Shapes of a cell (`SHAPES`):
- `faithful`: the registry's `tiny` overrides with every split-relevant size replaced by `faithful_sizes`: the
  smallest sizes that split like the entry's real shape (`real_shapes.toml`) at tp 2, 3, 4 and the cell's tp.
- `stress`: the registry's `tiny` overrides as written: deliberately odd splits (uneven grains, fewer kv heads
  than ranks) exercised for every architecture, whatever its checkpoints have.

`matrix/real_shapes.toml` records the real sizes of each registry entry: from a checkpoint's config.json
(`source = "hub config <hub id>"`, written by add-model or by hand from the published config) or from the
installed transformers' config class defaults (`source = "config-defaults transformers <version>"`, written by
`python -m matrix.shapes --write`; `--check` fails when the file is not what --write would make).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Collection
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix.config_values import UNREADABLE_CONFIG, ConfigValues, UnreadableConfig
from matrix.derive import HIDDEN_KEYS as DERIVED_HIDDEN_KEYS
from matrix.registry import MATRIX_DIR, MODELS_FILE, ModelEntry, RegistryError, SplitRule, read_toml
from matrix.toml_tables import TableError, read_table

if TYPE_CHECKING:
    from transformers import PretrainedConfig

REAL_SHAPES_FILE = MATRIX_DIR / "real_shapes.toml"
GRAIN = 64
"""DeepSpeed's `tensor_parallel.tp_grain_size` (default since 0.16.2): dims split in 64-element grains."""
MATRIX_TP = (2, 3, 4)
"""The tp sizes every faithful tiny config splits like its real checkpoint at (plus the cell's own)."""
SHAPES = ("faithful", "stress")
DEFAULT_SHAPES = ("faithful",)
UNMARKED_SHAPE = "stress"
"""The shape whose cells keep the plain id (`llama-eager-fp32-tp2`): every result stored before shapes
existed was a stress shape, so their history continues under the same ids; other shapes are marked in the
model part of the id (`llama.faithful-eager-fp32-tp2`)."""
SHAPE_SEPARATOR = "."
DEFAULTS_KEY = "defaults"
"""The record of a registry entry's transformers config class defaults (for entries without a known hub config)."""
AS_WRITTEN_KEY = "as_written"
"""The record of an entry that stands for no checkpoint (no hub_ids; e.g. llama_large, sized for the memory
checks): its source says why, its sizes are its own tiny config's, and its faithful cells run that config."""
LEAST_VOCAB = 256
"""Tiny checkpoints are read with a byte tokenizer (token ids < 256)."""
DEFAULT_TOP_K = 2
"""Experts per token where the real config does not say."""
HEAD_DIMS = range(16, 257, 4)
"""Head dims a faithful config may take (multiples of 4: rotary halves stay even)."""

# Config attribute names, first present wins (the same names matrix/derive.py shrinks).
HEAD_KEYS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "attention_heads",
    # an encoder-decoder's causal LM is its decoder (marian, whisper, trocr, prophetnet); the encoder's count is set
    # alike so the config stays one an encoder-decoder model could be built from
    "decoder_attention_heads",
    "num_decoder_attention_heads",
    "encoder_attention_heads",
    "num_encoder_attention_heads",
)
KV_KEYS = ("num_key_value_heads", "num_kv_heads", "kv_n_heads", "n_kv_heads", "multi_query_group_num")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "embed_dim", "emb_dim")
HEAD_DIM_KEYS = ("head_dim", "kv_channels", "attention_head_size")
FFN_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "ffn_hidden_size",
    "dff",
    "d_ff",
    "decoder_ffn_dim",
    "encoder_ffn_dim",
)
FFN_RATIO_KEYS = ("expansion_ratio", "intermediate_multiple_size")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k")
EXPERT_FFN_KEYS = ("moe_intermediate_size",)
SHARED_FFN_KEYS = ("shared_expert_intermediate_size",)
SHARED_COUNT_KEYS = ("n_shared_experts",)
NESTED = ("attn_config", "ffn_config", "text_config")
"""Sub-tables some configs keep sizes in: dbrx's attention and MLP tables, a multimodal model's language model (llama4,
gemma4, qwen3_5: its causal LM is the text model; a vision tower's sizes are never read as the model's)."""
HEAD_DIM_FOLLOWS_HIDDEN = {"bitnet"}
"""Config classes that accept head_dim but need heads x head_dim = hidden (bitnet's attention sub-norm is
hidden wide): measured, a free head_dim fails their forward."""
MIXER_KEYS = ("state_size", "ssm_state_size", "attention_hidden_size")
"""Sizes of an attention-free sequence mixer (mamba's and falcon_mamba's state, rwkv's time-mix width): a config with
one of them and no head count is read as one head, so only its widths (hidden, intermediate, vocab) split in grains."""
MLA_KEY = "qk_rope_head_dim"
"""Multi-head latent attention: heads split, head dims are low-rank sizes that stay as the tiny config has them."""
LATENT_VALUE_HEAD_DIM_KEYS = ("v_head_dim", "head_dim")
"""The value head dim of multi-head latent attention, first present wins: `v_head_dim` (deepseek_v2/v3); `head_dim`
where the one shared key-value head is head_dim wide and rope takes part of it (deepseek_v4, which has no
`v_head_dim`): the output projection reads heads x this."""


@dataclass(frozen=True)
class RealShape:
    """The split-relevant sizes of one checkpoint (or of a config class's defaults)."""

    source: str
    """`hub config <hub id>` or `config-defaults transformers <version>`."""
    heads: int
    kv_heads: int
    """Key/value heads (= heads for multi-head attention, 1 for multi-query)."""
    head_dim: int
    hidden: int
    intermediate: int
    """The dense MLP's width (MoE models: the width transformers' `intermediate_size` gives, often the experts')."""
    vocab: int
    tied_embeddings: bool
    experts: int = 0
    top_k: int = 0
    """Experts per token; 0 where the config does not say (some class defaults leave it unset)."""
    expert_intermediate: int = 0
    """Each routed expert's width (0: no MoE, or the experts use `intermediate`)."""
    shared_experts: int = 0
    """Shared experts (deepseek's `n_shared_experts`), 0 if none or not counted."""
    shared_expert_intermediate: int = 0
    """The shared expert's width where it has its own (qwen2_moe's `shared_expert_intermediate_size`)."""

    @property
    def qkv(self) -> int:
        """Width of a fused query/key/value projection."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def counts(self) -> dict[str, int]:
        """The counts AutoTP splits whole (heads; experts, which expert-parallel plans divide)."""
        return {"heads": self.heads, "kv_heads": self.kv_heads, "experts": self.experts}

    def validate(self) -> None:
        """real_shapes.toml's rules beyond the fields' types (toml_tables.read_table): sizes a checkpoint can have."""
        for size in fields(self):  # a size with a default (0: no MoE) may be 0, the others are at least 1
            value, least = getattr(self, size.name), 1 if size.name in _REQUIRED else 0
            if isinstance(value, int) and not isinstance(value, bool) and value < least:
                raise TableError(size.name, f"must be an integer >= {least}, got {value!r}")
        if self.heads % self.kv_heads:
            raise TableError("kv_heads", f"must divide heads {self.heads}, got {self.kv_heads}")
        if self.top_k > self.experts:
            raise TableError("top_k", f"must be at most experts ({self.experts}), got {self.top_k}")

    def dims(self) -> dict[str, int]:
        """The dims AutoTP splits in grains."""
        return {
            "hidden": self.hidden,
            "intermediate": self.intermediate,
            "vocab": self.vocab,
            "qkv": self.qkv,
            "attention_out": self.heads * self.head_dim,
            "expert_intermediate": self.expert_intermediate,
            "shared_expert_intermediate": self.shared_expert_intermediate,
        }


def count_split(count: int, tp: int) -> tuple[bool, int]:
    """How `count` whole units split over `tp` ranks: whether every rank gets one, and how many get one more."""
    return count >= tp, count % tp


def dim_split(size: int, tp: int) -> tuple[Any, ...]:
    """How a dim splits over `tp` ranks in grains (below one grain DeepSpeed splits it element by element)."""
    grains, rest = divmod(size, GRAIN)
    return ("grains", *count_split(grains, tp), rest) if grains else ("elements", *count_split(size, tp))


KV_UNIT_DIMS = ("hidden", "qkv", "attention_out")
"""Dims DeepSpeed's get_shard_size splits in kv-head units when they divide by the kv head count (MLP widths and
lm_head always go by grains; the name decides)."""


def rule_conditions(shape: RealShape, tp: int, rules: tuple[SplitRule, ...] = ()) -> dict[str, bool]:
    """Each condition of `rules` at `tp`, true where `shape` meets it."""
    sizes = {**shape.counts(), **shape.dims()}
    return {name: met for rule in rules for name, met in rule.conditions(sizes, tp).items()}


def split_pattern(shape: RealShape, tp: int, rules: tuple[SplitRule, ...] = ()) -> dict[str, Any]:
    """Every split AutoTP performs on `shape` at `tp` (and every condition of the architecture's `rules`), as a
    pattern two shapes that split alike share."""
    pattern: dict[str, Any] = {name: count_split(count, tp) for name, count in shape.counts().items() if count}
    pattern |= {name: dim_split(size, tp) for name, size in shape.dims().items() if size}
    pattern |= {f"{name} in kv-head units": shape.dims()[name] % shape.kv_heads == 0 for name in KV_UNIT_DIMS}
    # fusedqkv_utils cuts a glm/qwen-type fused qkv as q | k | v (chatglm2/3's layout) exactly when kv heads == 2
    pattern["kv_heads = 2"] = shape.kv_heads == 2
    pattern |= rule_conditions(shape, tp, rules)
    pattern["grouped_query"] = shape.kv_heads < shape.heads
    pattern["top_k"] = shape.top_k
    pattern["shared_experts"] = shape.shared_experts
    pattern["tied_embeddings"] = shape.tied_embeddings
    return pattern


def split_differences(
    tiny: RealShape, real: RealShape, tps: Collection[int], rules: tuple[SplitRule, ...] = ()
) -> list[str]:
    """`field at tp N: tiny <pattern> vs real <pattern>` for every split where the two differ."""
    differences = []
    for tp in tps:
        ours, theirs = split_pattern(tiny, tp, rules), split_pattern(real, tp, rules)
        differences += [
            f"{name} at tp {tp}: tiny {ours.get(name)} vs real {theirs.get(name)}"
            for name in sorted(set(ours) | set(theirs))
            if ours.get(name) != theirs.get(name)
        ]
    return differences


# ------------------------------------------------------------------------------------------ the rule


def faithful_count(real: int, tps: Collection[int], least: int = 1, rules: tuple[SplitRule, ...] = ()) -> int:
    """The smallest count >= `least` that splits like `real` at every tp in `tps`: same remainder mod the lcm
    of the tps (and of k x tp for each `multiple_of_tp_times` k of `rules`, all of them rules of this count), >=
    each tp exactly when `real` is, and every condition of `rules` met exactly where `real` meets it. `real`
    itself qualifies, so there always is one."""
    if real < least:
        raise ValueError(f"a count of {real} is below the least allowed {least}")
    period = count_period(tps, rules)
    count = real % period
    while count < least or not counts_alike(count, real, tps, rules):
        count += period
    return count


def count_period(tps: Collection[int], rules: tuple[SplitRule, ...] = ()) -> int:
    """The period of a count's split pattern over `tps` and the `multiple_of_tp_times` conditions of `rules`."""
    return math.lcm(
        *tps, *(rule.multiple_of_tp_times * tp for rule in rules if rule.multiple_of_tp_times for tp in tps)
    )


def counts_alike(count: int, real: int, tps: Collection[int], rules: tuple[SplitRule, ...] = ()) -> bool:
    """Whether `count` splits like `real` at every tp in `tps` and meets each condition of `rules` (rules of
    this count) exactly where `real` does."""

    def conditions(value: int, tp: int) -> dict[str, bool]:
        return {name: met for rule in rules for name, met in rule.conditions({rule.size: value}, tp).items()}

    return all(
        count_split(count, tp) == count_split(real, tp) and conditions(count, tp) == conditions(real, tp) for tp in tps
    )


def faithful_dim(real: int, tps: Collection[int], least: int = 1) -> int:
    """The smallest dim >= `least` whose grain count splits like `real`'s at every tp, with the same sub-grain rest."""
    grains, rest = divmod(real, GRAIN)
    if not grains:
        return real
    return faithful_count(grains, tps, least=max(1, -(-(least - rest) // GRAIN))) * GRAIN + rest


@dataclass(frozen=True)
class TinySizes:
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    experts: int
    top_k: int
    expert_intermediate: int
    shared_expert_intermediate: int


def faithful_sizes(
    real: RealShape,
    tps: Collection[int],
    head_dim_free: bool,
    latent: bool = False,
    rules: tuple[SplitRule, ...] = (),
    attention_free: bool = False,
) -> TinySizes:
    """The smallest sizes that split like `real` at every tp in `tps` and meet the count conditions of `rules`
    where `real` does. `head_dim_free`: the architecture takes head_dim on its own (else hidden = heads x
    head_dim); `latent`: multi-head latent attention, whose query/key head dims are low-rank sizes that stay as
    the tiny config has them (head_dim is the value head dim); `attention_free`: a sequence mixer without heads
    (MIXER_KEYS), whose only split sizes are its widths. Heads keep multi-head / grouped / multi-query attention."""

    def rules_of(*names: str) -> tuple[SplitRule, ...]:
        return tuple(rule for rule in rules if rule.size in names)

    multi_head = real.kv_heads == real.heads
    kv = faithful_count(real.kv_heads, tps, rules=rules_of("kv_heads", *(("heads",) if multi_head else ())))
    if multi_head:
        heads_options = [kv]
    else:
        period = count_period(tps, rules_of("heads"))
        heads_options = [
            kv * group
            for group in range(2, real.heads // real.kv_heads % period + 2 * period + 2)
            if counts_alike(kv * group, real.heads, tps, rules_of("heads"))
        ]
    hidden_alone = faithful_dim(real.hidden, tps)
    free = head_dim_free or latent or attention_free
    checked = (
        ("hidden",) if attention_free else ("hidden", "attention_out") if latent else ("hidden", "qkv", "attention_out")
    )

    def fits(heads: int, head_dim: int) -> bool:
        trial = replace(
            real, heads=heads, kv_heads=kv, head_dim=head_dim, hidden=hidden_alone if free else heads * head_dim
        )
        return all(
            dim_split(trial.dims()[name], tp) == dim_split(real.dims()[name], tp) for name in checked for tp in tps
        )

    # smallest attention first; among equals a head_dim that is a multiple of 8 (partial rotary factors stay even)
    options = sorted(
        ((heads, head_dim) for heads in heads_options for head_dim in HEAD_DIMS),
        key=lambda option: (option[0] * option[1], option[1] % 8 != 0, option),
    )
    found = next((option for option in options if fits(*option)), None)
    if found is None:
        raise RegistryError(
            f"no heads x head_dim up to {max(heads_options)} x {max(HEAD_DIMS)} splits like {real.source} "
            f"({real.heads} heads, {real.kv_heads} kv heads, head_dim {real.head_dim}, hidden {real.hidden})"
        )
    heads, head_dim = found
    top_k = real.top_k or DEFAULT_TOP_K
    experts = faithful_count(real.experts, tps, least=top_k, rules=rules_of("experts")) if real.experts else 0
    return TinySizes(
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        hidden=hidden_alone if free else heads * head_dim,
        intermediate=faithful_dim(real.intermediate, tps),
        vocab=faithful_dim(real.vocab, tps, least=LEAST_VOCAB),
        experts=experts,
        top_k=top_k if experts else 0,
        expert_intermediate=faithful_dim(real.expert_intermediate, tps) if real.expert_intermediate else 0,
        shared_expert_intermediate=(
            faithful_dim(real.shared_expert_intermediate, tps) if real.shared_expert_intermediate else 0
        ),
    )


def _tables(tiny: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The overrides and the sub-tables of them that hold sizes (NESTED)."""
    return (tiny, *(tiny[name] for name in NESTED if isinstance(tiny.get(name), dict)))


def _set(tiny: dict[str, Any], keys: tuple[str, ...], value: Any) -> bool:
    """Set every key of `keys` the overrides (or their nested sub-tables) hold; whether any was there."""
    found = False
    for table in _tables(tiny):
        for key in keys:
            if key in table:
                table[key] = value
                found = True
    return found


def _head_dim_free(entry: ModelEntry, real: RealShape) -> bool:
    """Whether the architecture takes head_dim apart from hidden / heads: where the real checkpoint sets them
    apart, or the entry's tiny config names a head_dim (except the classes that still need heads x head_dim =
    hidden, HEAD_DIM_FOLLOWS_HIDDEN). A free head_dim keeps a faithful model small: hidden and attention widths
    each take their own smallest faithful size."""
    if any(rule.equals == "hidden" for rule in entry.split_rules):
        return False
    return real.heads * real.head_dim != real.hidden or (
        any(key in entry.tiny for key in HEAD_DIM_KEYS) and entry.model_type not in HEAD_DIM_FOLLOWS_HIDDEN
    )


def faithful_tiny(entry: ModelEntry, real: RealShape, tps: Collection[int]) -> dict[str, Any]:
    """The entry's tiny overrides with every split-relevant size replaced by the rule's (faithful_sizes) value;
    everything else the overrides carry (pad ids, rotary dims, layer kinds) stays."""
    tiny = {
        key: dict(value) if key in NESTED and isinstance(value, dict) else value for key, value in entry.tiny.items()
    }
    latent = MLA_KEY in tiny
    attention_free = not any(key in table for table in _tables(tiny) for key in HEAD_KEYS)
    sizes = faithful_sizes(
        real,
        tps,
        head_dim_free=_head_dim_free(entry, real),
        latent=latent,
        rules=entry.split_rules,
        attention_free=attention_free,
    )
    _set(tiny, HEAD_KEYS, sizes.heads)
    if not _set(tiny, KV_KEYS, sizes.kv_heads) and sizes.kv_heads != sizes.heads and not tiny.get("multi_query"):
        tiny["num_key_value_heads"] = sizes.kv_heads
    if latent:  # the value head dim: the first of LATENT_VALUE_HEAD_DIM_KEYS the overrides hold
        _set(tiny, tuple(key for key in LATENT_VALUE_HEAD_DIM_KEYS if key in tiny)[:1], sizes.head_dim)
    else:
        _set(tiny, HEAD_DIM_KEYS, sizes.head_dim)
    old_hidden = _first(
        {**tiny, **{k: v for n in NESTED if isinstance(tiny.get(n), dict) for k, v in tiny[n].items()}}, HIDDEN_KEYS
    )
    # every width the tiny config keeps equal to hidden follows it (recurrent_gemma's lru_width, ...)
    _set(
        tiny,
        tuple(key for key in (*HIDDEN_KEYS, *DERIVED_HIDDEN_KEYS) if key in HIDDEN_KEYS or tiny.get(key) == old_hidden),
        sizes.hidden,
    )
    if not _set(tiny, FFN_KEYS, sizes.intermediate) and real.intermediate % real.hidden == 0:
        _set(tiny, FFN_RATIO_KEYS, real.intermediate // real.hidden)  # the width is a multiple of hidden (mpt)
    if real.experts:  # else the tiny config's experts stay (a class default without them, fixed in derived.toml)
        _set(tiny, EXPERT_KEYS, sizes.experts)
        _set(tiny, TOP_K_KEYS, sizes.top_k)
        if sizes.expert_intermediate:
            _set(tiny, EXPERT_FFN_KEYS, sizes.expert_intermediate)
        if sizes.shared_expert_intermediate:
            _set(tiny, SHARED_FFN_KEYS, sizes.shared_expert_intermediate)
        if real.shared_experts:
            _set(tiny, SHARED_COUNT_KEYS, real.shared_experts)
    if not _set(tiny, ("vocab_size",), sizes.vocab):  # a multimodal config keeps it in its text model's table
        tiny["vocab_size"] = sizes.vocab
    tiny["tie_word_embeddings"] = real.tied_embeddings
    return tiny


# ------------------------------------------------------------------------------ reading a config


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first(values: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    return next((values[key] for key in keys if _int(values.get(key))), None)


def read_shape(config: PretrainedConfig, source: str) -> RealShape:
    """The split-relevant sizes of a transformers config (a checkpoint's, or a class's defaults). A config without
    attention heads or a hidden size is a RegistryError (no split count applies: a state-space model); one that
    lacks a size this reader needs, or holds a non-integer there, an UnreadableConfig naming the key."""
    raw = config.to_dict()
    for name in NESTED:
        if isinstance(raw.get(name), dict):
            raw = {**raw, **raw[name]}
    values = ConfigValues(raw, type(config).__name__)
    hidden = _first(values, HIDDEN_KEYS)
    heads = _first(values, HEAD_KEYS) or (1 if hidden and any(key in values for key in MIXER_KEYS) else None)
    if not heads or not hidden:
        lacking = (
            f"no attention head count under the names {HEAD_KEYS} (nor an attention-free mixer's {MIXER_KEYS})"
            if hidden
            else f"no hidden size under the names {HIDDEN_KEYS}"
        )
        raise RegistryError(f"{source} (read by matrix/shapes.py:read_shape): the config has {lacking}")
    multi_query = values.get("multi_query") is True and not values.get("new_decoder_architecture")
    kv_heads = 1 if multi_query else (_first(values, KV_KEYS) or heads)
    if MLA_KEY in values:  # multi-head latent attention: the output projection reads heads x the value head dim
        head_dim = _first(values, LATENT_VALUE_HEAD_DIM_KEYS) or values.integer(LATENT_VALUE_HEAD_DIM_KEYS[0])
    else:
        head_dim = _first(values, HEAD_DIM_KEYS) or hidden // heads
    ratio = _first(values, FFN_RATIO_KEYS)
    intermediate = _first(values, FFN_KEYS) or (ratio or 4) * hidden
    experts = _first(values, EXPERT_KEYS) or 0
    expert_intermediate = _first(values, EXPERT_FFN_KEYS) or 0
    tied = values.get("tie_word_embeddings", getattr(config, "tie_word_embeddings", True))
    # a multimodal config may keep its vocabulary only in its language model's (fuyu from transformers 4.43)
    text_config = values.get("text_config")
    text_vocab = text_config.get("vocab_size") if isinstance(text_config, dict) else None
    vocab = text_vocab if "vocab_size" not in values and isinstance(text_vocab, int) else values.integer("vocab_size")
    return RealShape(
        source=source,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        hidden=hidden,
        intermediate=intermediate,
        vocab=vocab,
        tied_embeddings=bool(tied),
        experts=experts if experts > 1 else 0,
        top_k=(_first(values, TOP_K_KEYS) or 0) if experts > 1 else 0,
        expert_intermediate=expert_intermediate if experts > 1 else 0,
        shared_experts=(_first(values, SHARED_COUNT_KEYS) or 0) if experts > 1 else 0,
        shared_expert_intermediate=(_first(values, SHARED_FFN_KEYS) or 0) if experts > 1 else 0,
    )


def tiny_shape(model_type: str, tiny: dict[str, Any]) -> RealShape:
    """The sizes of the config a tiny checkpoint is built from (read like a real one)."""
    from transformers import AutoConfig

    return read_shape(AutoConfig.for_model(model_type, **tiny), "tiny")


TINY_SHAPES_FORMAT = 1
"""Bump when what a tiny shape record holds changes."""


def checked_tiny_shape(model_type: str, tiny: dict[str, Any]) -> RealShape | str:
    """tiny_shape, or why the config class refuses `tiny` (`<exception type>: <first line>`), remembered in the
    harness cache per transformers version and origin (a commit checkout's commit): the config classes import torch
    in transformers 5.x (~10 CPU s of the driver before its first cell), and the same transformers gives the same
    answer."""
    import hashlib
    import json

    from matrix import cache_root
    from matrix.installed import cache_identity

    key = {"format": TINY_SHAPES_FORMAT, "model_type": model_type, "tiny": tiny, **cache_identity("transformers")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    record = cache_root() / "tiny-shapes" / f"{digest}.json"
    try:
        known = json.loads(record.read_text())
        return known["refused"] if "refused" in known else RealShape(**known["shape"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not recorded yet (or unreadable): the config class answers
    from transformers.utils import logging as hf_logging

    # Configs built on the way warn about sizes they adjust (rope scaling vs positions): noise before the first cell.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    try:
        answer: RealShape | str = tiny_shape(model_type, tiny)
    except Exception as error:  # the config class's own validation refuses the sizes
        answer = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    finally:
        hf_logging.set_verbosity(verbosity)
    record.parent.mkdir(parents=True, exist_ok=True)
    # Parallel drivers (pytest-xdist workers) may write the same record: each through a staging file of its own.
    staging = record.with_name(f".{record.name}.tmp{os.getpid()}")
    staging.write_text(
        json.dumps({"key": key, **({"refused": answer} if isinstance(answer, str) else {"shape": asdict(answer)})})
    )
    staging.replace(record)
    return answer


def defaults_source() -> str:
    import transformers

    return f"config-defaults transformers {transformers.__version__}"


# ------------------------------------------------------------------------------ real_shapes.toml


def _parse_record(path: Path, entry: str, checkpoint: str, raw: object) -> RealShape:
    expected = {DEFAULTS_KEY: "config-defaults transformers ", AS_WRITTEN_KEY: "as written: "}.get(
        checkpoint, f"hub config {checkpoint}"
    )

    def named_source(shape: RealShape) -> None:
        if not shape.source.startswith(expected):
            raise TableError("source", f"must start with {expected!r}, got {shape.source!r}")

    where = f"{path}: entry [{entry}] checkpoint {checkpoint!r}"
    return read_table(RealShape, raw, where=where, error=RegistryError, rules=named_source)


def load_real_shapes(
    path: Path = REAL_SHAPES_FILE, registry: dict[str, ModelEntry] | None = None
) -> dict[str, dict[str, RealShape]]:
    """{entry: {hub id or 'defaults': shape}}; with `registry`, every entry must have the record its faithful
    cells use (faithful_record) and name only its own hub ids."""
    raw = read_toml(path, "; write it with python -m matrix.shapes --write")
    shapes = {}
    for entry, records in raw.items():
        if not isinstance(records, dict) or not records:
            raise RegistryError(f"{path}: entry [{entry}] must be a table of checkpoint = {{ sizes }}, got {records!r}")
        shapes[entry] = {
            checkpoint: _parse_record(path, entry, checkpoint, record) for checkpoint, record in records.items()
        }
    if registry is not None:
        for entry, records in shapes.items():
            if entry not in registry:
                raise RegistryError(f"{path}: entry [{entry}] is not in the model registry")
            hub_ids = registry[entry].hub_ids
            strangers = set(records) - {DEFAULTS_KEY, *hub_ids, *([] if hub_ids else [AS_WRITTEN_KEY])}
            if strangers:
                raise RegistryError(
                    f"{path}: entry [{entry}] has record(s) {sorted(strangers)} that are not in its hub_ids "
                    f"{list(hub_ids)} (or {DEFAULTS_KEY!r}; {AS_WRITTEN_KEY!r} for an entry without hub_ids)"
                )
        for name, model in registry.items():
            if not (model.skip_reason or model.trust_remote_code) and faithful_record(model, shapes) is None:
                raise RegistryError(
                    f"{path}: entry [{name}] has no record for {(model.hub_ids or [DEFAULTS_KEY])[0]!r}"
                    f" nor {DEFAULTS_KEY!r}; run python -m matrix.shapes --write"
                )
    return shapes


def real_shapes_file(models_file: Path) -> Path:
    """The real shapes of a registry file's entries: real_shapes.toml next to it."""
    return Path(models_file).with_name(REAL_SHAPES_FILE.name)


def faithful_record(entry: ModelEntry, shapes: dict[str, dict[str, RealShape]]) -> RealShape | None:
    """The real shape a faithful cell of `entry` splits like: its first hub id's (what `--checkpoints hub`
    loads) when recorded, else its own config when it stands for no checkpoint, else its config class defaults."""
    records = shapes.get(entry.name.split(SHAPE_SEPARATOR)[0], {})
    if entry.hub_ids and entry.hub_ids[0] in records:
        return records[entry.hub_ids[0]]
    return records.get(AS_WRITTEN_KEY) or records.get(DEFAULTS_KEY)


def shaped_name(name: str, shape: str) -> str:
    """The model part of a cell id for `shape` (see UNMARKED_SHAPE)."""
    return name if shape == UNMARKED_SHAPE else f"{name}{SHAPE_SEPARATOR}{shape}"


CHECKPOINT_SHAPE = re.compile(r"faithful-[a-z0-9]+(-[a-z0-9]+)*")
"""A faithful cell of checkpoints that split unlike the entry's first hub id: `faithful-<short name>` of the
first of them (`llama.faithful-meta-llama-3-8b`); the first hub id's cell keeps plain `faithful`."""


def checkpoint_shape(hub_id: str) -> str:
    """The shape of a faithful cell that stands first for `hub_id` (not the entry's first)."""
    return "faithful-" + re.sub(r"[^a-z0-9]+", "-", hub_id.rsplit("/", 1)[-1].lower()).strip("-")


def base_shape(shape: str) -> str:
    """`faithful` or `stress`: the kind of a shape (`faithful-meta-llama-3-8b` is faithful)."""
    return "faithful" if CHECKPOINT_SHAPE.fullmatch(shape) else shape


def split_shaped_name(text: str) -> tuple[str, str]:
    """(entry name, shape) of a model as cell ids and --models spell it (`qwen2` is the unmarked shape,
    `qwen2.faithful`, `qwen2.stress`, `llama.faithful-meta-llama-3-8b` explicit); a RegistryError for an
    unknown shape."""
    name, separator, shape = text.partition(SHAPE_SEPARATOR)
    if not separator:
        return text, UNMARKED_SHAPE
    if shape not in SHAPES and not CHECKPOINT_SHAPE.fullmatch(shape):
        raise RegistryError(
            f"{text!r}: unknown shape {shape!r}; spell a model <name> or <name>{SHAPE_SEPARATOR}<shape> "
            f"with shape one of {', '.join(SHAPES)} (or faithful-<checkpoint short name>)"
        )
    return name, shape


def parse_shapes(text: str) -> tuple[str, ...]:
    shapes = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    for shape in shapes:
        if shape not in SHAPES:
            raise RegistryError(
                f"unknown shape {shape!r}; use one of {', '.join(SHAPES)} (e.g. --shapes faithful,stress)"
            )
    return shapes


@dataclass(frozen=True)
class FaithfulGroup:
    """Real shapes of one entry that split alike at every tp of a cell: one faithful cell runs for all of them."""

    shape: str
    """`faithful` for the group of the entry's first record (faithful_record), else checkpoint_shape(first hub id)."""
    record: RealShape
    """The record the tiny config is derived from."""
    checkpoints: tuple[str, ...]
    """The hub ids (of the entry's recorded ones) whose split patterns equal the record's at every tp."""


def faithful_groups(
    entry: ModelEntry, shapes: dict[str, dict[str, RealShape]], tps: Collection[int]
) -> list[FaithfulGroup]:
    """The faithful cells `entry` needs at `tps`: one per distinct split pattern of its records (hub ids in
    registry order), the first record's (faithful_record, else the class defaults) first as plain `faithful`."""
    primary = faithful_record(entry, shapes) or _defaults_record(entry)
    records = shapes.get(entry.name.split(SHAPE_SEPARATOR)[0], {})

    def patterns(record: RealShape) -> list[dict[str, Any]]:
        return [split_pattern(record, tp, entry.split_rules) for tp in tps]

    groups: list[tuple[list[dict[str, Any]], str, RealShape, list[str]]] = [
        (patterns(primary), "faithful", primary, [])
    ]
    for hub_id in entry.hub_ids:
        if hub_id not in records:
            continue
        found = patterns(records[hub_id])
        group = next((group for group in groups if group[0] == found), None)
        if group is None:
            group = (found, checkpoint_shape(hub_id), records[hub_id], [])
            groups.append(group)
        group[3].append(hub_id)
    return [
        FaithfulGroup(shape=shape, record=record, checkpoints=tuple(hub_ids)) for _, shape, record, hub_ids in groups
    ]


def shaped_entries(
    entry: ModelEntry, shape: str, tp: int, shapes: dict[str, dict[str, RealShape]] | None = None
) -> list[ModelEntry]:
    """The entries the cells of `shape` (`faithful` or `stress`) at `tp` run: the stress one; or one faithful
    per group of the entry's checkpoints that split alike (faithful_groups), the first as plain `faithful`."""
    if shape == "stress" or entry.skip_reason or entry.expansion_error:
        return [shaped_entry(entry, shape, tp, shapes)]
    shapes = load_real_shapes() if shapes is None else shapes
    groups = faithful_groups_or_why(entry, shapes, tuple(sorted({*MATRIX_TP, tp})))
    if isinstance(groups, str):  # shaped_entry makes the skip naming why
        return [shaped_entry(entry, shape, tp, shapes)]
    return [shaped_entry(entry, group, tp, shapes) for group in groups]


def faithful_groups_or_why(
    entry: ModelEntry, shapes: dict[str, dict[str, RealShape]], tps: Collection[int]
) -> dict[str, FaithfulGroup] | str:
    """faithful_groups by shape, or why the entry has none, its faithful cells' skip reason: no record and no config
    class defaults to read one from, or a config the reader cannot read (the key and the reader named). The shapes
    step's guard: one architecture's config never stops the expansion of the others."""
    try:
        return {group.shape: group for group in faithful_groups(entry, shapes, tps)}
    except UnreadableConfig as error:
        return f"{UNREADABLE_CONFIG}: {error}"
    except RegistryError as error:
        return f"no faithful tiny config: {type(error).__name__}: {str(error).splitlines()[0][:300]}"


def shaped_entry(
    entry: ModelEntry, shape: str, tp: int, shapes: dict[str, dict[str, RealShape]] | None = None
) -> ModelEntry:
    """The entry the cell of exactly `shape` at `tp` runs: named for its shape; a faithful one with the rule's
    tiny config for tp 2, 3, 4 and `tp` and the hub ids it stands for (`checkpoints`), or a skip naming why there
    is none. A `faithful-<short name>` no group of the entry has is a RegistryError."""
    if shape == "stress" or entry.skip_reason or entry.expansion_error:
        return replace(entry, name=shaped_name(entry.name, shape))
    shapes = load_real_shapes() if shapes is None else shapes
    tps = tuple(sorted({*MATRIX_TP, tp}))
    groups = faithful_groups_or_why(entry, shapes, tps)
    if isinstance(groups, str):
        if shape != "faithful":
            raise RegistryError(f"{shaped_name(entry.name, shape)}: {entry.name} has no faithful cells: {groups}")
        return replace(entry, name=shaped_name(entry.name, shape), skip_reason=groups)
    if shape not in groups and shape != "faithful":
        raise RegistryError(
            f"{shaped_name(entry.name, shape)}: no checkpoint of {entry.name} splits apart under that "
            f"name at tp {tp}; its faithful cells: {', '.join(shaped_name(entry.name, s) for s in groups)}"
        )
    try:
        real, checkpoints = groups[shape].record, groups[shape].checkpoints
        if real.source.startswith("as written: "):
            return replace(entry, name=shaped_name(entry.name, shape), tiny_why=f"{real.source}; {entry.tiny_why}")
        tiny = faithful_tiny(entry, real, tps)
        sizes = checked_tiny_shape(entry.model_type, tiny)
    except ValueError as error:  # the rule found no sizes (a RegistryError); any other exception is a harness bug
        sizes = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    if isinstance(sizes, str):  # no sizes, or the config class refuses them (its own validation)
        return replace(entry, name=shaped_name(entry.name, shape), skip_reason=f"no faithful tiny config: {sizes}")
    why = (
        f"faithful to {real.source} at tp {', '.join(map(str, tps))}: {sizes.heads} heads, {sizes.kv_heads} kv heads, "
        f"head_dim {sizes.head_dim}, hidden {sizes.hidden}, intermediate {sizes.intermediate}, vocab {sizes.vocab}"
        + (f", {sizes.experts} experts top-{sizes.top_k}" if sizes.experts else "")
        + (f" of width {sizes.expert_intermediate}" if sizes.expert_intermediate else "")
    )
    return replace(entry, name=shaped_name(entry.name, shape), tiny=tiny, tiny_why=why, checkpoints=checkpoints)


def _defaults_record(entry: ModelEntry) -> RealShape:
    """An entry real_shapes.toml does not cover (a derived architecture): its config class defaults."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(entry.model_type)
    except Exception as error:  # a remote-code or unknown model type: no class defaults to read
        raise RegistryError(
            f"no real shape recorded in {REAL_SHAPES_FILE.name} and no config class defaults for "
            f"{entry.model_type!r} ({type(error).__name__})"
        ) from None
    return read_shape(config, defaults_source())


# ------------------------------------------------------------------------------ writing the file


_REQUIRED = {size.name for size in fields(RealShape) if size.default is MISSING}
"""What every record names; the sizes left out (of MoE) are 0."""


def _toml_record(shape: RealShape) -> str:
    values = {k: v for k, v in asdict(shape).items() if v or k in _REQUIRED}
    rendered = ", ".join(
        f"{k} = " + ('"' + v + '"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in values.items()
    )
    return "{ " + rendered + " }"


HEADER = """\
# Real sizes of every registry entry's checkpoints (matrix/shapes.py): what a faithful tiny config splits like.
# [<entry>] "<hub id>" = { ... }: from that checkpoint's config.json (source = "hub config <hub id>"; add-model
# writes it, or type it from the published config). "defaults" = { ... }: the installed transformers' config
# class defaults, used where no hub config is recorded for the entry's first hub id (source names the release).
# Regenerate the defaults with `python -m matrix.shapes --write`; `--check` fails when this file is stale.
"""


def render(registry: dict[str, ModelEntry], shapes: dict[str, dict[str, RealShape]]) -> str:
    """The file: hub-config records as they are, a defaults record (from the installed transformers) for every
    entry whose first hub id has none."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)
    blocks = []
    for name, entry in registry.items():
        if entry.skip_reason or entry.trust_remote_code:
            continue
        records = {k: v for k, v in shapes.get(name, {}).items() if k != DEFAULTS_KEY}
        if AS_WRITTEN_KEY in records:  # its sizes follow its tiny config
            records[AS_WRITTEN_KEY] = replace(
                tiny_shape(entry.model_type, entry.tiny), source=records[AS_WRITTEN_KEY].source
            )
        elif not (entry.hub_ids and entry.hub_ids[0] in records):
            records[DEFAULTS_KEY] = read_shape(AutoConfig.for_model(entry.model_type), defaults_source())
        blocks.append(_block(name, records))
    return HEADER + "\n" + "\n".join(blocks)


def _block(entry: str, records: dict[str, RealShape]) -> str:
    return f"[{entry}]\n" + "".join(f"{_key(k)} = {_toml_record(v)}\n" for k, v in records.items())


def _key(text: str) -> str:
    return text if text.replace("_", "").replace("-", "").isalnum() else '"' + text + '"'


def add_record(models_file: Path, entry: ModelEntry, hub_id: str | None, shape: RealShape | None) -> Path:
    """Append the real sizes of a new registry entry (add-model) to real_shapes.toml next to `models_file`: its
    checkpoint's (`hub_id`, `shape`), or without one its config class defaults. Returns the file written."""
    from transformers import AutoConfig

    path = real_shapes_file(models_file)
    if path.exists() and entry.name in load_real_shapes(path):
        raise RegistryError(f"{path}: entry [{entry.name}] already has records; remove them first")
    records = (
        {hub_id: shape}
        if hub_id and shape
        else {DEFAULTS_KEY: read_shape(AutoConfig.for_model(entry.model_type), defaults_source())}
    )
    path.write_text((path.read_text() if path.exists() else HEADER) + "\n" + _block(entry.name, records))
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from matrix.registry import load_models

    parser = argparse.ArgumentParser(description="Write or check matrix/real_shapes.toml.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--write", action="store_true", help="rewrite the file (defaults records from the installed transformers)"
    )
    mode.add_argument("--check", action="store_true", help="exit 1 when the file is not what --write would write")
    parser.add_argument("--models-file", type=Path, default=MODELS_FILE)
    args = parser.parse_args(argv)
    args.file = real_shapes_file(args.models_file)
    try:
        registry = load_models(args.models_file)
        shapes = load_real_shapes(args.file, registry if args.check else None) if args.file.exists() else {}
        text = render(registry, shapes)
    except (RegistryError, UnreadableConfig) as error:
        print(f"shapes: {error}", file=sys.stderr)
        return 2
    if args.write:
        args.file.write_text(text)
        print(f"wrote {args.file}")
        return 0
    if args.file.exists() and args.file.read_text() == text:
        print(f"{args.file} is up to date")
        return 0
    print(f"{args.file} is stale: run python -m matrix.shapes --write", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())

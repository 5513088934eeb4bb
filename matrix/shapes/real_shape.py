"""The split-relevant sizes of a checkpoint (`RealShape`), how AutoTP splits them (`split_pattern`), and reading
them from a transformers config (`read_shape`); matrix/shapes/__init__.py says what a shape is."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from matrix.config_keys import HEAD_KEYS
from matrix.config_values import ConfigValues, refusal
from matrix.registry import RegistryError, SplitRule
from matrix.shapes.layer_kinds import (
    LAYER_FIELDS,
    NULL,
    NULL_LAYER_FIELDS,
    cited_layers,
    first_appearance,
    layer_kinds,
)
from matrix.shapes.remembered import remembered
from matrix.toml_tables import TableError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GRAIN = 64
"""DeepSpeed's `tensor_parallel.tp_grain_size` (default since 0.16.2): dims split in 64-element grains."""
MATRIX_TP = (2, 3, 4)
"""The tp sizes every faithful tiny config splits like its real checkpoint at (plus the cell's own)."""
# Config attribute names, first present wins (the head count's are matrix/config_keys.py's, which matrix/shrink.py
# reads too: one list, so the real and the tiny config take the same name first).
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
    layers: dict[str, Any] = field(default_factory=dict)
    """The config.json fields that decide the checkpoint's layer kinds (matrix/shapes/layer_kinds.py LAYER_FIELDS), as
    the checkpoint has them; the class defaults stand for the fields left out."""
    layers_note: str = ""
    """Where a hub record's `layers` come from: the config.json values cited, and the fields config.json lacks (their
    class default applies)."""
    layer_pattern: tuple[str, ...] = ()
    """The checkpoint's layer kinds in the order they first appear (layer_kinds.layer_kinds of a config with
    `layers`): what a faithful tiny config keeps, one layer each. `--write` fills it in."""
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
            value, least = getattr(self, size.name), 1 if size.name in REQUIRED_SIZES else 0
            if isinstance(value, int) and not isinstance(value, bool) and value < least:
                raise TableError(size.name, f"must be an integer >= {least}, got {value!r}")
        if self.heads % self.kv_heads:
            raise TableError("kv_heads", f"must divide heads {self.heads}, got {self.kv_heads}")
        if self.top_k > self.experts:
            raise TableError("top_k", f"must be at most experts ({self.experts}), got {self.top_k}")
        if unknown := sorted(set(self.layers) - set(LAYER_FIELDS) - set(NULL_LAYER_FIELDS)):
            raise TableError(
                "layers", f"names {unknown}, which decide no layer kind; cite only fields of {LAYER_FIELDS}"
            )
        if sized := sorted(key for key in NULL_LAYER_FIELDS if self.layers.get(key, NULL) != NULL):
            raise TableError("layers", f"cites {sized} as a size; cite it only where config.json has null, as {NULL!r}")

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
    pattern["layer kinds"] = shape.layer_pattern
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


REQUIRED_SIZES = {size.name for size in fields(RealShape) if size.default is MISSING}
"""What every record names; the sizes left out (of MoE) are 0."""


# ------------------------------------------------------------------------------ reading a config


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def first_int(values: dict[str, Any], keys: tuple[str, ...]) -> int | None:
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
    hidden = first_int(values, HIDDEN_KEYS)
    heads = first_int(values, HEAD_KEYS) or (1 if hidden and any(key in values for key in MIXER_KEYS) else None)
    if not heads or not hidden:
        lacking = (
            f"no attention head count under the names {HEAD_KEYS} (nor an attention-free mixer's {MIXER_KEYS})"
            if hidden
            else f"no hidden size under the names {HIDDEN_KEYS}"
        )
        raise RegistryError(f"{source} (read by matrix/shapes/real_shape.py:read_shape): the config has {lacking}")
    multi_query = values.get("multi_query") is True and not values.get("new_decoder_architecture")
    kv_heads = 1 if multi_query else (first_int(values, KV_KEYS) or heads)
    if MLA_KEY in values:  # multi-head latent attention: the output projection reads heads x the value head dim
        head_dim = first_int(values, LATENT_VALUE_HEAD_DIM_KEYS) or values.integer(LATENT_VALUE_HEAD_DIM_KEYS[0])
    else:
        head_dim = first_int(values, HEAD_DIM_KEYS) or hidden // heads
    ratio = first_int(values, FFN_RATIO_KEYS)
    intermediate = first_int(values, FFN_KEYS) or (ratio or 4) * hidden
    experts = first_int(values, EXPERT_KEYS) or 0
    expert_intermediate = first_int(values, EXPERT_FFN_KEYS) or 0
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
        top_k=(first_int(values, TOP_K_KEYS) or 0) if experts > 1 else 0,
        expert_intermediate=expert_intermediate if experts > 1 else 0,
        shared_experts=(first_int(values, SHARED_COUNT_KEYS) or 0) if experts > 1 else 0,
        shared_expert_intermediate=(first_int(values, SHARED_FFN_KEYS) or 0) if experts > 1 else 0,
        layers=cited_layers(getattr(config, "model_type", ""), config),
        layer_pattern=first_appearance(layer_kinds(config)),
    )


def tiny_shape(model_type: str, tiny: dict[str, Any]) -> RealShape:
    """The sizes of the config a tiny checkpoint is built from (read like a real one)."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig

    return read_shape(AutoConfig.for_model(model_type, **tiny), "tiny")


TINY_SHAPES_FORMAT = 5
"""Bump when what a tiny shape record holds changes (2: its layer pattern; 3: a refusal's every line; 4: a model
transformers cannot build from the config is refused too; 5: dense-first MoE layers and a window deciding rope read)."""

UNBUILDABLE = "transformers cannot build the model from it"
"""How a refusal by the model class (not the config class) begins."""


def _build_on_meta(model_type: str, tiny: dict[str, Any]) -> None:
    """Build the causal-LM model of `tiny` on the meta device (no weights: cheap at any size), as a cell's setup
    would: a model class that refuses the config (zamba's tie across hybrid layers with one hybrid layer, gemma3n's
    kv-shared layer without an earlier layer of its kind) raises here, when the config is derived, not in a cell."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **tiny))  # type: ignore[no-untyped-call]


def checked_tiny_shape(model_type: str, tiny: dict[str, Any]) -> RealShape | str:
    """tiny_shape, or why the config class refuses `tiny` or the model class refuses to build from it
    (config_values.refusal), remembered in the harness cache (matrix/shapes/remembered.py)."""

    def answer() -> dict[str, Any]:
        try:
            shape = tiny_shape(model_type, tiny)
        except Exception as error:  # the config class's own validation refuses the sizes
            return {"refused": refusal(error)}
        try:
            _build_on_meta(model_type, tiny)
        except Exception as error:  # the model class refuses the config: a named skip, never a cell's `setup`
            return {"refused": f"{UNBUILDABLE}: {refusal(error)}"}
        return {"shape": asdict(shape)}

    known = remembered("tiny-shapes", {"format": TINY_SHAPES_FORMAT, "model_type": model_type, "tiny": tiny}, answer)
    if "refused" in known:
        return str(known["refused"])
    return RealShape(**{**known["shape"], "layer_pattern": tuple(known["shape"]["layer_pattern"])})


def defaults_source() -> str:
    # lazily: nox's own process imports this module, with only nox installed (README)
    import transformers

    return f"config-defaults transformers {transformers.__version__}"

"""Tiny configs derived automatically, for every causal-LM architecture transformers ships.

`derive_tiny(config)` turns any config (class defaults or a real checkpoint's config) into the
overrides of a tiny random checkpoint: sizes shrink, the structure that matters for sharding stays
(heads : kv heads ratio, decoupled head_dim, fused-qkv flags, MoE experts and top-k, tied
embeddings, bias flags, rope/alibi kind, sliding windows, per-layer kinds), and every derived value
is kept consistent (token ids < vocab, rotary dims <= head_dim, per-layer lists sized to the layer
count). The rules work on attribute *names*, so a new architecture with the usual names needs no
code; `matrix/derived.toml` holds the few per-architecture fixes and the named skips.

`derived_entries(registry)` gives a ModelEntry for every architecture in the installed transformers'
causal-LM mapping that the registry does not cover; one that cannot be built tiny carries a
`skip_reason`, so it is reported as a skip instead of silently missing. A skip may hold at some
transformers releases only (`[[skip_at.<model_type>]]`: a transformers bug fixed later, a class that
lost generate()); it is then asked of the installed release.

`python -m matrix.derive` lists what is derived and what is skipped; `python -m sessions.build_check`
runs the cell setup (tiny checkpoint + unsharded reference) of every derived architecture on CPU and
lists the failures: the way to keep the skip list honest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from matrix.config_values import UNREADABLE_CONFIG, ConfigValues, ExpansionError, UnreadableConfig
from matrix.registry import MATRIX_DIR, SKIPPABLE_PROBES, ModelEntry, RegistryError, read_toml
from matrix.toml_tables import TableError, read_table, written_as

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DERIVED_FILE = MATRIX_DIR / "derived.toml"

# The tiny shape. Why: 8 heads split evenly on tp 2/4 and unevenly on tp 3 (3/3/2); 2 kv heads are
# fewer than tp 3/4 ranks; head_dim 16 keeps weights small; 384 = 6 grains of 64 splits evenly on tp
# 2/3 and unevenly on tp 4, 256 = 4 grains keeps every expert shard non-empty up to tp 4.
HEADS = 8
KV_HEADS = 2
HEAD_DIM = 16
DENSE_FFN = 384
EXPERT_FFN = 256
EXPERTS = 4
VOCAB = 512
POSITIONS = 512
WINDOW = 16  # shorter than the 24-token probe prompt, so the sliding-window path really runs
MAX_LAYERS = 4
MAX_GQA_RATIO = 4
MAX_PARAMS = 2_000_000  # 8 MB of fp32 weights: "a tiny checkpoint" is checked, not hoped for

# Attribute-name groups (first present wins for reading; every present one is written).
LAYER_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "n_layers",
    "decoder_layers",
    "encoder_layers",
    "num_decoder_layers",
    "num_encoder_layers",
)
HEAD_KEYS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "attention_heads",
    "decoder_attention_heads",
    "encoder_attention_heads",
    "swa_num_attention_heads",
    "num_decoder_attention_heads",
    "num_encoder_attention_heads",
)
KV_KEYS = (
    "num_key_value_heads",
    "swa_num_key_value_heads",
    "num_kv_heads",
    "kv_n_heads",
    "n_kv_heads",
    "num_query_groups",
    "multi_query_group_num",
)
HIDDEN_KEYS = (
    "hidden_size",
    "n_embd",
    "d_model",
    "embed_dim",
    "emb_dim",
    "hidden_dim",
    "model_dim",
    "word_embed_proj_dim",
    "embedding_size",
    "adapter_in_dim",
    "input_embedding_size",
    "output_embedding_size",
    "lru_width",
    "attention_hidden_size",
    "router_hidden_size",
)
HEAD_DIM_KEYS = (
    "head_dim",
    "attention_head_dim",
    "d_head",
    "kv_channels",
    "dim_head",
    "attention_head_size",
    "swa_head_dim",
    "mamba_d_head",
    "mamba_head_dim",
    "mamba_headdim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_head_dim",
    "index_head_dim",
    "v_head_dim",
    "qk_nope_head_dim",
)
DENSE_FFN_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "ffn_hidden_size",
    "decoder_ffn_dim",
    "encoder_ffn_dim",
    "dim_ff",
    "dff",
    "d_ff",
    "feed_forward_size",
    "intermediate_size_mlp",
    "dense_intermediate_size",
    "shared_intermediate_size",
    "d_inner",
)
EXPERT_FFN_KEYS = (
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "shared_experts_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "expert_ffn_hidden_size",
    "expert_intermediate_size",
)
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "moe_topk", "num_experts_per_token", "moe_k")
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "context_length",
    "original_max_position_embeddings",
    "model_max_length",
)
WINDOW_KEYS = (
    "sliding_window",
    "window_size",
    "sliding_window_size",
    "attention_window_size",
    "local_attention_window_len",
    "attention_chunk_size",
    "local_attention",
    "block_size",
    "chunk_size",
    "mamba_chunk_size",
    "local_attn_chunk_length",
)
# Fixed small values for low-rank / state sizes (MLA, linear attention, SSM).
SMALL_KEYS = {
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "o_lora_rank": 32,
    "rotary_dim": 8,
    "adapter_rank": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_num_heads": 4,
    "index_n_heads": 4,
    "index_topk": 16,
    "mamba_d_state": 16,
    "state_size": 16,
    "ssm_state_size": 16,
    "mamba_dt_rank": 8,
    "time_step_rank": 8,
    "laurel_rank": 16,
    "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": VOCAB,
    "num_nextn_predict_layers": 0,
    "mtp_num_layers": 0,
    "pronunciation_embed_dim": 32,
    "shape_embed_dim": 32,
    "hc_lowrank": 16,
}
# Boundaries counted in layers ("the first k layers are dense"): 1 keeps one layer of each kind.
LAYER_BOUNDARY_KEYS = (
    "first_k_dense_replace",
    "max_window_layers",
    "moe_layer_end_index",
    "num_dense_layers",
    "loop_layer_index_end",
    "moe_layer_start_index",
    "num_kv_shared_layers",
)
LAYER_PERIOD_KEYS = (
    "decoder_sparse_step",
    "moe_layer_freq",
    "attn_layer_period",
    "expert_layer_period",
    "sliding_window_pattern",
    "full_attention_interval",
)
LAYER_OFFSET_KEYS = ("attn_layer_offset", "expert_layer_offset")
TOKEN_ID_PREFERRED = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# Real-config fields that describe the checkpoint, not the architecture: never copied into a tiny entry.
NOT_STRUCTURE = {
    "architectures",
    "transformers_version",
    "model_type",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "auto_map",
    "quantization_config",
    "task_specific_params",
    "id2label",
    "label2id",
    "_commit_hash",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "use_cache",
    "tokenizer_class",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "_experts_implementation",
    "initializer_range",
    "name_or_path",
    "rope_scaling",
}


class NotDerivable(Exception):
    """This architecture cannot be built tiny; the message is the skip reason."""


@dataclass(frozen=True)
class Derivation:
    tiny: dict[str, Any]
    """Overrides for `AutoConfig.for_model(model_type, **tiny)`."""
    why: str
    """The structure kept and the sizes chosen, for people reading the registry."""


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _first(values: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for key in keys:
        if _int(values.get(key)):
            return key, values[key]
    return None, None


def _per_layer_dict(value: Any, layers: int) -> dict[int, Any] | None:
    """{layer index: settings} for a dict keyed by layer indices ("02": {...}), else None."""
    if isinstance(value, dict) and value and all(str(k).isdigit() and int(k) < layers for k in value):
        return {int(k): v for k, v in value.items()}
    return None


def _layer_plan(values: Mapping[str, Any], layers: int) -> list[int]:
    """Which original layers the tiny model keeps: the first layer of each distinct per-layer kind
    (e.g. one sliding and one full attention layer), at least 2 and at most MAX_LAYERS."""
    structure = {k: v for k, v in values.items() if k not in NOT_STRUCTURE}
    per_layer = [
        v
        for k, v in structure.items()
        if isinstance(v, list) and len(v) == layers and layers > 1 and not _is_index_list(k, v, layers)
    ]
    per_layer += [[d.get(i) for i in range(layers)] for v in structure.values() if (d := _per_layer_dict(v, layers))]
    per_layer += [[i in v for i in range(layers)] for k, v in structure.items() if _is_index_list(k, v, layers)]
    kinds: dict[str, int] = {}
    for index in range(layers):
        kinds.setdefault(repr([v[index] for v in per_layer]), index)
    chosen = sorted(kinds.values())[:MAX_LAYERS]
    patterns = [len(v) for k, v in structure.items() if _is_pattern(k, v, layers) and len(v) <= MAX_LAYERS]
    for index in range(max(patterns, default=0)):  # one full cycle of a short pattern
        if index not in chosen:
            chosen.append(index)
    for index in range(layers):  # top up to 2 layers so cross-layer paths (KV cache per layer) run
        if len(chosen) >= min(2, layers):
            break
        if index not in chosen:
            chosen.append(index)
    return sorted(chosen)


def _is_index_list(key: str, value: Any, layers: int) -> bool:
    """A list of layer indices (`mlp_only_layers = [0, 3]`): named so, strictly increasing, each < layers."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(_int(v) and 0 <= v < layers for v in value)
        and key.endswith(("layers", "idxs", "layer_ids", "layer_indices"))
        and value == sorted(set(value))
    )


def _is_pattern(key: str, value: Any, layers: int) -> bool:
    """A short cyclic per-layer pattern (`block_types = ["recurrent", "recurrent", "attention"]`)."""
    return (
        isinstance(value, list)
        and 1 < len(value) < layers
        and all(isinstance(v, str) for v in value)
        and key.endswith("types")
    )


def _gqa(heads: int | None, kv: int | None, values: Mapping[str, Any]) -> tuple[int, int, str]:
    if values.get("multi_query") is True or kv == 1:
        return HEADS, 1, "multi-query (1 kv head)"
    if not heads or kv is None or kv >= heads:
        return HEADS, HEADS, "MHA (kv heads = heads)"
    ratio = max(1, min(MAX_GQA_RATIO, heads // kv))
    capped = "" if heads // kv <= MAX_GQA_RATIO else f", capped from {heads // kv}"
    return KV_HEADS * ratio, KV_HEADS, f"GQA {KV_HEADS * ratio}:{KV_HEADS} (ratio {ratio}{capped})"


def _shrink(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Shrunk sizes for one (sub-)config's `to_dict()`; structure keys keep their values."""
    tiny: dict[str, Any] = {}
    why: list[str] = []

    def put(keys: Iterable[str], new: int, only_if: Callable[[int], bool] = lambda old: True) -> None:
        for key in keys:
            old = values.get(key)
            if _int(old) and only_if(old):
                tiny[key] = new

    _, layers = _first(values, LAYER_KEYS)
    plan = _layer_plan(values, layers) if layers else []
    if layers:
        put(LAYER_KEYS, len(plan), lambda old: old > len(plan))
        why.append(f"{len(plan)} layers (one per per-layer kind)" if len(plan) > 2 else f"{len(plan)} layers")
        for key, value in values.items():
            if key in NOT_STRUCTURE:
                continue
            if _is_index_list(key, value, layers):
                tiny[key] = [new for new, old in enumerate(plan) if old in value] or [0]
            elif isinstance(value, list) and len(value) == layers and layers > 1:
                tiny[key] = [value[i] for i in plan]
            elif (by_layer := _per_layer_dict(value, layers)) is not None:
                # per-layer settings keyed by layer index: keep the planned layers, renumbered, each shrunk
                # in the context of the whole config (so MLA/head relations see the shared values)
                width = len(next(iter(value)))
                shared = {k: v for k, v in values.items() if k not in LAYER_KEYS}
                tiny[key] = {
                    str(new).zfill(width): {
                        **inner,
                        **{k: v for k, v in _shrink({**shared, **inner})[0].items() if k in inner},
                    }
                    for new, old in enumerate(plan)
                    if isinstance(inner := by_layer.get(old), dict)
                }
        put(LAYER_BOUNDARY_KEYS, 1, lambda old: 0 < old < layers)
        put(LAYER_PERIOD_KEYS, len(plan), lambda old: old > len(plan))
        for key in LAYER_OFFSET_KEYS:
            if _int(values.get(key)):
                period = tiny.get(key.replace("offset", "period"), values.get(key.replace("offset", "period")))
                tiny[key] = values[key] % period if _int(period) and period else 0

    _, heads = _first(values, HEAD_KEYS)
    _, kv = _first(values, KV_KEYS)
    tiny_heads, tiny_kv, attention = _gqa(heads, kv, values)
    if heads:
        put(HEAD_KEYS, tiny_heads)
        put(KV_KEYS, tiny_kv)
        if (
            "num_key_value_heads" in values and values["num_key_value_heads"] is None
        ):  # None means MHA; some classes divide by it
            tiny["num_key_value_heads"] = tiny_heads
        # a per-layer heads list (num_attention_heads_per_layer), already cut to the plan, follows the heads
        for key, value in tiny.items():
            if key.endswith("heads_per_layer") and isinstance(value, list):
                tiny[key] = [tiny_heads] * len(value)
        why.append(attention)
    _, hidden = _first(values, HIDDEN_KEYS)
    _, head_dim = _first(values, ("head_dim",))
    decoupled = bool(heads and hidden and head_dim and head_dim * heads != hidden)
    tiny_hidden = tiny_heads * HEAD_DIM
    put(HIDDEN_KEYS, tiny_hidden, lambda old: old > 64 or old == hidden)
    put(HEAD_DIM_KEYS, HEAD_DIM, lambda old: old > HEAD_DIM)
    if decoupled:
        tiny["head_dim"] = HEAD_DIM * 2
    if heads and "head_dim" in values and values["head_dim"] is None:  # some classes read it without a fallback
        tiny["head_dim"] = HEAD_DIM
    if _int(values.get("qk_rope_head_dim")):  # MLA: keep how head_dim relates to the rope/nope split
        rope, nope = values["qk_rope_head_dim"], values.get("qk_nope_head_dim") or 0
        tiny["qk_rope_head_dim"] = HEAD_DIM
        for key in ("head_dim", "qk_head_dim", "swa_head_dim"):
            if values.get(key) == rope:
                tiny[key] = HEAD_DIM
            elif values.get(key) == rope + nope:
                tiny[key] = HEAD_DIM + (HEAD_DIM if nope else 0)
    why.append(
        f"hidden {tiny_hidden}, head_dim {tiny.get('head_dim', HEAD_DIM)}"
        + (" (decoupled from hidden/heads, as in the source)" if decoupled else "")
    )
    if "mamba_n_heads" in values or "mamba_num_heads" in values or "mamba_d_ssm" in values:
        inner = int(values.get("mamba_expand", values.get("expand", 2)) or 2) * tiny_hidden
        put(("mamba_d_ssm",), inner)
        put(("mamba_n_heads", "mamba_num_heads"), inner // HEAD_DIM)

    _, experts = _first(values, EXPERT_KEYS)
    # In MoE configs the "dense" width often is the expert width too: keep it expert-sized.
    put(DENSE_FFN_KEYS, EXPERT_FFN if experts and experts > 1 else DENSE_FFN, lambda old: old > DENSE_FFN)
    for key in DENSE_FFN_KEYS:
        if isinstance(tiny.get(key, values.get(key)), list):  # per-layer widths
            tiny[key] = [min(DENSE_FFN, w) if _int(w) else w for w in tiny.get(key, values[key])]
    put(EXPERT_FFN_KEYS, EXPERT_FFN, lambda old: old > EXPERT_FFN)
    if experts and experts > 1:
        put(EXPERT_KEYS, min(experts, EXPERTS))
        _, top_k = _first(values, TOP_K_KEYS)
        tiny_top_k = 1 if top_k == 1 else 2
        put(TOP_K_KEYS, tiny_top_k)
        for key in TOP_K_KEYS[:1]:  # left unset by some class defaults although the router needs it
            if key in values and values[key] is None:
                tiny[key] = tiny_top_k
        # grouped routing (experts split into groups, top groups first): 2 groups of 2, best group wins
        put(("n_group", "num_expert_group"), 2, lambda old: old > 2)
        put(("topk_group",), 1, lambda old: old > 1)
        if _int(values.get("zero_expert_num")) and values["zero_expert_num"] > 0:
            tiny["zero_expert_num"] = 1
        why.append(f"MoE {min(experts, EXPERTS)} experts top-{tiny_top_k} (source {experts} top-{top_k})")
    put([k for k in values if "vocab_size" in k], VOCAB, lambda old: old > VOCAB)
    put(POSITION_KEYS, POSITIONS, lambda old: old > POSITIONS)
    put(WINDOW_KEYS, WINDOW, lambda old: old > WINDOW)
    if any(values.get(k) for k in WINDOW_KEYS[:1]):
        why.append(f"sliding window {WINDOW}")
    for key, small in SMALL_KEYS.items():
        if _int(values.get(key)) and values[key] > small:
            tiny[key] = small
    rotary = tiny.get("rotary_dim")
    if rotary and rotary > tiny.get("head_dim", HEAD_DIM):
        tiny["rotary_dim"] = tiny.get("head_dim", HEAD_DIM) // 2
    return tiny, why


def _token_ids(values: Mapping[str, Any], tiny: dict[str, Any]) -> None:
    """Token ids the tiny vocab cannot hold move to small free ids; equal ids stay equal."""
    vocab = tiny.get("vocab_size", values.get("vocab_size"))
    if not _int(vocab):
        return
    keys = [k for k in values if k.endswith(("_token_id", "_token_index", "_token_ids"))]
    used = {
        v for k in keys for v in (values[k] if isinstance(values[k], list) else [values[k]]) if _int(v) and v < vocab
    }
    moved: dict[int, int] = {}

    def move(key: str, old: int) -> int:
        if old < vocab:
            return old
        if old not in moved:
            preferred = TOKEN_ID_PREFERRED.get(key)
            candidates = ([preferred] if preferred is not None else []) + list(range(vocab - 1, 0, -1))
            moved[old] = next(c for c in candidates if c not in used)
            used.add(moved[old])
        return moved[old]

    for key in sorted(keys, key=lambda k: k not in TOKEN_ID_PREFERRED):
        value = values[key]
        if _int(value) and value >= vocab:
            tiny[key] = move(key, value)
        elif isinstance(value, list) and any(_int(v) and v >= vocab for v in value):
            tiny[key] = [move(key, v) if _int(v) else v for v in value]


def _structure(values: Mapping[str, Any], defaults: Mapping[str, Any], sub_configs: Collection[str]) -> dict[str, Any]:
    """What a real config sets differently from its class defaults (flags, rope kind, bias, ...)."""
    return {
        k: v
        for k, v in values.items()
        if k not in NOT_STRUCTURE and k not in sub_configs and k in defaults and v != defaults[k]
    }


# Sizes a config class may compute from the primary ones (attention width, mamba head size, ...).
SECONDARY_KEYS = (*HEAD_DIM_KEYS, "attention_hidden_size", "mamba_d_ssm", "mamba_n_heads", "mamba_num_heads")


def _let_class_compute(config: PretrainedConfig, tiny: dict[str, Any]) -> dict[str, Any]:
    """Drop secondary sizes the config class computes itself from the tiny primary ones (e.g.
    attention_head_dim = 2 * hidden / heads), so a relation the class encodes is never broken."""
    primary = {k: v for k, v in tiny.items() if k not in SECONDARY_KEYS}
    try:
        probe = type(config)(**primary).to_dict()
    except Exception:  # the class validates secondary sizes too: keep ours
        return tiny
    source = config.to_dict()
    return {k: v for k, v in tiny.items() if k in primary or probe.get(k) == source.get(k)}


def _derive(config: PretrainedConfig, real: bool) -> tuple[dict[str, Any], list[str]]:
    values = ConfigValues(config.to_dict(), type(config).__name__)
    base = _structure(values, type(config)().to_dict(), getattr(config, "sub_configs", {}) or {}) if real else {}
    tiny, why = _shrink(values)
    tiny = _let_class_compute(config, {**base, **tiny})
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            sub_tiny, sub_why = _derive(sub, real)
            if sub_tiny:
                tiny[name] = sub_tiny
                why.append(f"{name}: {', '.join(sub_why)}")
    _token_ids({**values, **{k: v for k, v in tiny.items() if not isinstance(v, dict)}}, tiny)
    return tiny, why


def derive_tiny(config: PretrainedConfig, real: bool = False) -> Derivation:
    """The tiny overrides for `config`. `real=True` (a checkpoint's config): the fields it sets
    differently from the class defaults are kept too, so the tiny model has the checkpoint's layout."""
    tiny, why = _derive(config, real)
    structure = [
        k
        for k in (
            "tie_word_embeddings",
            "multi_query",
            "new_decoder_architecture",
            "alibi",
            "parallel_attn",
            "attention_bias",
            "mlp_bias",
            "bias",
            "use_qkv_bias",
            "position_embedding_type",
        )
        if k in config.to_dict() and not isinstance(config.to_dict()[k], dict)
    ]
    kept = ", ".join(f"{k}={config.to_dict()[k]}" for k in structure)
    return Derivation(tiny, "derived: " + "; ".join(why) + (f"; kept {kept}" if kept else ""))


# ---------------------------------------------------------------- the derived part of the matrix


@dataclass(frozen=True)
class VersionSkip:
    """A skip that holds only at the transformers releases `transformers` (a PEP 440 specifier) names."""

    transformers: str = field(metadata=written_as("a quoted version range: transformers = '>=4.46, <4.54'"))
    reason: str

    def applies(self, transformers_version: str) -> bool:
        return SpecifierSet(self.transformers).contains(Version(transformers_version), prereleases=True)

    def validate(self) -> None:
        """derived.toml's rules beyond the fields' types (toml_tables.read_table)."""
        if not self.reason.strip():
            raise TableError("reason", f"needs a non-empty string, got {self.reason!r}")
        try:
            releases = SpecifierSet(self.transformers)
        except InvalidSpecifier:
            releases = SpecifierSet()
        if not releases:  # not a specifier, or empty (it would hold at every release)
            raise TableError(
                "transformers",
                f"must be a version range such as '>=4.46, <4.54' (use [skip] for every release), got {self.transformers!r}",
            )


@dataclass(frozen=True)
class DerivedData:
    """matrix/derived.toml: per-architecture fixes the rules cannot know, and named skips."""

    fixes: dict[str, dict[str, Any]]
    skips: dict[str, str]
    version_skips: dict[str, tuple[VersionSkip, ...]] = field(default_factory=dict)
    """[[skip_at.<model_type>]]: skips that hold at some transformers releases only."""
    probe_skips: dict[str, dict[str, str]] = field(default_factory=dict)
    """[probe_skip.<model_type>]: probes the architecture cannot run (ModelEntry.probe_skips), each with its reason."""

    def skip_reason(self, model_type: str, transformers_version: str) -> str | None:
        """Why `model_type` is not derived at `transformers_version`, or None."""
        if model_type in self.skips:
            return self.skips[model_type]
        for skip in self.version_skips.get(model_type, ()):
            if skip.applies(transformers_version):
                return f"{skip.reason} (transformers {transformers_version}; skipped at {skip.transformers})"
        return None


def _parse_version_skips(path: Path, raw: object, skips: dict[str, str]) -> dict[str, tuple[VersionSkip, ...]]:
    """[[skip_at.<model_type>]] tables (one per range of releases; a single [skip_at.<model_type>] table works too)."""
    if not isinstance(raw, dict):
        raise RegistryError(f"{path}: skip_at must be tables [[skip_at.<model_type>]], got {raw!r}")
    parsed = {}
    for model_type, tables in raw.items():
        where = f"{path}: [[skip_at.{model_type}]]"
        if model_type in skips:
            raise RegistryError(f"{where}: {model_type!r} is already skipped at every release by [skip]")
        tables = [tables] if isinstance(tables, dict) else tables
        if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
            raise RegistryError(f"{where} must be tables with 'transformers' and 'reason', got {raw[model_type]!r}")
        parsed[model_type] = tuple(read_table(VersionSkip, table, where=where, error=RegistryError) for table in tables)
    return parsed


def load_derived_data(path: Path = DERIVED_FILE) -> DerivedData:
    raw = read_toml(path)
    unknown = set(raw) - {"fix", "skip", "skip_at", "probe_skip"}
    if unknown:
        raise RegistryError(
            f"{path}: unknown table(s) {sorted(unknown)}; use [fix.<model_type>], [skip], [[skip_at.<model_type>]] "
            "and [probe_skip.<model_type>]"
        )
    skips = raw.get("skip", {})
    for model_type, reason in skips.items():
        if not isinstance(reason, str) or not reason.strip():
            raise RegistryError(f"{path}: [skip] {model_type!r} needs a non-empty reason string")
    probe_skips = raw.get("probe_skip", {})
    for model_type, probes in probe_skips.items():
        if not isinstance(probes, dict) or not probes or set(probes) - set(SKIPPABLE_PROBES):
            raise RegistryError(
                f"{path}: [probe_skip.{model_type}] must give reasons to probes of {list(SKIPPABLE_PROBES)}, got {probes!r}"
            )
    return DerivedData(
        fixes=raw.get("fix", {}),
        skips=skips,
        version_skips=_parse_version_skips(path, raw.get("skip_at", {}), skips),
        probe_skips=probe_skips,
    )


def causal_lm_model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def entry_name(model_type: str) -> str:
    return model_type.replace("-", "_").lower()


def _merge(base: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    """`fix` over `base`, recursing into sub-config tables so a fix names only what it changes."""
    merged = dict(base)
    for key, value in fix.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def derive_for_model_type(model_type: str, data: DerivedData, transformers_version: str | None = None) -> Derivation:
    """Class defaults of `model_type` -> tiny overrides (plus its fix from derived.toml); its skips from
    derived.toml are asked at `transformers_version` (default: the installed release)."""
    import transformers
    from transformers import AutoConfig

    reason = data.skip_reason(model_type, transformers_version or transformers.__version__)
    if reason:
        raise NotDerivable(reason)

    try:
        config = AutoConfig.for_model(model_type)
    except Exception as error:
        raise NotDerivable(
            f"the config class cannot be built from its defaults: {type(error).__name__}: "
            f"{str(error).splitlines()[0][:200]}"
        ) from None
    derivation = derive_tiny(config)
    fix = data.fixes.get(model_type, {})
    if fix:
        return Derivation(_merge(derivation.tiny, fix), f"{derivation.why}; fixed in derived.toml: {', '.join(fix)}")
    return derivation


def derived_entries(registry: dict[str, ModelEntry], data: DerivedData | None = None) -> dict[str, ModelEntry]:
    """An entry per causal-LM architecture the registry does not cover; unbuildable ones carry a skip_reason.
    Names are the model_type ('-' -> '_'), suffixed `_derived` where a registry entry has that name."""
    from transformers.utils import logging as hf_logging

    data = data or load_derived_data()
    covered = {entry.model_type for entry in registry.values()}
    # Shrinking a config builds intermediate ones whose ids are not fixed yet (bos/eos >= the new vocab):
    # transformers warns about each, a hundred lines of noise before the first cell.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    try:
        entries = [
            derived_entry(model_type, registry, data)
            for model_type in causal_lm_model_types()
            if model_type not in covered
        ]
    finally:
        hf_logging.set_verbosity(verbosity)
    return {entry.name: entry for entry in entries}


def derived_entry(model_type: str, registry: dict[str, ModelEntry], data: DerivedData) -> ModelEntry:
    """The entry of one architecture (named apart from the registry's). The derivation step's guard: an architecture
    that cannot be built tiny, or whose config a reader cannot read, is a named skip; a harness exception for it
    (a bug) fails its cells as `setup` (ExpansionError); the other architectures are derived either way."""
    name = entry_name(model_type)
    name = f"{name}_derived" if name in registry else name
    try:
        derivation = derive_for_model_type(model_type, data)
    except NotDerivable as reason:
        return ModelEntry(name=name, model_type=model_type, tiny={}, skip_reason=f"{model_type}: {reason}")
    except UnreadableConfig as error:
        return ModelEntry(name, model_type, tiny={}, skip_reason=f"{model_type}: {UNREADABLE_CONFIG}: {error}")
    except Exception as error:  # a harness bug, reported on this architecture's cells as `setup`
        return ModelEntry(name, model_type, tiny={}, expansion_error=ExpansionError.of("derive", error))
    return ModelEntry(
        name=name,
        model_type=model_type,
        tiny=derivation.tiny,
        tiny_why=derivation.why,
        probe_skips=data.probe_skips.get(model_type, {}),
    )


def main(argv: list[str] | None = None) -> int:
    import argparse
    import warnings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--registry",
        action="store_true",
        help="also derive the registry's architectures from their class defaults (a wider test of the rules)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    entries = listed_entries(args.registry)
    skipped = {n: e.skip_reason for n, e in entries.items() if e.skip_reason}
    failed = {n: e.expansion_error.describe() for n, e in entries.items() if e.expansion_error}
    print(
        f"{len(causal_lm_model_types())} causal-LM architectures; {len(entries)} {'in all' if args.registry else 'not in the registry'}: "
        f"{len(entries) - len(skipped) - len(failed)} derived, {len(skipped)} skipped, {len(failed)} failed (harness bugs)"
    )
    for name, reason in sorted(skipped.items()):
        print(f"  skip {name}: {reason}")
    for name, reason in sorted(failed.items()):
        print(f"  setup {name}: {reason}")
    return 1 if failed else 0


def listed_entries(whole_registry: bool) -> dict[str, ModelEntry]:
    """The derived entries, quietly: every architecture when `whole_registry`, else those the registry lacks."""
    from transformers.utils import logging as hf_logging

    from matrix.registry import load_models

    hf_logging.set_verbosity(logging.ERROR)
    return derived_entries({} if whole_registry else load_models())


if __name__ == "__main__":
    raise SystemExit(main())

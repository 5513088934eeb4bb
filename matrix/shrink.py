"""`derive_tiny(config)`: any config (class defaults or a real checkpoint's config) turned into the overrides of a tiny
random checkpoint. Sizes shrink, the structure that matters for sharding stays (heads : kv heads ratio, decoupled
head_dim, fused-qkv flags, MoE experts and top-k, tied embeddings, bias flags, rope/alibi kind, sliding windows,
per-layer kinds), and every derived value is kept consistent (token ids < vocab, rotary dims <= head_dim, per-layer
lists sized to the layer count). The attribute names each rule reads: matrix/config_keys.py."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from matrix.config_keys import (
    DENSE_FFN,
    DENSE_FFN_KEYS,
    EXPERT_FFN,
    EXPERT_FFN_KEYS,
    EXPERT_KEYS,
    EXPERTS,
    HEAD_DIM,
    HEAD_DIM_KEYS,
    HEAD_KEYS,
    HEADS,
    HIDDEN_KEYS,
    KV_HEADS,
    KV_KEYS,
    LAYER_BOUNDARY_KEYS,
    LAYER_KEYS,
    LAYER_OFFSET_KEYS,
    LAYER_PERIOD_KEYS,
    MAX_GQA_RATIO,
    MAX_LAYERS,
    NOT_STRUCTURE,
    POSITION_KEYS,
    POSITIONS,
    SMALL_KEYS,
    TOKEN_ID_PREFERRED,
    TOP_K_KEYS,
    VOCAB,
    WINDOW,
    WINDOW_KEYS,
)
from matrix.config_values import ConfigValues

if TYPE_CHECKING:
    from transformers import PretrainedConfig


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


class _Shrinking:
    """The shrunk sizes of one (sub-)config as its rules fill them in, in order (a later rule reads what an earlier
    one chose: the offsets read the shrunk periods, rotary_dim the shrunk head_dim)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values
        self.tiny: dict[str, Any] = {}
        self.why: list[str] = []

    def put(self, keys: Iterable[str], new: int, only_if: Callable[[int], bool] = lambda old: True) -> None:
        """`new` for each of `keys` the config sets to an int that `only_if` accepts."""
        for key in keys:
            old = self.values.get(key)
            if _int(old) and only_if(old):
                self.tiny[key] = new


def _shrink(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Shrunk sizes for one (sub-)config's `to_dict()`; structure keys keep their values."""
    shrinking = _Shrinking(values)
    _shrink_layers(shrinking)
    heads, tiny_heads = _shrink_heads(shrinking)
    _shrink_widths(shrinking, heads, tiny_heads)
    _shrink_experts(shrinking)
    _shrink_the_rest(shrinking)
    return shrinking.tiny, shrinking.why


def _shrink_layers(shrinking: _Shrinking) -> None:
    """One layer per per-layer kind; per-layer lists, index lists and per-layer tables cut to the planned layers."""
    values, tiny, put = shrinking.values, shrinking.tiny, shrinking.put
    _, layers = _first(values, LAYER_KEYS)
    plan = _layer_plan(values, layers) if layers else []
    if not layers:
        return
    put(LAYER_KEYS, len(plan), lambda old: old > len(plan))
    shrinking.why.append(f"{len(plan)} layers (one per per-layer kind)" if len(plan) > 2 else f"{len(plan)} layers")
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


def _shrink_heads(shrinking: _Shrinking) -> tuple[int | None, int]:
    """Query and kv heads in the source's ratio (capped); (the source's heads, the tiny heads)."""
    values, tiny, put = shrinking.values, shrinking.tiny, shrinking.put
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
        shrinking.why.append(attention)
    return heads, tiny_heads


def _shrink_widths(shrinking: _Shrinking, heads: int | None, tiny_heads: int) -> None:
    """Hidden width and head_dim (a head_dim decoupled from hidden/heads stays decoupled, MLA's rope/nope split kept),
    and the mamba mixer's widths that follow them."""
    values, tiny, put = shrinking.values, shrinking.tiny, shrinking.put
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
    shrinking.why.append(
        f"hidden {tiny_hidden}, head_dim {tiny.get('head_dim', HEAD_DIM)}"
        + (" (decoupled from hidden/heads, as in the source)" if decoupled else "")
    )
    if "mamba_n_heads" in values or "mamba_num_heads" in values or "mamba_d_ssm" in values:
        inner = int(values.get("mamba_expand", values.get("expand", 2)) or 2) * tiny_hidden
        put(("mamba_d_ssm",), inner)
        put(("mamba_n_heads", "mamba_num_heads"), inner // HEAD_DIM)


def _shrink_experts(shrinking: _Shrinking) -> None:
    """Feed-forward widths (expert-sized in MoE configs), experts, top-k and grouped routing."""
    values, tiny, put = shrinking.values, shrinking.tiny, shrinking.put
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
        shrinking.why.append(f"MoE {min(experts, EXPERTS)} experts top-{tiny_top_k} (source {experts} top-{top_k})")


def _shrink_the_rest(shrinking: _Shrinking) -> None:
    """Vocabulary, positions, sliding windows, the fixed small low-rank and state sizes, rotary_dim <= head_dim."""
    values, tiny, put = shrinking.values, shrinking.tiny, shrinking.put
    put([k for k in values if "vocab_size" in k], VOCAB, lambda old: old > VOCAB)
    put(POSITION_KEYS, POSITIONS, lambda old: old > POSITIONS)
    put(WINDOW_KEYS, WINDOW, lambda old: old > WINDOW)
    if any(values.get(k) for k in WINDOW_KEYS[:1]):
        shrinking.why.append(f"sliding window {WINDOW}")
    for key, small in SMALL_KEYS.items():
        if _int(values.get(key)) and values[key] > small:
            tiny[key] = small
    rotary = tiny.get("rotary_dim")
    if rotary and rotary > tiny.get("head_dim", HEAD_DIM):
        tiny["rotary_dim"] = tiny.get("head_dim", HEAD_DIM) // 2


def fit_token_ids(values: Mapping[str, Any], tiny: dict[str, Any]) -> None:
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
    fit_token_ids({**values, **{k: v for k, v in tiny.items() if not isinstance(v, dict)}}, tiny)
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

"""The kinds of a model's layers, read from its config, and the layer fields of a faithful tiny config.

A layer's kind is its sequence mixer (what `layer_types`, jamba's `layers_block_type` or gpt_neo's `attention_layers`
name: full, sliding or linear attention, mamba, ...; bamba's `layers_block_type` computed from `attn_layer_indices`, the
attention layers; `attention` where the config names none), whether its MLP is dense
or a mixture of experts (`sparse`; `mlp_layer_types` where the config lists it per layer), `no_rope` where it skips
rotary positions (`no_rope_layers`; EXAONE 4's full layers where its config has a sliding window), and `kv_shared`
where it reuses an earlier layer's keys and values (the last
`num_kv_shared_layers` of gemma3n and gemma4; the class refuses a config whose shared layers have no earlier layer of
their attention kind, so those are kinds of their own). A checkpoint's layer pattern is its kinds in the order they
first appear. DeepSpeed treats each kind apart (a sparse MLP's experts, a mamba mixer), so a faithful tiny config keeps
one layer of every kind its checkpoint has, in that order, and no kind the checkpoint lacks (qwen2_moe.faithful stands
for Qwen1.5-MoE-A2.7B, whose every layer is sparse).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from matrix.config_keys import LAYER_BOUNDARY_KEYS, LAYER_KEYS

if TYPE_CHECKING:
    from transformers import PretrainedConfig

MIXER_KEYS = ("layers_block_type", "layer_types", "attention_layers")
"""Per-layer mixer names, first present wins (jamba's `layers_block_type` says mamba where its `layer_types` says
linear_attention)."""
LAYER_FIELDS = (
    *LAYER_KEYS,
    "layer_types",
    "block_types",
    "layers_block_type",
    "mlp_layer_types",
    "attention_types",
    "mlp_only_layers",
    "attn_layer_indices",
    "decoder_sparse_step",
    "first_k_dense_replace",
    "moe_layers",
    "interleave_moe_layer_step",
    "attn_layer_period",
    "attn_layer_offset",
    "expert_layer_period",
    "expert_layer_offset",
    "sliding_window_pattern",
    "full_attention_interval",
    "no_rope_layers",
    "no_rope_layer_interval",
    "num_kv_shared_layers",
    "num_dense_layers",
    "moe_layer_start_index",
    "moe_layer_end_index",
    "moe_layer_interval",
    "is_moe",
)
"""The config fields that decide layer kinds: what a record's `layers` cites (real_shapes.toml)."""
NULL = "null"
"""How a record's `layers` spells config.json's `null` (TOML has none)."""
NULL_LAYER_FIELDS = ("sliding_window",)
"""Fields whose `null` decides layer kinds (WINDOW_DECIDES_ROPE): a record cites them only as NULL, their value
being a size the tiny config shrinks."""
WINDOW_DECIDES_ROPE = frozenset({"exaone4", "exaone_moe", "kolibri1"})
"""Families whose attention ropes only where the config has no sliding window or the layer is sliding (`if
self.sliding_window is None or self.is_sliding`): EXAONE-4.0-32B's full layers skip rope; the 1.2B has no window and
every layer full, so every layer ropes (a tiny config with a window and full layers has no positions at all)."""
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
FROM_END_KEYS = ("num_kv_shared_layers",)
"""Layer boundaries counted from the last layer back (`num_kv_shared_layers = 15`: the last 15 layers)."""
SHARED_BLOCK_MIXERS = {"zamba": ("hybrid",)}
"""Mixers whose layers share one block (transformers ties zamba's shared transformer across its hybrid layers and
refuses a model with one hybrid layer, the tie having nothing to tie into): a faithful config keeps two layers of
each such kind, as its checkpoint has many."""


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _values(config: PretrainedConfig) -> dict[str, Any]:
    """The config's fields with its sub-tables' (dbrx's ffn_config, a multimodal model's text_config) merged in."""
    raw = config.to_dict()
    for name in ("ffn_config", "text_config"):
        if isinstance(raw.get(name), dict):
            raw = {**raw, **raw[name]}
    return raw


def layer_count(values: Mapping[str, Any]) -> int:
    return next((values[key] for key in LAYER_KEYS if _int(values.get(key))), 0)


def _per_layer(config: PretrainedConfig, values: Mapping[str, Any], key: str, layers: int) -> list[Any] | None:
    value = getattr(config, key, None) if key not in values else values[key]  # jamba's are properties
    return list(value) if isinstance(value, list | tuple) and len(value) == layers else None


MLP_LAYER_TYPES = {"dense": "dense", "sparse": "sparse", "moe": "sparse"}
"""`mlp_layer_types` values as kinds (deepseek_v4 says `moe`); another value names a kind of its own (deepseek_v4's
`hash_moe` layers route by token id through a router without weights)."""


def _mlps(config: PretrainedConfig, values: Mapping[str, Any], layers: int) -> list[str]:
    """`dense` or `sparse` per layer, by the rule each family's modeling code applies (the layer's __init__ choosing
    its MLP class; tests/matrix/test_layer_pattern.py compares every architecture's reading with the model it
    builds)."""
    named = _per_layer(config, values, "mlp_layer_types", layers)  # the per-layer list of newer MoE classes
    if named is not None:
        return [MLP_LAYER_TYPES.get(kind, kind) for kind in named]
    experts = _per_layer(config, values, "layers_num_experts", layers)  # jamba
    if experts is not None:
        return ["sparse" if count > 1 else "dense" for count in experts]
    count = next((values[key] for key in EXPERT_COUNT_KEYS if _int(values.get(key))), 0)
    if count <= 1 or values.get("is_moe") is False:  # doge: experts sized by default, used only with is_moe
        return ["dense"] * layers
    if "mlp_only_layers" in values or "decoder_sparse_step" in values:  # qwen2_moe, qwen3_moe, qwen3_next
        only, step = values.get("mlp_only_layers") or [], values.get("decoder_sparse_step") or 1
        return ["dense" if i in only or (i + 1) % step else "sparse" for i in range(layers)]
    if isinstance(values.get("moe_layers"), list):  # llama4
        return ["sparse" if i in values["moe_layers"] else "dense" for i in range(layers)]
    if _int(values.get("first_k_dense_replace")):  # deepseek_v2/v3, glm4_moe: the first k layers dense
        return ["dense" if i < values["first_k_dense_replace"] else "sparse" for i in range(layers)]
    if _int(values.get("num_dense_layers")):  # lfm2_moe, afmoe: the first n layers dense
        return ["dense" if i < values["num_dense_layers"] else "sparse" for i in range(layers)]
    if _int(values.get("moe_layer_interval")):  # ernie4_5_moe: every interval-th layer from start to end (inclusive)
        start, end, step = (
            values.get("moe_layer_start_index") or 0,
            values.get("moe_layer_end_index"),
            values["moe_layer_interval"],
        )
        end = layers - 1 if end is None or end < 0 else end
        return ["sparse" if (i + 1) % step == 0 and start <= i <= end else "dense" for i in range(layers)]
    return ["sparse"] * layers


def layer_kinds(config: PretrainedConfig) -> tuple[str, ...]:
    """Each layer's kind: `<mixer>/<dense|sparse>`, `/no_rope` added where the layer skips rotary positions."""
    values = _values(config)
    layers = layer_count(values)
    mixers = next(
        (found for key in MIXER_KEYS if (found := _per_layer(config, values, key, layers)) is not None),
        ["attention"] * layers,
    )
    ropes = _per_layer(config, values, "no_rope_layers", layers) or [1] * layers  # 1: the layer uses rope
    if values.get("model_type") in WINDOW_DECIDES_ROPE and values.get("sliding_window") is not None:
        ropes = [rope and mixer == "sliding_attention" for rope, mixer in zip(ropes, mixers, strict=True)]
    shared = values.get("num_kv_shared_layers") or 0
    first_shared = layers - shared if _int(shared) and shared > 0 else layers
    return tuple(
        f"{mixer}/{mlp}" + ("" if rope else "/no_rope") + ("/kv_shared" if index >= first_shared else "")
        for index, (mixer, mlp, rope) in enumerate(zip(mixers, _mlps(config, values, layers), ropes, strict=True))
    )


def first_appearance(kinds: Sequence[str]) -> tuple[str, ...]:
    """The distinct kinds in the order they first appear: a layer pattern."""
    return tuple(dict.fromkeys(kinds))


def cited_layers(model_type: str, config: PretrainedConfig) -> dict[str, Any]:
    """The layer fields of `config` a record cites: those of LAYER_FIELDS it has, less the per-layer lists its class
    computes from the others (gemma3's layer_types from sliding_window_pattern), so a record stays one line."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig

    values = _values(config)
    cited = {key: values[key] for key in LAYER_FIELDS if key in values and values[key] is not None}
    if values.get("model_type") in WINDOW_DECIDES_ROPE:
        cited |= {key: NULL for key in NULL_LAYER_FIELDS if key in values and values[key] is None}
    for key in [key for key, value in cited.items() if isinstance(value, list) and len(value) > 1]:
        rest = {k: v for k, v in cited.items() if k != key}
        try:
            computed = getattr(AutoConfig.for_model(model_type, **config_fields(rest)), key, None)
        except Exception:  # the class cannot compute it without the list: the list stays cited
            continue
        if computed == cited[key]:
            del cited[key]
    return cited


def config_fields(layers: Mapping[str, Any]) -> dict[str, Any]:
    """A record's `layers` as config.json has them: NULL read as None."""
    return {key: None if key in NULL_LAYER_FIELDS and value == NULL else value for key, value in layers.items()}


def real_layer_kinds(model_type: str, layers: Mapping[str, Any]) -> tuple[str, ...]:
    """The kinds of a checkpoint whose config.json has `layers` (the class defaults for every other field)."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig

    return layer_kinds(AutoConfig.for_model(model_type, **config_fields(layers)))


def _plan(kinds: Sequence[str], shared_mixers: Sequence[str] = ()) -> list[int]:
    """The layers a faithful config keeps: the first of each kind (the first two where its mixer is one of
    `shared_mixers`, SHARED_BLOCK_MIXERS), topped up to 2 (a cache spans layers)."""
    plan = [kinds.index(kind) for kind in first_appearance(kinds)]
    for kind in first_appearance(kinds):
        if kind.split("/")[0] in shared_mixers:
            plan += [index for index, other in enumerate(kinds) if other == kind][1:2]
    plan.sort()
    for index in range(len(kinds)):
        if len(plan) >= min(2, len(kinds)):
            break
        if index not in plan:
            plan.append(index)
    return sorted(plan)


def _other_per_layer_lists(tiny: Mapping[str, Any], real_values: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """The per-layer lists outside LAYER_FIELDS that `tiny` sets for each of its layers (gemma3n's
    `activation_sparsity_pattern`, hy_v4's `indexer_types`) and the real config has for each of its `layers`: the
    class refuses a list whose length is not the layer count, so each follows the kept layers like the kinds do.
    Lists of integers are sizes the tiny config shrank, not the checkpoint's to copy: they stay as `tiny` has them."""
    own = layer_count(tiny)
    return {
        key: real_values[key]
        for key, value in tiny.items()
        if key not in LAYER_FIELDS
        and isinstance(value, list)
        and len(value) == own > 1
        and isinstance(real_values.get(key), list)
        and len(real_values[key]) == layers
        and not any(_int(item) for item in real_values[key])
    }


def _cycled_patterns(real_values: Mapping[str, Any], layers: int) -> dict[str, list[str]]:
    """The short per-layer patterns the class repeats over the layers (recurrent_gemma's `block_types = ["recurrent",
    "recurrent", "attention"]`: layer i is block_types[i % 3]); kept as they are, a tiny config's fewer layers repeat
    the cycle's start only (2 layers: no attention layer at all)."""
    return {
        key: value
        for key, value in real_values.items()
        if key.endswith("types")
        and isinstance(value, list)
        and 1 < len(value) < layers
        and all(isinstance(item, str) for item in value)
    }


def tiny_layer_fields(model_type: str, layers: Mapping[str, Any], tiny: Mapping[str, Any]) -> dict[str, Any]:
    """The layer fields a faithful tiny config of a checkpoint whose config.json cites `layers` takes: the first layer
    of each real kind in order (at least 2 layers). The fields are `layers`, the LAYER_FIELDS `tiny` sets and its other
    per-layer lists (_other_per_layer_lists), with the checkpoint's values (its class defaults where `layers` does not
    cite them). Layer counts and per-layer lists
    follow the kept layers, layer index lists and boundaries are renumbered; periods and offsets are the first values
    (the tiny config's own first) whose layers have the kept kinds. Other fields stay as `tiny` has them; where they
    keep the kinds apart, the closest pattern found is taken and `--check` names the difference."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig

    layers = config_fields(layers)
    real = AutoConfig.for_model(model_type, **layers)
    kinds = layer_kinds(real)
    plan = _plan(kinds, SHARED_BLOCK_MIXERS.get(model_type, ()))
    wanted = tuple(kinds[index] for index in plan)
    fields: dict[str, Any] = {}
    searched: dict[str, list[int]] = {}
    real_values = _values(real)
    cycled = _cycled_patterns(real_values, len(kinds))
    derived = {
        # a field the class leaves None (lfm2_moe's layer_types) computes nothing: the tiny config's own value stays
        **{key: real_values[key] for key in tiny if key in LAYER_FIELDS and real_values.get(key) is not None},
        **_other_per_layer_lists(tiny, real_values, len(kinds)),
        **cycled,
        **layers,
    }
    for key, value in derived.items():
        if key in LAYER_KEYS and _int(value):
            fields[key] = len(plan)
        elif key in cycled:  # the kept layers' entries of the cycle, which the tiny config's layers then repeat
            fields[key] = [value[index % len(value)] for index in plan]
        elif key == "attention_types":  # gpt_neo's [[kinds, repeats]]: the kept layers' kinds once
            fields[key] = [[[real.attention_layers[index] for index in plan], 1]]
        elif key.endswith("_indices") and isinstance(value, list):  # bamba's attention layers: renumbered, never
            fields[key] = [new for new, old in enumerate(plan) if old in value]  # a per-layer list of its length
        elif isinstance(value, list) and len(value) == len(kinds) and len(kinds) > 1:
            fields[key] = [value[index] for index in plan]
        elif isinstance(value, list) and key.endswith("layers") and all(_int(v) for v in value):
            fields[key] = [new for new, old in enumerate(plan) if old in value]
        elif key in FROM_END_KEYS and _int(value):
            fields[key] = sum(1 for index in plan if index >= len(kinds) - value)
        elif key in LAYER_BOUNDARY_KEYS and _int(value):
            fields[key] = sum(1 for index in plan if index < value)
        elif _int(value):  # a period or an offset
            least = 0 if "offset" in key else 1  # a period, interval or step of 0 divides by zero
            own = [tiny[key]] if _int(tiny.get(key)) and tiny[key] >= least else []
            searched[key] = list(dict.fromkeys([*own, *range(least, len(plan) + 2)]))
        else:
            fields[key] = value
    best: tuple[int, dict[str, Any]] = (-1, fields)
    for values in itertools.product(*searched.values()):
        trial = {**fields, **dict(zip(searched, values, strict=True))}
        try:
            found = layer_kinds(AutoConfig.for_model(model_type, **{**tiny, **trial}))
        except Exception:  # the class refuses the combination (an offset not below its period): the next one
            continue
        if found == wanted:
            return trial
        score = sum(1 for a, b in zip(found, wanted, strict=False) if a == b)
        best = max(best, (score, trial), key=lambda option: option[0])
    return best[1]

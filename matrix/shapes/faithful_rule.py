"""The one rule that makes a faithful tiny config: the smallest sizes that split like a real checkpoint's at every tp
(`faithful_sizes`), written into a registry entry's tiny overrides (`faithful_tiny`)."""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from matrix.config_keys import HEAD_KEYS
from matrix.config_keys import HIDDEN_KEYS as DERIVED_HIDDEN_KEYS
from matrix.registry import ModelEntry, RegistryError, SplitRule
from matrix.shapes.layer_kinds import tiny_layer_fields
from matrix.shapes.real_shape import (
    EXPERT_FFN_KEYS,
    EXPERT_KEYS,
    FFN_KEYS,
    FFN_RATIO_KEYS,
    GRAIN,
    HEAD_DIM_FOLLOWS_HIDDEN,
    HEAD_DIM_KEYS,
    HIDDEN_KEYS,
    KV_KEYS,
    LATENT_VALUE_HEAD_DIM_KEYS,
    MLA_KEY,
    NESTED,
    SHARED_COUNT_KEYS,
    SHARED_FFN_KEYS,
    TOP_K_KEYS,
    RealShape,
    count_split,
    dim_split,
    first_int,
)
from matrix.shapes.remembered import remembered
from matrix.shrink import fit_token_ids

if TYPE_CHECKING:
    pass

LEAST_VOCAB = 256
"""Tiny checkpoints are read with a byte tokenizer (token ids < 256)."""
DEFAULT_TOP_K = 2
"""Experts per token where the real config does not say."""
HEAD_DIMS = range(16, 257, 4)
"""Head dims a faithful config may take (multiples of 4: rotary halves stay even)."""


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
    old_hidden = first_int(
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
    _fit_vocab(entry.model_type, tiny, sizes.vocab)
    tiny["tie_word_embeddings"] = real.tied_embeddings
    tiny.update(faithful_layer_fields(entry.model_type, real, tiny))
    return tiny


def _fit_vocab(model_type: str, tiny: dict[str, Any], vocab: int) -> None:
    """The faithful vocab where the class keeps a second vocab size equal to `vocab_size` (marian's
    decoder_vocab_size: its causal LM's decoder embeds, ties and scores over it, its loss reads vocab_size), and every
    token id inside it (a pad id the derived config moved below 512 is past a smaller faithful vocab)."""
    defaults = remembered("tiny-shapes", {"class_defaults": model_type}, lambda: _class_defaults(model_type))
    tables = [(defaults, tiny)] + [
        (defaults.get(name) or {}, tiny[name]) for name in NESTED if isinstance(tiny.get(name), dict)
    ]
    equal_to_vocab = [
        key
        for own, _ in tables
        for key, value in own.items()
        if key != "vocab_size"
        and key.endswith("vocab_size")
        and isinstance(value, int)
        and value == own.get("vocab_size")
    ]
    _set(tiny, tuple(equal_to_vocab), vocab)
    for own, table in tables:
        fit_token_ids({**own, **{k: v for k, v in table.items() if not isinstance(v, dict)}}, table)


def _class_defaults(model_type: str) -> dict[str, Any]:
    """The config class's defaults as JSON values (remembered: the class imports torch), {} where there is no class to
    read (a remote-code or unknown model type: the overrides stay)."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig

    try:
        defaults = AutoConfig.for_model(model_type).to_dict()
    except Exception:
        return {}
    return dict(json.loads(json.dumps(defaults, default=str)))


LAYER_FIELDS_FORMAT = 6
"""Bump when tiny_layer_fields answers differently for the same question (3: kv-shared layers and shared blocks;
4: dense-first MoE layers, a window deciding rope; 5: a cycled pattern, recurrent_gemma's block_types; 6: layer
index lists named `*_indices`, bamba's attn_layer_indices)."""


def faithful_layer_fields(model_type: str, real: RealShape, tiny: dict[str, Any]) -> dict[str, Any]:
    """The layer fields that give `tiny` one layer of each of `real`'s layer kinds in their order (layer_kinds.
    tiny_layer_fields), remembered in the harness cache; none where the config class cannot build the checkpoint's
    `layers` (the pattern check then names the difference)."""

    def answer() -> dict[str, Any]:
        try:
            return tiny_layer_fields(model_type, real.layers, tiny)
        except Exception:  # the class refuses the cited fields: the tiny config keeps its own layer fields
            return {}

    key = {"format": LAYER_FIELDS_FORMAT, "model_type": model_type, "layers": real.layers, "tiny": tiny}
    return dict(remembered("tiny-layers", key, answer))

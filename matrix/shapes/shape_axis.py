"""The shape axis of cells: how a shape is spelled in cell ids, and the entries a faithful or stress cell runs
(one faithful cell per group of an entry's checkpoints that split alike)."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from matrix.config_values import UNREADABLE_CONFIG, UnreadableConfig, refusal
from matrix.registry import ModelEntry, RegistryError
from matrix.shapes.faithful_rule import faithful_tiny
from matrix.shapes.real_shape import (
    MATRIX_TP,
    RealShape,
    checked_tiny_shape,
    defaults_source,
    read_shape,
    split_pattern,
)
from matrix.shapes.records import REAL_SHAPES_FILE, SHAPE_SEPARATOR, faithful_record, load_real_shapes

if TYPE_CHECKING:
    pass

SHAPES = ("faithful", "stress")
DEFAULT_SHAPES = ("faithful",)
UNMARKED_SHAPE = "stress"
"""The shape whose cells keep the plain id (`llama-eager-fp32-tp2`): every result stored before shapes
existed was a stress shape, so their history continues under the same ids; other shapes are marked in the
model part of the id (`llama.faithful-eager-fp32-tp2`)."""


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
        return f"no faithful tiny config: {refusal(error)}"


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
        sizes = refusal(error)
    if isinstance(sizes, str):  # no sizes, or the config class refuses them (its own validation)
        return replace(entry, name=shaped_name(entry.name, shape), skip_reason=f"no faithful tiny config: {sizes}")
    why = (
        f"faithful to {real.source} at tp {', '.join(map(str, tps))}: {sizes.heads} heads, {sizes.kv_heads} kv heads, "
        f"head_dim {sizes.head_dim}, hidden {sizes.hidden}, intermediate {sizes.intermediate}, vocab {sizes.vocab}"
        + (f", {sizes.experts} experts top-{sizes.top_k}" if sizes.experts else "")
        + (f" of width {sizes.expert_intermediate}" if sizes.expert_intermediate else "")
        + f"; layers {' | '.join(sizes.layer_pattern)}"
        + (
            f" (NOT the checkpoint's {' | '.join(real.layer_pattern)})"
            if sizes.layer_pattern != real.layer_pattern
            else ""
        )
    )
    return replace(entry, name=shaped_name(entry.name, shape), tiny=tiny, tiny_why=why, checkpoints=checkpoints)


def _defaults_record(entry: ModelEntry) -> RealShape:
    """An entry real_shapes.toml does not cover (a derived architecture): its config class defaults, with the layer
    fields derived.toml fixes where the defaults lack a layer kind of the checkpoints (ModelEntry.defaults_layers)."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig

    fixed = f" with derived.toml's {', '.join(entry.defaults_layers)}" if entry.defaults_layers else ""
    try:
        config = AutoConfig.for_model(entry.model_type, **entry.defaults_layers)
    except Exception as error:  # a remote-code or unknown model type, or a fix the class refuses
        raise RegistryError(
            f"no real shape recorded in {REAL_SHAPES_FILE.name} and no config class defaults{fixed} for "
            f"{entry.model_type!r} ({type(error).__name__}: {str(error).strip().splitlines()[-1][:200]})"
        ) from None
    return read_shape(config, defaults_source() + fixed)

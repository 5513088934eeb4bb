"""A cell is one AutoTP check: model × variant × dtype × tp size. This module expands selections
into cells and parses the selection the user typed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeGuard

from matrix.cell_arguments import NO_ARGUMENTS, CellArguments
from matrix.config_values import ExpansionError
from matrix.registry import DTYPES, MODELS_FILE, DType, ModelEntry, RegistryError, load_models, pick
from matrix.shapes import (
    UNMARKED_SHAPE,
    RealShape,
    load_real_shapes,
    parse_shapes,
    real_shapes_file,
    shaped_entries,
    shaped_entry,
    shaped_name,
    split_shaped_name,
)
from matrix.variants import Variant, load_variants


def cell_id(model: str, variant: str, dtype: str, tp: int) -> str:
    """The one spelling of a cell: `{model}-{variant}-{dtype}-tp{tp}` (llama-eager-fp32-tp3); `model` carries
    the cell's shape where it is not the unmarked one (llama.faithful-eager-fp32-tp3, see matrix/shapes/)."""
    return f"{model}-{variant}-{dtype}-tp{tp}"


def parse_cell_id(
    text: str, models: Iterable[str] | None = None, variants: Iterable[str] | None = None
) -> tuple[str, str, str, int]:
    """cell_id read back against the known names (model and variant names may contain `-` and `_`): the one
    parser of cell ids. `models` default: the registry's entries, and where none fits the architectures derived
    outside it (matrix/derive.py, which needs transformers); `variants` default: the registry's. A RegistryError
    names what is wrong and what exists."""
    if models is None:
        registry = load_models()
        try:
            return parse_cell_id(text, registry, variants)
        except RegistryError as outside:
            try:
                # lazily: matrix/derive.py imports transformers, which nox's own process (it imports this module) lacks
                from matrix.derive import derived_entries

                derived = derived_entries(registry)
            except ImportError:  # no transformers here to derive architectures from: the registry's answer stands
                raise outside from None
            return parse_cell_id(text, [*registry, *derived], variants)
    variants = load_variants() if variants is None else variants
    match = re.fullmatch(r"(?P<rest>.+)-(?P<dtype>[a-z0-9]+)-tp(?P<tp>\d+)", text)
    if not match or match["dtype"] not in DTYPES:
        raise RegistryError(
            f"{text!r} is not a cell id; cell ids look like llama-eager-fp32-tp3 "
            f"({{model}}-{{variant}}-{{dtype}}-tp{{tp}}, dtype one of {', '.join(DTYPES)})"
        )
    models = set(models)
    for variant in sorted(variants, key=len, reverse=True):  # the longest variant name that fits wins
        model = match["rest"].removesuffix(f"-{variant}")
        if model != match["rest"] and split_shaped_name(model)[0] in models:
            return model, variant, match["dtype"], int(match["tp"])
    raise RegistryError(
        f"{text!r}: no model with a variant makes {match['rest']!r}; models: "
        f"{', '.join(sorted(models))}; variants: {', '.join(sorted(variants))}"
    )


DEFAULT_MODELS = "registry"
DEFAULT_TP_SIZES = (2, 3, 4)
DEFAULT_VARIANTS = ("eager",)
DEFAULT_DTYPES = ("fp32",)


@dataclass(frozen=True)
class Cell:
    model: ModelEntry
    variant: Variant
    dtype: DType
    tp: int
    arguments: CellArguments = NO_ARGUMENTS
    """What the cell passes besides the model and tp size (a remedy's `injection_policy`, ...): none by default."""

    @property
    def id(self) -> str:
        return cell_id(self.model.name, self.variant.name, self.dtype, self.tp)

    def coordinates(self) -> dict[str, str]:
        return {
            "id": self.id,
            "model": self.model.name,
            "variant": self.variant.name,
            "dtype": self.dtype,
            "tp": str(self.tp),
        }


def parse_tp_sizes(text: str) -> tuple[int, ...]:
    """`"2,3"` -> (2, 3); anything that is not a positive integer is refused with the value named."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        try:
            size = int(part)
        except ValueError:
            raise RegistryError(f"tp size {part!r} is not an integer; use e.g. --tp 2,3,4") from None
        if size < 1:
            raise RegistryError(f"tp size {size} must be >= 1; use e.g. --tp 2,3,4")
        sizes.append(size)
    return tuple(dict.fromkeys(sizes))


def parse_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def is_dtype(name: str) -> TypeGuard[DType]:
    """Whether `name` is one of the dtype names a cell runs in (DTYPES)."""
    return name in DTYPES


def parse_dtypes(text: str) -> tuple[DType, ...]:
    dtypes: list[DType] = []
    for name in parse_names(text):
        if not is_dtype(name):
            raise RegistryError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
        dtypes.append(name)
    return tuple(dtypes)


MODEL_SELECTIONS = {
    "registry": "every entry of matrix/models.toml (the default matrix)",
    "derived": "the architectures of transformers' causal-LM mapping the registry lacks, with derived tiny configs",
    "all": "registry + derived: every causal-LM architecture of the installed transformers",
}


def pick_models(names: list[str], models_file: Path = MODELS_FILE) -> list[ModelEntry]:
    """Entries by name or by one of MODEL_SELECTIONS; derived entries are computed only when asked for."""
    names = [split_shaped_name(name)[0] for name in names]
    registry = load_models(models_file)
    if names == ["registry"]:
        return list(registry.values())
    if all(name in registry for name in names):
        return pick(registry, names, "model")
    # lazily: matrix/derive.py imports transformers, which nox's own process (it imports this module) lacks
    from matrix.derive import derived_entries

    derived = derived_entries(registry)
    if names == ["derived"]:
        return list(derived.values())
    if names == ["all"]:
        return [*registry.values(), *derived.values()]
    return pick({**registry, **derived}, names, "model")


def expand(
    models: str = DEFAULT_MODELS,
    variants: str = ",".join(DEFAULT_VARIANTS),
    dtypes: str = ",".join(DEFAULT_DTYPES),
    tp: str = ",".join(map(str, DEFAULT_TP_SIZES)),
    *,
    models_file: Path = MODELS_FILE,
    shapes: str = UNMARKED_SHAPE,
) -> list[Cell]:
    """All cells of the selection, grouped by tp size so one rank group serves a run of cells. A model named
    with its shape (`qwen2.faithful`, `qwen2.stress`, `llama.faithful-meta-llama-3-8b`: how cell ids and replays
    spell it) runs exactly that cell's shape; any other name or selection runs each of `shapes` (the command
    line's --shapes; the registry's configs as written, `stress`, when not given), `faithful` as one cell per
    group of the entry's checkpoints that split alike (matrix.shapes.faithful_groups)."""
    names = parse_names(models)
    picked = pick_models(names, models_file)
    explicit = {split_shaped_name(name)[0]: split_shaped_name(name)[1] for name in names if "." in name}
    shape_names = parse_shapes(shapes)
    variant_entries = pick(load_variants(), parse_names(variants), "variant")
    dtype_names = parse_dtypes(dtypes)
    shapes_file = real_shapes_file(models_file)
    real_shapes = (
        load_real_shapes(shapes_file)
        if shapes_file.exists() and any(shape != "stress" for shape in (*shape_names, *explicit.values()))
        else {}
    )
    return [
        Cell(entry, variant, dtype, size)
        for size in parse_tp_sizes(tp)
        for model in picked
        for shape in ((explicit[model.name],) if model.name in explicit else shape_names)
        for entry in _shaped(model, shape, model.name in explicit, size, real_shapes)
        for variant in variant_entries
        for dtype in dtype_names
    ]


def _shaped(
    model: ModelEntry, shape: str, exactly: bool, tp: int, real_shapes: dict[str, dict[str, RealShape]]
) -> list[ModelEntry]:
    """The entries of `model`'s cells of `shape` at `tp`: exactly that cell's shape when the model was named with it,
    else one per group of checkpoints that split alike. The shapes step's guard for harness bugs: an exception for
    this architecture's shape (other than a RegistryError: a wrong selection) fails its cells as `setup` naming it,
    and the other cells run (an unreadable config is already its named skip: matrix/shapes/
    faithful_groups_or_why)."""
    try:
        return (
            [shaped_entry(model, shape, tp, real_shapes)] if exactly else shaped_entries(model, shape, tp, real_shapes)
        )
    except RegistryError:
        raise
    except Exception as error:  # a harness bug, reported on this architecture's cells as `setup`
        return [replace(model, name=shaped_name(model.name, shape), expansion_error=ExpansionError.of("shapes", error))]


def replay_name(model: str) -> str:
    """A cell's model coordinate as --models spells exactly that cell's shape (a plain name would take --shapes)."""
    name, shape = split_shaped_name(model)
    return f"{name}.{shape}"


def selection_options(cell: Cell) -> str:
    """The options of `nox -s matrix` (and the suites) that select exactly this cell."""
    return (
        f"--models {replay_name(cell.model.name)} --variants {cell.variant.name} --dtypes {cell.dtype} --tp {cell.tp}"
    )


def resolve_cell(model: str, variant: str, dtype: str, tp: int, models_file: Path = MODELS_FILE) -> Cell:
    """The Cell a recorded cell's coordinates name (`llama.faithful`, `qwen2`, a derived architecture), as a run
    of exactly that cell builds it: its shape's tiny config and the checkpoints it stands for. Every consumer of a
    recorded cell (repro scripts, draft issues, bisection steps) turns it back into what ran through this."""
    cells = expand(replay_name(model), variant, dtype, str(tp), models_file=models_file)
    found = [cell for cell in cells if cell.model.name == model]
    if len(found) != 1:
        raise RegistryError(
            f"cell {cell_id(model, variant, dtype, tp)}: the registry builds "
            f"{', '.join(c.id for c in cells) or 'no cell'}"
            " for it; was the entry renamed or its real shapes changed?"
        )
    return found[0]


def parse_cell(text: str) -> Cell:
    """A cell id (`bloom.faithful-eager-fp32-tp2`) as the Cell it names (parse_cell_id, then resolve_cell)."""
    return resolve_cell(*parse_cell_id(text))

"""The atlas's axes as data: every architecture `nox -s coverage` runs × the newest patch of every DeepSpeed minor
from `deepspeed_since` (and master) × the newest patch of every transformers minor from the oldest the registry
supports × tp 2, 3, 4, in the selections of matrix/atlas.toml; computed from PyPI release data like the nightly's
combinations (matrix/versions.py), so a new release enters the atlas by itself.

How many cells a combination holds depends on the transformers it installs (`models = "all"` is every causal-LM
architecture of that transformers), so `python -m matrix.atlas --count` is run by the environment's own python
(sessions/atlas.py does) and prints the count of each selection there.

The cost model's measured figures (sessions/atlas_cost.py CostModel) are data too: matrix/atlas_cost.toml, written by
`nox -s atlas -- --calibrate RESULTS` from slices' timings and JUnit durations."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import Any

import tomllib

from matrix.cells import Cell, expand
from matrix.json_records import write_record
from matrix.shapes import DEFAULT_SHAPES
from matrix.version_axes import AxisValueError, Combo, Pin, load_config
from matrix.versions import backfill_versions, select_axis, skip_reason

ATLAS_FILE = Path(__file__).with_name("atlas.toml")
COST_FILE = Path(__file__).with_name("atlas_cost.toml")
ATLAS_AXES = ("deepspeed", "transformers")
"""The axes the atlas widens; torch stays the runner's (matrix/versions.toml [axes.torch])."""


class AtlasConfigError(ValueError):
    """matrix/atlas.toml or matrix/atlas_cost.toml is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class AtlasSelection:
    """What runs at every version set: one `nox -s matrix` selection (matrix/cells.py expand)."""

    name: str
    """Its name in timings, plans and the cost model (`inference`, `training`)."""
    models: str
    """--models: names or a selection (`all`: every causal-LM architecture of the installed transformers)."""
    variants: str
    """--variants."""
    dtypes: str
    """--dtypes."""

    def suite_args(self, tp: tuple[int, ...]) -> list[str]:
        """Its pytest options, as `nox -s matrix -- …` takes them."""
        return [
            "--models",
            self.models,
            "--variants",
            self.variants,
            "--dtypes",
            self.dtypes,
            "--tp",
            ",".join(map(str, tp)),
        ]


@dataclass(frozen=True)
class AtlasConfig:
    deepspeed_since: str
    """The oldest DeepSpeed minor: the newest patch of it and of every later minor is an atlas column."""
    deepspeed_extra: tuple[str, ...]
    """Further DeepSpeed values, git refs (`deepspeed@master`): each run takes the ref's newest commit."""
    transformers_since: str
    """The oldest transformers minor; `min` is versions.toml's [axes.transformers] min."""
    tp: tuple[int, ...]
    selections: tuple[AtlasSelection, ...]


def load_atlas_config(path: Path = ATLAS_FILE) -> AtlasConfig:
    data = _read(path)
    known = {"deepspeed_since", "deepspeed_extra", "transformers_since", "tp", "selections"}
    if unknown := set(data) - known:
        raise AtlasConfigError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
        )
    for key in ("deepspeed_since", "transformers_since"):
        if not isinstance(data.get(key), str):
            raise AtlasConfigError(f'{path}: {key} must be a quoted release such as "0.14"')
    tp = data.get("tp", [])
    if not tp or not all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in tp):
        raise AtlasConfigError(f"{path}: tp must be a list of tensor-parallel sizes >= 1, e.g. [2, 3, 4]")
    extra = data.get("deepspeed_extra", [])
    if not all(isinstance(value, str) for value in extra):
        raise AtlasConfigError(f'{path}: deepspeed_extra must be a list of strings such as "deepspeed@master"')
    return AtlasConfig(
        deepspeed_since=data["deepspeed_since"],
        deepspeed_extra=tuple(extra),
        transformers_since=data["transformers_since"],
        tp=tuple(tp),
        selections=tuple(_selection(path, index, table) for index, table in enumerate(data.get("selections", []))),
    )


def _selection(path: Path, index: int, table: object) -> AtlasSelection:
    where = f"{path}: [[selections]] #{index + 1}"
    names = [field.name for field in fields(AtlasSelection)]
    if not isinstance(table, dict) or set(table) != set(names):
        found = ", ".join(sorted(table)) if isinstance(table, dict) else repr(table)
        raise AtlasConfigError(f"{where} must have exactly {', '.join(names)}; found {found}")
    if not all(isinstance(value, str) and value for value in table.values()):
        raise AtlasConfigError(f"{where}: every value must be a non-empty string")
    return AtlasSelection(**table)


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise AtlasConfigError(f"{path}: {error}") from None


# ---------------------------------------------------------------------------------------------
# Versions and combinations


@dataclass(frozen=True)
class AtlasAxes:
    deepspeed: tuple[Pin, ...]
    """Releases oldest first, then git refs."""
    transformers: tuple[Pin, ...]
    """Releases oldest first."""
    torch: Pin


def atlas_axes(
    config: AtlasConfig, until: Mapping[str, str] | None = None, *, cache_dir: Path | None = None
) -> AtlasAxes:
    """The atlas's values of each axis. `until` caps an axis at a release (`{"transformers": "5.24.0"}`): the atlas
    as it was before a newer release, what a nightly's increment is measured against."""
    until = dict(until or {})
    if unknown := set(until) - set(ATLAS_AXES):
        raise AxisValueError(f"until: {', '.join(sorted(unknown))} is not an atlas axis ({', '.join(ATLAS_AXES)})")
    matrix_config = load_config()
    rules = matrix_config.axes
    since = {
        "deepspeed": config.deepspeed_since,
        "transformers": str(rules["transformers"].min)
        if config.transformers_since == "min"
        else config.transformers_since,
    }
    pins = {}
    for axis in ATLAS_AXES:
        newest = until.get(axis) or select_axis(axis, matrix_config, cache_dir=cache_dir).latest.label
        versions = backfill_versions(axis, since[axis], newest, cache_dir=cache_dir)
        pins[axis] = tuple(_pin(axis, version, cache_dir) for version in versions)
    refs = tuple(_pin("deepspeed", value, cache_dir) for value in config.deepspeed_extra)
    torch = select_axis("torch", matrix_config, cache_dir=cache_dir).latest
    return AtlasAxes(deepspeed=pins["deepspeed"] + refs, transformers=pins["transformers"], torch=torch)


def _pin(axis: str, value: str, cache_dir: Path | None) -> Pin:
    return select_axis(axis, load_config(), override=value, cache_dir=cache_dir).latest


def atlas_combos(axes: AtlasAxes) -> list[Combo]:
    """Every version set of the atlas, transformers oldest first and DeepSpeed oldest first within each: the order
    slices run them in (a transformers version's tiny checkpoints and references are made once per runner)."""
    return [
        Combo(
            deepspeed=deepspeed,
            transformers=transformers,
            torch=axes.torch,
            tags=(),
            skip_reason=skip_reason({pin.package: pin.version for pin in (deepspeed, transformers, axes.torch)}),
        )
        for transformers in axes.transformers
        for deepspeed in axes.deepspeed
    ]


# ---------------------------------------------------------------------------------------------
# Cells


@dataclass(frozen=True)
class CellCounts:
    """A selection's cells at one transformers version, by what they will do: the cost of a cell that skips at once
    (no faithful tiny config, a version gate, an architecture that release lacks, remote code) is a few ms; a running
    one, seconds."""

    cells: int
    runs: int
    """Cells that will run; the rest skip before any checkpoint is made (a memory-plan skip is counted as running)."""


def will_run(cell: Cell, transformers_version: str) -> bool:
    """Whether the cell gets past suites/run/driver.py skip_reason at the atlas's options (tiny checkpoints, no remote
    code) and its expansion: tests/sessions/test_atlas_plan.py checks the two agree on every cell."""
    entry = cell.model
    return not (
        entry.skip_reason
        or entry.expansion_error
        or entry.trust_remote_code
        or entry.version_skip_reason(transformers_version)
    )


def count_cells(config: AtlasConfig) -> dict[str, CellCounts]:
    """Cells of each selection at the installed transformers (`all` derives its architectures from it)."""
    installed = metadata.version("transformers")
    counts = {}
    for selection in config.selections:
        cells = expand(
            selection.models,
            selection.variants,
            selection.dtypes,
            ",".join(map(str, config.tp)),
            shapes=",".join(DEFAULT_SHAPES),
        )
        runs = sum(will_run(cell, installed) for cell in cells)
        counts[selection.name] = CellCounts(len(cells), runs)
    return counts


# ---------------------------------------------------------------------------------------------
# The cost model's measured figures


@dataclass(frozen=True)
class SelectionCost:
    """One selection's seconds per cell, by what the cell does. Wall: JUnit's duration of each cell; CPU: the
    selection's CPU seconds (pytest, fork server, rank groups) less its start and its skips, over its running cells."""

    run_s: float
    """Wall seconds per running cell where the transformers version's tiny checkpoints and references exist."""
    first_run_s: float
    """... at a transformers version new to the runner (its checkpoints and references made)."""
    skip_s: float
    """Wall (and CPU) seconds per skipping cell."""
    run_cpu_s: float
    first_run_cpu_s: float


@dataclass(frozen=True)
class CostFigures:
    source: str
    """Which runs measured them, where, when."""
    load: float
    """The machine's 1-min load average while they were measured (ours included): wall figures hold at about it."""
    others_cores: float
    """Cores' worth of CPU other processes used meanwhile (the machine's busy time less ours, over the wall)."""
    selection_start_s: float
    """Wall seconds a selection's run takes beyond its cells' (pytest's start and collection, the fork server's
    imports); counted as CPU seconds too (one busy core)."""
    environment_s: float
    """Seconds a combination's environment takes to build over a DeepSpeed layer already there."""
    environment_cpu_s: float
    first_environment_s: float
    """Seconds until a runner with no layer of the combination's has it ready (torch, DeepSpeed and combination
    layers, the comm op); CPU counted alike."""
    merge_cell_s: float
    """Seconds per cell to merge a slice's results into the archive."""
    selections: Mapping[str, SelectionCost]


SELECTION_FIELDS = tuple(field.name for field in fields(SelectionCost))
FIGURE_FIELDS = tuple(field.name for field in fields(CostFigures) if field.name not in ("source", "selections"))


def load_cost(path: Path = COST_FILE) -> CostFigures:
    data = _read(path)
    try:
        return CostFigures(
            source=str(data["source"]),
            selections={
                name: SelectionCost(**{key: float(table[key]) for key in SELECTION_FIELDS})
                for name, table in data["cells"].items()
            },
            **{key: float(data[key]) for key in FIGURE_FIELDS},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise AtlasConfigError(
            f"{path}: {type(error).__name__} {error}; write it with `nox -s atlas -- --calibrate RESULTS`"
        ) from None


def cost_text(figures: CostFigures) -> str:
    """matrix/atlas_cost.toml's content for these figures."""
    lines = [
        "# The atlas cost model's measured seconds on one runner (sessions/atlas_cost.py CostModel), written by",
        "# `nox -s atlas -- --calibrate RESULTS [RESULTS ...]` from slices' timings (RESULTS/atlas-timing.jsonl) and",
        "# their cells' JUnit durations. Refresh: run a slice (`nox -s atlas -- --run COMBOS --results RESULTS`), then",
        "# calibrate on it; predict a different slice with it. `--calibrate-cells RESULTS` refreshes only the warm",
        "# seconds per cell, from a warm `nox -s matrix` run's JUnit.",
        f"source = {json.dumps(figures.source)}",
        *(f"{key} = {round(getattr(figures, key), 4)}" for key in FIGURE_FIELDS),
    ]
    for name, cost in sorted(figures.selections.items()):
        lines += ["", f"[cells.{name}]", *(f"{key} = {round(getattr(cost, key), 4)}" for key in SELECTION_FIELDS)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Cells of each atlas selection at the installed transformers.")
    parser.add_argument("--count", action="store_true", required=True, help="print {selection: cells} as JSON")
    parser.parse_args(argv)
    counts = count_cells(load_atlas_config())
    json.dump(
        {
            "transformers": metadata.version("transformers"),
            "selections": {name: write_record(c) for name, c in counts.items()},
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()

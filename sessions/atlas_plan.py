"""What `nox -s atlas -- --plan` decides before anything runs: the combinations the results archive lacks (a
combination counts as done once each selection of it has a run there that is not all `install` failures), split into
slices by transformers version and cost, and the lines it prints (the axes, the cells, the cost model's prediction and
what it assumes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from matrix.atlas import (
    COST_FILE,
    AtlasConfig,
    AtlasSelection,
)
from matrix.version_axes import AxisValueError, Combo
from sessions.atlas_cost import (
    Built,
    CostModel,
    Prediction,
)


def atlas_session_name(selection: AtlasSelection, combo: Combo) -> str:
    """The session its runs are recorded under, like `autotp(<combo id>)`: the archive tells which are done."""
    return f"atlas-{selection.name}({combo.id})"


# ---------------------------------------------------------------------------------------------
# What is missing


@dataclass(frozen=True)
class ArchivedSession:
    """What the archive holds of one session (`python -m reports atlas done` prints these)."""

    runs: int
    cells: int
    install: int
    """Cells recorded as `install` failures: the environment could not be installed."""

    @property
    def done(self) -> bool:
        return self.cells > self.install


def missing_combos(
    combos: Iterable[Combo], selections: Sequence[AtlasSelection], archived: Mapping[str, ArchivedSession]
) -> list[Combo]:
    """The combinations some selection of which has no run in the archive but install failures (skipped ones
    aside: versions.toml declares them incompatible)."""
    return [
        combo
        for combo in combos
        if not combo.skip_reason
        and not all(
            (found := archived.get(atlas_session_name(selection, combo))) is not None and found.done
            for selection in selections
        )
    ]


# ---------------------------------------------------------------------------------------------
# Cost model and slices


@dataclass(frozen=True)
class Slice:
    index: int
    """1-based."""
    of: int
    combos: tuple[Combo, ...]
    predicted: Prediction
    """On a fresh runner."""

    def job(self) -> dict[str, str | int | float]:
        """Its row of the job matrix: what the workflow's atlas job reads."""
        return {
            "slice": f"{self.index}/{self.of}",
            "combos": ",".join(combo.id for combo in self.combos),
            "cells": self.predicted.cells,
            "predicted_minutes": round(self.predicted.wall_s / 60, 1),
        }


def plan_slices(combos: Sequence[Combo], runners: int, model: CostModel) -> list[Slice]:
    """At most `runners` slices of the combinations: whole transformers versions where there are enough of them
    (a runner makes a version's checkpoints and references once), the costliest split by DeepSpeed until there
    are `runners` units; then each unit, costliest first, to the slice predicted to end first."""
    if runners < 1:
        raise AxisValueError(f"--plan {runners}: give the number of runners, 1 or more")
    order = {combo.id: index for index, combo in enumerate(combos)}
    units: list[list[Combo]] = []
    for combo in combos:
        if units and units[-1][0].transformers.id == combo.transformers.id:
            units[-1].append(combo)
        else:
            units.append([combo])
    while len(units) < runners and any(len(unit) > 1 for unit in units):
        widest = max((unit for unit in units if len(unit) > 1), key=model.slice_s)
        at = units.index(widest)
        units[at : at + 1] = [widest[: len(widest) // 2], widest[len(widest) // 2 :]]
    slices: list[list[Combo]] = [[] for _ in range(min(runners, len(units)))]
    for unit in sorted(units, key=model.slice_s, reverse=True):  # stable: equal costs keep the atlas's order
        emptiest = min(range(len(slices)), key=lambda index: (model.slice_s(slices[index]), index))
        slices[emptiest] = sorted(slices[emptiest] + unit, key=lambda combo: order[combo.id])
    return [
        Slice(index + 1, len(slices), tuple(members), model.predict(members)) for index, members in enumerate(slices)
    ]


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h ({seconds / 60:.0f} min)"


def plan_text(
    config: AtlasConfig,
    combos: Sequence[Combo],
    missing: Sequence[Combo],
    slices: Sequence[Slice],
    model: CostModel,
    built: Built,
) -> list[str]:
    """What `--plan` prints before anything runs: the axes, the cells, the cost model, the prediction and what it
    assumes."""
    deepspeed = list(dict.fromkeys(combo.deepspeed.label for combo in combos))
    transformers = list(dict.fromkeys(combo.transformers.label for combo in combos))
    figures = model.figures
    everything = model.predict(combos)
    here = model.predict(missing, built)
    slowest = max((s.predicted.wall_s for s in slices), default=0.0)
    lines = [
        f"atlas: {len(deepspeed)} DeepSpeed ({', '.join(deepspeed)}) × {len(transformers)} transformers "
        f"({transformers[0]} … {transformers[-1]}) × tp {','.join(map(str, config.tp))}: {len(combos)} version sets, "
        f"{everything.cells:,} cells ({everything.runs:,} run, the rest skip at once)",
        *(
            f"  at transformers {version}: "
            + " + ".join(f"{c.cells} {name} ({c.runs} run)" for name, c in counted.items())
            + " a version set"
            for version, counted in model.counts.items()
        ),
        f"missing from the archive: {len(missing)} version sets, {here.cells:,} cells; environments: "
        f"{len(missing)} combinations over {len({c.deepspeed.id for c in missing})} DeepSpeed layers, "
        f"{here.environments} of them not built here",
        f"cost model ({COST_FILE.name}): start {figures.selection_start_s:.1f} s a selection, "
        f"merge {figures.merge_cell_s * 1000:.1f} ms a cell; "
        + "; ".join(
            f"{name} {cost.run_s:.2f} s wall / {cost.run_cpu_s:.2f} s CPU a running cell ({cost.first_run_s:.2f} / "
            f"{cost.first_run_cpu_s:.2f} s at a transformers version new to the runner), {cost.skip_s * 1000:.0f} ms "
            f"a skip"
            for name, cost in figures.selections.items()
        ),
        f"predicted: {hours(here.wall_s)} ({here.cpu_s / 3600:.2f} h CPU) on 1 runner (this one); {hours(slowest)} "
        f"on {len(slices)} fresh runners (the slowest slice; "
        f"{hours(sum(s.predicted.wall_s for s in slices))} of runner time)",
        model.assumptions(built),
    ]
    lines += [
        f"  slice {s.index}/{s.of}: {len(s.combos)} version sets, {s.predicted.cells:,} cells, "
        f"{hours(s.predicted.wall_s)}: "
        f"{', '.join(combo.id for combo in s.combos[:4])}{' …' if len(s.combos) > 4 else ''}"
        for s in slices
    ]
    return lines

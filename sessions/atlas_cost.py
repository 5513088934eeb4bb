"""The atlas's cost model: a slice's wall and CPU seconds predicted from what its cells will do (run or skip, at a
transformers version new to the runner or not) and what its runner has already built, and the figures it uses
(matrix/atlas_cost.toml) measured from slices that ran: their atlas-timing.jsonl and their cells' JUnit durations.

What a slice records (`run_slice` in sessions/atlas.py writes it through `SliceMeter`): per combination and
selection the wall and CPU seconds (pytest, the fork server and the rank groups: the fork server reaps them so their
CPU reaches us), the machine's busy CPU seconds meanwhile (less ours: what else ran) and its load average."""

from __future__ import annotations

import json
import os
import socket
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

from matrix.atlas import AtlasSelection, CellCounts, CostFigures, SelectionCost
from matrix.version_axes import Combo

TIMING_FILE = "atlas-timing.jsonl"
"""One line per combination a slice ran (its environment's wait, each selection's cells and seconds), then one line
for the slice (merge, wall, CPU, load, and what was predicted): what `--calibrate` reads."""


@dataclass(frozen=True)
class Prediction:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    cells: int = 0
    runs: int = 0
    environments: int = 0
    """Environments built (a combination's, or its layers too)."""

    def __add__(self, other: Prediction) -> Prediction:
        return Prediction(
            self.wall_s + other.wall_s,
            self.cpu_s + other.cpu_s,
            self.cells + other.cells,
            self.runs + other.runs,
            self.environments + other.environments,
        )


@dataclass(frozen=True)
class Built:
    """What a runner has built before a slice starts: nothing on a fresh CI runner."""

    combinations: frozenset[str] = frozenset()
    """Combination ids whose environment is ready."""
    deepspeed: frozenset[str] = frozenset()
    """DeepSpeed ids whose layer (over the atlas's torch) is ready."""


@dataclass(frozen=True)
class CostModel:
    figures: CostFigures
    counts: Mapping[str, Mapping[str, CellCounts]]
    """Each selection's cells by transformers version (label), counted in an environment of that version."""
    stand_in: str
    """The transformers version whose counts stand in for one with no environment to count in (the newest)."""
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)

    def counts_at(self, combo: Combo) -> Mapping[str, CellCounts]:
        return self.counts.get(combo.transformers.label) or self.counts[self.stand_in]

    def cells(self, combo: Combo, first_at_transformers: bool) -> Prediction:
        """One combination's selections and their merge."""
        total = Prediction()
        figures = self.figures
        for name, counts in self.counts_at(combo).items():
            cost = figures.selections[name]
            run_s, run_cpu_s = (
                (cost.first_run_s, cost.first_run_cpu_s) if first_at_transformers else (cost.run_s, cost.run_cpu_s)
            )
            fixed = figures.selection_start_s + (counts.cells - counts.runs) * cost.skip_s
            fixed += counts.cells * figures.merge_cell_s
            total += Prediction(fixed + counts.runs * run_s, fixed + counts.runs * run_cpu_s, counts.cells, counts.runs)
        return total

    def environment(self, combo: Combo, built: Built, first_in_slice: bool) -> Prediction:
        """Its environment's build, unless built: the first one holds up the slice's start; later ones are built
        ahead while earlier cells run, their CPU taken from the cells' cores."""
        figures = self.figures
        if combo.id in built.combinations:
            return Prediction()
        if combo.deepspeed.id in built.deepspeed:
            wall_s, cpu_s = figures.environment_s, figures.environment_cpu_s
        else:
            wall_s = cpu_s = figures.first_environment_s
        return Prediction(wall_s if first_in_slice else cpu_s / self.cores, cpu_s, environments=1)

    def predict(self, combos: Sequence[Combo], built: Built = Built()) -> Prediction:
        """One runner's seconds for these combinations in this order."""
        total = Prediction()
        seen: set[str] = set()
        ready = built
        for index, combo in enumerate(combos):
            total += self.environment(combo, ready, index == 0)
            ready = Built(ready.combinations | {combo.id}, ready.deepspeed | {combo.deepspeed.id})
            total += self.cells(combo, combo.transformers.label not in seen)
            seen.add(combo.transformers.label)
        return total

    def slice_s(self, combos: Sequence[Combo]) -> float:
        """Seconds a fresh runner takes for these combinations (how plans balance their slices)."""
        return self.predict(combos).wall_s

    def assumptions(self, built: Built | None = None) -> str:
        """What a prediction assumes, in words: printed with it."""
        figures = self.figures
        counted = ", ".join(sorted(self.counts, key=_version_key))
        where = (
            "a fresh runner (nothing built)"
            if built is None
            else f"this runner's environments ({len(built.combinations)} atlas combinations built)"
        )
        return (
            f"assumes: cells run or skip as counted at transformers {counted} (others as at {self.stand_in}); "
            f"{where}, a missing combination built in {figures.environment_s:.0f} s over its DeepSpeed layer "
            f"({figures.first_environment_s:.0f} s with its layers), later builds overlapping the cells on "
            f"{self.cores} cores; wall at the calibration's load {figures.load:.1f} (others using "
            f"{figures.others_cores:.2f} cores) — CPU seconds do not depend on it; figures from {figures.source}"
        )


def _version_key(label: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in label.split("."))


def describe(prediction: Prediction) -> str:
    return (
        f"{prediction.cells:,} cells ({prediction.runs:,} run, {prediction.cells - prediction.runs:,} skip), "
        f"{prediction.environments} environments to build: {prediction.wall_s:.0f} s wall, {prediction.cpu_s:.0f} s CPU"
    )


# ---------------------------------------------------------------------------------------------
# Measuring a slice


def cpu_s() -> float:
    """CPU seconds of this process's finished children: the cells' pytest, its fork server, the rank groups (the
    fork server reaps them), environment builds that ended meanwhile."""
    times = os.times()
    return times.children_user + times.children_system


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: all but idle and iowait); 0 without /proc."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def load() -> float:
    """The 1-min load average (ours included)."""
    return os.getloadavg()[0]


@dataclass
class Meter:
    """Wall, our CPU and the machine's CPU from a start; `reading()` is the figures since, with the load at both
    ends."""

    clock: float = 0.0
    ours: float = 0.0
    machine: float = 0.0
    load_start: float = 0.0

    @classmethod
    def start(cls, clock: float) -> Meter:
        return cls(clock, cpu_s(), machine_cpu_s(), load())

    def reading(self, clock: float) -> dict[str, float]:
        wall, ours = clock - self.clock, cpu_s() - self.ours
        return {
            "seconds": wall,
            "cpu_s": ours,
            "others_cpu_s": max(0.0, machine_cpu_s() - self.machine - ours),
            "load_start": self.load_start,
            "load_end": load(),
        }


def junit_durations(folder: Path) -> dict[str, Any]:
    """Cells and skipped cells of the JUnit files in a results folder's junit/, and JUnit's seconds of each kind."""
    cells = skipped = 0
    run_s = skip_s = 0.0
    for path in sorted(folder.glob("*.xml")):
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            seconds = float(case.get("time") or 0)
            cells += 1
            if case.find("skipped") is not None:
                skipped += 1
                skip_s += seconds
            else:
                run_s += seconds
    return {"cells": cells, "skipped": skipped, "junit_run_s": run_s, "junit_skip_s": skip_s}


def comparison(predicted: Prediction, measured: Mapping[str, float], cores: int) -> str:
    """Predicted against measured, wall and CPU, with the load it ran at, and the wall the predicted CPU seconds give
    on the cores the others left (what the wall prediction would have been, had it known the load)."""
    others = measured["others_cpu_s"] / max(measured["seconds"], 1e-9)
    at_load = wall_given(predicted.cpu_s, cores, others)
    return (
        f"predicted {predicted.wall_s:.0f} s wall, {predicted.cpu_s:.0f} s CPU; measured {measured['seconds']:.0f} s "
        f"wall ({percent(predicted.wall_s, measured['seconds'])}), {measured['cpu_s']:.0f} s CPU "
        f"({percent(predicted.cpu_s, measured['cpu_s'])}); load {measured['load_start']:.1f} → "
        f"{measured['load_end']:.1f}, others using {others:.2f} cores, on the {cores - others:.2f} cores left the "
        f"predicted CPU takes {at_load:.0f} s ({percent(at_load, measured['seconds'])})"
    )


LEAST_SHARE = 0.25
"""The fewest cores' worth a slice is taken to get however busy the machine is (the scheduler shares it out)."""


def wall_given(cpu_s: float, cores: int, others_cores: float) -> float:
    """Wall seconds for `cpu_s` of work when other processes use `others_cores` of `cores`: the slice's ranks could
    use every core (tp up to 4 on 2 cores), so it gets what the others leave."""
    return cpu_s / max(cores - others_cores, LEAST_SHARE)


def percent(predicted: float, measured: float) -> str:
    """How far the measurement is from the prediction, as a share of the prediction."""
    return f"{(measured - predicted) / predicted:+.0%} of predicted" if predicted else "nothing predicted"


# ---------------------------------------------------------------------------------------------
# Calibration


def measured_figures(results: Sequence[Path], previous: CostFigures) -> CostFigures:
    """The cost model's figures from slices' results folders: per selection, JUnit's seconds per running cell at
    combinations whose transformers version the slice ran before and at those it had not, per skipping cell, and
    the CPU seconds per running cell (the selection's CPU less its start and skips); the start (a selection's wall
    beyond its cells'); a combination environment's build from those the slices built (else `previous`'s); the
    merge's seconds per cell; the load and the others' CPU meanwhile."""
    combos: list[tuple[Path, dict[str, Any]]] = []
    slices: list[dict[str, Any]] = []
    for folder in results:
        for line in _timing_lines(folder / TIMING_FILE):
            if "combo" in line:
                combos.append((folder, line))
            elif line.get("merged_cells"):
                slices.append(line)
    if not combos or not slices:
        raise ValueError(
            f"{', '.join(map(str, results))}: no finished, merged slice; run `nox -s atlas -- --run` first"
        )
    runs = [
        (first, {**line[name], **junit_durations(folder / line["combo"] / name / "junit")}, name)
        for folder, line in combos
        for name in _selections(line)
        for first in (line["first_transformers"],)
    ]
    if not all("others_cpu_s" in run for _, run, _ in runs):
        raise ValueError("these timings were recorded before a slice counted its rank groups' CPU: run a slice again")
    starts = [run["seconds"] - run["junit_run_s"] - run["junit_skip_s"] for _, run, _ in runs]
    start_s = sum(starts) / len(starts)
    selections = {
        name: _selection_cost(name, [(f, r) for f, r, n in runs if n == name], start_s) for _, _, name in runs
    }
    built = [line for _, line in combos if line.get("built") == "combination"]
    environment = (
        (
            sum(line["waited_s"] for line in built) / len(built),
            sum(line["waited_cpu_s"] for line in built) / len(built),
        )
        if built
        else (previous.environment_s, previous.environment_cpu_s)
    )
    layers = [line["waited_s"] for _, line in combos if line.get("built") == "layers"]
    wall = sum(run["seconds"] for _, run, _ in runs)
    loads = [value for _, run, _ in runs for value in (run["load_start"], run["load_end"])]
    names = ", ".join(line["combo"] for _, line in combos)
    kept = "" if built else f"; environment builds as in {previous.source}"
    return CostFigures(
        source=f"{date.today().isoformat()} on {socket.gethostname()}: {names}{kept}",
        load=sum(loads) / len(loads),
        others_cores=sum(run["others_cpu_s"] for _, run, _ in runs) / wall,
        selection_start_s=start_s,
        environment_s=environment[0],
        environment_cpu_s=environment[1],
        first_environment_s=sum(layers) / len(layers) if layers else previous.first_environment_s,
        merge_cell_s=sum(line["merge_s"] for line in slices) / sum(line["merged_cells"] for line in slices),
        selections=selections,
    )


def _timing_lines(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: {error}; give the --results folder of a `nox -s atlas -- --run` slice") from None


def _selections(line: Mapping[str, Any]) -> list[str]:
    return [key for key, value in line.items() if isinstance(value, dict)]


def _selection_cost(name: str, runs: list[tuple[bool, dict[str, Any]]], start_s: float) -> SelectionCost:
    skips = sum(run["skipped"] for _, run in runs)
    skip_s = sum(run["junit_skip_s"] for _, run in runs) / skips if skips else 0.0
    rates: dict[bool, tuple[float, float]] = {}
    for first in (True, False):
        ran = [run for is_first, run in runs if is_first == first and run["cells"] > run["skipped"]]
        if not ran:
            kind = "a transformers version new to" if first else "a transformers version already run on"
            raise ValueError(f"no {name} cells ran at {kind} the slice; calibrate on 2 DeepSpeed × 1 transformers")
        cells = sum(run["cells"] - run["skipped"] for run in ran)
        cpu = sum(run["cpu_s"] - start_s - run["skipped"] * skip_s for run in ran)
        rates[first] = (sum(run["junit_run_s"] for run in ran) / cells, cpu / cells)
    return SelectionCost(
        run_s=rates[False][0],
        first_run_s=rates[True][0],
        skip_s=skip_s,
        run_cpu_s=rates[False][1],
        first_run_cpu_s=rates[True][1],
    )


# ---------------------------------------------------------------------------------------------
# Recalibration from warm cells


REST_AS_IN = "; the rest as in "
"""Where a warm-cell calibration's source names the calibration its other figures come from."""


def warm_cell_figures(
    results: Path, selections: Sequence[AtlasSelection], tp: Sequence[int], previous: CostFigures
) -> CostFigures:
    """`previous` with the warm per-cell wall seconds (`run_s`) of each atlas selection whose cells `results` (a
    `nox -s matrix` results folder) ran, read from its JUnit: the mean of each tp's running cells, averaged over the
    atlas's tp sizes (every atlas row runs each of them once). A cell belongs to the selection whose variants and
    dtypes name its own. The CPU per warm cell scales with the wall (JUnit has no CPU seconds); a first run at a
    transformers version, skips, starts, environments and the merge keep `previous`'s figures (a warm run does not
    measure them), and the source says so."""
    seconds = _junit_seconds_by_cell(results / "junit")
    updated = dict(previous.selections)
    said: list[str] = []
    for selection in selections:
        mine = [
            (cell_tp, duration)
            for (variant, dtype, cell_tp), durations in seconds.items()
            if variant in _listed(selection.variants) and dtype in _listed(selection.dtypes)
            for duration in durations
        ]
        if not mine:
            continue
        by_tp = {size: [duration for cell_tp, duration in mine if cell_tp == size] for size in tp}
        if absent := [size for size, durations in by_tp.items() if not durations]:
            raise ValueError(
                f"{results / 'junit'}: no running {selection.name} cell at tp {', '.join(map(str, absent))}; run "
                f"`nox -s matrix -- --tp {','.join(map(str, tp))}` into it first"
            )
        means = {size: sum(durations) / len(durations) for size, durations in by_tp.items()}
        run_s = sum(means.values()) / len(means)
        old = previous.selections[selection.name]
        updated[selection.name] = replace(old, run_s=run_s, run_cpu_s=old.run_cpu_s * run_s / old.run_s)
        per_tp = ", ".join(f"tp {size} {mean:.3f} s" for size, mean in means.items())
        said.append(f"{selection.name} warm cells {per_tp} ({len(mine)} cells)")
    if not said:
        names = ", ".join(f"{s.name} ({s.variants} {s.dtypes})" for s in selections)
        raise ValueError(f"{results / 'junit'}: no running cell of an atlas selection: {names}")
    rest = previous.source.split(REST_AS_IN, 1)[-1]  # a calibration before this one replaced, not nested
    return replace(
        previous,
        source=f"{date.today().isoformat()} on {socket.gethostname()}: {'; '.join(said)} from {results.name}/ (a warm"
        f" nox -s matrix){REST_AS_IN}{rest}",
        selections=updated,
    )


def _listed(option: str) -> set[str]:
    return {value.strip() for value in option.split(",")}


def _junit_seconds_by_cell(folder: Path) -> dict[tuple[str, str, int], list[float]]:
    """JUnit seconds of every running (not skipped) cell in a results folder's junit/, by (variant, dtype, tp)."""
    paths = sorted(folder.glob("*.xml"))
    if not paths:
        raise ValueError(f"{folder}: no JUnit file; give the results folder of a `nox -s matrix` run")
    seconds: dict[tuple[str, str, int], list[float]] = {}
    for path in paths:
        try:
            cases = list(ElementTree.parse(path).getroot().iter("testcase"))
        except ElementTree.ParseError as error:
            raise ValueError(f"{path}: not JUnit XML ({error})") from None
        for case in cases:
            if case.find("skipped") is not None:
                continue
            cell = {prop.get("name"): prop.get("value") for prop in case.iter("property")}
            try:
                key = (str(cell["cell.variant"]), str(cell["cell.dtype"]), int(str(cell["cell.tp"])))
                duration = float(case.get("time") or "")
            except (KeyError, ValueError):
                raise ValueError(f"{path}: test case {case.get('name')!r} is not a cell with its time") from None
            seconds.setdefault(key, []).append(duration)
    return seconds

"""`nox -s atlas`: the atlas built once over many runners, extended every night, published as pages.

The axes are data (matrix/atlas.py); here they become work: the combinations the results archive lacks (a
combination counts as done once each selection of it has a run there that is not all `install` failures), split
into slices by transformers version and cost so a runner makes each transformers version's tiny checkpoints and
references once and shares its environment layers, a GitHub Actions job matrix of those slices, and the run of one
slice — the combinations' environments built ahead by EnvironmentsAhead while earlier cells run, the cells run by
`run_suites` like every session, the results merged into the archive like `nox -s backfill` does.

The cost model (CostModel) predicts a slice's seconds on one runner from matrix/atlas_cost.toml's measured figures;
`--calibrate RESULTS` measures them from a slice's RESULTS/atlas-timing.jsonl."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from functools import partial
from pathlib import Path

import nox
from nox.command import CommandFailed

from matrix import cache_root
from matrix.atlas import (
    ATLAS_AXES,
    COST_FILE,
    AtlasConfig,
    AtlasSelection,
    CostFigures,
    SelectionCost,
    atlas_axes,
    atlas_combos,
    cost_text,
    load_atlas_config,
    load_cost,
)
from matrix.versions import AxisValueError, Combo, ReleaseDataUnavailable, parse_pins
from sessions.environments import EnvironmentBuildError, environment_variables
from sessions.nox_sessions import (
    AHEAD_WORKERS,
    EnvironmentsAhead,
    install_harness,
    latest_combo,
    run_suites,
)

SCOPES = ("missing", "nightly")
TIMING_FILE = "atlas-timing.jsonl"
"""One line per combination a slice ran (seconds waited for its environment, each selection's cells and
seconds), then one line for the merge: what `--calibrate` reads."""


def atlas_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nox -s atlas --", allow_abbrev=False)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--plan", type=int, metavar="N", help="split the missing combinations into N slices")
    action.add_argument("--run", metavar="COMBOS", help="run one slice: comma-separated combination ids")
    action.add_argument("--nightly", action="store_true", help="plan `--scope nightly` on 1 runner, run it, triage")
    action.add_argument("--site", type=Path, metavar="OUT", help="render the atlas's pages from the archive")
    action.add_argument("--calibrate", type=Path, metavar="RESULTS", help="measure the cost model from a slice")
    parser.add_argument(
        "--scope",
        choices=SCOPES,
        default="missing",
        help="missing: every combination the archive lacks; nightly: those and the git refs at the newest transformers",
    )
    parser.add_argument("--archive", default="results/archive", help="the results archive (default results/archive)")
    parser.add_argument("--store", default="results/history.sqlite", help="history store merged into with the archive")
    parser.add_argument("--results", default="results/atlas", help="one folder per combination and selection")
    parser.add_argument("--until", action="append", default=[], metavar="AXIS=VERSION", help="cap an axis")
    parser.add_argument("--deepspeed", help="only these DeepSpeed values of the atlas (comma-separated)")
    parser.add_argument("--transformers", help="only these transformers values of the atlas (comma-separated)")
    parser.add_argument("--job-matrix", type=Path, help="also write the plan's GitHub Actions job matrix (JSON)")
    parser.add_argument("--no-merge", action="store_true", help="leave the slice's results unmerged (CI merges)")
    parser.add_argument(
        "--keep-cache", action="store_true", help="keep each transformers version's checkpoints when the slice is done"
    )
    parser.add_argument("--no-triage", action="store_true", help="--nightly: do not triage new transitions")
    parser.add_argument("--max-minutes", default="60", help="--nightly: the triage's budget (default 60)")
    return parser


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
class CostModel:
    figures: CostFigures
    cells: Mapping[str, int]
    """Cells of each selection per combination (counted at the newest transformers: older ones hold fewer
    architectures, so a prediction for them is an upper bound)."""

    def combination_s(self, first_at_transformers: bool) -> float:
        """One combination's cells and merge; its transformers version's checkpoints and references made or not."""
        total = 0.0
        for name, cells in self.cells.items():
            cost = self.figures.selections.get(name, SelectionCost(0.0, 0.0))
            total += cells * ((cost.first_cell_s if first_at_transformers else cost.cell_s) + self.figures.merge_cell_s)
        return total

    def slice_s(self, combos: Sequence[Combo]) -> float:
        """Seconds one runner with nothing built takes for these combinations, in this order."""
        if not combos:
            return 0.0
        seen: set[str] = set()
        total = self.figures.first_environment_s + self.figures.environment_s * (len(combos) - 1)
        for combo in combos:
            total += self.combination_s(combo.transformers.id not in seen)
            seen.add(combo.transformers.id)
        return total

    @property
    def combination_cells(self) -> int:
        return sum(self.cells.values())


@dataclass(frozen=True)
class Slice:
    index: int
    """1-based."""
    of: int
    combos: tuple[Combo, ...]
    predicted_s: float

    def job(self, cells: int) -> dict[str, str | int | float]:
        """Its row of the job matrix: what the workflow's atlas job reads."""
        return {
            "slice": f"{self.index}/{self.of}",
            "combos": ",".join(combo.id for combo in self.combos),
            "cells": cells * len(self.combos),
            "predicted_minutes": round(self.predicted_s / 60, 1),
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
        Slice(index + 1, len(slices), tuple(members), model.slice_s(members)) for index, members in enumerate(slices)
    ]


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h ({seconds / 60:.0f} min)"


def plan_text(
    config: AtlasConfig, combos: Sequence[Combo], missing: Sequence[Combo], slices: Sequence[Slice], model: CostModel
) -> list[str]:
    """What `--plan` prints before anything runs: the axes, the cells, the cost model, the prediction."""
    deepspeed = list(dict.fromkeys(combo.deepspeed.label for combo in combos))
    transformers = list(dict.fromkeys(combo.transformers.label for combo in combos))
    per_combination = " + ".join(f"{cells} {name}" for name, cells in model.cells.items())
    figures = model.figures
    cells = model.combination_cells
    lines = [
        f"atlas: {len(deepspeed)} DeepSpeed ({', '.join(deepspeed)}) × {len(transformers)} transformers "
        f"({transformers[0]} … {transformers[-1]}) × tp {','.join(map(str, config.tp))}: {len(combos)} version sets",
        f"cells: {per_combination} = {cells} per version set (counted at the newest transformers; older ones hold "
        f"fewer architectures), {cells * len(combos):,} in the atlas",
        f"missing from the archive: {len(missing)} version sets, {cells * len(missing):,} cells; environments: "
        f"{len(missing)} combinations over {len({c.deepspeed.id for c in missing})} DeepSpeed layers, one torch "
        f"layer per runner",
        f"cost model ({COST_FILE.name}: {figures.source}): first environment {figures.first_environment_s:.0f} s, "
        f"each further one {figures.environment_s:.1f} s, merge {figures.merge_cell_s * 1000:.1f} ms a cell; "
        + "; ".join(
            f"{name} {cost.cell_s:.3f} s a cell ({cost.first_cell_s:.3f} s at a transformers version new to the runner)"
            for name, cost in figures.selections.items()
        ),
    ]
    one_runner = model.slice_s(list(missing))
    slowest = max((s.predicted_s for s in slices), default=0.0)
    lines.append(
        f"predicted: {hours(one_runner)} on 1 runner; {hours(slowest)} on {len(slices)} runners "
        f"(the slowest slice; {hours(sum(s.predicted_s for s in slices))} of runner time)"
    )
    lines += [
        f"  slice {s.index}/{s.of}: {len(s.combos)} version sets, {cells * len(s.combos):,} cells, "
        f"{hours(s.predicted_s)}: {', '.join(combo.id for combo in s.combos[:4])}{' …' if len(s.combos) > 4 else ''}"
        for s in slices
    ]
    return lines


# ---------------------------------------------------------------------------------------------
# The session


def run_atlas(session: nox.Session, argv: list[str]) -> None:
    args, pytest_args = atlas_parser().parse_known_args(argv)
    if args.calibrate:
        calibrate(session, args.calibrate)
        return
    config = load_atlas_config()
    try:
        until = parse_pins(args.until, "--until", ATLAS_AXES)
        combos = chosen(atlas_combos(atlas_axes(config, until)), args)
    except (AxisValueError, ReleaseDataUnavailable) as error:
        session.error(str(error))
    if args.run:  # builds nothing before its own timing starts: a runner's first environment is part of the slice
        run_slice(session, config, by_ids(combos, args.run), args, pytest_args)
        return
    python = install_harness(session, latest_combo(session))
    if args.site:
        reports_atlas(session, python, "site", "--archive", args.archive, "--out", str(args.site))
        return
    missing = missing_combos(combos, config.selections, read_archived(session, python, args.archive))
    if args.nightly or args.scope == "nightly":
        missing = [*missing, *newest_refs(combos, missing)]
    model = CostModel(load_cost(), count_cells(session, python))
    slices = plan_slices(missing, 1 if args.nightly else args.plan, model) if missing else []
    for line in plan_text(config, combos, missing, slices, model):
        session.log(line)
    if args.job_matrix:
        args.job_matrix.write_text(json.dumps([s.job(model.combination_cells) for s in slices]) + "\n")
        session.log(f"wrote {args.job_matrix}")
    if args.nightly and slices:
        run_slice(session, config, list(slices[0].combos), args, pytest_args)
        if not args.no_triage:
            reports_run(session, python, "triage", "--store", args.store, "--max-minutes", args.max_minutes)


def newest_refs(combos: list[Combo], missing: list[Combo]) -> list[Combo]:
    """The git refs (master) at the newest transformers, unless missing already: each night runs the ref's newest
    commit there (the atlas's other git-ref combinations are filled once, by the first build)."""
    newest = combos[-1].transformers.id
    return [c for c in combos if c.deepspeed.version is None and c.transformers.id == newest and c not in missing]


def chosen(combos: list[Combo], args: argparse.Namespace) -> list[Combo]:
    """The combinations whose DeepSpeed and transformers values are among --deepspeed and --transformers."""
    for axis in ATLAS_AXES:
        wanted = getattr(args, axis)
        if wanted:
            values = {value.strip() for value in wanted.split(",")}
            known = {getattr(combo, axis).label for combo in combos}
            if unknown := values - known:
                raise AxisValueError(f"--{axis} {', '.join(sorted(unknown))}: not in the atlas ({', '.join(known)})")
            combos = [combo for combo in combos if getattr(combo, axis).label in values]
    return combos


def by_ids(combos: list[Combo], ids: str) -> list[Combo]:
    known = {combo.id: combo for combo in combos}
    wanted = [text.strip() for text in ids.split(",") if text.strip()]
    if unknown := [text for text in wanted if text not in known]:
        raise SystemExit(f"--run {', '.join(unknown)}: not an atlas combination (see `nox -s atlas -- --plan 1`)")
    return [known[text] for text in wanted]


def reports_atlas(session: nox.Session, python: Path, *args: str, silent: bool = False) -> str:
    return reports_run(session, python, "atlas", *args, silent=silent)


def reports_run(session: nox.Session, python: Path, verb: str, *args: str, silent: bool = False) -> str:
    output = session.run(
        str(python), "-m", "reports", verb, *args, env=environment_variables(python), external=True, silent=silent
    )
    return output if isinstance(output, str) else ""


def read_archived(session: nox.Session, python: Path, archive: str) -> dict[str, ArchivedSession]:
    if not Path(archive).is_dir():
        session.log(f"{archive}: no results archive yet, every combination is missing")
        return {}
    printed = reports_atlas(session, python, "done", "--archive", archive, silent=True)
    return {name: ArchivedSession(**counts) for name, counts in json.loads(printed).items()}


def count_cells(session: nox.Session, python: Path) -> dict[str, int]:
    printed = session.run(
        str(python), "-m", "matrix.atlas", "--count", env=environment_variables(python), external=True, silent=True
    )
    counts: dict[str, int] = json.loads(str(printed).strip().splitlines()[-1])  # matrix.atlas --count's line
    return counts


# ---------------------------------------------------------------------------------------------
# One slice


def run_slice(
    session: nox.Session, config: AtlasConfig, combos: list[Combo], args: argparse.Namespace, pytest_args: list[str]
) -> None:
    """Run the combinations' selections, each into `<results>/<combo>/<selection>/`, timing each, then merge them
    into the archive and the store (unless --no-merge)."""
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    timing = results / TIMING_FILE
    started = time.monotonic()
    for combo in combos:
        if combo.skip_reason:
            session.log(f"{combo.id}: skipped, {combo.skip_reason}")
    runnable = [combo for combo in combos if not combo.skip_reason]
    folders: list[str] = []
    python: Path | None = None
    seen: set[str] = set()
    version_began = time.time()
    with EnvironmentsAhead(runnable, "", "", session.log, AHEAD_WORKERS) as ahead:
        for index, combo in enumerate(runnable):
            if combo.transformers.id not in seen:
                version_began = time.time()
            load = os.getloadavg()[0]  # what else ran on the machine: a shared runner's seconds grow with it
            waited = seconds(partial(ready_or_failed, ahead, combo))
            line: dict[str, object] = {
                "combo": combo.id,
                "waited_s": waited,
                "first_transformers": combo.transformers.id not in seen,
                "load": load,
            }
            seen.add(combo.transformers.id)
            for selection in config.selections:
                folder = results / combo.id / selection.name
                begun, cpu = time.monotonic(), children_cpu_s()
                selected = [*selection.suite_args(config.tp), "--results", str(folder), *pytest_args]
                try:
                    ran, failure = run_suites(session, combo, selected, ahead, atlas_session_name(selection, combo))
                except CommandFailed as error:  # pytest itself died (e.g. collection): it stays missing, the rest runs
                    ran, failure = None, f"{combo.id} {selection.name}: the suites did not finish ({error.reason})"
                line[selection.name] = {
                    "seconds": time.monotonic() - begun,
                    "cpu_s": children_cpu_s() - cpu,
                    **junit_counts(folder / "junit"),
                }
                python = ran or python
                if (folder / "junit").is_dir():
                    folders.append(str(folder / "junit"))
                if failure:
                    session.warn(failure)
            last_there = index + 1 == len(runnable) or runnable[index + 1].transformers.id != combo.transformers.id
            if last_there and not args.keep_cache:
                freed = prune_transformers_cache(combo.transformers.label, version_began)
                session.log(f"{combo.transformers.id}: done here, its cached checkpoints freed ({freed / 1e9:.1f} GB)")
            append_line(timing, line)
    merged = sum(line_cells for line_cells in (junit_counts(Path(f))["cells"] for f in folders))
    merge_s = 0.0
    if not args.no_merge and folders:
        python = python or install_harness(session, latest_combo(session))
        merge_s = seconds(lambda: reports_run(session, python, "merge", *folders, "--store", args.store))
    wall = time.monotonic() - started
    append_line(timing, {"merge_s": merge_s, "merged_cells": merged, "wall_s": wall})
    session.log(f"atlas slice: {len(runnable)} version sets, {merged} cells in {wall:.0f} s ({timing})")


PER_TRANSFORMERS_CACHES = ("references", "training")
"""Harness caches whose entries are keyed by the transformers version among the rest (suites/reference.py,
suites/variants/training.py): what a slice wrote there while it ran one version is never read at another."""


def prune_transformers_cache(version: str, since: float) -> int:
    """Free what the cells made for one transformers version once the slice ran its last combination there: the tiny
    checkpoints whose config names it and the references and training steps written since the version began. Every
    architecture at one version is ~12 GB (docs/findings.md), a hosted runner has ~14 GB of disk; what was cached
    before is kept. Returns the bytes freed."""
    root = cache_root()
    doomed = [
        folder
        for folder in sorted((root / "tiny").glob("*"))
        if folder.stat().st_mtime >= since and _config_version(folder / "config.json") == version
    ]
    doomed += [
        path
        for kind in PER_TRANSFORMERS_CACHES
        for path in sorted((root / kind).glob("*"))
        if path.is_file() and path.stat().st_mtime >= since
    ]
    freed = 0
    for path in doomed:
        if path.is_dir():
            freed += sum(file.stat().st_size for file in path.rglob("*") if file.is_file())
            shutil.rmtree(path)
        else:
            freed += path.stat().st_size
            path.unlink()
    return freed


def _config_version(config: Path) -> str:
    try:
        return str(json.loads(config.read_text()).get("transformers_version", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def ready_or_failed(ahead: EnvironmentsAhead, combo: Combo) -> None:
    """Wait for the combination's environment; a failed build is recorded by run_suites, not here."""
    try:
        ahead.ready(combo)
    except (EnvironmentBuildError, AxisValueError, ReleaseDataUnavailable):
        pass


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children (the cells' pytest and its ranks; environment builds that
    ended meanwhile): unlike the wall time, not stretched by what else runs on the machine."""
    times = os.times()
    return times.children_user + times.children_system


def seconds(work: Callable[[], object]) -> float:
    begun = time.monotonic()
    work()
    return time.monotonic() - begun


def junit_counts(folder: Path) -> dict[str, int]:
    """Cells and skipped cells of the JUnit files in a results folder's junit/."""
    cells = skipped = 0
    for path in sorted(folder.glob("*.xml")):
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            cells += 1
            skipped += case.find("skipped") is not None
    return {"cells": cells, "skipped": skipped}


def append_line(path: Path, record: dict[str, object]) -> None:
    with path.open("a") as stream:
        stream.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------------------------------------
# Calibration


def calibrate(session: nox.Session, results: Path) -> None:
    """matrix/atlas_cost.toml from a slice's timings: the first combination's wait is the first environment, the
    others' mean wait each further one; per selection, seconds per cell at combinations whose transformers version
    the slice had run before, and at those it had not; the merge's seconds per cell."""
    try:
        figures = measured_figures(results / TIMING_FILE)
    except ValueError as error:
        session.error(str(error))
    COST_FILE.write_text(cost_text(figures))
    session.log(f"wrote {COST_FILE}:\n{cost_text(figures)}")


def measured_figures(path: Path) -> CostFigures:
    try:
        lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: {error}; give the --results folder of a `nox -s atlas -- --run` slice") from None
    combos = [line for line in lines if "combo" in line]
    merges = [line for line in lines if "merge_s" in line]
    if not combos or not merges or not merges[-1]["merged_cells"]:
        raise ValueError(f"{path}: no finished, merged slice here; run `nox -s atlas -- --run COMBOS` first")
    names = [key for key in combos[0] if isinstance(combos[0][key], dict)]
    selections = {}
    for name in names:
        rates = {}
        for first in (True, False):
            ran = [line[name] for line in combos if line["first_transformers"] == first and line[name]["cells"]]
            if not ran:
                kind = "a transformers version new to" if first else "a transformers version already run on"
                raise ValueError(
                    f"{path}: no {name} cells at {kind} the slice; calibrate on 2 DeepSpeed × 1 transformers"
                )
            rates[first] = sum(r["seconds"] for r in ran) / sum(r["cells"] for r in ran)
        selections[name] = SelectionCost(cell_s=rates[False], first_cell_s=rates[True])
    later = [line["waited_s"] for line in combos[1:]]
    loads = [line["load"] for line in combos if "load" in line]
    load = f", load average {sum(loads) / len(loads):.1f}" if loads else ""
    return CostFigures(
        source=f"{date.today().isoformat()} on {socket.gethostname()}{load}: {', '.join(line['combo'] for line in combos)}",
        first_environment_s=combos[0]["waited_s"],
        environment_s=sum(later) / len(later) if later else 0.0,
        merge_cell_s=merges[-1]["merge_s"] / merges[-1]["merged_cells"],
        selections=selections,
    )

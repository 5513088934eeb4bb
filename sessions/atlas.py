"""`nox -s atlas`: the atlas built once over many runners, extended every night, published as pages.

The axes are data (matrix/atlas.py); here they become work: the combinations the results archive lacks (a
combination counts as done once each selection of it has a run there that is not all `install` failures), split
into slices by transformers version and cost so a runner makes each transformers version's tiny checkpoints and
references once and shares its environment layers, a GitHub Actions job matrix of those slices, and the run of one
slice — the combinations' environments built ahead by EnvironmentsAhead while earlier cells run, the cells run by
`run_suites` like every session, the results merged into the archive like `nox -s backfill` does.

The cost model (sessions/atlas_cost.py) predicts a slice's wall and CPU seconds from matrix/atlas_cost.toml's measured
figures and the cells counted at each transformers version; `--calibrate RESULTS…` measures them from slices that ran;
`--calibrate-cells RESULTS` the warm per-cell seconds from a `nox -s matrix` results folder;
`--run` prints its prediction before and the comparison after."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import nox
from nox.command import CommandFailed
from packaging.version import Version

from matrix.atlas import (
    ATLAS_AXES,
    COST_FILE,
    AtlasConfig,
    CellCounts,
    atlas_axes,
    atlas_combos,
    cost_text,
    load_atlas_config,
    load_cost,
)
from matrix.harness_cache import prune
from matrix.releases import ReleaseDataUnavailable
from matrix.version_axes import AxisValueError, Combo, Pin, parse_pins
from sessions.atlas_cost import (
    TIMING_FILE,
    Built,
    CostModel,
    Meter,
    comparison,
    describe,
    junit_durations,
    measured_figures,
    warm_cell_figures,
)
from sessions.atlas_plan import ArchivedSession, atlas_session_name, missing_combos, plan_slices, plan_text
from sessions.environments import (
    READY_MARKER,
    EnvironmentBuildError,
    EnvironmentSpec,
    env_root,
    environment_variables,
)
from sessions.nox_sessions import (
    AHEAD_WORKERS,
    EnvironmentsAhead,
    combo_environment,
    install_harness,
    latest_combo,
    run_suites,
)

SCOPES = ("missing", "nightly")


def atlas_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nox -s atlas --", allow_abbrev=False)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--plan", type=int, metavar="N", help="split the missing combinations into N slices")
    action.add_argument("--run", metavar="COMBOS", help="run one slice: comma-separated combination ids")
    action.add_argument("--nightly", action="store_true", help="plan `--scope nightly` on 1 runner, run it, triage")
    action.add_argument("--site", type=Path, metavar="OUT", help="render the atlas's pages from the archive")
    action.add_argument(
        "--calibrate", type=Path, nargs="+", metavar="RESULTS", help="measure the cost model from slices' results"
    )
    action.add_argument(
        "--calibrate-cells",
        type=Path,
        metavar="RESULTS",
        help="the warm per-cell seconds from a `nox -s matrix` results folder's JUnit (by tp)",
    )
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
        "--keep-cache",
        action="store_true",
        help="leave the harness cache as it is when the slice is done with a transformers version (by default it is "
        "pruned then to AUTOTP_CACHE_LIMIT, least recently used first: that version's checkpoints and references)",
    )
    parser.add_argument("--no-triage", action="store_true", help="--nightly: do not triage new transitions")
    parser.add_argument("--max-minutes", default="60", help="--nightly: the triage's budget (default 60)")
    return parser


# ---------------------------------------------------------------------------------------------
# The session


def run_atlas(session: nox.Session, argv: list[str]) -> None:
    args, pytest_args = atlas_parser().parse_known_args(argv)
    if args.calibrate:
        calibrate(session, args.calibrate)
        return
    config = load_atlas_config()
    if args.calibrate_cells:
        calibrate_cells(session, config, args.calibrate_cells)
        return
    try:
        until = parse_pins(args.until, "--until", ATLAS_AXES)
        combos = chosen(atlas_combos(atlas_axes(config, until)), args)
    except (AxisValueError, ReleaseDataUnavailable) as error:
        session.error(str(error))
    if args.run:  # builds nothing before its own timing starts: a runner's first environment is part of the slice
        ran = by_ids(combos, args.run)
        model = cost_model(session, ran, None)
        if model is None:
            session.log("no environment here to count the slice's cells in: nothing predicted")
        run_slice(session, config, ran, args, pytest_args, model)
        return
    python = install_harness(session, latest_combo(session))
    if args.site:
        reports_atlas(session, python, "site", "--archive", args.archive, "--out", str(args.site))
        return
    missing = missing_combos(combos, config.selections, read_archived(session, python, args.archive))
    if args.nightly or args.scope == "nightly":
        missing = [*missing, *newest_refs(combos, missing)]
    model = cost_model(session, missing or combos, python)
    assert model is not None  # counted at least with the newest combination's python
    slices = plan_slices(missing, 1 if args.nightly else args.plan, model) if missing else []
    for line in plan_text(config, combos, missing, slices, model, built_here(missing)):
        session.log(line)
    if args.job_matrix:
        args.job_matrix.write_text(json.dumps([s.job() for s in slices]) + "\n")
        session.log(f"wrote {args.job_matrix}")
    if args.nightly and slices:
        run_slice(session, config, list(slices[0].combos), args, pytest_args, model)
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


def cost_model(session: nox.Session, combos: Sequence[Combo], newest: Path | None) -> CostModel | None:
    """The cost model with each selection's cells counted at every transformers version of `combos` that has an
    environment here, and at `newest` (the python of the newest combination: its counts stand in for versions with
    none); None when there is nowhere to count."""
    counts: dict[str, dict[str, CellCounts]] = {}
    pythons = [*(python for version in transformers_of(combos) if (python := environment_at(version))), newest]
    for python in dict.fromkeys(python for python in pythons if python is not None):
        printed = session.run(
            str(python), "-m", "matrix.atlas", "--count", env=environment_variables(python), external=True, silent=True
        )
        counted = json.loads(str(printed).strip().splitlines()[-1])
        counts[counted["transformers"]] = {
            name: CellCounts(**numbers) for name, numbers in counted["selections"].items()
        }
    if not counts:
        return None
    stand_in = counted["transformers"] if newest is not None else max(counts, key=Version)
    return CostModel(load_cost(), counts, stand_in)


def transformers_of(combos: Sequence[Combo]) -> list[Pin]:
    return list({combo.transformers.id: combo.transformers for combo in combos}.values())


def environment_at(transformers: Pin) -> Path | None:
    """The python of a combination environment built here at this transformers version (any DeepSpeed)."""
    for folder in sorted(env_root().glob(f"*-{transformers.id}-*")):
        if (folder / READY_MARKER).exists() and "+" not in folder.name and "-asof" not in folder.name:
            return folder / "bin" / "python"
    return None


def built_here(combos: Sequence[Combo]) -> Built:
    """Which of the combinations' environments, and which of their DeepSpeed layers, are built here."""
    root = env_root()
    specs = {combo.id: combo_environment(combo) for combo in combos}

    def ready(spec: EnvironmentSpec | None) -> bool:
        return spec is not None and (root / spec.key / READY_MARKER).exists()

    return Built(
        frozenset(combo.id for combo in combos if ready(specs[combo.id])),
        frozenset(combo.deepspeed.id for combo in combos if ready(specs[combo.id].base)),
    )


# ---------------------------------------------------------------------------------------------
# One slice


def run_slice(
    session: nox.Session,
    config: AtlasConfig,
    combos: list[Combo],
    args: argparse.Namespace,
    pytest_args: list[str],
    model: CostModel | None = None,
) -> None:
    """Run the combinations' selections, each into `<results>/<combo>/<selection>/`, timing each, then merge them
    into the archive and the store (unless --no-merge). With `model`, its prediction for this runner is printed
    first and compared with what was measured at the end."""
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    timing = results / TIMING_FILE
    for combo in combos:
        if combo.skip_reason:
            session.log(f"{combo.id}: skipped, {combo.skip_reason}")
    runnable = [combo for combo in combos if not combo.skip_reason]
    built = built_here(runnable)
    predicted = model.predict(runnable, built) if model else None
    if model and predicted:
        session.log(f"atlas slice predicted: {describe(predicted)}")
        session.log(model.assumptions(built))
    folders: list[str] = []
    python: Path | None = None
    seen: set[str] = set()
    whole = Meter.start(time.monotonic())
    with EnvironmentsAhead(runnable, "", "", session.log, AHEAD_WORKERS) as ahead:
        for index, combo in enumerate(runnable):
            wait = Meter.start(time.monotonic())
            ready_or_failed(ahead, combo)
            waited = wait.reading(time.monotonic())
            line: dict[str, Any] = {
                "combo": combo.id,
                "built": None
                if combo.id in built.combinations
                else "combination"
                if combo.deepspeed.id in built.deepspeed
                else "layers",
                "waited_s": waited["seconds"],
                "waited_cpu_s": waited["cpu_s"],
                "first_transformers": combo.transformers.id not in seen,
            }
            seen.add(combo.transformers.id)
            ran, written = run_selections(session, config, combo, results, pytest_args, ahead, line)
            python = ran or python
            folders += written
            last_there = index + 1 == len(runnable) or runnable[index + 1].transformers.id != combo.transformers.id
            if last_there and not args.keep_cache:  # its checkpoints and references are never read at another
                pruned = prune(guard=0.0)  # the slice's suites are over: only a live run's lock keeps an entry
                said = pruned.line() or "the harness cache is within its limit"
                session.log(f"{combo.transformers.id}: done here; {said}")
            append_line(timing, line)
    merged = sum(junit_counts(Path(folder))["cells"] for folder in folders)
    merge = Meter.start(time.monotonic())
    if not args.no_merge and folders:
        python = python or install_harness(session, latest_combo(session))
        reports_run(session, python, "merge", *folders, "--store", args.store)
    measured = whole.reading(time.monotonic())
    append_line(
        timing,
        {
            "merge_s": merge.reading(time.monotonic())["seconds"],
            "merged_cells": merged,
            **{f"slice_{key}": value for key, value in measured.items()},
            **({"predicted": asdict(predicted)} if predicted else {}),
        },
    )
    session.log(f"atlas slice: {len(runnable)} version sets, {merged} cells in {measured['seconds']:.0f} s ({timing})")
    if predicted:
        session.log(f"atlas slice: {comparison(predicted, measured, model.cores if model else 1)}")


def run_selections(
    session: nox.Session,
    config: AtlasConfig,
    combo: Combo,
    results: Path,
    pytest_args: list[str],
    ahead: EnvironmentsAhead,
    line: dict[str, Any],
) -> tuple[Path | None, list[str]]:
    """Each selection of `combo` into `<results>/<combo>/<selection>/`, its time and counts into `line`: the harness
    python that ran (None if none did) and the JUnit folders written."""
    python: Path | None = None
    folders: list[str] = []
    for selection in config.selections:
        folder = results / combo.id / selection.name
        meter = Meter.start(time.monotonic())
        selected = [*selection.suite_args(config.tp), "--results", str(folder), *pytest_args]
        try:
            ran, failure = run_suites(session, combo, selected, ahead, atlas_session_name(selection, combo))
        except CommandFailed as error:  # pytest itself died (e.g. collection): it stays missing, the rest runs
            ran, failure = None, f"{combo.id} {selection.name}: the suites did not finish ({error.reason})"
        line[selection.name] = {**meter.reading(time.monotonic()), **junit_counts(folder / "junit")}
        python = ran or python
        if (folder / "junit").is_dir():
            folders.append(str(folder / "junit"))
        if failure:
            session.warn(failure)
    return python, folders


def ready_or_failed(ahead: EnvironmentsAhead, combo: Combo) -> None:
    """Wait for the combination's environment; a failed build is recorded by run_suites, not here."""
    try:
        ahead.ready(combo)
    except (EnvironmentBuildError, AxisValueError, ReleaseDataUnavailable):
        pass


def junit_counts(folder: Path) -> dict[str, int]:
    """Cells and skipped cells of the JUnit files in a results folder's junit/."""
    counted = junit_durations(folder)
    return {"cells": counted["cells"], "skipped": counted["skipped"]}


def append_line(path: Path, record: dict[str, object]) -> None:
    with path.open("a") as stream:
        stream.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------------------------------------
# Calibration


def calibrate(session: nox.Session, results: list[Path]) -> None:
    """matrix/atlas_cost.toml from slices' timings and JUnit durations (sessions/atlas_cost.py measured_figures)."""
    try:
        figures = measured_figures(results, load_cost())
    except ValueError as error:
        session.error(str(error))
    COST_FILE.write_text(cost_text(figures))
    session.log(f"wrote {COST_FILE}:\n{cost_text(figures)}")


def calibrate_cells(session: nox.Session, config: AtlasConfig, results: Path) -> None:
    """matrix/atlas_cost.toml's warm per-cell seconds from a `nox -s matrix` run's JUnit (sessions/atlas_cost.py
    warm_cell_figures); `nox -s atlas -- --plan N` then prices the atlas with them."""
    try:
        figures = warm_cell_figures(results, config.selections, config.tp, load_cost())
    except ValueError as error:
        session.error(str(error))
    COST_FILE.write_text(cost_text(figures))
    session.log(f"wrote {COST_FILE}:\n{cost_text(figures)}")

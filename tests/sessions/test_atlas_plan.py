"""`nox -s atlas`'s plan: what the archive lacks, the cost model, the slices and their job matrix, the calibration
from a slice's timings; one slice's run going on past a combination whose suites die."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import asdict
from pathlib import Path

import pytest
from nox.command import CommandFailed

from matrix.atlas import CellCounts, CostFigures, SelectionCost, atlas_axes, atlas_combos, load_atlas_config
from matrix.harness_cache import cache_entries, live_run
from matrix.releases import MAX_AGE_ENV
from matrix.version_axes import AxisValueError
from sessions import atlas
from sessions.atlas import junit_counts, newest_refs
from sessions.atlas_cost import (
    TIMING_FILE,
    Built,
    CostModel,
    Prediction,
    comparison,
    measured_figures,
    wall_given,
    warm_cell_figures,
)
from sessions.atlas_plan import ArchivedSession, atlas_session_name, hours, missing_combos, plan_slices, plan_text

FIXTURES = Path(__file__).parents[1] / "matrix" / "fixtures"
FIGURES = CostFigures(
    source="test",
    load=2.0,
    others_cores=0.5,
    selection_start_s=10.0,
    environment_s=40.0,
    environment_cpu_s=30.0,
    first_environment_s=100.0,
    merge_cell_s=0.01,
    selections={
        "inference": SelectionCost(run_s=0.5, first_run_s=1.0, skip_s=0.01, run_cpu_s=0.8, first_run_cpu_s=1.5),
        "training": SelectionCost(run_s=0.2, first_run_s=0.3, skip_s=0.01, run_cpu_s=0.4, first_run_cpu_s=0.5),
    },
)
COUNTS = {"inference": CellCounts(cells=600, runs=500), "training": CellCounts(cells=200, runs=200)}
MODEL = CostModel(FIGURES, {"5.25.0": COUNTS}, "5.25.0", cores=2)


@pytest.fixture(scope="module")
def combos():
    """DeepSpeed 0.18.9, 0.19.8 × transformers 5.23.0, 5.24.0, 5.25.0, as the atlas orders them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MAX_AGE_ENV, "inf")
        every = atlas_combos(atlas_axes(load_atlas_config(), cache_dir=FIXTURES))
    return [
        c
        for c in every
        if c.deepspeed.label in ("0.18.9", "0.19.8") and c.transformers.label in ("5.23.0", "5.24.0", "5.25.0")
    ]


def test_a_combination_is_missing_until_each_selection_ran_without_install_failures(combos):
    selections = load_atlas_config().selections
    done = ArchivedSession(runs=1, cells=600, install=0)
    archived = {atlas_session_name(selection, combos[0]): done for selection in selections}
    archived[atlas_session_name(selections[0], combos[1])] = done  # training never ran
    archived.update(
        {atlas_session_name(selection, combos[2]): ArchivedSession(1, 71, 71) for selection in selections}
    )  # could not be installed
    assert missing_combos(combos, selections, archived) == combos[1:]
    assert missing_combos(combos, selections, {}) == combos


def test_the_nightly_adds_the_git_refs_at_the_newest_transformers_only():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MAX_AGE_ENV, "inf")
        every = atlas_combos(atlas_axes(load_atlas_config(), cache_dir=FIXTURES))
    assert [c.id for c in newest_refs(every, [])] == ["ds@master-tf5.25.0-pt2.13.0"]
    assert newest_refs(every, [every[-1]]) == []  # already missing: planned once


def cells_s(first: bool) -> tuple[float, float]:
    """One combination's wall and CPU under MODEL: each selection's start, runs, skips and merge."""
    inference, training = FIGURES.selections["inference"], FIGURES.selections["training"]
    fixed = 2 * 10 + 100 * 0.01 + 800 * 0.01
    wall = fixed + 500 * (inference.first_run_s if first else inference.run_s)
    wall += 200 * (training.first_run_s if first else training.run_s)
    cpu = fixed + 500 * (inference.first_run_cpu_s if first else inference.run_cpu_s)
    cpu += 200 * (training.first_run_cpu_s if first else training.run_cpu_s)
    return wall, cpu


def test_the_cost_model_charges_runs_skips_and_references_once_per_transformers(combos):
    same_transformers = combos[:2]  # 0.18.9 and 0.19.8 at 5.23.0
    (first, first_cpu), (warm, warm_cpu) = cells_s(True), cells_s(False)
    # a fresh runner: the first environment with its layers holds up the start; the second is built ahead, its CPU
    # over the 2 cores taken from the cells'; its DeepSpeed layer is new too
    predicted = MODEL.predict(same_transformers)
    assert predicted.wall_s == pytest.approx(100 + 100 / 2 + first + warm)
    assert predicted.cpu_s == pytest.approx(100 + 100 + first_cpu + warm_cpu)
    assert (predicted.cells, predicted.runs, predicted.environments) == (1600, 1400, 2)
    assert MODEL.slice_s(combos[::2]) == pytest.approx(100 + 2 * 30 / 2 + 3 * first)  # one DeepSpeed, 3 transformers
    assert MODEL.predict([]) == Prediction()


def test_environments_already_built_cost_nothing_and_a_new_combination_over_a_built_layer_less(combos):
    (first, _), (warm, _) = cells_s(True), cells_s(False)
    everything = Built(frozenset(c.id for c in combos[:2]), frozenset(c.deepspeed.id for c in combos[:2]))
    assert MODEL.predict(combos[:2], everything).wall_s == pytest.approx(first + warm)
    layers_only = Built(frozenset(), frozenset(c.deepspeed.id for c in combos[:2]))
    assert MODEL.predict(combos[:2], layers_only).wall_s == pytest.approx(40 + 30 / 2 + first + warm)
    assert MODEL.predict(combos[:2], layers_only).cpu_s == pytest.approx(60 + sum(cells_s(f)[1] for f in (True, False)))


def test_a_transformers_version_counted_here_is_predicted_by_its_own_counts(combos):
    few = {"inference": CellCounts(cells=300, runs=100), "training": CellCounts(cells=200, runs=100)}
    model = CostModel(FIGURES, {"5.25.0": COUNTS, "5.23.0": few}, "5.25.0", cores=2)
    at_5_23 = model.predict(combos[:1])
    assert (at_5_23.cells, at_5_23.runs) == (500, 200)
    assert model.predict(combos[-1:]).cells == 800  # 5.25.0 counted; 5.24.0 would stand in as 5.25.0
    assert model.predict(combos[2:3]).cells == 800
    text = model.assumptions(Built())
    assert "counted at transformers 5.23.0, 5.25.0 (others as at 5.25.0)" in text and "load 2.0" in text


def test_slices_keep_a_transformers_version_together_while_there_are_enough(combos):
    slices = plan_slices(combos, 3, MODEL)
    assert [[c.id for c in s.combos] for s in slices] == [[c.id for c in combos[i : i + 2]] for i in (0, 2, 4)]
    assert {s.of for s in slices} == {3} and [s.index for s in slices] == [1, 2, 3]


@pytest.mark.parametrize("runners", [1, 2, 4, 6, 50])
def test_every_missing_combination_is_in_exactly_one_slice(combos, runners):
    slices = plan_slices(combos, runners, MODEL)
    ran = [c.id for s in slices for c in s.combos]
    assert sorted(ran) == sorted(c.id for c in combos)
    assert len(slices) == min(runners, len(combos))
    for s in slices:  # each in the atlas's order (a transformers version's cells once per runner)
        assert list(s.combos) == sorted(s.combos, key=combos.index)
        assert s.predicted == MODEL.predict(s.combos)


def test_more_runners_finish_sooner_and_the_slowest_slice_is_balanced(combos):
    one = plan_slices(combos, 1, MODEL)[0].predicted.wall_s
    two = plan_slices(combos, 2, MODEL)
    six = plan_slices(combos, 6, MODEL)
    assert max(s.predicted.wall_s for s in six) < max(s.predicted.wall_s for s in two) < one
    # three transformers versions on two runners: one runner takes two of them, the other one
    assert sorted(len(s.combos) for s in two) == [2, 4]


def test_zero_runners_is_refused(combos):
    with pytest.raises(AxisValueError, match="--plan 0"):
        plan_slices(combos, 0, MODEL)


def test_the_plan_states_cells_and_hours_on_one_and_on_n_runners_and_what_it_assumes(combos):
    slices = plan_slices(combos, 3, MODEL)
    text = "\n".join(plan_text(load_atlas_config(), combos, combos, slices, MODEL, Built()))
    assert "2 DeepSpeed (0.18.9, 0.19.8) × 3 transformers (5.23.0 … 5.25.0)" in text
    assert "6 version sets, 4,800 cells (4,200 run" in text
    assert "at transformers 5.25.0: 600 inference (500 run) + 200 training (200 run) a version set" in text
    assert "environments: 6 combinations over 2 DeepSpeed layers, 6 of them not built here" in text
    one, slowest = MODEL.predict(combos).wall_s, max(s.predicted.wall_s for s in slices)
    assert f"predicted: {hours(one)}" in text and f"{hours(slowest)} on 3 fresh runners" in text
    assert "assumes: cells run or skip as counted at transformers 5.25.0" in text
    row = slices[0].job()
    assert row == {
        "slice": "1/3",
        "combos": f"{combos[0].id},{combos[1].id}",
        "cells": 1600,
        "predicted_minutes": round(slices[0].predicted.wall_s / 60, 1),
    }
    json.dumps(row)  # the workflow reads it as JSON


def timing(tmp_path: Path, lines: list[dict]) -> Path:
    path = tmp_path / TIMING_FILE
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def junit(folder: Path, runs: list[float], skips: list[float]) -> None:
    folder.mkdir(parents=True)
    cases = [f'<testcase name="r{i}" time="{t}"/>' for i, t in enumerate(runs)]
    cases += [f'<testcase name="s{i}" time="{t}"><skipped/></testcase>' for i, t in enumerate(skips)]
    (folder / "a.xml").write_text(f"<testsuite>{''.join(cases)}</testsuite>")


def measured(seconds: float, cpu: float, cells: int, skipped: int) -> dict:
    reading = {"seconds": seconds, "cpu_s": cpu, "others_cpu_s": seconds / 4, "load_start": 2.0, "load_end": 4.0}
    return {**reading, "cells": cells, "skipped": skipped}


def test_calibration_reads_slices_timings_and_their_cells_junit_durations(tmp_path):
    junit(tmp_path / "a" / "inference" / "junit", [2.0] * 3, [0.01] * 2)
    junit(tmp_path / "b" / "inference" / "junit", [1.0] * 3, [0.03] * 2)
    path = timing(
        tmp_path,
        [
            {
                "combo": "a",
                "built": "combination",
                "waited_s": 50.0,
                "waited_cpu_s": 20.0,
                "first_transformers": True,
                "inference": measured(16.02, 30.02, 5, 2),  # JUnit 6.02 s: a start of 10 s
            },
            {
                "combo": "b",
                "built": None,
                "waited_s": 0.0,
                "waited_cpu_s": 0.0,
                "first_transformers": False,
                "inference": measured(13.06, 13.06, 5, 2),  # JUnit 3.06 s
            },
            {"merge_s": 1.0, "merged_cells": 10, "slice_seconds": 80.0},
        ],
    )
    figures = measured_figures([path.parent], FIGURES)
    assert figures.selection_start_s == pytest.approx(10.0)
    assert figures.selections["inference"] == pytest.approx(
        SelectionCost(
            run_s=1.0,
            first_run_s=2.0,
            skip_s=0.02,
            run_cpu_s=(13.06 - 10 - 0.04) / 3,
            first_run_cpu_s=(30.02 - 10 - 0.04) / 3,
        )
    )
    assert (figures.environment_s, figures.environment_cpu_s) == (50.0, 20.0)
    assert figures.first_environment_s == FIGURES.first_environment_s  # no layer built: kept, and said so
    assert figures.merge_cell_s == 0.1 and figures.load == 3.0 and figures.others_cores == pytest.approx(0.25)
    assert "a, b" in figures.source and "environment builds" not in figures.source


def test_calibration_refuses_timings_without_the_rank_groups_cpu_or_without_a_warm_combination(tmp_path):
    old = {"seconds": 1.0, "cpu_s": 1.0, "cells": 1, "skipped": 0}  # before the fork server reaped its ranks
    line = {"combo": "a", "waited_s": 1.0, "first_transformers": True, "inference": old}
    junit(tmp_path / "a" / "inference" / "junit", [0.5], [])
    timing(tmp_path, [line, {"merge_s": 1.0, "merged_cells": 1}])
    with pytest.raises(ValueError, match="before a slice counted its rank groups' CPU"):
        measured_figures([tmp_path], FIGURES)
    timing(tmp_path, [{**line, "inference": measured(1.0, 1.0, 1, 0)}, {"merge_s": 1.0, "merged_cells": 1}])
    with pytest.raises(ValueError, match="calibrate on 2 DeepSpeed × 1 transformers"):
        measured_figures([tmp_path], FIGURES)
    with pytest.raises(ValueError, match="give the --results folder"):
        measured_figures([tmp_path / "nowhere"], FIGURES)


def test_the_comparison_states_wall_cpu_and_load_and_the_wall_on_the_cores_left():
    reading = {"seconds": 110.0, "cpu_s": 180.0, "others_cpu_s": 55.0, "load_start": 2.5, "load_end": 3.5}
    text = comparison(Prediction(wall_s=100.0, cpu_s=200.0), reading, cores=2)
    assert text == (
        "predicted 100 s wall, 200 s CPU; measured 110 s wall (+10% of predicted), 180 s CPU (-10% of predicted); "
        "load 2.5 → 3.5, others using 0.50 cores, on the 1.50 cores left the predicted CPU takes 133 s "
        "(-18% of predicted)"
    )
    assert wall_given(100.0, 2, 1.9) == 400.0  # a machine the others fill still gives the slice a share


def test_junit_counts_cells_and_skips(tmp_path):
    (tmp_path / "a.xml").write_text(
        '<testsuite><testcase name="x"/><testcase name="y"><skipped/></testcase>'
        '<testcase name="z"><failure/></testcase></testsuite>'
    )
    assert junit_counts(tmp_path) == {"cells": 3, "skipped": 1}
    assert junit_counts(tmp_path / "missing") == {"cells": 0, "skipped": 0}


class SliceSession:
    """What run_slice asks of a nox session, recorded."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def log(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        self.warnings.append(message)


class NoBuilds:
    def __init__(self, *args: object) -> None:
        pass

    def __enter__(self) -> NoBuilds:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def ready(self, combo: object) -> None:
        pass


def test_a_combination_whose_suites_die_stays_missing_and_the_slice_merges_the_rest(combos, tmp_path, monkeypatch):
    """transformers 4.43.4 once made pytest die collecting (INTERNALERROR, exit 3): the slice ran nothing after it and
    merged nothing before it."""
    dying = combos[0]

    def run_suites(session, combo, selected, ahead, session_name):
        if combo == dying:
            raise CommandFailed("Returned code 3", return_code=3)
        junit = Path(selected[selected.index("--results") + 1]) / "junit"
        junit.mkdir(parents=True)
        (junit / "a.xml").write_text('<testsuite><testcase name="x"/></testsuite>')
        return Path("python"), ""

    merged: list[tuple[str, ...]] = []
    monkeypatch.setattr(atlas, "EnvironmentsAhead", NoBuilds)
    monkeypatch.setattr(atlas, "run_suites", run_suites)
    monkeypatch.setattr(atlas, "reports_run", lambda session, python, verb, *args: merged.append((verb, *args)))
    session = SliceSession()
    arguments = Namespace(results=str(tmp_path), keep_cache=True, no_merge=False, store="history.sqlite")
    atlas.run_slice(session, load_atlas_config(), combos[:2], arguments, [])
    assert [warning.split(":")[0] for warning in session.warnings] == [f"{dying.id} inference", f"{dying.id} training"]
    ((verb, *folders, _, store),) = merged
    assert verb == "merge" and store == "history.sqlite"
    assert folders == [str(tmp_path / combos[1].id / name / "junit") for name in ("inference", "training")]
    timings = [json.loads(line) for line in (tmp_path / TIMING_FILE).read_text().splitlines()]
    assert [line.get("combo") for line in timings] == [dying.id, combos[1].id, None]
    assert timings[-1]["merged_cells"] == 2


def test_a_cell_counted_as_running_is_one_the_driver_does_not_skip():
    """matrix/atlas.py will_run mirrors suites/run/driver.py skip_reason at the atlas's options on every atlas cell."""
    import transformers

    from matrix.atlas import will_run
    from matrix.cells import expand
    from matrix.shapes import DEFAULT_SHAPES
    from suites.run.driver import RunOptions, skip_reason

    config = load_atlas_config()
    for selection in config.selections:
        cells = expand(selection.models, selection.variants, selection.dtypes, "2,3,4", shapes=",".join(DEFAULT_SHAPES))
        for cell in cells:
            runs = skip_reason(cell, RunOptions()) is None and cell.model.expansion_error is None
            assert will_run(cell, transformers.__version__) == runs, cell.id


def cells_junit(folder: Path, cells: list[tuple[str, int, float]], skipped: tuple[str, int] | None = None) -> None:
    """A `nox -s matrix` results folder's JUnit: each cell (variant, tp, seconds) with the properties it records."""
    folder.mkdir(parents=True)

    def case(variant: str, tp: int, seconds: float, inner: str = "") -> str:
        names = {"cell.variant": variant, "cell.dtype": "fp32", "cell.tp": str(tp), "outcome": "pass"}
        properties = "".join(f'<property name="{name}" value="{value}"/>' for name, value in names.items())
        return f'<testcase name="c" time="{seconds}"><properties>{properties}</properties>{inner}</testcase>'

    cases = [case(*cell) for cell in cells] + ([case(*skipped, 0.001, "<skipped/>")] if skipped else [])
    (folder / "matrix.xml").write_text(f"<testsuites><testsuite>{''.join(cases)}</testsuite></testsuites>")


def test_warm_cells_recalibrate_the_per_cell_seconds_from_a_matrix_runs_junit_by_tp(tmp_path, combos):
    """`nox -s atlas -- --calibrate-cells RESULTS`: each tp's mean over its running cells, averaged over the atlas's
    tp sizes (tp 2 has twice the cells here and still weighs a third); CPU scaled alike; skips, training (no train
    cells ran) and the rest kept from before, and the source says which figures are new."""
    runs = [("eager", 2, 0.1), ("eager", 2, 0.3), ("eager", 2, 0.2), ("eager", 2, 0.2), ("eager", 3, 0.4)]
    cells_junit(tmp_path / "junit", [*runs, ("eager", 3, 0.2), ("eager", 4, 0.7)], skipped=("eager", 4))
    config = load_atlas_config()
    figures = warm_cell_figures(tmp_path, config.selections, config.tp, FIGURES)
    assert asdict(figures.selections["inference"]) == pytest.approx(
        asdict(SelectionCost(run_s=0.4, first_run_s=1.0, skip_s=0.01, run_cpu_s=0.8 * 0.4 / 0.5, first_run_cpu_s=1.5))
    )
    assert figures.selections["training"] == FIGURES.selections["training"]
    assert figures.selection_start_s == FIGURES.selection_start_s and figures.load == FIGURES.load
    assert "tp 2 0.200 s, tp 3 0.300 s, tp 4 0.700 s (7 cells)" in figures.source
    assert figures.source.endswith("the rest as in test")
    again = warm_cell_figures(tmp_path, config.selections, config.tp, figures)
    assert again.source == figures.source  # calibrated again: the new figures replace the old, never nest them
    assert str(tmp_path) not in figures.source  # the plan's words are read elsewhere: no host folder
    # the plan prices the atlas with them: each of the 500 running inference cells 0.1 s less once warm
    model = CostModel(figures, {"5.25.0": COUNTS}, "5.25.0", cores=2)
    before, after = MODEL.cells(combos[0], False), model.cells(combos[0], False)
    assert before.wall_s - after.wall_s == pytest.approx(500 * 0.1)
    assert model.cells(combos[0], True) == MODEL.cells(combos[0], True)


def test_warm_cells_refuse_a_folder_without_every_atlas_tp_or_without_cells(tmp_path):
    config = load_atlas_config()
    cells_junit(tmp_path / "a" / "junit", [("eager", 2, 0.1), ("eager", 3, 0.2)], skipped=("eager", 4))
    with pytest.raises(ValueError, match=r"a/junit: no running inference cell at tp 4; run `nox -s matrix -- --tp"):
        warm_cell_figures(tmp_path / "a", config.selections, config.tp, FIGURES)
    cells_junit(tmp_path / "b" / "junit", [("meta", 2, 0.1)])
    with pytest.raises(ValueError, match="no running cell of an atlas selection: inference"):
        warm_cell_figures(tmp_path / "b", config.selections, config.tp, FIGURES)
    with pytest.raises(ValueError, match="no JUnit file; give the results folder of a `nox -s matrix` run"):
        warm_cell_figures(tmp_path / "nowhere", config.selections, config.tp, FIGURES)
    (tmp_path / "c" / "junit").mkdir(parents=True)
    (tmp_path / "c" / "junit" / "matrix.xml").write_text('<testsuite><testcase name="x" time="1"/></testsuite>')
    with pytest.raises(ValueError, match=r"matrix.xml: test case 'x' is not a cell with its time"):
        warm_cell_figures(tmp_path / "c", config.selections, config.tp, FIGURES)


def test_the_slice_prunes_the_harness_cache_when_done_with_a_transformers_version_but_never_a_live_runs_entries(
    combos, tmp_path, monkeypatch
):
    """The harness cache's one bound (matrix/harness_cache.py, AUTOTP_CACHE_LIMIT): once the slice ran a transformers
    version's last combination, what its cells cached is evicted least recently used first, though it was used a
    moment ago; while a run beside the slice shares the cache (its lock under `.runs/`), nothing used since that run
    began is evicted; release data never is."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("AUTOTP_CACHE", str(cache))
    monkeypatch.setenv("AUTOTP_CACHE_LIMIT", "0")
    (cache / "releases").mkdir(parents=True)
    (cache / "releases" / "deepspeed.json").write_text("{}")
    first, second, third = combos[:3]
    assert first.transformers == second.transformers != third.transformers  # one version, then the next
    seen_by: dict[str, list[str]] = {}

    def run_suites(session, combo, selected, ahead, session_name):  # the cells cache a checkpoint and a reference
        (cache / "tiny" / f"{combo.id}-{session_name}").mkdir(parents=True, exist_ok=True)
        (cache / "tiny" / f"{combo.id}-{session_name}" / "model.safetensors").write_bytes(b"x" * 4096)
        (cache / "references").mkdir(exist_ok=True)
        (cache / "references" / f"{combo.id}-{session_name}.pt").write_bytes(b"x" * 4096)
        seen_by[combo.id] = sorted(str(entry.path.relative_to(cache)) for entry in cache_entries(cache))
        return Path("python"), ""

    def kept() -> list[str]:
        return sorted(str(entry.path.relative_to(cache)) for entry in cache_entries(cache))

    monkeypatch.setattr(atlas, "EnvironmentsAhead", NoBuilds)
    monkeypatch.setattr(atlas, "run_suites", run_suites)
    arguments = Namespace(results=str(tmp_path / "results"), keep_cache=False, no_merge=True, store="history.sqlite")
    atlas.run_slice(SliceSession(), load_atlas_config(), [first, second], arguments, [])
    assert any(first.id in name for name in seen_by[second.id])  # kept while its version ran
    assert kept() == []  # then evicted, the moment the version was done
    assert (cache / "releases" / "deepspeed.json").is_file()

    with live_run(cache):  # a run beside the slice, sharing its cache: what it uses meanwhile stays
        (cache / "references" / "beside.pt").write_bytes(b"x" * 4096)
        atlas.run_slice(SliceSession(), load_atlas_config(), [third], arguments, [])
        assert "references/beside.pt" in kept() and any(third.id in name for name in kept())
    arguments.keep_cache = True
    atlas.run_slice(SliceSession(), load_atlas_config(), [first], arguments, [])
    assert any(first.id in name for name in kept())  # --keep-cache: nothing evicted

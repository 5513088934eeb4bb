"""`nox -s atlas`'s plan: what the archive lacks, the cost model, the slices and their job matrix, the calibration
from a slice's timings; one slice's run going on past a combination whose suites die."""

from __future__ import annotations

import json
import os
from argparse import Namespace
from pathlib import Path

import pytest
from nox.command import CommandFailed

from matrix.atlas import CostFigures, SelectionCost, atlas_axes, atlas_combos, load_atlas_config
from matrix.versions import MAX_AGE_ENV, AxisValueError
from sessions import atlas
from sessions.atlas import (
    TIMING_FILE,
    ArchivedSession,
    CostModel,
    atlas_session_name,
    hours,
    junit_counts,
    measured_figures,
    missing_combos,
    newest_refs,
    plan_slices,
    plan_text,
    prune_transformers_cache,
)

FIXTURES = Path(__file__).parents[1] / "matrix" / "fixtures"
FIGURES = CostFigures(
    source="test",
    first_environment_s=100.0,
    environment_s=5.0,
    merge_cell_s=0.01,
    selections={"inference": SelectionCost(cell_s=0.5, first_cell_s=1.0), "training": SelectionCost(0.2, 0.3)},
)
MODEL = CostModel(FIGURES, {"inference": 600, "training": 200})


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


def test_the_cost_model_charges_the_first_environment_once_and_references_once_per_transformers(combos):
    same_transformers = combos[:2]  # 0.18.9 and 0.19.8 at 5.23.0
    cells = 600 * (1.0 + 0.01) + 200 * (0.3 + 0.01)  # first at this transformers
    warm = 600 * (0.5 + 0.01) + 200 * (0.2 + 0.01)
    assert MODEL.slice_s(same_transformers) == pytest.approx(100 + 5 + cells + warm)
    assert MODEL.slice_s(combos[::2]) == pytest.approx(100 + 2 * 5 + 3 * cells)  # three transformers versions
    assert MODEL.slice_s([]) == 0


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
        assert s.predicted_s == pytest.approx(MODEL.slice_s(s.combos))


def test_more_runners_finish_sooner_and_the_slowest_slice_is_balanced(combos):
    one = plan_slices(combos, 1, MODEL)[0].predicted_s
    two = plan_slices(combos, 2, MODEL)
    six = plan_slices(combos, 6, MODEL)
    assert max(s.predicted_s for s in six) < max(s.predicted_s for s in two) < one
    # three transformers versions on two runners: one runner takes two of them, the other one
    assert sorted(len(s.combos) for s in two) == [2, 4]


def test_zero_runners_is_refused(combos):
    with pytest.raises(AxisValueError, match="--plan 0"):
        plan_slices(combos, 0, MODEL)


def test_the_plan_states_cells_and_hours_on_one_and_on_n_runners(combos):
    slices = plan_slices(combos, 3, MODEL)
    text = "\n".join(plan_text(load_atlas_config(), combos, combos, slices, MODEL))
    assert "2 DeepSpeed (0.18.9, 0.19.8) × 3 transformers (5.23.0 … 5.25.0)" in text
    assert "600 inference + 200 training = 800 per version set" in text and "4,800 in the atlas" in text
    assert "environments: 6 combinations over 2 DeepSpeed layers" in text
    one = MODEL.slice_s(combos)
    assert f"predicted: {hours(one)} on 1 runner; {hours(max(s.predicted_s for s in slices))} on 3 runners" in text
    row = slices[0].job(MODEL.combination_cells)
    assert row == {
        "slice": "1/3",
        "combos": f"{combos[0].id},{combos[1].id}",
        "cells": 1600,
        "predicted_minutes": round(slices[0].predicted_s / 60, 1),
    }
    json.dumps(row)  # the workflow reads it as JSON


def timing(tmp_path: Path, lines: list[dict]) -> Path:
    path = tmp_path / TIMING_FILE
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_calibration_reads_a_slices_timings(tmp_path):
    path = timing(
        tmp_path,
        [
            {
                "combo": "a",
                "waited_s": 120.0,
                "first_transformers": True,
                "inference": {"seconds": 300.0, "cells": 600, "skipped": 10},
                "training": {"seconds": 60.0, "cells": 200, "skipped": 0},
            },
            {
                "combo": "b",
                "waited_s": 4.0,
                "first_transformers": False,
                "inference": {"seconds": 240.0, "cells": 600, "skipped": 10},
                "training": {"seconds": 50.0, "cells": 200, "skipped": 0},
            },
            {"merge_s": 16.0, "merged_cells": 1600, "wall_s": 800.0},
        ],
    )
    figures = measured_figures(path)
    assert (figures.first_environment_s, figures.environment_s, figures.merge_cell_s) == (120.0, 4.0, 0.01)
    assert figures.selections["inference"] == SelectionCost(cell_s=0.4, first_cell_s=0.5)
    assert figures.selections["training"] == SelectionCost(cell_s=0.25, first_cell_s=0.3)
    assert "a, b" in figures.source


def test_calibration_without_a_warm_combination_says_what_to_run(tmp_path):
    path = timing(
        tmp_path,
        [
            {"combo": "a", "waited_s": 1.0, "first_transformers": True, "inference": {"seconds": 1.0, "cells": 1}},
            {"merge_s": 1.0, "merged_cells": 1, "wall_s": 3.0},
        ],
    )
    with pytest.raises(ValueError, match="calibrate on 2 DeepSpeed × 1 transformers"):
        measured_figures(path)
    with pytest.raises(ValueError, match="give the --results folder"):
        measured_figures(tmp_path / "nowhere" / TIMING_FILE)


def test_junit_counts_cells_and_skips(tmp_path):
    (tmp_path / "a.xml").write_text(
        '<testsuite><testcase name="x"/><testcase name="y"><skipped/></testcase>'
        '<testcase name="z"><failure/></testcase></testsuite>'
    )
    assert junit_counts(tmp_path) == {"cells": 3, "skipped": 1}
    assert junit_counts(tmp_path / "missing") == {"cells": 0, "skipped": 0}


def test_a_transformers_versions_cache_is_freed_when_the_slice_is_done_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    old = 1_000_000.0

    def made(path: Path, content: str, when: float | None = None) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        if when is not None:
            os.utime(path, (when, when))
            os.utime(path.parent, (when, when))
        return path

    made(tmp_path / "tiny" / "llama-a" / "config.json", '{"transformers_version": "5.23.0"}')
    made(tmp_path / "tiny" / "llama-b" / "config.json", '{"transformers_version": "5.24.0"}')  # the next version's
    made(tmp_path / "tiny" / "qwen2-c" / "config.json", '{"transformers_version": "5.23.0"}', old)  # cached before
    made(tmp_path / "references" / "new.pt", "x" * 10)
    made(tmp_path / "references" / "older.pt", "x", old)
    made(tmp_path / "training" / "new.pt", "x" * 5)
    made(tmp_path / "releases" / "deepspeed.json", "{}")
    freed = prune_transformers_cache("5.23.0", since=old + 1)
    left = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*") if path.is_file())
    assert left == [
        "references/older.pt",
        "releases/deepspeed.json",
        "tiny/llama-b/config.json",
        "tiny/qwen2-c/config.json",
    ]
    assert freed == len('{"transformers_version": "5.23.0"}') + 10 + 5


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

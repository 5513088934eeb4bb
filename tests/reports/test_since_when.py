"""Since when, on the first night (reports/analysis/since_when.py, reports/search/since_when.py, `python -m reports
since-when`): a planted first night whose new causes' example cells were run at two earlier points, one per axis;
the report, report.json and the step summary read since when and the axis that moved from those results; the cost
cap bounds the cells and points a since-when run takes, and what it runs."""

import json
import shutil
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, render, section, write_junit

from matrix import releases
from matrix.earlier_points import EarlierPoint, earlier_points
from reports.__main__ import main
from reports.search import since_when as search_since_when
from reports.search.since_when import plan_since_when, run_since_when
from reports.store.records import CellKey

FIXTURES = Path(__file__).parents[1] / "matrix" / "fixtures"
LATEST = {"deepspeed": "0.19.8", "transformers": "5.25.0", "torch": "2.13.0"}
LLAMA = (
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (N… and N…) @ deepspeed/module_inject/layers.py:forward"
)
BLOOM = (
    "RuntimeError: The expanded size of the tensor (N) must match @ transformers/models/bloom/modeling_bloom.py:forward"
)


@pytest.fixture(autouse=True)
def no_step_summary_env(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture
def release_cache(tmp_path, monkeypatch):
    """PyPI release data recorded in tests/matrix/fixtures (DeepSpeed up to 0.19.8, transformers up to 5.25.0),
    as a previous online run leaves it; the network refused."""
    cache = tmp_path / "releases"
    cache.mkdir()
    for package in ("deepspeed", "transformers", "torch"):
        shutil.copy(FIXTURES / f"{package}.json", cache / f"{package}.json")
    monkeypatch.setenv(releases.CACHE_DIR_ENV, str(cache))

    def refuse(package):
        raise OSError(f"network disabled in tests (asked for {package})")

    monkeypatch.setattr(releases, "fetch_pypi_json", refuse)
    return cache


def first_night(junit: Path) -> None:
    """The first run at the latest versions: llama and bloom fail with a cause each, mistral passes."""
    write_junit(
        junit / "first.xml",
        [fail("llama", "forward", LLAMA), fail("bloom", "forward", BLOOM), Cell("mistral")],
        run_id="matrix@2026-12-07T03:00:00Z@vm",
        started="2026-12-07T03:00:00Z",
        deepspeed="0.19.8",
        transformers="5.25.0",
        torch="2.13.0+cpu",
    )


def earlier_points_run(junit: Path) -> None:
    """What `since-when` records: the two example cells at DeepSpeed 0.18.9 (llama works, bloom fails the same way)
    and at transformers 4.57.6 (llama fails the same way, bloom works), the other axis at the latest versions."""
    for name, started, ds, tf, cells in (
        ("ds.xml", "2026-12-07T04:00:00Z", "0.18.9", "5.25.0", [Cell("llama"), fail("bloom", "forward", BLOOM)]),
        ("tf.xml", "2026-12-07T04:10:00Z", "0.19.8", "4.57.6", [fail("llama", "forward", LLAMA), Cell("bloom")]),
    ):
        write_junit(
            junit / name,
            cells,
            run_id=f"since-when@{started}@vm",
            started=started,
            deepspeed=ds,
            transformers=tf,
            torch="2.13.0+cpu",
        )


def causes_by_cell(out: Path) -> dict[str, dict]:
    data = json.loads((out / "report.json").read_text())["failing_now"]
    return {cause["repro"]["cell"]: cause for cause in data["causes"]} | {"": data}


def test_the_first_night_names_since_when_with_both_axes_and_its_cost_bound(tmp_path):
    junit = tmp_path / "junit"
    first_night(junit)
    out = render(junit, tmp_path)
    text = " ".join(section((out / "report.md").read_text(), "Failing now, by cause"))
    assert "This is the first run in this history" in text
    assert "`nox -s since-when` runs each new cause's example cell at a few earlier releases of each axis" in text
    assert "the last transformers of the previous major: at most 4 more environments and 64 cell runs" in text
    assert "`--axis transformers`" in text  # not DeepSpeed only
    summary = (out / "step-summary.md").read_text()
    assert "| not known yet |" in summary


def test_two_earlier_points_say_since_when_and_the_axis_that_moved(tmp_path):
    junit = tmp_path / "junit"
    first_night(junit)
    earlier_points_run(junit)
    out = render(junit, tmp_path)
    causes = causes_by_cell(out)
    llama, bloom = causes["llama-eager-fp32-tp2"], causes["bloom-eager-fp32-tp2"]
    assert llama["since"]["text"] == (
        "works at DeepSpeed 0.18.9; fails from DeepSpeed 0.19.8, the next release tried; fails at every point tried: "
        "transformers 4.57.6"
    )
    assert llama["since"]["moved"] == ["deepspeed"]
    assert bloom["since"]["text"] == (
        "works at transformers 4.57.6; fails from transformers 5.25.0, the next release tried; fails at every point "
        "tried: DeepSpeed 0.18.9"
    )
    assert bloom["since"]["moved"] == ["transformers"]
    report = (out / "report.md").read_text()
    assert "This is the first run in this history" not in report
    lines = section(report, "Failing now, by cause")
    moved = next(line for line in lines if line.startswith("The axis that moved"))
    assert "DeepSpeed for 1 cause" in moved and "transformers for 1 cause" in moved and "`nox -s triage`" in moved
    assert any(
        "works at transformers 4.57.6; fails from transformers 5.25.0, the next release tried" in line for line in lines
    )
    summary = (out / "step-summary.md").read_text()
    assert "| works at DeepSpeed 0.18.9; fails from DeepSpeed 0.19.8, the next release tried; fails at every" in summary
    assert "The axis that moved" in summary
    assert len(summary.splitlines()) <= 40


def test_a_point_the_cell_fails_otherwise_is_not_taken_for_the_cause(tmp_path):
    junit = tmp_path / "junit"
    first_night(junit)
    write_junit(
        junit / "tf.xml",
        [fail("llama", "setup", "ValueError: unknown model type @ suites/run/driver.py:build"), Cell("bloom")],
        run_id="since-when@2026-12-07T04:10:00Z@vm",
        started="2026-12-07T04:10:00Z",
        deepspeed="0.19.8",
        transformers="4.57.6",
        torch="2.13.0+cpu",
    )
    causes = causes_by_cell(render(junit, tmp_path))
    assert causes["llama-eager-fp32-tp2"]["since"]["text"] == (
        "not comparable at transformers 4.57.6 (another failure or no verdict)"
    )
    assert causes["llama-eager-fp32-tp2"]["since"]["moved"] == []


# ---- The cost cap ---------------------------------------------------------------------------------------------------


def test_earlier_points_alternate_the_axes_and_stop_at_the_cap(release_cache):
    assert earlier_points(LATEST) == [
        EarlierPoint("deepspeed", "0.18.9"),
        EarlierPoint("transformers", "4.57.6"),
        EarlierPoint("deepspeed", "0.17.6"),
        EarlierPoint("deepspeed", "0.16.9"),
    ]
    assert earlier_points(LATEST, max_points=2) == [
        EarlierPoint("deepspeed", "0.18.9"),
        EarlierPoint("transformers", "4.57.6"),
    ]
    # transformers 4.x as the latest: no earlier major to try there
    assert [p.axis for p in earlier_points({**LATEST, "transformers": "4.57.6"}, deepspeed_minors=1)] == ["deepspeed"]


def test_the_plan_and_the_run_keep_to_the_cap(tmp_path, monkeypatch):
    examples = [CellKey(f"m{n}", "eager", "fp32", 2) for n in range(5)] + [CellKey("m9", "eager", "fp32", 3)]
    points = [EarlierPoint("deepspeed", "0.18.9"), EarlierPoint("transformers", "4.57.6")]
    plan = plan_since_when(examples, points, LATEST, max_cells=3)
    assert plan.cells == tuple(examples[:3]) and plan.left_out == tuple(examples[3:])
    assert plan.cell_runs == 6
    cost = plan.cost_text(tmp_path)
    assert cost.startswith("3 example cells (3 more new causes over the cap, not tried) × 2 points (deepspeed 0.18.9")
    assert "= 6 cell runs; 2 environments, 2 to build (ds0.18.9-tf5.25.0-pt2.13.0, ds0.19.8-tf4.57.6-pt2.13.0)" in cost

    built, commands = [], []
    monkeypatch.setattr(
        search_since_when, "ensure_environment", lambda root, spec, log: built.append(spec.key) or Path("python")
    )
    monkeypatch.setattr(search_since_when, "environment_variables", lambda python: {})
    monkeypatch.setattr(search_since_when.subprocess, "run", lambda argv, **kwargs: commands.append(argv))
    runs = run_since_when(plan, tmp_path, tmp_path / "results", 60.0, log=lambda line: None)
    assert built == ["ds0.18.9-tf5.25.0-pt2.13.0", "ds0.19.8-tf4.57.6-pt2.13.0"]
    assert [run.point for run in runs] == points
    selected = [argv[argv.index("--models") + 1] for argv in commands]
    assert selected == ["m0.stress,m1.stress,m2.stress"] * 2  # only the capped cells, once per point
    assert all(argv[argv.index("--tp") + 1] == "2" and "since-when" in argv for argv in commands)


def test_since_when_runs_nothing_where_the_history_already_says_it(tmp_path, release_cache, capsys):
    junit = tmp_path / "junit"
    first_night(junit)
    earlier_points_run(junit)
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(["since-when", "--store", str(store), "--plan"]) == 0
    assert "has runs at more than one version set" in capsys.readouterr().out


def test_since_when_prints_its_capped_cost_first(tmp_path, release_cache, capsys):
    junit = tmp_path / "junit"
    first_night(junit)
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    capsys.readouterr()
    args = ["since-when", "--store", str(store), "--env-root", str(tmp_path / "envs"), "--plan"]
    assert main([*args, "--max-cells", "1", "--max-points", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(
        "since-when: 1 example cells (1 more new causes over the cap, not tried) × 2 points (deepspeed 0.18.9, "
        "transformers 4.57.6) = 2 cell runs; 2 environments, 2 to build"
    ), printed


# ---- Links to the run (the nightly's step summary and drafts) -------------------------------------------------------


def test_the_step_summary_and_drafts_link_the_run_by_validated_variables():
    from reports import ReportsError
    from reports.outputs.markdown import actions_run_url, found_by

    actions = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/autotp", "GITHUB_RUN_ID": "42"}
    url = actions_run_url(actions)
    assert url == "https://github.com/o/autotp/actions/runs/42"
    assert "(https://github.com/o/autotp/actions/runs/42)" in found_by(url)[0]
    assert actions_run_url({}) == "" and found_by("") == []
    with pytest.raises(ReportsError, match="GITHUB_SERVER_URL"):
        actions_run_url({**actions, "GITHUB_SERVER_URL": "javascript:alert(1)//"})


# ---- One family name (DeepSpeed's) in the supported-models page ---------------------------------------------------


def test_supported_models_names_each_family_as_deepspeeds_page_does_everywhere(tmp_path):
    junit = tmp_path / "junit"
    write_junit(
        junit / "run.xml",
        [
            fail("gpt_bigcode.faithful", "forward", checkpoints=("bigcode/gpt_bigcode-santacoder",)),
            Cell("gpt_neox.faithful", checkpoints=("EleutherAI/pythia-70m",)),
            Cell("llama"),
            Cell("llama_large"),
        ],
        run_id="matrix@2026-12-07T03:00:00Z@vm",
        started="2026-12-07T03:00:00Z",
        deepspeed="0.19.8",
        transformers="5.25.0",
    )
    page = (render(junit, tmp_path) / "supported-models.md").read_text()
    assert "- starcode — fails" in page and "`bigcode/gpt_bigcode-santacoder` (starcode, faithful shapes)" in page
    assert "`EleutherAI/pythia-70m` (gpt-neox, faithful shapes)" in page
    assert "(gpt_bigcode," not in page and "(gpt_neox," not in page  # the entries' own names only in cell ids
    assert "- llama (llama_large) architecture under stress shapes" in page

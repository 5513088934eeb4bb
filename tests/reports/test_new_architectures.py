"""The report lists the architectures a transformers release brought (what `nox -s coverage` ran at the newest release
it covered and not at the previous one) with their first verdicts; runs of other sessions (a selection of models) say
nothing about which architectures a release has."""

from __future__ import annotations

import json

from reports.outputs.model import read_report
from tests.reports.reports_testkit import Cell, fail, render, section, write_junit

TITLE = "New architectures since the previous transformers release"
DEEPSEEK_V4 = (
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (Nx2N and Nx2N) @ "
    "deepspeed/module_inject/layers.py:forward"
)


def known(tps=(2, 3)) -> list[Cell]:
    """Architectures every covered release has: one passing, one failing."""
    return [Cell("llama.faithful", tp=tp) for tp in tps] + [
        fail("opt.faithful", "forward", "ValueError: opt broke", tp=tp) for tp in tps
    ]


def test_the_architectures_a_release_brought_are_listed_with_their_first_verdicts(tmp_path):
    junit = tmp_path / "junit"
    write_junit(junit / "c1.xml", known(), run_id="coverage@1", started="2026-12-01T03:00:00", transformers="5.24.0")
    write_junit(
        junit / "c2.xml",
        [
            *known(),
            *[fail("deepseek_v4.faithful", "forward", DEEPSEEK_V4, tp=tp) for tp in (2, 3)],
            Cell("dory.faithful", "skip"),
        ],
        run_id="coverage@2",
        started="2026-12-05T03:00:00",
        transformers="5.25.0",
    )
    # a later coverage run at the same release: the first verdicts stay the earliest ones
    write_junit(
        junit / "c3.xml",
        [*known(), *[Cell("deepseek_v4.faithful", tp=tp) for tp in (2, 3)]],
        run_id="coverage@3",
        started="2026-12-06T03:00:00",
        transformers="5.25.0",
    )
    # runs of a selection: a newer transformers and an architecture coverage never ran are no new architectures
    write_junit(
        junit / "m1.xml", [Cell("mistral")], run_id="matrix@1", started="2026-12-06T04:00:00", transformers="5.25.0"
    )
    write_junit(
        junit / "m2.xml", [Cell("gpt2")], run_id="matrix@2", started="2026-12-07T04:00:00", transformers="5.26.0"
    )
    out = render(junit, tmp_path)

    lines = section((out / "report.md").read_text(), TITLE)
    assert lines == [
        "2 architectures new in transformers 5.25.0 (`nox -s coverage` at 5.25.0 against 5.24.0), first verdicts:",
        f"- deepseek_v4 — deepseek_v4.faithful eager fp32 tp2/3: forward `{DEEPSEEK_V4}`",
        "- dory — dory.faithful eager fp32 tp2: skip",
    ]
    assert section((out / "step-summary.md").read_text(), TITLE) == lines  # the nightly's first screen
    html = (out / "report.html").read_text()
    assert "deepseek_v4 — deepseek_v4.faithful eager fp32 tp2/3: forward <code>RuntimeError: mat1" in html
    entry = json.loads((out / "report.json").read_text())["new_architectures"]
    assert (entry["release"], entry["previous"]) == ("5.25.0", "5.24.0")
    assert [a["name"] for a in entry["architectures"]] == ["deepseek_v4", "dory"]
    assert read_report(out).new_architectures.architectures[1].verdicts[0].outcome == "skip"
    assert [v["cell"] for v in entry["architectures"][0]["verdicts"]] == [
        "deepseek_v4.faithful-eager-fp32-tp2",
        "deepseek_v4.faithful-eager-fp32-tp3",
    ]


def test_without_coverage_at_two_releases_there_is_nothing_to_compare(tmp_path):
    junit = tmp_path / "junit"
    write_junit(junit / "c1.xml", known(), run_id="coverage@1", started="2026-12-01T03:00:00", transformers="5.24.0")
    write_junit(junit / "m1.xml", known(), run_id="matrix@1", started="2026-12-02T03:00:00", transformers="5.25.0")
    out = render(junit, tmp_path)
    assert section((out / "report.md").read_text(), TITLE) == [
        "`nox -s coverage` has run only at transformers 5.24.0: no earlier release to compare with."
    ]


def test_a_release_that_brought_no_architecture_says_so(tmp_path):
    junit = tmp_path / "junit"
    write_junit(junit / "c1.xml", known(), run_id="coverage@1", started="2026-12-01T03:00:00", transformers="5.24.0")
    write_junit(
        junit / "c2.xml", known((2,)), run_id="coverage@2", started="2026-12-05T03:00:00", transformers="5.25.0"
    )
    out = render(junit, tmp_path)
    assert section((out / "report.md").read_text(), TITLE) == [
        "No architectures new in transformers 5.25.0 (`nox -s coverage` at 5.25.0 against 5.24.0)."
    ]


def test_a_history_without_coverage_runs_has_no_such_section(tmp_path):
    junit = tmp_path / "junit"
    write_junit(junit / "m1.xml", known(), run_id="matrix@1", started="2026-12-01T03:00:00", transformers="5.24.0")
    write_junit(junit / "m2.xml", known(), run_id="matrix@2", started="2026-12-02T03:00:00", transformers="5.25.0")
    out = render(junit, tmp_path)
    assert f"## {TITLE}" not in (out / "report.md").read_text()
    assert 'id="new-architectures"' not in (out / "report.html").read_text()
    assert json.loads((out / "report.json").read_text())["new_architectures"] == {
        "release": "",
        "previous": "",
        "architectures": [],
    }

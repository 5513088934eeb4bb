"""Since when, from a real `nox -s since-when` run (tests/reports/fixtures/since_when_run/): the JUnit the default
matrix's nightly wrote for phi3 and bloom at tp 2 (and a passing llama), and the JUnit `since-when` wrote when it ran
those two example cells at DeepSpeed 0.18.9 and at transformers 4.57.6 (2026-12-07, DeepSpeed 0.19.8, transformers
5.25.0, this CPU machine). bloom works at transformers 4.57.6; phi3 fails the same way at both points.

- the report, report.json, the step summary and the draft say "works at X; fails from Y" for the axis that moved;
- a since-when run is never compared: not a session of "Since the previous run" or of the step summary, not a side of
  the gate, not in the PR comment, even where its points differ (bloom passes at one, fails at the other)."""

import json
import re
from pathlib import Path

import pytest
from reports_testkit import section

from reports.__main__ import main
from reports.outputs.draft_issue import installed_transformers

RUN = Path(__file__).parent / "fixtures" / "since_when_run"
NIGHTLY = "matrix@2026-12-07T06:51:08Z@vm"
NEXT_NIGHTLY = "matrix@2026-12-08T06:51:08Z@vm"
SINCE_WHEN = ("since-when@2026-12-07T08:09:01Z@vm", "since-when@2026-12-07T08:10:04Z@vm")


@pytest.fixture(autouse=True)
def no_step_summary_env(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def latest_transformers() -> str:
    """The transformers the tests' environment has: the nightly's 5.25.0 is read as it, so render writes the drafts
    (their tiny configs come from the installed config classes)."""
    return installed_transformers() or "5.25.0"


def real_history(junit: Path, *, next_night: bool = False) -> Path:
    """The real JUnit files, the nightly's at the installed transformers; with `next_night`, the same nightly again a
    day later (the next night of the same session)."""
    junit.mkdir(parents=True)
    latest = f'name="version.transformers" value="{latest_transformers()}"'
    for path in RUN.glob("*.xml"):
        text = path.read_text(encoding="utf-8").replace('name="version.transformers" value="5.25.0"', latest)
        (junit / path.name).write_text(text, encoding="utf-8")
    if next_night:
        nightly = (junit / "matrix.xml").read_text(encoding="utf-8")
        (junit / "matrix-next.xml").write_text(
            nightly.replace("2026-12-07T06:51:08", "2026-12-08T06:51:08").replace(
                "2026-12-07T06:46:05", "2026-12-08T06:46:05"
            ),
            encoding="utf-8",
        )
    return junit


def merged(tmp_path: Path, *, next_night: bool = False) -> Path:
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(real_history(tmp_path / "junit", next_night=next_night)), "--store", str(store)]) == 0
    return store


def rendered(tmp_path: Path, *, next_night: bool = False) -> Path:
    out = tmp_path / "out"
    assert main(["render", "--store", str(merged(tmp_path, next_night=next_night)), "--out", str(out)]) == 0
    return out


def test_a_real_since_when_run_says_works_at_and_fails_from_in_every_output(tmp_path):
    out = rendered(tmp_path)
    latest = latest_transformers()
    bloom_since = (
        f"works at transformers 4.57.6; fails from transformers {latest}, the next release tried; "
        "fails at every point tried: DeepSpeed 0.18.9"
    )
    phi3_since = "fails at every point tried: DeepSpeed 0.18.9; transformers 4.57.6"
    causes = {c["repro"]["cell"]: c for c in json.loads((out / "report.json").read_text())["failing_now"]["causes"]}
    assert causes["bloom.faithful-eager-fp32-tp2"]["since"]["text"] == bloom_since
    assert causes["bloom.faithful-eager-fp32-tp2"]["since"]["moved"] == ["transformers"]
    assert causes["phi3.faithful-eager-fp32-tp2"]["since"]["text"] == phi3_since
    report = (out / "report.md").read_text()
    assert "since the first run" not in report and "This is the first run in this history" not in report
    assert any(bloom_since in line for line in section(report, "Failing now, by cause"))
    summary = (out / "step-summary.md").read_text()
    assert f"| {bloom_since} | `bloom.faithful-eager-fp32-tp2` |" in summary
    assert f"| {phi3_since} | `phi3.faithful-eager-fp32-tp2` |" in summary
    drafts = {path.name: path.read_text() for path in (out / "draft-issue").glob("*.md")}
    bloom = next(text for text in drafts.values() if "BloomForCausalLM" in text.splitlines()[0])
    regression = bloom.split("**Regression?**\n\n", 1)[1].split("\n", 1)[0]
    assert regression == f"{bloom_since[:1].upper()}{bloom_since[1:]}."
    assert all("since the first run" not in text.lower() for text in drafts.values())


def test_a_since_when_run_is_no_sessions_previous_run_in_the_report_or_the_step_summary(tmp_path):
    """At its two points bloom fails then passes: compared, that would read "1 fix" (it was, before this test)."""
    out = rendered(tmp_path, next_night=True)
    since = section((out / "report.md").read_text(), "Since the previous run of each session")
    assert since[0] == "2 cells still failing in 2 causes.", since
    assert f"- `matrix`: run `{NIGHTLY}` → `{NEXT_NIGHTLY}`: no version changed" in since
    assert not any("since-when" in line for line in since), since
    summary = (out / "step-summary.md").read_text()
    line = next(line for line in summary.splitlines() if line.startswith("- Since the previous trusted run"))
    assert line == "- Since the previous trusted run: 2 cells still failing in 2 causes.", line
    data = json.loads((out / "report.json").read_text())["since_previous_run"]
    assert [s["session"] for s in data["sessions"]] == ["matrix"]
    assert data["counts"]["fixed"] == {"cells": 0, "causes": 0}


def test_a_since_when_run_is_never_a_side_of_the_gate(tmp_path, capsys):
    store = merged(tmp_path, next_night=True)
    capsys.readouterr()
    # the candidate by version set: the since-when point at DeepSpeed 0.19.8 (bloom passes there) is not in it
    assert main(["gate", "--store", str(store), "--baseline", NIGHTLY, "--candidate", "deepspeed=0.19.8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\b0 fixed\b", out) and "since-when" not in out, out
    # the baseline by version set: only since-when ran DeepSpeed 0.18.9, so nothing is a baseline there
    assert main(["gate", "--store", str(store), "--baseline", "deepspeed=0.18.9", "--candidate", NEXT_NIGHTLY]) == 2
    err = capsys.readouterr().err
    assert "--baseline 'deepspeed=0.18.9' matches no stored run" in err and "deepspeed 0.18.9" not in err, err


def test_a_since_when_run_is_neither_compared_nor_posted_by_publish(tmp_path, capsys):
    store, out = merged(tmp_path, next_night=True), tmp_path / "out"
    assert main(["publish", "--store", str(store), "--out", str(out)]) == 0
    comment = (out / "publish" / "comment.md").read_text()
    assert "since-when" not in comment and "2 still failing, 0 fixed, 0 flaky" in comment, comment
    assert f"(run `{NEXT_NIGHTLY}`; base: `matrix` last nightly `{NIGHTLY}`)" in comment, comment
    assert not list((out / "publish").glob("issues/*.md"))
    capsys.readouterr()
    assert main(["publish", "--store", str(store), "--out", str(out), "--session", "since-when"]) == 2
    assert "--session since-when: its runs are earlier points" in capsys.readouterr().err

"""A run with a remedy (a patched DeepSpeed, a workaround's arguments: matrix/remedies.py `remedied`) is never the
state of DeepSpeed: the store gives no reader its results (reports/store `HistoryStore.aggregates`/`observations`),
so render, drafts, since-when, bisect, triage, gate and publish describe the runs without remedies, and a remedy's
effect is said only by its verified result. The door never archives one, wherever its file was found."""

import shutil
from pathlib import Path

from matrix.remedies import WITHOUT_SESSION, remedied
from reports.__main__ import main
from reports.store import HistoryStore
from tests.reports.reports_testkit import Cell, fail, section, write_junit

REMEDY_STORE = Path(__file__).parent / "fixtures" / "remedy-store"  # real `nox -s remedy` runs (fixtures/README.md)
PATCHED = "remedy-ctrl-attention-dense-row-parallel@2026-12-07T13:49:38Z@vm"
CTRL_CELLS = [f"ctrl.faithful-eager-fp32-tp{tp}" for tp in (2, 3, 4)]


def test_render_describes_the_release_not_the_patched_deepspeed_run_after_it(tmp_path, capsys):
    """The real runs of `nox -s remedy -- --cause ctrl.faithful` merged as a nightly merges an artifact folder (one
    `merge` of the results folder, no --untrusted): the patched DeepSpeed's run started last, at a commit of its own,
    and every ctrl cell passes there; the report still says the release's verdicts, with the patch's proof."""
    results = shutil.copytree(REMEDY_STORE, tmp_path / "results")
    store, archive, out = tmp_path / "history.sqlite", tmp_path / "archive", tmp_path / "out"
    assert main(["merge", str(results), "--store", str(store), "--archive", str(archive)]) == 0
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1].startswith(
        "3 cells fail in 1 cause (1 new) at deepspeed 0.19.8, transformers 5.25.0, torch 2.13.0+cpu"
    )
    report = (out / "report.md").read_text()
    (cause,) = [line for line in section(report, "Failing now, by cause") if line.startswith("1. ")]
    assert "ctrl.faithful tp2/3/4" in cause
    assert "verified: 3 of 3 cells pass with this proposed DeepSpeed change" in cause  # the remedy's verdict
    assert "fdc16ad" not in report and PATCHED not in report  # the patched commit and run are named nowhere
    assert "remedy-ctrl" not in (out / "report.json").read_text() + (out / "report-details.json").read_text()
    supported = (out / "supported-models.md").read_text()
    assert "- llama — works at tp 2, 3, 4" in supported and "ctrl — works" not in supported
    # Not archived although merged as trusted: a rebuilt store (render --history) never holds it either.
    assert [path.name for path in archive.rglob("*") if PATCHED.split("@")[0] in path.name] == []
    with HistoryStore(store, create=False, read_only=True) as history:
        assert {run.run_id: run.trusted for run in history.runs() if run.remedied} == {PATCHED: False}
        observed = history.observations()
    assert {obs.run.session for obs in observed} == {WITHOUT_SESSION}  # gate, publish, drafts, bisect, triage
    assert {obs.cell.id: obs.result.outcome for obs in observed if obs.cell.model == "ctrl.faithful"} == dict.fromkeys(
        CTRL_CELLS, "fail"
    )


def test_a_workaround_run_at_the_releases_versions_is_no_verdict_of_the_release(tmp_path):
    """A workaround runs the release itself, so its run is at the release run's very point (same versions, same
    harness): its passing cells must neither make the release's failures flaky nor be its newest verdict."""
    release = dict(deepspeed="0.19.8", transformers="5.25.0", harness_git="f6e84297")
    cells = [fail("ctrl.faithful", "forward", "RuntimeError: mat1 and mat2 shapes", tp=tp) for tp in (2, 3)]
    write_junit(
        tmp_path / "junit" / "without.xml",
        [*cells, Cell("llama.faithful")],
        run_id=f"{WITHOUT_SESSION}@2026-12-07T10:00:00Z@vm",
        started="2026-12-07T10:00:00Z",
        **release,
    )
    write_junit(
        tmp_path / "junit" / "workaround.xml",
        [Cell("ctrl.faithful", tp=tp) for tp in (2, 3)],
        run_id="remedy-ctrl-row-parallel-policy@2026-12-07T11:00:00Z@vm",
        started="2026-12-07T11:00:00Z",
        **release,
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    with HistoryStore(store, create=False, read_only=True) as history:
        aggregates = history.aggregates()
    ctrl = [group for group in aggregates.groups if group.cell.model == "ctrl.faithful"]
    assert sorted((group.cell.tp, group.outcome, group.count) for group in ctrl) == [(2, "fail", 1), (3, "fail", 1)]
    assert {obs.run.session for obs in aggregates.recent} == {WITHOUT_SESSION}
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "ctrl.faithful tp2/3" in "\n".join(section(report, "Failing now, by cause"))
    assert "flaky" not in "\n".join(section(report, "Failing now, by cause"))


def test_only_the_runs_with_a_remedy_are_remedied():
    assert not remedied(WITHOUT_SESSION) and not remedied("nightly") and not remedied("matrix")
    assert remedied("remedy-ctrl-row-parallel-policy") and remedied("remedy-fused-experts-split+moe-router-kept-whole")
    assert remedied("remedy-fused-experts-split")  # a stack's runs without its own patch: still a patched DeepSpeed

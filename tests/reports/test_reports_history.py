import json
from dataclasses import asdict, replace

from reports_testkit import Cell, fail, render, section

from matrix.json_records import read_record, write_record
from reports.analysis.answers import EntryStatus, TransitionEntry
from reports.analysis.history import analyse
from reports.outputs.model import read_report
from reports.outputs.report_parts import FlakyEntry, HarnessChangeEntry
from reports.search.triage import open_transitions
from reports.store.records import Bisection, CellKey, CellResult, Commit, Observation, Run, TriageAttempt, Versions


def regressions(markdown: str) -> list[str]:
    """The titles of the root causes listed as regressions."""
    lines = section(markdown, "Root causes")
    listed = lines[lines.index(next(line for line in lines if line.startswith("### Regressions"))) + 1 :]
    return [
        line
        for line in listed[: next((i for i, line in enumerate(listed) if line.startswith("###")), None)]
        if line[:1].isdigit()
    ]


def test_report_lists_transitions_flaky_cells_and_matrix(scenario, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = render(scenario, tmp_path)
    report = (out / "report.md").read_text()

    assert "Latest versions: deepspeed 0.11.0, transformers 4.45.0, torch 2.4.0, python 3.11.7." in report
    assert "| llama | ❌ shard 0.5 |" in report and "| bloom | ✅ |" in report and "| qwen2 | ❌ setup |" in report
    assert "6 architectures, 6 cells at these versions:" in report  # counts per outcome class, pass first
    assert "| pass | 3 | 3 |\n| numerics | 1 | 1 |\n| setup | 1 | 1 |\n| shard | 1 | 1 |" in report
    assert section(report, "Root causes") == [
        "4 root causes over 4 transitions. A range is last good → first bad (regressions) or last bad → first good "
        "(fixes) along one axis; the other axes are held at the latest versions (deepspeed 0.11.0, transformers "
        '4.45.0, torch 2.4.0, python 3.11.7) unless a cause says "at …".',
        "### Regressions: 2 causes, 2 cells",
        "1. shard: init_inference fails to shard it `AssertionError: heads % tp != N` — deepspeed 0.10.0 → 0.10.1 "
        "at transformers 4.44.0 — 1 cell: eager fp32: llama tp2",
        "   - answer: not yet triaged",
        "2. setup: setup failure `ImportError: cannot import name X` — transformers 4.44.0 → 4.45.0 — 1 cell: "
        "eager fp32: qwen2 tp2",
        "   - answer: not yet triaged",
        "### Fixes: 1 cause, 1 cell",
        "1. forward: the sharded model raises ForwardError `ForwardError: broken` — deepspeed 0.9.5 → 0.10.0 "
        "at transformers 4.44.0 — 1 cell: eager fp32: gpt-neox tp2",
        "   - answer: not yet triaged",
        "### Failure-class changes: 1 cause, 1 cell",
        "1. shard → numerics: logits differ from the unsharded model `logits_max_rel N > N` — deepspeed 0.10.0 → "
        "0.10.1 at transformers 4.44.0 — 1 cell: eager fp32: opt tp2",
        "   - answer: not yet triaged",
    ]
    # "at transformers 4.44.0" is the typed pins of the model that differ from the latest versions, read back too
    assert [c.elsewhere for c in read_report(out).root_causes] == [
        ((("transformers", "4.44.0"),),),
        (),
        ((("transformers", "4.44.0"),),),
        ((("transformers", "4.44.0"),),),
    ]
    assert section(report, "Details: every transition")[1:-1] == [  # inside <details>: one answer line each
        "- llama tp2 eager fp32: broke at deepspeed 0.10.0 → 0.10.1 (not yet triaged), shard: AssertionError: "
        "heads % tp != 0",
        "- qwen2 tp2 eager fp32: broke at transformers 4.44.0 → 4.45.0 (not yet triaged), setup: ImportError: "
        "cannot import name X",
        "- gpt-neox tp2 eager fp32: fixed at deepspeed 0.9.5 → 0.10.0 (not yet triaged), was forward: "
        "ForwardError: broken",
        "- opt tp2 eager fp32: failure class changed at deepspeed 0.10.0 → 0.10.1: shard → numerics: logits_max_rel "
        "0.3 > 0.01 (not yet triaged)",
    ]
    # bloom is flaky at 0.10.0 (pass on one runner, fail on another) and passes either side: no transition.
    # falcon is skipped at 0.10.0: skips are not failures.
    assert section(report, "Flaky cells") == [
        "- bloom-eager-fp32-tp2 at deepspeed 0.10.0, transformers 4.44.0, torch 2.4.0, python 3.11.7: "
        "1 pass / 1 fail (forward: RuntimeError: NCCL timeout)",
    ]

    data = read_report(out)
    assert [t.cell.id for t in data.regressions] == ["llama-eager-fp32-tp2", "qwen2-eager-fp32-tp2"]
    supported = data.supported_models
    assert (supported.levels["works"], supported.levels["fails"]) == (("bloom", "falcon", "gpt-neox"), ("llama", "opt"))
    assert supported.not_tested == ("qwen2",)  # it fails in setup: the harness failed, nothing is known of AutoTP
    assert data.timeline.cells[3].statuses == ("pass", "pass", "fail", "fail", "fail")
    assert data.timeline.cells[3].key_metric == (1e-6, 2e-6, 0.5, 0.5, 0.5)
    changed = {cell.cell.id: cell.changed for cell in data.timeline.cells}
    assert changed["bloom-eager-fp32-tp2"] and not changed["falcon-eager-fp32-tp2"]  # flaky is a change, a skip none

    summary = (out / "step-summary.md").read_text()
    assert summary.startswith("## AutoTP matrix — ✅ 3 pass, ❌ 3 fail\n")
    # The first screen only: the counts, what changed since the previous trusted run, a row per cause
    assert "- No session has a previous trusted run to compare with." in summary  # each ran once
    assert "## Details" not in summary and "| model |" not in summary and "## Root causes" not in summary


def test_step_summary_goes_to_github_when_set(session, tmp_path, monkeypatch):
    github_summary = tmp_path / "github-summary.md"
    github_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(github_summary))
    session([Cell("llama")])
    out = render(tmp_path / "junit", tmp_path)
    assert github_summary.read_text().startswith("earlier step\n## AutoTP matrix — ✅ 1 pass")
    assert not (out / "step-summary.md").exists()


def test_versions_are_ordered_as_releases_not_strings(session, tmp_path):
    # Imported out of order, and "0.10.0" < "0.9.0" as strings: the break must still be 0.9.0 → 0.10.0.
    session([fail("llama", "shard")], deepspeed="0.10.0")
    session([Cell("llama")], deepspeed="0.9.0")
    session([Cell("llama")], deepspeed="0.8.1")
    out = render(tmp_path / "junit", tmp_path)
    assert regressions((out / "report.md").read_text()) == [
        "1. shard: init_inference fails to shard it `ShardError: broken` — deepspeed 0.9.0 → 0.10.0 — 1 cell: "
        "eager fp32: llama tp2"
    ]


def test_mixed_outcomes_at_different_versions_are_not_flaky(session, tmp_path):
    session([Cell("llama"), Cell("opt", tp=4)], torch="2.3.1")
    session([fail("llama", "memory"), Cell("opt", "skip", tp=4)], torch="2.4.0")
    report = (render(tmp_path / "junit", tmp_path) / "report.md").read_text()
    assert section(report, "Flaky cells") == ["None."]
    assert regressions(report) == [
        "1. memory: weights are split unevenly `MemoryError: broken` — torch 2.3.1 → 2.4.0 — 1 cell: "
        "eager fp32: llama tp2"
    ]
    assert "| llama | ❌ memory | — |" in report and "| opt | — | ⏭️ |" in report


def test_a_release_is_one_version_set_whatever_harness_commit_recorded_it(session, tmp_path):
    # Old files stamped the harness's HEAD as deepspeed_git; new ones keep it apart as run.harness_git.
    session([Cell("llama")], deepspeed="0.19.8", deepspeed_git="b9b025f", harness_git=None)
    session([fail("llama", "shard")], deepspeed="0.19.8", deepspeed_git="c0ffee1", harness_git="c0ffee1" + "0" * 33)
    session([Cell("llama")], deepspeed="0.19.8", harness_git="d" * 40 + "-dirty")
    out = render(tmp_path / "junit", tmp_path)
    report, data = (out / "report.md").read_text(), read_report(out)
    assert data.timeline.version_sets == ("deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7",)
    assert data.latest_versions.deepspeed_git == ""
    assert data.regressions == data.fixes == data.class_changes == () and data.root_causes == ()
    assert section(report, "Flaky cells") == [  # one version set: pass and fail there are flakiness
        "- llama-eager-fp32-tp2 at deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7: "
        "2 pass / 1 fail (shard: ShardError: broken)"
    ]
    assert (
        "Latest versions: deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7 "
        "(harness c0ffee1000, dddddddddd-dirty)."
    ) in report
    assert data.latest_harness == ["c0ffee1" + "0" * 33, "d" * 40 + "-dirty"]
    assert "harness c0ffee1000, dddddddddd-dirty" in (out / "report.html").read_text()


def test_labels_that_are_not_releases_come_after_the_releases(session, tmp_path):
    # Install failures at git refs record the ref (matrix.version_axes.Pin.label) where no version exists.
    session([fail("llama", "install", "pip failed")], deepspeed="pr/1234", started="2025-01-01T00:00:00Z")
    session([Cell("llama")], deepspeed="0.19.8", started="2025-01-02T00:00:00Z")
    session([fail("llama", "install", "pip failed")], deepspeed="master", started="2025-01-03T00:00:00Z")
    session([Cell("llama")], deepspeed="0.19.7", started="2025-01-04T00:00:00Z")
    session([Cell("llama")], transformers="main", started="2025-01-05T00:00:00Z")
    out = render(tmp_path / "junit", tmp_path)
    data = read_report(out)
    assert [label.split(",")[:2] for label in data.timeline.version_sets] == [
        ["deepspeed 0.14.2", " transformers main"],
        ["deepspeed 0.19.7", " transformers 4.44.0"],
        ["deepspeed 0.19.8", " transformers 4.44.0"],
        ["deepspeed pr/1234", " transformers 4.44.0"],  # first seen first, after every release
        ["deepspeed master", " transformers 4.44.0"],
    ]
    assert regressions((out / "report.md").read_text()) == [
        "1. install: install failure `pip failed` — deepspeed 0.19.8 → pr/1234 — 1 cell: eager fp32: llama tp2"
    ]


# ---- an answer is attached only to the transition it proved (reports.analysis.history.answer_for) --------------------

LLAMA = CellKey("llama", "eager", "fp32", 2)
HELD = (("transformers", "5.24.0"), ("torch", "2.13.0"))


def observations(points: list[tuple[str, str, str]], harness: str = "") -> list[Observation]:
    """llama tp2 at each (deepspeed, deepspeed_git, failure class or "" for a pass), one run a day."""
    found = []
    for n, (deepspeed, deepspeed_git, failure_class) in enumerate(points, start=1):
        run = Run(
            f"r{n}",
            "nightly",
            "runner-1",
            f"2026-01-{n:02d}T00:00:00Z",
            "cpu",
            "gloo",
            Versions(deepspeed, "5.24.0", "2.13.0+cpu", "3.11.7", deepspeed_git),
            harness,
        )
        outcome = "fail" if failure_class else "pass"
        found.append(
            Observation(
                CellResult(
                    run.run_id,
                    LLAMA,
                    outcome,
                    failure_class,
                    f"{failure_class.title()}Error: N" if failure_class else "",
                ),
                run,
            )
        )
    return found


def answer(before: str, after: str, failure_class: str, kind: str, **fields) -> Bisection:
    mode = "fixed" if kind == "fixed" else "broken"
    return Bisection(
        LLAMA,
        mode,
        "deepspeed",
        before,
        after,
        HELD,
        failure_class,
        f"{failure_class.title()}Error: N",
        kind=kind,
        recorded_at=fields.pop("recorded_at", "2026-02-01T00:00:00+00:00"),
        **fields,
    )


# pass, shard, pass, numerics: broke 0.16.4 → 0.17.0 (shard), fixed 0.17.0 → 0.18.0, broke 0.18.0 → 0.19.0 (numerics)
TWO_BREAKS = [("0.16.4", "", ""), ("0.17.0", "", "shard"), ("0.18.0", "", ""), ("0.19.0", "", "numerics")]


def attached(points, bisections) -> dict[tuple[str, str, str], Bisection | None]:
    """(kind, before, after) of each transition -> its answer."""
    history = analyse(observations(points), None, bisections)
    return {(t.kind, t.before.deepspeed, t.after.deepspeed): t.bisection for t in history.transitions}


def test_a_commit_answer_attaches_only_to_the_range_its_search_ran_over():
    commit_only = answer(
        "a" * 40, "b" * 40, "shard", "broke", commit="b" * 40, searched_older="v0.16.4", searched_newer="v0.17.0"
    )
    found = attached(TWO_BREAKS, [commit_only])
    assert found[("broke", "0.16.4", "0.17.0")] == commit_only
    # It was attached to every later broken transition of the cell and axis before (its ends are no releases).
    assert found[("broke", "0.18.0", "0.19.0")] is None
    assert found[("fixed", "0.17.0", "0.18.0")] is None
    # Searched over a wider range than the transition's: it proves nothing about this one.
    wider = answer("a" * 40, "b" * 40, "shard", "broke", searched_older="v0.15.0", searched_newer="v0.17.0")
    assert attached(TWO_BREAKS, [wider])[("broke", "0.16.4", "0.17.0")] is None
    # Recorded before the range was kept: it cannot be placed, so it answers nothing.
    legacy = answer("a" * 40, "b" * 40, "shard", "")
    assert set(attached(TWO_BREAKS, [legacy]).values()) == {None}
    # Between two builds from git the commits themselves are the range's ends.
    git_built = [("0.18.1+aaaaaaa", "a" * 40, ""), ("0.18.1+bbbbbbb", "b" * 40, "shard")]
    between = answer("a" * 40, "b" * 40, "shard", "broke", searched_older="a" * 10, searched_newer="b" * 40)
    assert list(attached(git_built, [between]).values()) == [between]
    elsewhere = replace(between, searched_newer="c" * 40)
    assert list(attached(git_built, [elsewhere]).values()) == [None]


def test_an_answer_of_another_kind_or_failure_class_is_not_attached():
    right = answer("0.18.5", "0.18.6", "numerics", "broke")
    other_kind = answer("0.18.5", "0.18.6", "numerics", "class-change", recorded_at="2026-02-02T00:00:00+00:00")
    other_class = answer("0.18.5", "0.18.6", "shard", "broke", recorded_at="2026-02-03T00:00:00+00:00")
    # The two wrong ones are newer: the newest answer inside the range used to win whatever it was about.
    assert attached(TWO_BREAKS, [right, other_kind, other_class])[("broke", "0.18.0", "0.19.0")] == right
    assert attached(TWO_BREAKS, [other_kind, other_class])[("broke", "0.18.0", "0.19.0")] is None
    # A fix answer is keyed on the failure that went away: shard, at the fix 0.17.0 → 0.18.0.
    fix = answer("0.17.2", "0.17.3", "shard", "fixed")
    assert attached(TWO_BREAKS, [fix])[("fixed", "0.17.0", "0.18.0")] == fix
    assert attached(TWO_BREAKS, [replace(fix, failure_class="numerics")])[("fixed", "0.17.0", "0.18.0")] is None
    # Stored before kinds were kept: the mode says it, the class and range still have to match.
    legacy = replace(right, kind="")
    assert attached(TWO_BREAKS, [legacy])[("broke", "0.18.0", "0.19.0")] == legacy
    assert attached(TWO_BREAKS, [replace(legacy, failure_class="shard")])[("broke", "0.18.0", "0.19.0")] is None


def test_triage_asks_again_about_transitions_a_wrong_answer_used_to_close():
    commit_only = answer(
        "a" * 40, "b" * 40, "shard", "broke", commit="b" * 40, searched_older="v0.16.4", searched_newer="v0.17.0"
    )
    history = analyse(observations(TWO_BREAKS), None, [commit_only])
    assert [(t.kind, t.before.deepspeed) for t in open_transitions(history.transitions)] == [
        ("fixed", "0.17.0"),
        ("broke", "0.18.0"),
    ]


# ---- a verdict that changed with the harness commit ----------------------------------------------------------------


def test_a_verdict_that_changed_with_the_harness_is_shown_as_a_harness_change(session, tmp_path):
    old, fix, later = ("a" * 40, "b" * 40, "c" * 40)
    session([Cell("llama")], deepspeed="0.19.7", harness_git=old)
    session([Cell("llama")], deepspeed="0.19.8", harness_git=old)
    session([Cell("llama")], deepspeed="0.19.8", harness_git=old)
    session([fail("llama", "numerics")], deepspeed="0.19.8", harness_git=fix)  # the harness fix: a false pass
    session([fail("llama", "numerics")], deepspeed="0.19.9", harness_git=later)
    out = render(tmp_path / "junit", tmp_path)
    report, data = (out / "report.md").read_text(), read_report(out)
    # Neither flaky at 0.19.8 nor broken by a DeepSpeed release: 0.19.7 and 0.19.8 pass under the old harness,
    # 0.19.8 and 0.19.9 fail under the new one.
    assert section(report, "Flaky cells") == ["None."] and data.flaky == ()
    assert data.regressions == data.fixes == data.class_changes == ()
    assert section(report, "Harness changes")[1:] == [
        "- llama-eager-fp32-tp2 at deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7: "
        "pass ×2 at harness aaaaaaaaaa → fail ×1 at harness bbbbbbbbbb"
    ]
    assert data.harness_changes[0].before_status.status == "pass"
    assert report.count("| llama | ❌ numerics |") == 2  # 0.19.9 and 0.19.8: the newer harness's verdict there
    assert (
        "<li>llama-eager-fp32-tp2 at deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7: pass ×2 at "
        "harness aaaaaaaaaa → fail ×1 at harness bbbbbbbbbb</li>"
    ) in (out / "report.html").read_text()


def test_a_library_change_measured_by_another_harness_commit_is_still_a_transition(session, tmp_path):
    # The verdict differs between harness commits only across versions, and alternates at one version: the
    # harness explains nothing there (flaky), and 0.19.7 → 0.19.9 is a release transition as before.
    session([Cell("llama")], deepspeed="0.19.7", harness_git="a" * 40)
    session([Cell("llama")], deepspeed="0.19.8", harness_git="a" * 40)
    session([fail("llama", "numerics")], deepspeed="0.19.8", harness_git="b" * 40)
    session([Cell("llama")], deepspeed="0.19.8", harness_git="c" * 40)
    session([fail("llama", "numerics")], deepspeed="0.19.9", harness_git="d" * 40)
    data = read_report(render(tmp_path / "junit", tmp_path))
    assert data.harness_changes == () and [e.cell for e in data.flaky] == ["llama-eager-fp32-tp2"]
    assert [(t.before, t.after) for t in data.regressions] == [("0.19.7", "0.19.9")]


def test_a_transition_reads_back_from_report_json_with_every_part():
    """report.json's form of a transition (write_record) read back (matrix.json_records.read_record, as
    read_report does) is the same entry: candidate commits with their files, a bisection with suspects and untestable
    commits,
    or the triage attempt that could not answer."""
    cell = CellKey("llama", "eager", "fp32", 2)
    pins = (("transformers", "5.24.0"), ("torch", "2.13.0"))
    commit = Commit("a" * 40, "Shard heads (#4321)", 4321, ("deepspeed/module_inject/auto_tp.py",), relevant=True)
    failing = EntryStatus("fail", 0, 2, 0, "shard", "AssertionError: heads", 0.5)
    passing = EntryStatus("pass", 2, 0, 0, "", "", None)
    bisection = Bisection(
        cell, "broken", "deepspeed", "0.19.7", "0.19.8", pins, "shard", "AssertionError: heads", files=("a.py",),
        untestable=("b" * 40,), suspects=(commit,), kind="broke",
    )  # fmt: skip
    attempt = TriageAttempt(cell, "deepspeed", "broken", "0.19.7", "0.19.8", pins, "every step untestable")
    answered = TransitionEntry(
        cell, "broke", "deepspeed", "0.19.7", "0.19.8", pins, passing, failing, (commit,), bisection, None
    )
    for entry in (answered, replace(answered, bisection=None, attempt=attempt)):
        assert read_record(TransitionEntry, json.loads(json.dumps(write_record(entry)))) == entry


def test_a_flaky_point_and_a_harness_change_read_back_from_report_json():
    """report.json's form of a flaky point (FlakyEntry.json) and of a harness change read back (as read_report does)
    are the same entries."""
    flaky = FlakyEntry(
        "llama-eager-fp32-tp2",
        Versions("0.19.8", "4.44.0", "2.4.0", "3.11.7", deepspeed_git="a" * 40),
        EntryStatus("flaky", 2, 1, 0, "forward", "RuntimeError: NCCL timeout", 0.25),
    )
    change = HarnessChangeEntry(
        "llama-eager-fp32-tp2",
        "deepspeed 0.19.8",
        "pass ×2 at harness aaaaaaaaaa → fail ×1 at harness bbbbbbbbbb",
        EntryStatus("pass", 2, 0, 0, "", "", None),
        EntryStatus("fail", 0, 1, 0, "numerics", "logits differ", None),
    )
    assert read_record(FlakyEntry, json.loads(json.dumps(write_record(flaky)))) == flaky
    assert read_record(HarnessChangeEntry, json.loads(json.dumps(asdict(change)))) == change

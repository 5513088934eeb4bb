import json

from reports_testkit import Cell, fail, render, section


def regressions(markdown: str) -> list[str]:
    """The titles of the root causes listed as regressions."""
    lines = section(markdown, "Root causes")
    listed = lines[lines.index(next(line for line in lines if line.startswith("### Regressions"))) + 1:]
    return [line for line in listed[:next((i for i, line in enumerate(listed) if line.startswith("###")), None)]
            if line[:1].isdigit()]


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
        "1. shard `AssertionError: heads % tp != N` — deepspeed 0.10.0 → 0.10.1 at transformers 4.44.0 — 1 cell: "
        "eager fp32: llama tp2",
        "   - answer: not yet triaged",
        "2. setup `ImportError: cannot import name X` — transformers 4.44.0 → 4.45.0 — 1 cell: eager fp32: qwen2 tp2",
        "   - answer: not yet triaged",
        "### Fixes: 1 cause, 1 cell",
        "1. forward `ForwardError: broken` — deepspeed 0.9.5 → 0.10.0 at transformers 4.44.0 — 1 cell: eager fp32: "
        "gpt-neox tp2",
        "   - answer: not yet triaged",
        "### Failure-class changes: 1 cause, 1 cell",
        "1. shard → numerics `logits_max_rel N > N` — deepspeed 0.10.0 → 0.10.1 at transformers 4.44.0 — 1 cell: "
        "eager fp32: opt tp2",
        "   - answer: not yet triaged",
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

    data = json.loads((out / "report.json").read_text())
    assert [t["cell"] for t in data["regressions"]] == ["llama-eager-fp32-tp2", "qwen2-eager-fp32-tp2"]
    supported = data["supported_models"]
    assert (supported["supported"], supported["unsupported"]) == (["bloom", "falcon", "gpt-neox"], ["llama", "opt"])
    assert supported["not_tested"] == ["qwen2"]  # it fails in setup: the harness failed, nothing is known of AutoTP
    assert data["timeline"]["cells"][3]["statuses"] == ["pass", "pass", "fail", "fail", "fail"]
    assert data["timeline"]["cells"][3]["key_metric"] == [1e-6, 2e-6, 0.5, 0.5, 0.5]
    changed = {cell["cell"]: cell["changed"] for cell in data["timeline"]["cells"]}
    assert changed["bloom-eager-fp32-tp2"] and not changed["falcon-eager-fp32-tp2"]  # flaky is a change, a skip none

    summary = (out / "step-summary.md").read_text()
    assert summary.startswith("## AutoTP matrix — ✅ 3 pass, ❌ 3 fail\n")
    assert section(summary, "Root causes") == section(report, "Root causes")
    assert "## Details" not in summary and "| model |" not in summary  # the first screen only


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
        "1. shard `ShardError: broken` — deepspeed 0.9.0 → 0.10.0 — 1 cell: eager fp32: llama tp2"]


def test_mixed_outcomes_at_different_versions_are_not_flaky(session, tmp_path):
    session([Cell("llama"), Cell("opt", tp=4)], torch="2.3.1")
    session([fail("llama", "memory"), Cell("opt", "skip", tp=4)], torch="2.4.0")
    report = (render(tmp_path / "junit", tmp_path) / "report.md").read_text()
    assert section(report, "Flaky cells") == ["None."]
    assert regressions(report) == ["1. memory `MemoryError: broken` — torch 2.3.1 → 2.4.0 — 1 cell: eager fp32: llama tp2"]
    assert "| llama | ❌ memory | — |" in report and "| opt | — | ⏭️ |" in report


def test_a_release_is_one_version_set_whatever_harness_commit_recorded_it(session, tmp_path):
    # Old files stamped the harness's HEAD as deepspeed_git; new ones keep it apart as run.harness_git.
    session([Cell("llama")], deepspeed="0.19.8", deepspeed_git="b9b025f", harness_git=None)
    session([fail("llama", "shard")], deepspeed="0.19.8", deepspeed_git="c0ffee1", harness_git="c0ffee1" + "0" * 33)
    session([Cell("llama")], deepspeed="0.19.8", harness_git="d" * 40 + "-dirty")
    out = render(tmp_path / "junit", tmp_path)
    report, data = (out / "report.md").read_text(), json.loads((out / "report.json").read_text())
    assert data["timeline"]["version_sets"] == ["deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7"]
    assert data["latest_versions"]["deepspeed_git"] == ""
    assert data["regressions"] == data["fixes"] == data["class_changes"] == data["root_causes"] == []
    assert section(report, "Flaky cells") == [  # one version set: pass and fail there are flakiness
        "- llama-eager-fp32-tp2 at deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7: "
        "2 pass / 1 fail (shard: ShardError: broken)"]
    assert ("Latest versions: deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7 "
            "(harness c0ffee1000, dddddddddd-dirty).") in report
    assert data["latest_harness"] == ["c0ffee1" + "0" * 33, "d" * 40 + "-dirty"]
    assert "harness c0ffee1000, dddddddddd-dirty" in (out / "report.html").read_text()


def test_labels_that_are_not_releases_come_after_the_releases(session, tmp_path):
    # Install failures at git refs record the ref (matrix.versions.Pin.label) where no version exists.
    session([fail("llama", "install", "pip failed")], deepspeed="pr/1234", started="2025-01-01T00:00:00Z")
    session([Cell("llama")], deepspeed="0.19.8", started="2025-01-02T00:00:00Z")
    session([fail("llama", "install", "pip failed")], deepspeed="master", started="2025-01-03T00:00:00Z")
    session([Cell("llama")], deepspeed="0.19.7", started="2025-01-04T00:00:00Z")
    session([Cell("llama")], transformers="main", started="2025-01-05T00:00:00Z")
    out = render(tmp_path / "junit", tmp_path)
    data = json.loads((out / "report.json").read_text())
    assert [label.split(",")[:2] for label in data["timeline"]["version_sets"]] == [
        ["deepspeed 0.14.2", " transformers main"],
        ["deepspeed 0.19.7", " transformers 4.44.0"],
        ["deepspeed 0.19.8", " transformers 4.44.0"],
        ["deepspeed pr/1234", " transformers 4.44.0"],  # first seen first, after every release
        ["deepspeed master", " transformers 4.44.0"],
    ]
    assert regressions((out / "report.md").read_text()) == [
        "1. install `pip failed` — deepspeed 0.19.8 → pr/1234 — 1 cell: eager fp32: llama tp2"]

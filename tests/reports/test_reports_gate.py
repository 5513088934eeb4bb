from pathlib import Path

import pytest
from reports_testkit import Cell, fail

from reports.__main__ import main


@pytest.fixture
def store(scenario, tmp_path):
    path = tmp_path / "history.sqlite"
    assert main(["merge", str(scenario), "--store", str(path)]) == 0
    return path


def gate(store, capsys, *args):
    code = main(["gate", "--store", str(store), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_regression_blocks_and_known_failures_do_not(store, capsys):
    code, out, _ = gate(store, capsys, "--baseline", "deepspeed=0.10.0", "--candidate", "deepspeed=0.10.1")
    assert code == 1
    assert out.splitlines() == [
        "2 new failures, 0 already failing on the base, 0 flaky, 0 known; 0 fixed, 0 missing",
        "baseline deepspeed=0.10.0: 2 trusted run(s): session2@2025-01-02T00:00:00Z@runner-1, "
        "session3@2025-01-03T00:00:00Z@runner-1",
        "- new cause 0a3409902e38: numerics: logits differ from the unsharded model — "
        "The sharded model runs, but its outputs differ from the unsharded "
        "model's beyond rounding: a weight, bias or per-head tensor is split or joined the wrong way. — 1 cell: "
        "eager fp32: opt tp2 (the base fails another way: shard `ShardError: broken`)",
        "  - opt-eager-fp32-tp2: logits_max_rel 0.3 > 0.01",  # with its numbers: the cause masks them
        "- new cause 0fa092dc1df6: shard: init_inference fails to shard it — "
        "init_inference raises AssertionError while sharding the model: no sharded "
        "model to run. — 1 cell: eager fp32: llama tp2 (pass on the base)",
        "  - llama-eager-fp32-tp2: AssertionError: heads % tp != 0",
        "",
        "cell                  baseline  candidate        verdict",
        "--------------------  --------  ---------------  ---------------",
        "llama-eager-fp32-tp2  pass      1/1 runs failed  regression",
        "opt-eager-fp32-tp2    fail      1/1 runs failed  changed failure",
        "",
        "changed failures (baseline -> candidate):",
        "  opt-eager-fp32-tp2: shard: ShardError: broken -> numerics: logits_max_rel 0.3 > 0.01",
        "",
        "1 regression, 1 changed failure, 4 pass",
        "FAIL: 1 cell(s) pass in the baseline and failed in ≥1 candidate run(s)",
    ]


def test_a_failure_that_changed_class_is_reported_and_blocks_only_when_asked(tmp_path, session, capsys):
    # opt fails in both, first in shard, then with wrong numbers: not the same known failure.
    session([fail("opt", "shard")], deepspeed="0.10.0")
    session([fail("opt", "numerics", "logits_max_rel 0.3 > 0.01")], deepspeed="0.10.1")
    store = tmp_path / "changed.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    args = ("--baseline", "deepspeed=0.10.0", "--candidate", "deepspeed=0.10.1")
    code, out, _ = gate(store, capsys, *args)
    assert code == 0 and "opt-eager-fp32-tp2  fail      1/1 runs failed  changed failure" in out
    assert out.rstrip().endswith("(1 failure(s) changed; --block-changed makes that block)")
    code, out, _ = gate(store, capsys, *args, "--block-changed")
    assert code == 1 and "FAIL: 1 cell(s) fail in another class or signature (--block-changed)" in out


def test_only_known_failures_pass_the_gate(store, capsys):
    code, out, _ = gate(
        store,
        capsys,
        "--baseline",
        "deepspeed=0.10.1,transformers=4.44.0",
        "--candidate",
        "deepspeed=0.11.0,transformers=4.44.0",
    )
    assert code == 0
    assert "llama-eager-fp32-tp2  fail      1/1 runs failed  known" in out
    assert out.rstrip().endswith("OK: no cell that passes in the baseline fails in the candidate")


def test_confirmations_require_repeated_failures(store, capsys):
    # llama passes at 0.10.0 and fails in both 0.11.0 runs (transformers 4.44.0 and 4.45.0).
    args = ("--baseline", "deepspeed=0.10.0", "--candidate", "deepspeed=0.11.0")
    assert gate(store, capsys, *args, "--confirmations", "2")[0] == 1
    code, out, _ = gate(store, capsys, *args, "--confirmations", "3")
    assert code == 0
    assert "llama-eager-fp32-tp2  pass      2/2 runs failed  unconfirmed" in out


def test_run_ids_and_bad_selectors(store, capsys):
    run_id = "session1@2025-01-01T00:00:00Z@runner-1"
    code, out, _ = gate(store, capsys, "--baseline", run_id, "--candidate", run_id)
    assert code == 0 and "gpt-neox-eager-fp32-tp2  fail      1/1 runs failed  known" in out
    code, _, err = gate(store, capsys, "--baseline", "no-such-run", "--candidate", run_id)
    assert code == 2
    assert "--baseline 'no-such-run': no stored run has this id, and it is not a version set" in err
    code, _, err = gate(store, capsys, "--baseline", "deepspeed=9.9.9", "--candidate", run_id)
    assert code == 2 and "--baseline 'deepspeed=9.9.9' matches no stored run; stored version sets:" in err
    code, _, err = gate(store, capsys, "--baseline", "cuda=12.1", "--candidate", run_id)
    assert code == 2 and "'cuda=12.1' must be AXIS=VALUE with AXIS one of deepspeed, transformers" in err


def test_a_verdict_that_changed_with_the_harness_is_a_harness_change_not_a_flaky_baseline(tmp_path, session, capsys):
    old, fix, later = ("a" * 40, "b" * 40, "c" * 40)
    # llama: a harness fix turns a false pass into a fail at 0.19.8; bloom: one turns a false fail into a pass.
    session([Cell("llama"), Cell("bloom")], deepspeed="0.19.7", harness_git=old)
    session([Cell("llama"), fail("bloom", "shard")], deepspeed="0.19.8", harness_git=old)
    session([fail("llama", "numerics"), Cell("bloom")], deepspeed="0.19.8", harness_git=fix)
    session([fail("llama", "numerics"), fail("bloom", "shard")], deepspeed="0.19.9", harness_git=later)
    store = tmp_path / "harness.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    code, out, _ = gate(store, capsys, "--baseline", "deepspeed=0.19.8", "--candidate", "deepspeed=0.19.9")
    # The baseline is the newer harness's verdict: bloom passes there, so its failure now blocks.
    assert code == 1 and "baseline flaky" not in out
    assert "bloom-eager-fp32-tp2  pass      1/1 runs failed  regression" in out
    assert "llama-eager-fp32-tp2  fail      1/1 runs failed  known" in out
    assert out.splitlines()[
        out.splitlines().index(
            "baseline verdicts that changed with the harness commit at the same "
            "versions (a harness change, not flakiness; the newer harness's "
            "verdict is the baseline):"
        )
        + 1 :
    ][:2] == [
        "  bloom-eager-fp32-tp2: fail ×1 at harness aaaaaaaaaa → pass ×1 at harness bbbbbbbbbb",
        "  llama-eager-fp32-tp2: pass ×1 at harness aaaaaaaaaa → fail ×1 at harness bbbbbbbbbb",
    ]


MERGE_BASE, HEAD = "1" * 40, "2" * 40


def _base_and_head(session, tmp_path, capsys, head_cells, base_cells=None) -> Path:
    """The nightly of the merge base (trusted) and a pull request's run of its head (merged --untrusted)."""
    base_cells = base_cells or [
        Cell("llama"),
        Cell("qwen2"),
        Cell("bloom"),
        fail("opt", "shard"),
        fail("falcon", "numerics", "logits_max_rel 0.3 > 0.01"),
        fail("phi", "forward", "RuntimeError: shape '[2, 8]' is invalid"),
    ]
    session(base_cells, "nightly", deepspeed="0.19.8", deepspeed_git=MERGE_BASE[:7], session="nightly")
    session(head_cells, "pr", deepspeed="0.19.8", deepspeed_git=HEAD[:7], session="latest")
    store = tmp_path / "pr.sqlite"
    assert main(["merge", str(tmp_path / "nightly"), "--store", str(store)]) == 0
    assert main(["merge", "--untrusted", str(tmp_path / "pr"), "--store", str(store)]) == 0
    capsys.readouterr()
    return store


def test_a_candidate_that_skips_or_renames_baseline_cells_blocks(tmp_path, session, capsys):
    # The head skips qwen2, leaves bloom out and renames the failing opt and phi cells: nothing fails, yet the gate
    # never saw four cells the base has verdicts for.
    head_cells = [
        Cell("llama"),
        Cell("qwen2", "skip"),
        Cell("opt-renamed"),
        Cell("phi", tp=3),
        fail("falcon", "numerics", "logits_max_rel 0.3 > 0.01"),
    ]
    store = _base_and_head(session, tmp_path, capsys, head_cells)
    args = ("--head", HEAD, "--merge-base", MERGE_BASE)
    code, out, _ = gate(store, capsys, *args)
    assert code == 1
    assert out.splitlines()[0] == (
        f"As of {HEAD} with merge base {MERGE_BASE}: 0 new failures, 1 already failing on the base, 0 flaky, "
        "0 known; 0 fixed, 4 missing"
    )
    assert (
        "missing (a verdict on the base, none in the candidate: skipped, not run or renamed): "
        "eager fp32: bloom tp2, opt tp2, phi tp2, qwen2 tp2"
    ) in out
    assert "FAIL: 4 cell(s) with a verdict in the baseline have none in the candidate" in out
    code, out, _ = gate(store, capsys, *args, "--allow-missing")
    assert code == 0
    assert "missing (a verdict on the base, none in the candidate: skipped, not run or renamed; allowed by " in out
    # A release gate's selectors block the same way.
    code, out, _ = gate(
        store, capsys, "--baseline", f"deepspeed_git={MERGE_BASE[:7]}", "--candidate", f"deepspeed_git={HEAD[:7]}"
    )
    assert code == 1 and "4 missing" in out.splitlines()[0]


def test_a_pull_requests_check_needs_its_head_runs_and_a_trusted_run_of_its_merge_base(tmp_path, session, capsys):
    store = _base_and_head(session, tmp_path, capsys, [Cell("llama")], [Cell("llama")])
    code, _, err = gate(store, capsys, "--head", "3" * 40, "--merge-base", MERGE_BASE)
    assert code == 2 and f"--head {'3' * 40}: no stored run tested this commit" in err
    # The head's own (untrusted) run is never the base, though it names the commit.
    code, _, err = gate(store, capsys, "--head", HEAD, "--merge-base", HEAD)
    assert code == 2 and f"--merge-base {HEAD}: no trusted run tested this DeepSpeed commit" in err
    code, _, err = gate(store, capsys, "--head", HEAD[:7], "--merge-base", MERGE_BASE)
    assert code == 2 and "not a commit sha; pass all 40 hex digits" in err
    code, _, err = gate(store, capsys, "--head", HEAD, "--baseline", "deepspeed=0.19.8")
    assert code == 2 and "not a mix" in err
    code, out, _ = gate(store, capsys, "--head", HEAD, "--merge-base", MERGE_BASE)
    assert code == 0 and out.startswith(f"As of {HEAD} with merge base {MERGE_BASE}: 0 new failures")

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
        "- new cause 0a3409902e38: numerics: The sharded model runs, but its outputs differ from the unsharded "
        "model's beyond rounding: a weight, bias or per-head tensor is split or joined the wrong way. — 1 cell: "
        "eager fp32: opt tp2 (the base fails another way: shard `ShardError: broken`)",
        "- new cause 0fa092dc1df6: shard: init_inference raises AssertionError while sharding the model: no sharded "
        "model to run. — 1 cell: eager fp32: llama tp2 (pass on the base)",
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

"""`python -m reports draft-issue` (nox -s draft-issue): a bug report for DeepSpeed's tracker, ready to file."""

import json
import re

import pytest
from reports_testkit import BLOOM, Cell, fail, issue_18_store, write_junit

from reports.__main__ import main
from reports.store.records import Bisection, CellKey, CellResult, Run, Versions
from reports.store.history_store import HistoryStore


@pytest.fixture(autouse=True)
def no_step_summary_env(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def failing_causes(store, out):
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    return json.loads((out / "report.json").read_text())["failing_now"]["causes"]


def test_bloom_tp2_at_the_latest_versions_is_a_complete_report(tmp_path, capsys):
    store = issue_18_store(tmp_path)
    (bloom,) = failing_causes(store, tmp_path / "out")
    capsys.readouterr()
    assert main(["draft-issue", "--cause", bloom["id"], "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    file = tmp_path / "out" / "draft-issue" / f"forward-{bloom['id']}.md"
    assert printed.strip() == file.read_text().strip()
    title, body = file.read_text().split("\n\n", 1)
    assert title == (
        "# [BUG] AutoTP forward: RuntimeError: The expanded size of the tensor (N) must match the existing "
        "size (N) at non… (bloom tp2 and 2 more cells)"
    )
    sections = re.findall(r"^\*\*(.+?)\*\*", body, re.M)
    assert sections == [
        "Describe the bug",
        "To Reproduce",
        "Expected behavior",
        "Actual behavior",
        "First bad version",
        "System info",
        "Log excerpt",
    ]
    assert "on `bloom` at tp 2 (eager, fp32): the sharded model raised during forward, generate or the loss." in body
    assert (
        "3 cells of the autotp-matrix run at these versions fail with the same cause: eager fp32: bloom tp2/3/4."
        in body
    )
    script = re.search(r"```python\n(.*?)\n```", body, re.S)[1]
    compile(script, "repro_bloom-eager-fp32-tp2.py", "exec")  # the inlined script is whole Python
    assert (
        "'id': 'bloom-eager-fp32-tp2'" in script
        and "'command': 'deepspeed --num_gpus 2 repro_bloom-eager-fp32-tp2.py'" in script
    )
    assert script == (tmp_path / "out" / "draft-issue" / "repro_bloom-eager-fp32-tp2.py").read_text().rstrip("\n")
    assert "`nox -s repro -- --models bloom.stress --variants eager --dtypes fp32 --tp 2`" in body
    assert f"forward: `{' '.join(BLOOM.split())}`" in body
    assert "Since 2026-12-04 (session nightly); broke at transformers 5.23.0 → 5.24.0 (not yet triaged)." in body
    assert "- deepspeed: 0.19.8\n- transformers: 5.24.0\n- torch: 2.13.0+cpu\n- python: 3.11.7\n" in body
    assert body.rstrip().endswith(f"```text\nTraceback ...\n{BLOOM}\n```")


def test_the_first_bad_commit_and_the_known_issue_when_there_are_some(tmp_path, capsys):
    junit = tmp_path / "junit"
    write_junit(
        junit / "a.xml",
        [Cell("llama")],
        run_id="nightly@2026-12-01T00:00:00Z@vm",
        started="2026-12-01T00:00:00Z",
        deepspeed="0.19.7",
    )
    write_junit(
        junit / "b.xml",
        [
            fail(
                "llama",
                "numerics",
                "logits: max |dlogit| 0.31 > 0.0001",
                metrics={"logits_max_abs": 0.31, "time_load_s": 2.0},
            )
        ],
        run_id="nightly@2026-12-02T00:00:00Z@vm",
        started="2026-12-02T00:00:00Z",
        deepspeed="0.19.8",
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    with HistoryStore(store, create=False) as history:
        history.add_bisection(
            Bisection(
                CellKey("llama", "eager", "fp32", 2),
                "broken",
                "deepspeed",
                "0.19.7",
                "0.19.8",
                (("transformers", "4.44.0"), ("torch", "2.4.0")),
                "numerics",
                "logits: max |dlogit| N > N",
                commit="feed" * 10,
                subject="Change the all-reduce (#4321)",
                pr=4321,
                recorded_at="2026-12-03T00:00:00+00:00",
            )
        )
    registry = tmp_path / "known_failures.toml"
    registry.write_text(
        '[known_failures.allreduce]\nfailure_class = "numerics"\nsignature = "dlogit"\n'
        'upstream = "https://github.com/example/upstream/issues/3"\nnote = "a stand-in"\n'
    )
    assert (
        main(
            [
                "draft-issue",
                "--cell",
                "llama-eager-fp32-tp2",
                "--store",
                str(store),
                "--out",
                str(tmp_path / "out"),
                "--known-failures",
                str(registry),
            ]
        )
        == 0
    )
    body = capsys.readouterr().out
    assert (
        "> Already tracked upstream: [example/upstream#3](https://github.com/example/upstream/issues/3) (a stand-in)"
        in body
    )
    assert (
        "since deepspeed" not in body
        and "broke at deepspeed 0.19.7 → 0.19.8, first bad commit [feedfeedfe]"
        "(https://github.com/deepspeedai/DeepSpeed/commit/"
        + "feed" * 10
        + ') ([#4321](https://github.com/deepspeedai/DeepSpeed/pull/4321) "Change the all-reduce").'
    ) in body
    assert "- `logits_max_abs` = 0.31\n" in body and "time_load_s" not in body  # the check's numbers, not timings


def test_a_secret_in_the_log_never_reaches_the_report(tmp_path, monkeypatch, capsys):
    token = "hf_notarealtoken1234567"
    monkeypatch.setenv("HF_TOKEN", token)
    write_junit(
        tmp_path / "junit" / "a.xml",
        [fail("llama", "forward", f"OSError: bad credentials {token} @ x.py:f")],
        run_id="nightly@2026-12-01T00:00:00Z@vm",
        started="2026-12-01T00:00:00Z",
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    assert main(["draft-issue", "--cell", "llama-eager-fp32-tp2", "--store", str(store), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    written = next((tmp_path / "draft-issue").glob("forward-*.md")).read_text()
    assert "bad credentials ***" in printed and "bad credentials ***" in written
    assert token not in printed + written


@pytest.mark.parametrize(
    "cells, argument, message",
    [
        (
            [fail("llama", "setup", "ImportError: cannot import name X")],
            ["--cell", "llama-eager-fp32-tp2"],
            r"cause [0-9a-f]{12} is a setup failure \(the harness failed: .*\): the harness or its environment failed, not "
            "DeepSpeed; fix it here instead of filing it",
        ),
        (
            [fail("llama", "shard")],
            ["--cause", "123456789abc"],
            r"--cause 123456789abc: no cause failing at the latest versions has it; failing causes: [0-9a-f]{12} \(shard, 1 "
            r"cell, e.g. llama-eager-fp32-tp2\)",
        ),
        (
            [Cell("llama")],
            ["--cell", "llama-eager-fp32-tp2"],
            "--cell llama-eager-fp32-tp2: no cause failing at the latest versions has it; failing causes: none",
        ),
    ],
)
def test_what_cannot_be_drafted_is_refused_in_one_line(tmp_path, capsys, cells, argument, message):
    write_junit(
        tmp_path / "junit" / "a.xml", cells, run_id="nightly@2026-12-01T00:00:00Z@vm", started="2026-12-01T00:00:00Z"
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(["draft-issue", *argument, "--store", str(store), "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert re.fullmatch("error: " + message + r".*\n", error), error
    assert not (tmp_path / "draft-issue").exists()


def test_the_failure_with_its_numbers_and_a_traceback_without_the_runners_folders(tmp_path, capsys):
    run = Run(
        "nightly@2026-12-01T00:00:00Z@vm",
        "nightly",
        "vm",
        "2026-12-01T00:00:00Z",
        "cpu",
        "gloo",
        Versions("0.19.8", "5.24.0", "2.13.0+cpu", "3.11.7"),
    )
    frame = (
        '  File "/home/someone/.venvs/x/lib/python3.11/site-packages/transformers/models/bloom/modeling_bloom.py", '
        "line 271, in forward"
    )
    raised = "RuntimeError: The expanded size of the tensor (4) must match the existing size (8)"
    result = CellResult(
        run.run_id,
        CellKey("bloom", "eager", "fp32", 2),
        "fail",
        "forward",
        "RuntimeError: The expanded size of the tensor (N) must match the existing size (N) @ "
        "transformers/models/bloom/modeling_bloom.py:forward",
        f"Traceback (most recent call last):\n{frame}\n    scores = alibi.baddbmm(\n{raised}\n",
    )
    store = tmp_path / "history.sqlite"
    with HistoryStore(store, create=True) as history:
        history.import_runs([(run, [result])], source=tmp_path)
    assert main(["draft-issue", "--cell", "bloom-eager-fp32-tp2", "--store", str(store), "--out", str(tmp_path)]) == 0
    body = capsys.readouterr().out
    assert f"With its numbers: `{raised}`" in body
    assert '  File ".../site-packages/transformers/models/bloom/modeling_bloom.py", line 271, in forward' in body
    assert "/home/someone" not in body

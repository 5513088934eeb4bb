"""`python -m reports draft-issue` (nox -s draft-issue): a bug report for DeepSpeed's tracker, ready to file."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest
from reports_testkit import BLOOM, Cell, fail, issue_18_store, write_junit

from matrix.registry import load_models
from reports.__main__ import main
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey, CellResult, Run, Versions
from sessions.standalone import ranks_of, run_standalone


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
    # What a maintainer writes: [BUG], the mechanism in words, the class users load, tp sizes and versions; whole
    assert title == (
        "# [BUG] AutoTP: its forward fails on a tensor whose size the split changed (BloomForCausalLM, tp 2/3/4, "
        "DeepSpeed 0.19.8, transformers 5.24.0)"
    )
    sections = re.findall(r"^\*\*(.+?)\*\*", body, re.M)
    assert sections == [
        "Describe the bug",
        "To Reproduce",
        "Expected behavior",
        "Actual behavior",
        "Regression?",
        "ds_report output",
        "Log excerpt",
    ]
    assert (
        "on `BloomForCausalLM` at tp 2 (fp32): the sharded model raised during forward, generate or the loss." in body
    )
    assert (
        "The model is a tiny random bloom model with deliberately odd splits (the registry's stress shape: uneven "
        "grains, fewer kv heads than ranks); it stands for no real checkpoint. The same cause fails at: bloom tp 2, "
        "3, 4."
    ) in body
    # the minimal script is inlined, whole Python of at most 40 lines with no harness names; the full one attached
    script = re.search(r"```python\n(.*?)\n```", body, re.S)[1]
    compile(script, "autotp-bloom-tp2.py", "exec")
    assert len(script.splitlines()) <= 40 and "deepspeed.init_inference(" in script
    assert not re.search(r"autotp-matrix|stress|faithful|CELL|RESULT", script)
    assert script == (tmp_path / "out" / "draft-issue" / "autotp-bloom-tp2.py").read_text().rstrip("\n")
    assert "Save as `autotp-bloom-tp2.py` and run `LOCAL_SIZE=2 deepspeed --num_gpus 2 autotp-bloom-tp2.py`" in body
    assert "Attached: `autotp-bloom-tp2-full.py`" in body
    assert script_cell((tmp_path / "out" / "draft-issue" / "autotp-bloom-tp2-full.py").read_text())["tp"] == 2
    assert "nox -s" not in body and "autotp-matrix" not in body
    assert "the sharded forward raises: `RuntimeError: The expanded size of the tensor (N)" in body
    assert "Since 2026-12-04 (session nightly); broke at transformers 5.23.0 → 5.24.0 (not yet triaged)." in body
    assert (
        "```text\nDeepSpeed general environment info:\ntorch version .................... 2.13.0+cpu\n"
        "deepspeed info ................... 0.19.8, unknown, unknown\n"
        "accelerator ...................... cpu (backend gloo)\n```\n\n- transformers: 5.24.0\n- python: 3.11.7\n"
    ) in body
    assert body.rstrip().endswith(f"```text\nTraceback ...\n{BLOOM}\n```")


def faithful_store(tmp_path):
    """One run of faithful cells failing with one cause: ctrl (Salesforce/ctrl), phi3 (Phi-3-mini) and phimoe."""
    hub = {
        "ctrl": "Salesforce/ctrl",
        "phi3": "microsoft/Phi-3-mini-4k-instruct",
        "phimoe": "microsoft/Phi-3.5-MoE-instruct",
    }
    cells = [
        fail(f"{model}.faithful", "forward", MAT1, tp=tp, checkpoints=(hub[model],))
        for model in ("ctrl", "phi3", "phimoe")
        for tp in (2, 3, 4)
    ]
    write_junit(
        tmp_path / "junit" / "a.xml", cells, run_id="matrix@2026-12-06T00:00:00Z@vm", started="2026-12-06T00:00:00Z"
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    return store


MAT1 = (
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (48x768 and 384x768) @ "
    "deepspeed/module_inject/layers.py:forward"
)


def test_a_faithful_cell_gets_its_script_and_the_checkpoint_users_run_most(tmp_path, capsys):
    """Every default cell is faithful (`phi3.faithful`, registry key `phi3`): read through the one parser of cell
    ids, it gets its standalone script, which builds the faithful tiny config and can load the real checkpoint; the
    example is Phi-3-mini (ranked above CTRL and Phi-3.5-MoE in the registry's popularity order), named with its
    model card."""
    store = faithful_store(tmp_path)
    (cause,) = failing_causes(store, tmp_path / "out")
    assert cause["repro"]["cell"] == "phi3.faithful-eager-fp32-tp2"
    assert cause["repro"]["checkpoints"] == ["microsoft/Phi-3-mini-4k-instruct"]
    capsys.readouterr()
    assert main(["draft-issue", "--cause", cause["id"], "--store", str(store), "--out", str(tmp_path / "x")]) == 0
    text = capsys.readouterr().out
    title, body = text.split("\n\n", 1)
    assert title == (
        "# [BUG] AutoTP: a sharded layer gets an input of the wrong width (Phi3ForCausalLM, tp 2/3/4, DeepSpeed "
        "0.14.2, "
        "transformers 4.44.0)"
    )
    assert (
        "The model is a tiny random model that splits exactly like [microsoft/Phi-3-mini-4k-instruct]"
        "(https://huggingface.co/microsoft/Phi-3-mini-4k-instruct) at tp 2, 3 and 4"
    ) in body
    assert "The same cause fails at: ctrl tp 2, 3, 4; phi3 tp 2, 3, 4; phimoe tp 2, 3, 4." in body
    script = re.search(r"```python\n(.*?)\n```", body, re.S)[1]
    from matrix.cells import parse_cell

    faithful = parse_cell("phi3.faithful-eager-fp32-tp2").model
    assert faithful.tiny != load_models()["phi3"].tiny  # the faithful config, not the registry's, as a literal
    assert f"hidden_size={faithful.tiny['hidden_size']}," in script and "AutoConfig.for_model('phi3'," in script
    cell = script_cell((tmp_path / "x" / "draft-issue" / "autotp-phi3-tp2-full.py").read_text())
    assert cell["checkpoints"] == ["microsoft/Phi-3-mini-4k-instruct"] and cell["hub_id"] is None


def test_the_minimal_script_run_alone_raises_the_cells_own_line(tmp_path, capfd):
    """The phi3 cause's minimal script, run alone with the test environment's own `deepspeed` launcher at tp 2 (real
    ranks on CPU), raises the very line the cell recorded, its numbers included: it runs the cell's padded batch of two
    prompts first, as the cell's probes do (with one prompt only it raised 24x768 where the draft said 48x768)."""
    store = faithful_store(tmp_path)
    (cause,) = failing_causes(store, tmp_path / "out")
    assert main(["draft-issue", "--cause", cause["id"], "--store", str(store), "--out", str(tmp_path / "x")]) == 0
    capfd.readouterr()
    script = tmp_path / "x" / "draft-issue" / "autotp-phi3-tp2.py"
    said = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (48x768 and 384x768)"
    assert f"# the sharded forward above raises: {said}" in script.read_text()
    status = run_standalone(script, ranks_of(script), Path(sys.executable).parent / "deepspeed")
    printed = capfd.readouterr()
    assert status != 0 and f"[rank0]: {said}" in printed.out + printed.err


def script_cell(script: str) -> dict:
    """The CELL literal a repro script carries (every value it runs with)."""
    assignment = next(
        node
        for node in ast.parse(script).body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "CELL"
    )
    return ast.literal_eval(assignment.value)


def test_what_autotp_did_is_a_section_of_its_own_when_the_record_carries_it(tmp_path):
    """The draft's "What AutoTP did and where it broke" comes from a typed record (Diagnosis); none without one."""
    from reports.analysis import analyse
    from reports.outputs.diagnosis import Diagnosis
    from reports.outputs.draft_issue import draft_text
    from reports.outputs.model import build_report
    from reports.outputs.publish import inert
    from reports.store import aggregate

    store = faithful_store(tmp_path)
    with HistoryStore(store, create=False, read_only=True) as history_store:
        observations = history_store.observations()
    history = analyse(observations)
    report = build_report(history, aggregate(observations), None, {})
    (entry,) = report.failing_now.causes
    diagnosis = Diagnosis(
        mechanism="`self_attn.qkv_proj` sliced with the unsharded head count",
        policy=("Phi3DecoderLayer: self_attn.o_proj, mlp.down_proj",),
        replaced=("model.layers.*.self_attn.o_proj: Linear → LinearAllreduce (rank 0 holds 384 of 768 columns)",),
        left_whole=(),
        broke_at="model.layers.*.self_attn.o_proj (LinearAllreduce)",
        whose="AutoTP's: the unsharded model passes the same probes",
    )
    title, body = draft_text(
        entry, report, history, observations, folder=tmp_path / "d", inert=inert, diagnosis=diagnosis
    )
    assert title.startswith("[BUG] AutoTP: a sharded layer gets an input of the wrong width (Phi3ForCausalLM, tp 2/3/4")
    section = body.split("**What AutoTP did and where it broke**\n\n", 1)[1].split("**To Reproduce**", 1)[0]
    assert section.splitlines()[:2] == [
        "`self_attn.qkv_proj` sliced with the unsharded head count.",
        "Whose: AutoTP's: the unsharded model passes the same probes.",
    ]
    assert "- Phi3DecoderLayer: self_attn.o_proj, mlp.down_proj" in section
    assert "Where it broke: model.layers.*.self_attn.o_proj (LinearAllreduce)" in section
    _, plain = draft_text(entry, report, history, observations, folder=tmp_path / "d", inert=inert)
    assert "What AutoTP did" not in plain


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
            r"cause [0-9a-f]{12} is a setup failure \(the harness failed: .*\): the harness or its environment failed, "
            r"not "
            "DeepSpeed; fix it here instead of filing it",
        ),
        (
            [fail("llama", "shard")],
            ["--cause", "123456789abc"],
            r"--cause 123456789abc: no cause failing at the latest versions has it; failing causes: [0-9a-f]{12} "
            r"\(shard, 1 "
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
    assert f"the sharded forward raises: `{raised}`" in body
    assert '  File "transformers/models/bloom/modeling_bloom.py", line 271, in forward' in body
    assert "/home/someone" not in body


def test_a_user_sees_the_libraries_frames_only_with_paths_from_their_package():
    """The rank's traceback as a draft shows it: the harness's frames (the ones calling init_inference, and any of
    its own between DeepSpeed's, as a wrapper of `tp_parser` once was) dropped, site-packages prefixes cut to the
    package (`deepspeed/…`), other absolute paths to their file name, the harness's rank and `logs:` lines gone."""
    from reports.outputs.library_trace import library_trace

    env = "/work/envs/ds0.19.8-tf5.25.0-pt2.13.0/lib/python3.11/site-packages"
    message = "\n".join(
        [
            "rank 0 raised in shard (shard):",
            "Traceback (most recent call last):",
            '  File "/work/wt/x/suites/engine/cell_runner.py", line 219, in run_on_rank',
            "    engine, model = _shard(job, model, world_size)",
            f'  File "{env}/deepspeed/inference/engine.py", line 162, in __init__',
            "    parser_dict = AutoTP.tp_parser(model)",
            '  File "/work/wt/x/suites/checks/sharding.py", line 75, in tp_parser',
            "    policy = parse(model)",
            "             ^^^^^^^^^^^^",
            f'  File "{env}/deepspeed/module_inject/auto_tp.py", line 392, in tp_parser',
            "    if AutoTP.kernel_supported(module_list) else 'Not able'",
            "ValueError: Unsupported activation function: silu (config read from /home/someone/ckpt/config.json)",
            "",
            "logs: /work/wt/x/results/logs/jetmoe.faithful-eager-fp32-tp2",
        ]
    )
    trace = "\n".join(library_trace(message))
    assert trace == "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "deepspeed/inference/engine.py", line 162, in __init__',
            "    parser_dict = AutoTP.tp_parser(model)",
            '  File "deepspeed/module_inject/auto_tp.py", line 392, in tp_parser',
            "    if AutoTP.kernel_supported(module_list) else 'Not able'",
            "ValueError: Unsupported activation function: silu (config read from config.json)",
            "",
        ]
    )


SAVE_16BIT = "save: save_16bit_model: rank 0: model.layers.0.self_attn.q_proj.weight: shape"


def test_a_training_rows_draft_describes_training_and_attaches_its_training_script(tmp_path, capsys):
    """A training cause's draft says what the row asked of DeepSpeed (`deepspeed.initialize` with autotp_size, the
    row's steps), expects what training expects, and attaches the row's own script (its optimizer steps through
    `deepspeed.initialize`), saying what that script does not check; an inference script would reproduce nothing."""
    cells = [fail("llama", "numerics", SAVE_16BIT, variant="train_ckpt", tp=tp) for tp in (2, 3)]
    write_junit(
        tmp_path / "junit" / "a.xml", cells, run_id="matrix@2026-12-06T00:00:00Z@vm", started="2026-12-06T00:00:00Z"
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    (cause,) = failing_causes(store, tmp_path / "out")
    capsys.readouterr()
    assert main(["draft-issue", "--cause", cause["id"], "--store", str(store), "--out", str(tmp_path / "x")]) == 0
    body = capsys.readouterr().out.split("\n\n", 1)[1]
    assert (
        'AutoTP training (`deepspeed.initialize(model=model, config={"tensor_parallel": {"autotp_size": 2}, ...})`; '
        "2 steps, save_checkpoint + save_16bit_model"
    ) in body
    assert "init_inference" not in body and "```python" not in body and "logits" not in body.split("**Actual")[0]
    assert "a weight update or the saved, gathered or resumed weights differ from the same steps" in body
    assert "Attached: `autotp-llama-tp2-train_ckpt.py`, the same model and the same steps" in body
    assert "It compares losses only" not in body  # it judges what the cell judged (tests/suites/records)
    assert "the saved, gathered and loaded weights and the step after loading" in body
    assert "the saved, gathered and resumed weights match the same steps on the unsharded model" in body
    attached = script_cell((tmp_path / "x" / "draft-issue" / "autotp-llama-tp2-train_ckpt.py").read_text())
    assert attached["training"] and attached["tp"] == 2
    assert not list((tmp_path / "x" / "draft-issue").glob("autotp-llama-tp2.py"))  # no inference script beside it

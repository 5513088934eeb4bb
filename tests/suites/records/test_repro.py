"""Repro scripts (suites/records/repro.py) and redaction: the script builds the cell's own weights, loads
through the cell's load mode, fetches a hub checkpoint at the commit the cell loaded, and no secret reaches it."""

import json
import sys

import pytest
import torch

from matrix.cells import expand


def test_planted_token_never_reaches_records_or_repro(tmp_path, monkeypatch):
    from suites.records.repro import write_repro
    from suites.records.run_records import CellRecorder, RunInfo
    from suites.verdicts.outcome import failed

    token = "hf_plantedSecretValue123"
    monkeypatch.setenv("HF_TOKEN", token)
    cell = expand("llama", tp="2")[0]
    recorder = CellRecorder(tmp_path, RunInfo("unit"), {"deepspeed": "0.19.8"})
    properties = {}
    recorder.record(
        cell,
        failed("forward", f"OSError: 401 for token {token}", f"Authorization: Bearer {token}"),
        lambda key, value: properties.__setitem__(key, value),
    )
    write_repro(
        cell,
        "tiny",
        tmp_path / "repro",
        run=recorder.run,
        versions={"deepspeed": "0.19.8"},
        outcome_line=f"fail forward {token}",
    )
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file()) + json.dumps(properties)
    assert token not in written
    assert "***" in written


def _repro_module(cell, tmp_path, monkeypatch, checkpoints="tiny", loaded_revision=None):
    """The repro script written for `cell`, imported in this process (one rank, no process group)."""
    import importlib.util

    from suites.records.repro import write_repro
    from suites.records.run_records import RunInfo

    script = write_repro(
        cell,
        checkpoints,
        tmp_path / "repro",
        run=RunInfo("unit", accelerator="cpu", backend="gloo"),
        versions={"deepspeed": "0.19.8"},
        outcome_line="fail numerics",
        loaded_revision=loaded_revision,
    )
    spec = importlib.util.spec_from_file_location(f"repro_{cell.variant.name}_under_test", script)
    repro = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, repro)  # as `python script.py` has it: its dataclasses need it
    spec.loader.exec_module(repro)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.distributed, "barrier", lambda: None)
    return repro


def test_repro_script_builds_the_weights_of_the_cell_it_reproduces(tmp_path, monkeypatch):
    """The repro makes its tiny checkpoint itself; with other weights than the harness's (e.g. biases left
    at 0) it would say MATCH for a bias bug the harness reported."""
    from safetensors.torch import load_file

    from matrix.checkpoints import tiny_checkpoint

    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    cell = expand("qwen2", tp="2")[0]  # q/k/v biases
    folder = tmp_path / _repro_module(cell, tmp_path, monkeypatch).checkpoint_folder(None, None)
    built = load_file(folder / "model.safetensors")
    harness = load_file(tiny_checkpoint(cell.model) / "model.safetensors")
    assert built.keys() == harness.keys()
    assert all(torch.equal(built[name], harness[name]) for name in harness)


def test_meta_repro_loads_through_the_meta_path(tmp_path, monkeypatch):
    cell = expand("llama", "meta", tp="2")[0]
    repro = _repro_module(cell, tmp_path, monkeypatch)
    folder = repro.checkpoint_folder(None, None)
    model, options = repro.meta_model(folder)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    listed = json.loads((tmp_path / options["checkpoint"]).read_text())["checkpoints"]
    assert len(listed) >= 2 and all(name.endswith(".safetensors") for name in listed)  # split like the cell's


def test_hub_repro_fetches_the_commit_the_cell_loaded(tmp_path, monkeypatch):
    """A hub cell's repro pins the snapshot: the commit its record says it loaded, else the registry's pin;
    without it a later upload would change what the repro tests."""
    import dataclasses

    import huggingface_hub

    entry = expand("llama", tp="2")[0]
    pinned, loaded = "a" * 40, "b" * 40
    model = dataclasses.replace(entry.model, hub_ids=("org/llama-x",), revisions={"org/llama-x": pinned})
    cell = dataclasses.replace(entry, model=model)
    fetched = []
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, revision=None: fetched.append((repo_id, revision)) or "snap",
    )
    for loaded_revision, expected in ((loaded, loaded), (None, pinned)):
        repro = _repro_module(cell, tmp_path, monkeypatch, checkpoints="hub", loaded_revision=loaded_revision)
        assert repro.checkpoint_folder(repro.CELL["hub_id"], repro.CELL["revision"]) == "snap"
        assert fetched.pop() == ("org/llama-x", expected)


def test_a_verdict_with_newlines_is_data_never_code(tmp_path, monkeypatch):
    """A failure's signature holds anything a raising library put there: a newline in it must not end a comment and
    run what follows (issue #42). Every harness value is a Python literal in CELL; the script's statements are the
    template's, whatever the verdict says."""
    import ast

    from suites.records.repro import TEMPLATE, write_repro
    from suites.records.run_records import RunInfo

    injected = "fail forward x\nimport os; os.system('touch PWNED')  # \r\n\u2028open('PWNED2', 'w')\n#"
    cell = expand("llama", tp="2")[0]
    script = write_repro(
        cell,
        "tiny",
        tmp_path / "repro",
        run=RunInfo("unit", accelerator="cpu", backend="gloo"),
        versions={"deepspeed": "0.19.8\nimport sys"},
        outcome_line=injected,
    )
    tree = ast.parse(script.read_text())
    template = ast.parse(TEMPLATE.read_text())
    statements = [type(node).__name__ for node in tree.body]
    assert statements.count("Import") == [type(n).__name__ for n in template.body].count("Import")
    assert "os.system" not in ast.unparse([n for n in tree.body if not isinstance(n, ast.AnnAssign)])
    cell_spec = next(n for n in tree.body if isinstance(n, ast.AnnAssign) and n.target.id == "CELL")
    spec = ast.literal_eval(cell_spec.value)
    assert spec["verdict"] == injected and spec["versions"] == {"deepspeed": "0.19.8\nimport sys"}
    comments = [line for line in script.read_text().splitlines() if line.lstrip().startswith("#")]
    assert not any("PWNED" in line or "import sys" in line for line in comments)
    import importlib.util

    monkeypatch.chdir(tmp_path)
    loaded = importlib.util.spec_from_file_location("repro_injected_under_test", script)
    module = importlib.util.module_from_spec(loaded)
    monkeypatch.setitem(sys.modules, loaded.name, module)  # as `python script.py` has it: its dataclasses need it
    loaded.loader.exec_module(module)  # importing it runs nothing the verdict said
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()


def test_every_kind_of_cell_gets_a_script_with_what_it_runs(tmp_path):
    """Faithful, stress and derived shapes and every variant, read back through the one parser of cell ids: the
    script is whole Python and its CELL literal carries the cell's own tiny config, load, quantization or training."""
    import ast

    from matrix.cells import parse_cell
    from matrix.variants import load_variants
    from suites.records.repro import write_repro
    from suites.records.run_records import RunInfo

    cells = [
        "qwen2.faithful-eager-fp32-tp2",
        "llama.faithful-meta-llama-3-8b-eager-fp32-tp3",
        "qwen2-eager-fp32-tp2",
        "qwen2.faithful-meta-fp32-tp2",
        "qwen2.faithful-ds_int8-fp32-tp2",
        "qwen2.faithful-train_zero1-fp32-tp2",
        "xlnet-eager-fp32-tp2",  # an architecture outside the registry, derived from its config class
    ]
    for cell_id in cells:
        cell = parse_cell(cell_id)
        script = write_repro(
            cell,
            "tiny",
            tmp_path,
            run=RunInfo("unit"),
            versions={"deepspeed": "0.19.8"},
            outcome_line="fail shard 'x'\nimport os",
        )
        text = script.read_text()
        tree = ast.parse(text)  # a newline in the verdict stays inside its string literal
        spec = ast.literal_eval(
            next(n.value for n in tree.body if isinstance(n, ast.AnnAssign) and n.target.id == "CELL")
        )
        assert spec["id"] == cell_id and spec["tiny"] == cell.model.tiny and spec["verdict"].endswith("\nimport os")
        assert list(spec["checkpoints"]) == list(cell.model.checkpoints)
        variant = load_variants()[cell.variant.name]
        assert (spec["load"], spec["quantization"], spec["training"]) == (
            variant.load,
            variant.quantization,
            variant.training,
        )
        if variant.training:
            assert spec["ds_config"]["tensor_parallel"]["autotp_size"] == cell.tp
            assert spec["ds_config"]["zero_optimization"]["stage"] == variant.zero_stage
    assert parse_cell("llama.faithful-meta-llama-3-8b-eager-fp32-tp3").model.checkpoints == (
        "meta-llama/Meta-Llama-3-8B",
    )


def whole_by_design(name: str, shape: tuple[int, ...], counts, tp: int) -> str:
    """A rule planted in the harness by the test below (under the harness rule's own name): attention kept whole."""
    return "planted: attention kept whole" if "self_attn" in name else ""


def _script_module(tmp_path, monkeypatch, name):
    """A repro script written now for llama at tp 2, imported (its main does not run)."""
    import importlib.util

    from suites.records.repro import write_repro
    from suites.records.run_records import RunInfo

    script = write_repro(
        expand("llama", tp="2")[0], "tiny", tmp_path / name, run=RunInfo("unit"), versions={}, outcome_line="x"
    )
    loaded = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(loaded)
    monkeypatch.setitem(sys.modules, name, module)  # as `python script.py` has it: its dataclasses need it
    loaded.loader.exec_module(module)
    return script.read_text(), module


def test_the_script_judges_memory_by_the_harness_code_as_it_is_when_written(tmp_path, monkeypatch):
    """One memory rule (issue 56): the script's memory judgement is the harness's `memory_findings` and the rules it
    calls, copied in when the script is written. It judges a rank group as the harness's check does; a rule changed
    in the harness (planted: attention kept whole by design) is in the next script written, whose judgement follows
    it, as the harness's does."""
    from suites.checks import memory
    from suites.records import repro
    from tests.suites.checks.test_check_units import _layered, _split

    reference = _layered(heads=8, kv_heads=2)
    for tp, whole in ((2, ("self_attn",)), (2, ()), (3, ("experts",)), (4, ("mlp",))):
        ranks = _split(reference, tp, whole=whole)
        harness = memory.memory_findings(reference, ranks, None, None, (0, 19, 8), False)
        _, script = _script_module(tmp_path, monkeypatch, f"repro_now_{tp}_{len(whole)}")
        problems, notes = script.memory_findings(reference, ranks, None, None, (0, 19, 8), False)
        assert ([p.text for p in problems], notes) == ([p.text for p in harness[0]], harness[1])
    left_attention_whole = _split(reference, 2, whole=("self_attn",))
    assert "linears left whole: model.layers.*.self_attn" in memory.check(reference, left_attention_whole).reason

    repro.harness_functions.cache_clear()
    monkeypatch.setattr(memory, "whole_by_design", whole_by_design)  # the harness's rule, changed
    text, script = _script_module(tmp_path, monkeypatch, "repro_planted")
    repro.harness_functions.cache_clear()  # the next script is written from the harness as it is again
    assert "planted: attention kept whole" in text
    harness = memory.check(reference, left_attention_whole)
    problems, notes = script.memory_findings(reference, left_attention_whole, None, None, None, False)
    assert harness.passed and not problems
    assert notes == harness.reason.split("; ") and "planted: attention kept whole" in harness.reason


@pytest.mark.autotp
def test_the_script_alone_says_match_for_a_good_cell_and_mismatch_for_experts_left_whole(tmp_path):
    """Run as a maintainer would, with DeepSpeed's launcher on CPU: llama.faithful's script prints `RESULT: MATCH`;
    mixtral.faithful's (transformers' fused experts, which AutoTP leaves whole) `FAIL memory` and `RESULT: MISMATCH`,
    though its logits match: the memory check is in the script, not only in the harness."""
    import subprocess
    import sys

    from matrix.cells import parse_cell
    from suites.engine.rank_group import launch_environment
    from suites.records.repro import write_repro
    from suites.records.run_records import RunInfo

    results = {}
    for cell_id in ("llama.faithful-eager-fp32-tp2", "mixtral.faithful-eager-fp32-tp2"):
        script = write_repro(
            parse_cell(cell_id),
            "tiny",
            tmp_path,
            run=RunInfo("unit"),
            versions={},
            outcome_line="from the test",
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "deepspeed.launcher.runner",
                "--num_gpus",
                "2",
                "--master_port",
                str(free_port()),
                script.name,
            ],
            cwd=tmp_path,
            env=launch_environment(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        results[cell_id] = (done.returncode, done.stdout + done.stderr)
    code, output = results["llama.faithful-eager-fp32-tp2"]
    assert code == 0 and "RESULT: MATCH" in output, output[-3000:]
    code, output = results["mixtral.faithful-eager-fp32-tp2"]
    assert code != 0 and "RESULT: MISMATCH" in output, output[-3000:]
    assert "ok   logits (plain)" in output and "FAIL memory: experts left whole: model.layers.*.mlp.experts" in output


def free_port() -> int:
    from suites.engine.rank_group import free_port as port

    return port()

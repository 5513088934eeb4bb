"""Repro scripts (suites/records/repro.py) and redaction: the script builds the cell's own weights, loads
through the cell's load mode, fetches a hub checkpoint at the commit the cell loaded, and no secret reaches it."""

import json

import torch

from matrix.cells import expand


def test_planted_token_never_reaches_records_or_repro(tmp_path, monkeypatch):
    from suites.outcome import failed
    from suites.records.run_records import CellRecorder, RunInfo
    from suites.records.repro import write_repro

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
    write_repro(cell, "tiny", tmp_path / "repro", recorder.run, {"deepspeed": "0.19.8"}, f"fail forward {token}")
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file()) + json.dumps(properties)
    assert token not in written
    assert "***" in written


def _repro_module(cell, tmp_path, monkeypatch, checkpoints="tiny", loaded_revision=None):
    """The repro script written for `cell`, imported in this process (one rank, no process group)."""
    import importlib.util

    from suites.records.run_records import RunInfo
    from suites.records.repro import write_repro

    script = write_repro(
        cell,
        checkpoints,
        tmp_path / "repro",
        RunInfo("unit", accelerator="cpu", backend="gloo"),
        {"deepspeed": "0.19.8"},
        "fail numerics",
        loaded_revision,
    )
    spec = importlib.util.spec_from_file_location(f"repro_{cell.variant.name}_under_test", script)
    repro = importlib.util.module_from_spec(spec)
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
    folder = tmp_path / _repro_module(cell, tmp_path, monkeypatch).checkpoint_folder()
    built = load_file(folder / "model.safetensors")
    harness = load_file(tiny_checkpoint(cell.model) / "model.safetensors")
    assert built.keys() == harness.keys()
    assert all(torch.equal(built[name], harness[name]) for name in harness)


def test_meta_repro_loads_through_the_meta_path(tmp_path, monkeypatch):
    cell = expand("llama", "meta", tp="2")[0]
    repro = _repro_module(cell, tmp_path, monkeypatch)
    folder = repro.checkpoint_folder()
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
        assert repro.checkpoint_folder() == "snap"
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
        RunInfo("unit", accelerator="cpu", backend="gloo"),
        {"deepspeed": "0.19.8\nimport sys"},
        injected,
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
    loaded.loader.exec_module(importlib.util.module_from_spec(loaded))  # importing it runs nothing the verdict said
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()

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

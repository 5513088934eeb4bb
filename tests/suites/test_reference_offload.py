"""Reference at any size: with host RAM capped below the model, the reference process loads it through
accelerate with disk offload, never holds the whole model, and computes exactly the numbers of the
uncapped unsharded model; the cached reference travels to another cache as one file per model."""

from __future__ import annotations

import torch

from matrix.checkpoints import resolve_checkpoint
from matrix.json_records import write_record
from matrix.registry import load_models
from suites.checks.inputs import ProbeSpec
from suites.reference.cache import cached_reference
from suites.reference.checkpoint_sizes import checkpoint_size
from suites.reference.memory_plan import PROCESS_RUNTIME_BYTES, Runner, plan_reference
from suites.reference.unsharded import (
    compute_reference,
    export_references,
    import_references,
    load_reference,
    reference_record,
)


def test_capped_reference_offloads_and_equals_the_uncapped_one(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    checkpoint = resolve_checkpoint(load_models()["llama_large"], "tiny")  # ~325 MB fp32, llama-shaped
    folder = checkpoint.folder
    model_bytes = checkpoint_size(folder).model_bytes("fp32")
    # Room for the runtime and about a third of the weights: the rest must come from disk.
    cap = int((PROCESS_RUNTIME_BYTES + model_bytes // 3) / 0.9)
    monkeypatch.setenv("AUTOTP_HOST_MEMORY", str(cap))
    plan = plan_reference(checkpoint_size(folder), "fp32", Runner.detect())
    assert plan.offload == "disk" and plan.cpu_bytes < model_bytes / 2

    spec = ProbeSpec()
    path = cached_reference(checkpoint, "fp32", spec, plan=plan)
    measured = reference_record(path)
    assert measured["offload"] == "disk" and measured["max_memory"] == {"cpu": plan.cpu_bytes}
    # The reference process never held the whole model: its peak grew by less than the model's bytes.
    # (How close the plan comes to the measured peak is benchmarks/memory_plan.py's job: a process's absolute
    # peak depends on what the test session already holds.)
    assert measured["peak_rss_bytes"] - measured["rss_before_bytes"] < model_bytes

    capped, uncapped = write_record(load_reference(path)), write_record(compute_reference(folder, None, "fp32", spec))
    for name, value in uncapped.items():
        if name.endswith("_seconds"):
            continue  # timings, not numbers of the model
        if name == "module_outputs":  # each module's (shape, summary): offloaded layers compute the same outputs
            assert list(capped[name]) == list(value)
            for module, (shape, summary) in value.items():
                assert capped[name][module][0] == shape and torch.equal(capped[name][module][1], summary), module
            continue
        assert torch.equal(capped[name], value) if isinstance(value, torch.Tensor) else capped[name] == value, name

    bundle, count = export_references(checkpoint, tmp_path / "llama_large.autotp-references.pt")
    assert count == 1 and bundle.stat().st_size < model_bytes / 20  # observations (logits), never weights
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "other-runner"))
    assert import_references(bundle) == 1
    imported = tmp_path / "other-runner" / path.relative_to(tmp_path / "cache")
    assert torch.equal(load_reference(imported).logits_plain, load_reference(path).logits_plain)

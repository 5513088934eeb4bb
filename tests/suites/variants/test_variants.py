"""The variants (matrix/variants.toml) run for real, and each one's checks report a wrong result.

One rank group per tp size serves every cell of that size (cells are grouped by tp). Cells that
find a DeepSpeed limitation on this stack (e.g. torchao under init_inference, DeepSpeed's
post-init quantization needing fp16) must say so with a clear class and signature or skip reason.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from matrix.cells import expand
from matrix.checkpoints import tiny_checkpoint
from matrix.registry import RegistryError
from matrix.variants import _parse_variant, load_variants
from suites.checks import judge
from suites.checks.contracts import MetaLoad
from suites.checks.interface import CheckInputs
from suites.run.driver import RunOptions, prepare_job, run_cell
from suites.variants.loading import checkpoints_json, fresh_process_meta_failure
from tests.suites.rank_summaries import inference_rank

ARCHITECTURES = "llama,qwen2,mistral"


@pytest.fixture
def pool(rank_pool):
    return rank_pool  # the session's shared pool (conftest.py): one live rank group at a time


def test_variants_registry_parses_and_refuses_bad_values(tmp_path):
    variants = load_variants()
    assert {"eager", "meta", "meta_bin", "meta_host", "ds_int8", "ds_int4", "torchao_int8", "train"} <= set(variants)
    for raw, field in (
        ({"load": "lazy"}, "load"),
        ({"quantization": "gptq"}, "quantization"),
        ({"checkpoint_format": "bin"}, "checkpoint_format"),
        ({"training": True, "load": "meta"}, "training"),
        ({"quant_group_size": 3}, "quant_group_size"),
        ({"keep_module_on_host": "yes"}, "keep_module_on_host"),
    ):
        with pytest.raises(RegistryError, match=field):
            _parse_variant(Path("variants.toml"), "bad", raw)


@pytest.mark.autotp
@pytest.mark.parametrize("tp", [2, 3])
def test_variants_run_on_three_architectures(pool, tp):
    expected = {
        "meta": "pass",
        "meta_bin": "pass",
        "meta_host": "pass",
        "train": "pass",
        # Findings on deepspeed 0.19.8 / transformers 5.24 CPU, reported, not harness bugs:
        "torchao_int8": "fail",
        "ds_int8": "skip",
    }
    cells = expand(ARCHITECTURES, ",".join(expected), "fp32", str(tp))
    seen, seen_messages = {}, {}
    for cell in cells:
        outcome = run_cell(cell, pool, RunOptions(cell_timeout=600))  # the machine may be shared and slow
        seen[cell.id] = (outcome.outcome, outcome.failure_class, outcome.signature or outcome.message)
        seen_messages[cell.id] = outcome.message
    # torch 2.13: a fresh process fails building the model under deepspeed.OnDevice (a first import of torch._dynamo
    # there): the meta cells fail with that, as a user's script would, and say that the rest of the cell passed.
    fresh_fails = {
        cell.model.name: fresh_process_meta_failure(str(tiny_checkpoint(cell.model)), "fp32", False)
        for cell in cells
        if cell.variant.load == "meta"
    }
    for cid in seen:
        if cid.split("-")[1].startswith("meta") and fresh_fails[cid.split("-")[0]]:
            expected[cid.split("-")[1]] = "fail"
    # llama's and mistral's stress shapes have 2 kv heads: at tp 3 DeepSpeed's kv-unit split leaves rank 2 no query
    # head (issue #43's memory rule), a finding of every variant that passes otherwise
    starved = {"llama", "mistral"} if tp == 3 else set()
    kv_unit_split = "memory: linears split unevenly: model.layers.*.self_attn.{q_proj,o_proj}"
    wrong = {
        cid: got
        for cid, got in seen.items()
        if not (
            got[:2] == ("fail", "memory") and got[2].startswith(kv_unit_split)
            if cid.split("-")[0] in starved and expected[cid.split("-")[1]] == "pass"
            else got[0] == expected[cid.split("-")[1]]
        )
    }
    assert not wrong, wrong
    for cid, (outcome, failure_class, signature) in seen.items():
        if outcome == "fail" and cid.split("-")[1].startswith("meta"):
            assert failure_class == "shard" and "Signature mismatch" in signature, signature
            # the rest of the cell passed every check, or failed only the kv-unit split's memory finding
            rest = "the same model passed every check" if cid.split("-")[0] not in starved else kv_unit_split
            assert rest in seen_messages[cid], seen_messages[cid]
        if "torchao" in cid:
            assert failure_class == "shard" and "is not supported for quantized model" in signature, signature
        if "ds_int8" in cid:
            assert "expected in half" in signature, signature


@pytest.mark.autotp
def test_fp16_is_unsupported_with_reason_where_the_accelerator_lacks_it(pool):
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    cell = expand("llama", "eager", "fp16", "2")[0]
    outcome = run_cell(cell, pool, RunOptions())
    if torch.float16 in get_accelerator().supported_dtypes():
        assert outcome.outcome == "pass", outcome.message
    else:  # DeepSpeed's refusal, its own state: not a harness skip, not a failure
        assert outcome.outcome == "unsupported" and not outcome.failure_class
        assert f"DeepSpeed {deepspeed.__version__} does not support fp16" in outcome.message, outcome.message


def test_a_dtype_deepspeed_refuses_is_unsupported_and_a_harness_skip_stays_a_skip(monkeypatch):
    """Whatever this CPU lists: an accelerator without bf16 makes a bf16 cell `unsupported`, naming the release and
    what it lists; a cell the harness skips first (a model's skip reason) stays `skip`."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    monkeypatch.setattr(type(accelerator), "supported_dtypes", lambda self: [torch.float32])
    cell = expand("llama", "eager", "bf16", "2")[0]
    outcome = prepare_job(cell, RunOptions())
    assert not isinstance(outcome, tuple) and outcome.outcome == "unsupported", outcome
    assert outcome.message == (
        f"DeepSpeed {deepspeed.__version__} does not support bf16 on its {accelerator.device_name()} accelerator "
        "here (supported_dtypes: float32)"
    )
    skipped = replace(cell, model=replace(cell.model, skip_reason="no tiny config"))
    outcome = prepare_job(skipped, RunOptions())
    assert not isinstance(outcome, tuple) and (outcome.outcome, outcome.message) == ("skip", "no tiny config")


@pytest.mark.autotp
def test_meta_load_memory_is_measured_and_judged(pool):
    """Peak RSS per rank of both load modes in one run, on a model big enough to tell. The meta cell
    must pass when it stays well below eager and fail with class `memory` when it does not: on
    deepspeed 0.19.8 it does not (measured: eager ~376 MB, meta ~518 MB per rank for 325 MB of weights)."""
    growth, outcomes = {}, {}
    # Twice over: the first cells of a rank also pay one-off imports (torch._dynamo, model modules).
    for cell in 2 * expand("llama_large", "eager,meta", "fp32", "2"):
        outcome = run_cell(cell, pool, RunOptions(cell_timeout=600))
        growth[cell.variant.name] = outcome.metrics["rss_load_peak_growth_max_bytes"]
        outcomes[cell.variant.name] = outcome
    print(f"peak RSS growth per rank while loading+sharding: {growth}")
    full_model_bytes = 81e6 * 4
    assert outcomes["eager"].outcome == "pass", outcomes["eager"].message
    assert growth["eager"] > 0.8 * full_model_bytes, growth
    meta = outcomes["meta"]
    # Where a fresh process cannot build the model on the meta device, that is the verdict and the rank's own
    # (past it, with the workaround) is in the message.
    fresh = meta.metrics.get("fresh_process_failed") == 1.0
    if growth["meta"] < full_model_bytes:
        assert "the same model passed every check" in meta.message if fresh else meta.outcome == "pass", meta.message
    elif fresh:
        assert "the same model failed memory: meta_memory:" in meta.message, meta.message
    else:
        assert (meta.outcome, meta.failure_class) == ("fail", "memory"), meta.message
        assert meta.signature.startswith("meta_memory:"), meta.signature


@pytest.mark.autotp
def test_corrupted_meta_checkpoint_shard_is_reported(pool, tmp_path):
    cell = expand("llama", "meta", "fp32", "2")[0]
    job, _ = prepare_job(cell, RunOptions())
    damaged = tmp_path / "damaged"
    shutil.copytree(job.loaded_checkpoint, damaged)
    from safetensors.torch import load_file, save_file

    # One tensor in one of the checkpoint files (the meta variant splits it into several) is damaged.
    weights = next(
        w for w in sorted(damaged.glob("*.safetensors")) if any(n.endswith("down_proj.weight") for n in load_file(w))
    )
    state = load_file(weights)
    name = next(n for n in state if n.endswith("down_proj.weight"))
    state[name] = state[name] * 1.5
    save_file(state, weights, metadata={"format": "pt"})
    for listing in damaged.glob("ds_checkpoints_*.json"):
        listing.unlink()  # the meta loader lists the damaged folder's own files
    listing = checkpoints_json(damaged, cell.variant.checkpoint_format)
    # The damage is what this judges, past a fresh process's own failure to build the model (if any).
    outcome = pool.run(cell.tp, replace(job, meta=MetaLoad(str(damaged), str(listing), None)), 600)
    assert (outcome.outcome, outcome.failure_class) == ("fail", "numerics"), outcome.message
    assert outcome.signature.startswith("logits:"), outcome.signature


@pytest.mark.autotp
@pytest.mark.parametrize(
    "fault, check",
    [("wrong_gradient", "train_grads"), ("rank1_nan_gradient", "train_grads"), ("corrupt_loss", "train_loss")],
)
def test_wrong_training_step_is_reported(pool, fault, check):
    cell = expand("llama", "train", "fp32", "2")[0]
    outcome = run_cell(cell, pool, RunOptions(faults=(f"tests.faults:{fault}",)))
    assert (outcome.outcome, outcome.failure_class) == ("fail", "numerics"), outcome.message
    assert outcome.signature.startswith(f"{check}:"), outcome.signature


def test_wrong_quantization_scale_is_reported():
    """The strict check compares with the unsharded *quantized* model, the relaxed one with the fp32
    baseline. No quantized AutoTP cell passes on this CPU stack (see the findings above), so this
    proves in the driver process that a quantized model with wrong scales fails both, while the
    same quantized model passes both."""
    from suites.checks import quantization as quantization_checks
    from suites.checks.inputs import ProbeSpec, build_inputs, load_tokenizer
    from suites.checks.probes import observe
    from suites.reference.unsharded import compute_reference
    from suites.variants.loading import load_model
    from suites.variants.quantization import hf_quantization_config

    pytest.importorskip("torchao")
    cell = expand("llama", "torchao_int8", "fp32", "2")[0]
    checkpoint, spec = str(tiny_checkpoint(cell.model)), ProbeSpec()
    tolerance = cell.model.tolerance_for("fp32")
    reference = compute_reference(checkpoint, None, "fp32", spec, quantization="torchao_int8")
    baseline = compute_reference(checkpoint, None, "fp32", spec)
    model = load_model(checkpoint, "fp32", False, hf_quantization_config("torchao_int8"))
    inputs = build_inputs(load_tokenizer(None), spec)

    def judged():
        observed = observe(model, inputs, spec, "cpu")
        strict = judge.judge(CheckInputs(tolerance, (inference_rank(0, observed),), reference, observed))
        return next(r for r in strict if r.name == "logits"), quantization_checks.check(baseline, observed, tolerance)

    strict, relaxed = judged()
    assert strict.passed and all(r.passed for r in relaxed), (strict, relaxed)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.scale.mul_(1.1)
    strict, _ = judged()
    assert not strict.passed and strict.failure_class == "numerics", strict
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.scale.mul_(3.0)
    _, relaxed = judged()
    assert [r.name for r in relaxed if not r.passed] == ["quant_tokens"], relaxed

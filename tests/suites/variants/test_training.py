"""The training rows (matrix/variants.toml, tag `train-all`) run for real, and every training check
reports a wrong result with its class and a signature naming the stage: faults injected into real
rank processes (tests/faults.py) break one thing each, the same cell without the fault passes.

Measured findings on deepspeed 0.19.8 / transformers 5.24 CPU are expected verdicts here (FINDINGS), not
harness bugs: save_16bit_model below ZeRO-3 writes rank 0's tensor-parallel shards (engine.save_16bit_model
saves `module.state_dict()`; the TP consolidation it has is never called), so `train_ckpt` fails `save`;
llama's 2 kv heads over 3 ranks leave rank 2 empty k/v shards, which ZeRO-3 never makes available in the
forward, tp_overlap_comm's backward cannot reshape and ds_to_universal cannot merge.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from matrix.cells import Cell, expand
from matrix.registry import DEFAULT_TOLERANCES, RegistryError, load_models
from matrix.variants import Variant, _parse_variant, load_variants
from suites.run.driver import RunOptions, run_cell

TRAINING_ROWS = [name for name, variant in load_variants().items() if "train-all" in variant.tags]
SAVE_16BIT_KEEPS_SHARDS = ("numerics", "save: save_16bit_model: rank 0: model.layers.0.self_attn.q_proj.weight: shape")
EMPTY_SHARD_UNDER_ZERO3 = ("forward", "step 1: AssertionError: {'id': N, 'status': 'NOT_AVAILABLE'")
FINDINGS = {
    **{
        f"{model}-{variant}-fp32-tp{tp}": SAVE_16BIT_KEEPS_SHARDS
        for model in ("llama", "qwen2")
        for variant in ("train_ckpt", "train_universal")
        for tp in (2, 3)
    },
    "llama-train_zero3-fp32-tp3": EMPTY_SHARD_UNDER_ZERO3,
    "llama-train_ckpt_zero3-fp32-tp3": EMPTY_SHARD_UNDER_ZERO3,
    "llama-train_overlap-fp32-tp3": ("forward", "step 1: RuntimeError: cannot reshape tensor of N elements"),
    "llama-train_universal-fp32-tp3": ("forward", "ds_to_universal: TypeError: 'NoneType' object is not iterable"),
}
"""Cell id -> (failure class, signature start) of a DeepSpeed finding; every other training cell passes, but for
KV_UNIT_SPLIT."""
KV_UNIT_SPLIT = ("memory", "memory: linears split unevenly: model.layers.*.self_attn.{q_proj,o_proj}")
"""llama's stress shape (6 query heads, 2 kv heads) at tp 3: DeepSpeed splits attention in kv-head units, so rank 2
holds no query head (issue #43's memory rule) — a finding of every row that reaches the memory check, its own
or its second model's (mistral's stress shape has 2 kv heads too)."""
NOTHING_MATCHES = {
    "use_default_specs": False,
    "layer_specs": [{"patterns": [r".*\.no_such_proj\.weight$"], "partition_type": "column"}],
}


@pytest.fixture
def pool(rank_pool):
    return rank_pool  # the session's shared pool (conftest.py): one live rank group at a time


def run_with(cell, pool, fault=None):
    return run_cell(cell, pool, RunOptions(cell_timeout=600, faults=(f"tests.faults:{fault}",) if fault else ()))


def test_training_rows_are_data_selected_by_their_tag():
    variants = load_variants()
    assert {
        "train",
        "train_heuristics",
        "train_tp_plan",
        "train_preset",
        "train_custom",
        "train_zero1",
        "train_zero2",
        "train_zero3",
        "train_overlap",
        "train_ckpt",
        "train_ckpt_zero3",
        "train_universal",
        "train_two_models",
    } <= set(TRAINING_ROWS)
    assert all(variants[name].training for name in TRAINING_ROWS)
    assert [c.variant.name for c in expand("llama", "train-all", tp="2")] == TRAINING_ROWS
    assert [c.variant.name for c in expand("llama", "train,train-all", tp="2")] == TRAINING_ROWS  # each row once
    assert [c.variant.name for c in expand("llama", tp="2")] == ["eager"]  # the default matrix stays inference


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"training": True, "needs": ["autotp_training"], "partitioning": "guess"}, "partitioning"),
        ({"training": True, "needs": ["autotp_training"], "partitioning": "custom"}, "partition_config"),
        ({"training": True, "needs": ["autotp_training"], "partition_config": NOTHING_MATCHES}, "partition_config"),
        ({"training": True, "needs": ["autotp_training"], "zero_stage": 4}, "zero_stage"),
        ({"training": True, "needs": ["autotp_training"], "training_steps": 0}, "training_steps"),
        ({"training": True, "needs": ["autotp_training"], "tp_overlap_comm": True}, r"must list \['tp_overlap_comm'\]"),
        ({"training": True, "needs": ["autotp_training", "time_travel"]}, "unknown feature"),
        (
            {
                "training": True,
                "needs": ["autotp_training", "gather_replaced_params", "universal_checkpoint"],
                "checkpoint_round_trip": True,
                "resume_tp": 1,
            },
            "resume_tp",
        ),
        ({"training": True, "needs": ["autotp_training"], "optimizer": "lamb"}, "optimizer"),
        ({"zero_stage": 1}, "without training = true"),
        ({"training": True, "needs": "autotp_training"}, "needs"),
    ],
)
def test_training_rows_refuse_bad_values(raw, message):
    with pytest.raises(RegistryError, match=message):
        _parse_variant(Path("variants.toml"), "bad", raw)


@pytest.mark.parametrize(
    "feature, take_away",
    [
        ("tp_overlap_comm", "config field"),
        ("partition_config", "config field"),
        ("preset_model", "config field"),
        ("gather_replaced_params", "layers attribute"),
        ("universal_checkpoint", "module"),
        ("hf_tp_plan", "module"),
    ],
)
def test_a_release_without_a_rows_feature_skips_naming_it(monkeypatch, feature, take_away):
    """Detected in the installed package, never assumed from its version: taking the feature away from
    this release must turn into the named skip."""
    import importlib.util

    from deepspeed.module_inject import layers
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig

    from matrix.variants import TRAINING_FEATURES
    from suites.variants.training import version_skip_reason

    assert version_skip_reason(("autotp_training", feature)) is None
    if take_away == "config field":
        monkeypatch.setattr(
            TPTrainingConfig, "model_fields", {k: v for k, v in TPTrainingConfig.model_fields.items() if k != feature}
        )
    elif take_away == "layers attribute":
        monkeypatch.delattr(layers, "GatherReplacedLayerParams")
    else:
        real = importlib.util.find_spec
        module = {"hf_tp_plan": "tp_plan_converter", "universal_checkpoint": "ds_to_universal"}[feature]
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name.endswith(module) else real(name, *a)
        )
    assert version_skip_reason(("autotp_training", feature)).endswith(f"lacks {TRAINING_FEATURES[feature]}")


def test_a_partitioning_source_the_model_lacks_is_a_named_skip():
    from matrix.checkpoints import tiny_checkpoint
    from suites.variants.training import model_skip_reason

    variants, models = load_variants(), load_models()
    gpt2, mistral = str(tiny_checkpoint(models["gpt2"])), str(tiny_checkpoint(models["mistral"]))
    assert "ships no tp_plan" in model_skip_reason(variants["train_tp_plan"], gpt2, "gpt2")
    assert "no AutoTP preset" in model_skip_reason(variants["train_preset"], mistral, "mistral")
    assert model_skip_reason(variants["train_preset"], mistral, "llama") is None


def test_heuristics_hides_the_tp_plan_of_that_instance_only():
    """DeepSpeed takes a model's HF tp_plan over its heuristics; `heuristics` rows hide it, and another
    model of the same class (the next cell in the rank) still has it."""
    from deepspeed.runtime.tensor_parallel.config import _get_hf_tp_plan

    from matrix.checkpoints import tiny_checkpoint
    from suites.variants.training import hide_tp_plan, load_for_training

    checkpoint = str(tiny_checkpoint(load_models()["llama"]))
    hidden, other = load_for_training(checkpoint, "fp32", False), load_for_training(checkpoint, "fp32", False)
    hide_tp_plan(hidden)
    assert _get_hf_tp_plan(hidden) is None
    assert _get_hf_tp_plan(other)["layers.*.self_attn.o_proj"] == "rowwise"
    assert isinstance(hidden, type(other)) and type(hidden).__name__ == type(other).__name__


@pytest.mark.autotp
@pytest.mark.parametrize("tp", [2, 3])
def test_training_rows_run_on_llama_and_qwen2(pool, tp):
    seen = {}
    for cell in expand("llama,qwen2", ",".join(TRAINING_ROWS), "fp32", str(tp)):
        outcome = run_with(cell, pool)
        seen[cell.id] = (outcome.outcome, outcome.failure_class, outcome.signature or outcome.message)
    wrong = {}
    for cell_id, got in seen.items():
        expected = FINDINGS.get(cell_id)
        matches = got[1] == expected[0] and got[2].startswith(expected[1]) if expected else got[0] == "pass"
        # llama's own, or the second model's (mistral) of a two-model row: the memory check comes first and decides
        if tp == 3 and (cell_id.startswith("llama-") or "-train_two_models-" in cell_id):
            matches = matches or (got[1] == KV_UNIT_SPLIT[0] and KV_UNIT_SPLIT[1].removeprefix("memory: ") in got[2])
        if not matches:
            wrong[cell_id] = got
    assert not wrong, wrong


@pytest.mark.autotp
@pytest.mark.parametrize(
    "model, variant, fault, failure_class, signature_start",
    [
        (
            "llama",
            "train",
            "rank1_weight_drifts_after_backward",
            "numerics",
            "train_update: after step 1: weight update of model.layers.0.self_attn.q_proj.weight on rank 1",
        ),
        (
            "llama",
            "train_two_models",
            "wrong_gradient_of_second_model",
            "numerics",
            "train_grads: second model mistral: step 1: gradient of model.layers.0.self_attn.q_proj.weight on rank 1",
        ),
        (
            "llama",
            "train_heuristics",
            "raise_in_second_backward",
            "forward",
            "step 2: RuntimeError: injected failure in training step N",
        ),
        (
            "llama",
            "train_heuristics",
            "harness_bug_in_training_step",
            "setup",
            "step batches: TypeError: 'NoneType' object is not callable @ suites/variants/training.py:run_training",
        ),
        (
            "qwen2",
            "train_ckpt_zero3",
            "raise_before_load_checkpoint",
            "shard",
            "load: RuntimeError: injected failure loading the checkpoint",
        ),
        (
            "qwen2",
            "train_ckpt_zero3",
            "gather_drops_biases",
            "numerics",
            "gather: GatherReplacedLayerParams: rank 0: model.layers.0.self_attn.q_proj.bias: shape",
        ),
        (
            "qwen2",
            "train_ckpt_zero3",
            "rank1_load_skips_a_shard",
            "numerics",
            # the shard holds the fresh model's value: no trained update at all
            "load: load_checkpoint: weight update of model.layers.0.self_attn.q_proj.weight on rank 1 is zero where "
            "the "
            "unsharded weight update is not",
        ),
        # DeepSpeed writing no 16-bit file is its output failing validation where it enters the harness, not `setup`
        ("qwen2", "train_ckpt_zero3", "save_16bit_writes_nothing", "numerics", "save: save_16bit_model wrote no file"),
        (
            "qwen2",
            "train_ckpt_zero3",
            "load_drops_optimizer_state",
            "numerics",
            "resume: step 3 after load_checkpoint at tp 2: weight update of",
        ),
        # a split 1-D bias of a row-parallel layer is DeepSpeed's layout, named; it raised IndexError (`setup`) before
        (
            "phi",
            "train",
            "row_parallel_bias_split",
            "numerics",
            "train_grads: sharded: rank 0: model.layers.0.self_attn.dense.bias: bias of a row-parallel layer split",
        ),
    ],
)
def test_training_fault_is_reported_with_its_class_and_stage(
    pool, model, variant, fault, failure_class, signature_start
):
    cell = expand(model, variant, "fp32", "2")[0]
    healthy = run_with(cell, pool)
    assert healthy.outcome == "pass", healthy.message
    outcome = run_with(cell, pool, fault)
    assert (outcome.outcome, outcome.failure_class) == ("fail", failure_class), outcome.message
    assert outcome.signature.startswith(signature_start), outcome.signature


@pytest.mark.autotp
@pytest.mark.parametrize(
    "model, variant, fault, signature_start",
    [
        ("llama", "train_zero1", "loss_scaled_by_one_percent", "train_loss: step 1: training loss differs"),
        # bf16 at ZeRO 0 fails train_update on its own (the clipping finding below): the fault fails train_grads first
        (
            "llama",
            "train",
            "rank1_gradient_off_by_a_quarter",
            "train_grads: step 1: gradient of model.layers.0.self_attn.q_proj.weight on rank 1",
        ),
        # a small tensor's gradient, judged against a floor of 1 bf16 ulp of the model's largest gradient
        (
            "llama",
            "train",
            "rank1_smallest_gradient_off_by_ten_percent",
            "train_grads: step 1: gradient of model.layers.1.self_attn.",
        ),
        ("qwen2", "train_zero3", "rank1_last_step_lr_doubled", "train_update: after step 2: weight update of"),
        # AdamW's update, judged in the units of the gradient it normalises (Adam's gain rule): 6 % of it fails
        (
            "qwen2",
            "train_universal",
            "adam_last_step_lr_raised",
            "train_update: after step 2: weight update of",
        ),
        ("qwen2", "train_ckpt_zero3", "gather_drops_biases", "gather: GatherReplacedLayerParams: rank 0:"),
        # A shard left at its initial value: 2 SGD steps move a weight by less than its 2 bf16 ulps of the weight scale,
        # so `load` judges the loaded weights by the update they hold (it was `resume` that caught it before)
        (
            "qwen2",
            "train_ckpt_zero3",
            "rank1_load_skips_a_shard",
            "load: load_checkpoint: weight update of model.layers.0.self_attn.q_proj.weight on rank 1",
        ),
        ("qwen2", "train_ckpt_zero3", "save_16bit_writes_nothing", "save: save_16bit_model wrote no file"),
        (
            "qwen2",
            "train_ckpt_zero3",
            "load_drops_optimizer_state",
            "resume: step 3 after load_checkpoint at tp 2: weight update of",
        ),
    ],
)
def test_training_checks_fail_in_bf16_at_bf16_bounds(pool, model, variant, fault, signature_start):
    """bf16's training bounds are a few of its ulps (matrix/registry.py): a fault of bf16's size still fails each
    check there, and the same cell without it does not fail that way."""
    cell = expand(model, variant, "bf16", "2")[0]
    healthy = run_with(cell, pool)
    assert not healthy.signature.startswith(signature_start.split(":")[0] + ":"), healthy.signature
    outcome = run_with(cell, pool, fault)
    assert (outcome.outcome, outcome.failure_class) == ("fail", "numerics"), outcome.message
    assert outcome.signature.startswith(signature_start), outcome.signature


@pytest.mark.autotp
def test_ds_to_universal_arguments_the_release_refuses_are_setup(pool):
    """ds_to_universal's arguments come from the installed release's own parser: one that refuses them means the
    harness's arguments do not fit the release (`setup`), never DeepSpeed's conversion failing (`forward`)."""
    outcome = run_with(expand("qwen2", "train_universal", "fp32", "2")[0], pool, "universal_parser_refuses")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "setup"), outcome.message
    assert outcome.signature.startswith(
        "ds_to_universal: arguments: ValueError: deepspeed.checkpoint.ds_to_universal.parse_arguments refused"
    ), outcome.signature


def test_adams_gain_rule_turns_an_update_back_into_its_gradient():
    """Adam's gain rule (ShardedTrainee.change_comparison): after AdamW's first step an element moved by
    -lr * g / (|g| + eps), so the update times adam_gradient_units is -g, for a gradient far below eps (where Adam
    multiplies a gradient error by lr / eps) and far above it alike; a parameter Adam never stepped keeps plain
    units."""
    import torch

    from suites.variants.training import adam_gradient_units, deepspeed_optimizer, torch_optimizer

    stepped, untouched = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))
    optimizer = torch_optimizer(deepspeed_optimizer("adam"), [stepped, untouched])
    assert isinstance(optimizer, torch.optim.AdamW)
    gradient = torch.tensor([1e-6, -3e-4, 2e-2, -5.0])
    stepped.grad = gradient.clone()
    optimizer.step()
    torch.testing.assert_close(stepped.detach() * adam_gradient_units(optimizer, stepped), -gradient)
    assert torch.equal(adam_gradient_units(optimizer, untouched), torch.ones(2))


def test_ds_to_universal_arguments_are_the_releases_own():
    from suites.variants.trainee import universal_arguments

    before = list(sys.argv)
    arguments = universal_arguments(Path("/scratch"))
    assert (arguments.input_folder, arguments.output_folder) == ("/scratch/trained", "/scratch/trained_universal")
    assert (arguments.num_extract_workers, arguments.num_merge_workers, arguments.strict) == (1, 1, True)
    assert not arguments.keep_temp_folder and not arguments.inject_missing_state and sys.argv == before


@pytest.mark.autotp
def test_bf16_clipping_that_ignores_tensor_parallelism_is_reported(pool):
    """A finding on deepspeed 0.19.8: in bf16 at ZeRO 0 its FP16_UnfusedOptimizer clips by a gradient norm over
    this rank's shards only (llama tp 2: 3.65 where the model's is 4.31), so the update is ~18 % too large while
    every gradient is right; ZeRO 1 computes the norm right and passes at bf16's tolerance."""
    zero0, zero1 = (run_with(expand("llama", variant, "bf16", "2")[0], pool) for variant in ("train", "train_zero1"))
    assert (zero0.outcome, zero0.failure_class) == ("fail", "numerics"), zero0.message
    assert zero0.signature.startswith("train_update: after step 1: weight update of"), zero0.signature
    assert zero0.metrics["grad_max_rel_error"] < 0.03 and zero0.metrics["update_max_rel_error"] > 0.1
    assert zero1.outcome == "pass", zero1.message


@pytest.mark.autotp
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_partition_pattern_that_matches_nothing_fails_memory(pool, dtype):
    """DeepSpeed #8088: custom patterns that match no parameter leave the model whole on every rank. Its
    numbers are then exactly right, so only the per-rank bytes can fail it."""
    variant = Variant(
        name="train_custom_nothing",
        training=True,
        training_steps=2,
        partitioning="custom",
        zero_stage=1,
        partition_config=NOTHING_MATCHES,
        needs=("autotp_training", "partition_config"),
    )
    outcome = run_with(Cell(load_models()["llama"], variant, dtype, 2), pool)
    assert (outcome.outcome, outcome.failure_class) == ("fail", "memory"), outcome.message
    assert outcome.signature.startswith("memory: linears left whole: model.layers.*.self_attn."), outcome.signature
    assert outcome.metrics["grad_params_sharded"] == 0
    assert outcome.metrics["train_loss_rel_delta"] <= DEFAULT_TOLERANCES[dtype].train_loss_rel

"""Real faults injected into rank processes by the harness's self-tests.

Each hook is called on every rank at each stage with the model, and may return a replacement model:
`loaded` and `sharded` (inference), `sharded`, `trained`, `saved`, `restoring` and `restored` (training, see
suites/variants/training.py), `finished` with no model after rank 0 wrote the verdict. Startup hooks
(AUTOTP_STARTUP_FAULT, suites/engine/worker.py) get `server` or `rank` and no model. Hooks change only the model
instance they are given, so a reused rank
group serves the next cell unharmed (except the hooks whose point is to kill or hang the group).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import time
import types

import torch
import torch.nn.functional as F


def _row_parallel_layers(model):
    """The decoder's row-parallel layers (LmHeadLinearAllreduce splits differently and is left alone)."""
    return [m for m in model.modules() if type(m).__name__ == "LinearAllreduce"]


def _column_parallel_layers(model):
    return [m for m in model.modules() if type(m).__name__ == "LinearLayer"]


def _wrap_logits(model, change):
    """Replace `model.forward` so `change(output, args, kwargs)` can alter its logits."""
    original = model.forward

    def forward(*args, **kwargs):
        output = original(*args, **kwargs)
        change(output, args, kwargs)
        return output

    model.forward = forward
    return model


def noop_allreduce(stage, model, rank):
    """Row-parallel layers skip their all-reduce: each rank keeps only its partial sum."""
    assert stage != "sharded" or _row_parallel_layers(model), "no LinearAllreduce layer to break"
    if stage == "sharded":
        for layer in _row_parallel_layers(model):
            layer.forward = types.MethodType(lambda self, x: F.linear(x, self.weight, self.bias), layer)


def wrong_shard(stage, model, rank):
    """Rank 1 holds its column-parallel shard with the output rows rotated (a misplaced slice)."""
    if stage == "sharded" and rank == 1:
        with torch.no_grad():
            for layer in _column_parallel_layers(model):
                layer.weight.copy_(torch.roll(layer.weight, shifts=1, dims=0))


def perturb_rank_logits(stage, model, rank):
    """Rank 1's logits drift from rank 0's after the all-reduce."""
    if stage == "sharded" and rank == 1:
        return _wrap_logits(model, lambda output, args, kwargs: output.logits.add_(0.05))


def drift_one_prefill_token(stage, model, rank):
    """Every rank's prefill logits of the first prompt's third token drift by 8.5 bf16 ulps of the forward's
    largest logit: just over the default bf16 bound (8), under the 9 ulps qwen3_moe's override allowed. That token
    is routed alike on both sides (qwen3_moe bf16's flipping token is in the left-padded row)."""

    def change(output, args, kwargs):
        logits = output.logits
        if logits.dim() == 3 and logits.shape[1] > 2:  # a prefill, not a decode step
            logits[0, 2] += 8.5 * torch.finfo(torch.bfloat16).eps * logits.abs().max()

    if stage == "sharded":
        return _wrap_logits(model, change)


def rank1_nan_logits(stage, model, rank):
    """Rank 1's logits turn NaN after the all-reduce; rank 0's, which the other checks read, stay right."""
    if stage == "sharded" and rank == 1:
        return _wrap_logits(model, lambda output, args, kwargs: output.logits.fill_(float("nan")))


def half_vocabulary_logits(stage, model, rank):
    """The sharded model returns logits for half the vocabulary (an lm_head slice never gathered)."""

    def change(output, args, kwargs):
        output.logits = output.logits[..., : output.logits.shape[-1] // 2]

    if stage == "sharded":
        return _wrap_logits(model, change)


def row_parallel_bias_on_every_rank(stage, model, rank):
    """Row-parallel layers add their bias on every rank before the all-reduce: the bias counts tp times."""
    if stage == "sharded":
        layers = [m for m in _row_parallel_layers(model) if getattr(m, "bias", None) is not None]
        assert layers, "no row-parallel layer with a bias"
        for layer in layers:

            def forward(x, original=layer.forward, layer=layer):
                return original(x) + layer.bias * (torch.distributed.get_world_size() - 1)

            layer.forward = forward


def column_parallel_bias_of_rank0_everywhere(stage, model, rank):
    """Column-parallel biases are sliced at rank 0's offset on every rank (the weight is sliced right)."""
    if stage == "sharded":
        layers = [m for m in _column_parallel_layers(model) if getattr(m, "bias", None) is not None]
        assert layers, "no column-parallel layer with a bias"
        for layer in layers:
            torch.distributed.broadcast(layer.bias.data, src=0)


def rank1_permuted_norm_weights(stage, model, rank):
    """Rank 1 holds its norm weights rotated by one position (a norm sliced or permuted by mistake)."""
    if stage == "sharded" and rank == 1:
        norms = [
            m for m in model.modules() if "norm" in type(m).__name__.lower() and getattr(m, "weight", None) is not None
        ]
        assert norms, "no norm layer"
        with torch.no_grad():
            for norm in norms:
                norm.weight.copy_(torch.roll(norm.weight, shifts=1, dims=0))


def nan_decode_logits(stage, model, rank):
    """One-token decode steps return NaN logits (prefill is untouched)."""

    def change(output, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] == 1:
            output.logits[..., :1] = float("nan")

    if stage == "sharded":
        return _wrap_logits(model, change)


def corrupt_batched_decode_steps(stage, model, rank):
    """Only decode steps of a batch (two or more sequences decoded together) are wrong."""

    def change(output, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] == 1 and ids.shape[0] > 1:
            output.logits.add_(torch.linspace(0, 5, output.logits.shape[-1]))

    if stage == "sharded":
        return _wrap_logits(model, change)


def corrupt_decode_steps(stage, model, rank):
    """Only one-token decode steps (the KV-cache path) are wrong; prefill is untouched."""

    def change(output, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] == 1:
            output.logits.add_(torch.linspace(0, 5, output.logits.shape[-1]))

    if stage == "sharded":
        return _wrap_logits(model, change)


def corrupt_loss(stage, model, rank):
    """Only the `labels=` loss path is wrong (perplexity, the training loss), logits are untouched."""

    def change(output, args, kwargs):
        if kwargs.get("labels") is not None:
            output.loss = output.loss * 1.01

    if stage == "sharded":
        return _wrap_logits(model, change)


def decode_lm_head_not_gathered(stage, model, rank):
    """Inside generate, the lm_head's slices are gathered for the first step only: every decode step after it
    returns this rank's half of the vocabulary (a decode-only path that skips the gather)."""
    if stage != "sharded":
        return None
    head, generate = model.get_output_embeddings(), model.generate
    calls = {"in_generate": False, "count": 0}

    def head_forward(hidden, original=head.forward):
        logits = original(hidden)
        calls["count"] += calls["in_generate"]
        return logits[..., : logits.shape[-1] // 2] if calls["count"] > 1 else logits

    def counted_generate(*args, **kwargs):
        calls.update(in_generate=True, count=0)
        try:
            return generate(*args, **kwargs)
        finally:
            calls["in_generate"] = False

    head.forward, model.generate = head_forward, counted_generate
    return model


def overflowing_loss(stage, model, rank):
    """The sharded labels= path returns a huge finite loss: exp(loss) overflows a float."""

    def change(output, args, kwargs):
        if "labels" in kwargs:
            output.loss = output.loss * 0 + 1e6

    if stage == "sharded":
        return _wrap_logits(model, change)


def skip_lm_head_allreduce_on_task_items(stage, model, rank):
    """The sharded lm_head skips its all-reduce (each rank scores with a partial sum over its slice of
    the hidden features), only in forwards of four or more sequences: the task probes' batches (four
    choices an item; lm-eval requests eight at a time). The standard probes run one or two sequences, so
    only the accuracy check can see it."""
    if stage != "sharded":
        return
    from deepspeed.module_inject import layers

    heads = [m for m in model.modules() if type(m).__name__ == "LmHeadLinearAllreduce"]
    assert heads, "no sharded lm_head to break"
    for head in heads:

        def forward(input, original=head.forward):
            if input.shape[0] < 4:
                return original(input)
            real = layers.dist.inference_all_reduce
            layers.dist.inference_all_reduce = lambda tensor, *args, **kwargs: tensor
            try:
                return original(input)
            finally:
                layers.dist.inference_all_reduce = real

        head.forward = forward


def skip_sharding(stage, model, rank):
    """AutoTP leaves the model whole: the sharded module is swapped for the full model."""
    if stage == "sharded":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model.config._name_or_path, dtype=model.dtype).eval()


def deepspeed_leaves_lm_head_whole(stage, model, rank):
    """A planted DeepSpeed whose set_lm_head leaves the output head a plain nn.Linear, whole on every rank
    (AutoTP's `_replace_last_linear_module` returns the model untouched, once; restored after sharding)."""
    from deepspeed.module_inject.auto_tp import AutoTP

    original = AutoTP.__dict__["_replace_last_linear_module"]
    original = getattr(original, "planted_over", original)
    if stage == "loaded":

        def leave_whole(self, r_module):
            AutoTP._replace_last_linear_module = original
            return r_module

        leave_whole.planted_over = original
        AutoTP._replace_last_linear_module = leave_whole
    elif stage in ("sharded", "finished"):
        AutoTP._replace_last_linear_module = original
        if stage == "sharded":
            assert type(model.lm_head) is torch.nn.Linear, f"lm_head became {type(model.lm_head).__name__}"


def parser_misses_the_attention_output(stage, model, rank):
    """A planted DeepSpeed whose parser (auto_tp.py `tp_parser`) leaves `self_attn.o_proj` out of the row-parallel
    linears it chooses, as 0.19.8's does CTRL's `multi_head_attention.dense`: AutoTP makes the attention's output
    projection column-parallel (restored after sharding; an `injection_policy` passed to init_inference bypasses the
    parser, as in DeepSpeed)."""
    from deepspeed.module_inject.auto_tp import AutoTP

    original = AutoTP.__dict__["tp_parser"]
    original = getattr(original, "planted_over", original)
    if stage == "loaded":

        def misses_o_proj(model):
            return [(layer, [name for name in names if name != "self_attn.o_proj"]) for layer, names in original(model)]

        misses_o_proj.planted_over = original
        AutoTP.tp_parser = misses_o_proj
    elif stage in ("sharded", "finished"):
        AutoTP.tp_parser = original


def attention_left_whole(stage, model, rank):
    """AutoTP leaves every attention projection whole, the MLP still split and all-reduced: every rank computes
    the full attention, so the numbers stay exact (the planted DeepSpeed bug of issue #24)."""
    if stage == "sharded":
        from transformers import AutoModelForCausalLM

        whole = AutoModelForCausalLM.from_pretrained(model.config._name_or_path, dtype=model.dtype).eval()
        for sharded_layer, whole_layer in zip(model.model.layers, whole.model.layers):
            sharded_layer.self_attn = whole_layer.self_attn
        return model


def rewrapped_mlp(stage, model, rank):
    """A layer comes back under another name (wrapped in a container): numbers unchanged, name unknown."""

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    if stage == "sharded":
        model.model.layers[0].mlp = Wrapped(model.model.layers[0].mlp)
        return model


def break_before_shard(stage, model, rank):
    """A weight of impossible shape makes init_inference raise on every rank."""
    if stage == "loaded":
        target = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        target.weight = torch.nn.Parameter(torch.zeros(7))


def raise_in_forward(stage, model, rank):
    """Every rank raises in the forward of the sharded model."""
    if stage == "sharded":

        def forward(*args, **kwargs):
            raise RuntimeError("injected forward failure at layer 3")

        model.forward = forward


def rank1_raises_in_forward(stage, model, rank):
    """Only rank 1 raises; rank 0 waits for it in a collective."""
    if stage == "sharded" and rank == 1:
        raise_in_forward(stage, model, rank)


def rank1_hangs(stage, model, rank):
    """Rank 1 never reaches the collective: a deadlock."""
    if stage == "sharded" and rank == 1:

        def forward(*args, **kwargs):
            time.sleep(3600)

        model.forward = forward


def rank1_sigkill(stage, model, rank):
    """Rank 1 is killed by SIGKILL mid-forward (what the OOM killer does)."""
    if stage == "sharded" and rank == 1:

        def forward(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        model.forward = forward


def rank1_segfault(stage, model, rank):
    """Rank 1 dereferences a null pointer mid-forward."""
    if stage == "sharded" and rank == 1:

        def forward(*args, **kwargs):
            ctypes.string_at(0)

        model.forward = forward


def rank1_exceeds_memory_limit(stage, model, rank):
    """Rank 1 runs into its address-space limit mid-forward (an allocation the machine cannot give)."""
    if stage == "sharded" and rank == 1:
        import resource

        def forward(*args, **kwargs):
            resource.setrlimit(resource.RLIMIT_AS, (8 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
            return torch.empty(16 << 30, dtype=torch.uint8)

        model.forward = forward


def rank1_dies_after_the_verdict(stage, model, rank):
    """Rank 1 is killed right after rank 0 wrote the cell's verdict."""
    if stage == "finished" and rank == 1:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)


# --- variant faults (tests/suites/variants/test_variants.py) ---


def wrong_gradient(stage, model, rank):
    """After backward, rank 1's gradient of its first sharded weight is off by 1 %."""
    if stage == "trained" and rank == 1:
        from deepspeed.module_inject.layers import LinearLayer

        layer = next(m for m in model.modules() if isinstance(m, LinearLayer))
        layer.weight.grad.mul_(1.01)


def rank1_nan_gradient(stage, model, rank):
    """After backward, rank 1's gradient of its first sharded weight is NaN in one element."""
    if stage == "trained" and rank == 1:
        from deepspeed.module_inject.layers import LinearLayer

        layer = next(m for m in model.modules() if isinstance(m, LinearLayer))
        layer.weight.grad.view(-1)[0] = float("nan")


def rank1_hangs_on_opt_while_flagged(stage, model, rank):
    """Rank 1 hangs on the opt cell while the file named by AUTOTP_TEST_HANG_FLAG exists: a driver
    interrupted there is interrupted mid-run for sure, and a rerun without the flag completes."""
    flag = os.environ.get("AUTOTP_TEST_HANG_FLAG", "")
    if stage == "sharded" and rank == 1 and model.config.model_type == "opt" and os.path.exists(flag):
        while os.path.exists(flag):
            time.sleep(0.2)


# --- start-up faults (tests/suites/checks/test_faults.py): called through AUTOTP_STARTUP_FAULT as the fork server
# (`server`) and each rank (`rank`) start, before any cell ---


def server_import_fails(stage, rank):
    """The fork server's own pre-imports fail the way a harness import of a module an older transformers
    lacks does (transformers.masking_utils before 4.53): the harness's import statement raises."""
    if stage == "server":
        import sys

        sys.modules["transformers.generation.utils"] = None


def rank1_harness_raises_at_start(stage, rank):
    """Harness code on rank 1 raises while the rank sets itself up (the harness's own function is given bad input)."""
    if stage == "rank" and rank == 1:
        from matrix.cells import parse_cell_id

        parse_cell_id("injected harness failure in rank setup", (), ())


def rank1_logs_secrets_at_start(stage, rank):
    """Rank 1 prints credentials to its log (the planted ones of tests/planted_secrets.py), then raises."""
    if stage == "rank" and rank == 1:
        from tests.planted_secrets import leaky_text

        print(leaky_text(), flush=True)
        raise RuntimeError(f"injected harness failure after logging secrets: {leaky_text()}")


def rank1_names_its_modeling_modules_at_start(stage, rank):
    """Rank 1 raises naming the transformers modeling modules it started with (tests/suites/engine/test_preload.py)."""
    if stage == "rank" and rank == 1:
        import sys

        started_with = sorted(
            name for name in sys.modules if name.startswith("transformers.models.") and ".modeling_" in name
        )
        raise RuntimeError(f"injected: started with {' '.join(started_with)}")


def rank1_torch_raises_at_start(stage, rank):
    """torch's own code raises on rank 1 while it starts (a collective before the process group exists)."""
    if stage == "rank" and rank == 1:
        torch.distributed.barrier()


def rank1_sigkill_at_start(stage, rank):
    """Rank 1 is killed by a signal while it starts."""
    if stage == "rank" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)


# --- training faults (tests/suites/variants/test_training.py): stages `sharded` (after deepspeed.initialize), `trained`
# (after each backward), `saved` (after save_checkpoint + save_16bit_model), `restoring` / `restored` (a
# fresh engine before / after load_checkpoint) ---


def _count_calls(model, stage_name: str) -> int:
    """How often this hook ran at this stage on this model instance (1 on the first call)."""
    counts = model.__dict__.setdefault("_autotp_test_calls", {})
    counts[stage_name] = counts.get(stage_name, 0) + 1
    return counts[stage_name]


def rank1_weight_drifts_after_backward(stage, model, rank):
    """After backward (gradients right), rank 1's first column-parallel weight moves by 1e-3 of its scale:
    the weight the optimizer leaves is not the one the gradients call for."""
    if stage == "trained" and rank == 1:
        layer = _column_parallel_layers(model)[0]
        with torch.no_grad():
            layer.weight.add_(1e-3 * layer.weight.abs().max())


def wrong_gradient_of_second_model(stage, model, rank):
    """After backward, rank 1's gradient of the second model's (mistral's) first sharded weight is off by 1 %."""
    if stage == "trained" and rank == 1 and model.config.model_type == "mistral":
        _column_parallel_layers(model)[0].weight.grad.mul_(1.01)


def raise_in_second_backward(stage, model, rank):
    """Every rank raises after the second backward (training step 2)."""
    if stage == "trained" and _count_calls(model, stage) == 2:
        raise RuntimeError("injected failure in training step 2")


def raise_before_load_checkpoint(stage, model, rank):
    """Every rank raises while the fresh engine is about to load the checkpoint."""
    if stage == "restoring":
        raise RuntimeError("injected failure loading the checkpoint")


def gather_drops_biases(stage, model, rank):
    """GatherReplacedLayerParams gathers column-parallel weights but leaves their biases as this rank's
    shard (the 1-D bias case of DeepSpeed #7249)."""
    if stage == "saved":
        layers = [m for m in _column_parallel_layers(model) if getattr(m, "bias", None) is not None]
        assert layers, "no column-parallel layer with a bias"
        for layer in layers:
            weight, bias = layer.weight, layer.bias
            for method in ("gather_params", "_tp_partition"):
                real = getattr(weight, method)
                setattr(weight, method, lambda params, real=real, bias=bias: real([p for p in params if p is not bias]))


def rank1_load_skips_a_shard(stage, model, rank):
    """load_checkpoint restores everything but rank 1's first column-parallel weight, which keeps the value
    the fresh model was built with (under ZeRO-3 read and written through GatheredParameters)."""
    if rank != 1 or stage not in ("restoring", "restored"):
        return
    import deepspeed

    layer = _column_parallel_layers(model)[0]
    with deepspeed.zero.GatheredParameters([layer.weight], modifier_rank=0, enabled=hasattr(layer.weight, "ds_id")):
        if stage == "restoring":
            layer.autotp_test_fresh_weight = layer.weight.detach().clone()
        else:
            with torch.no_grad():
                layer.weight.copy_(layer.autotp_test_fresh_weight)


def save_16bit_writes_nothing(stage, model, rank):
    """engine.save_16bit_model returns without writing its file (patched on the engine class from `sharded` until
    the cell is `finished`, then restored for the next cell)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    if stage == "sharded" and not hasattr(DeepSpeedEngine, "_autotp_saved_save_16bit_model"):
        DeepSpeedEngine._autotp_saved_save_16bit_model = DeepSpeedEngine.save_16bit_model
        DeepSpeedEngine.save_16bit_model = lambda self, *args, **kwargs: False
    elif stage == "finished" and hasattr(DeepSpeedEngine, "_autotp_saved_save_16bit_model"):
        DeepSpeedEngine.save_16bit_model = DeepSpeedEngine._autotp_saved_save_16bit_model
        del DeepSpeedEngine._autotp_saved_save_16bit_model


def load_drops_optimizer_state(stage, model, rank):
    """load_checkpoint restores the weights but not the optimizer state (SGD's momentum): the next step's
    loss and gradients are right, its update is not. Under ZeRO-3 the optimizer is reachable from a parameter."""
    if stage == "restored":
        optimizer = next(model.parameters())._z3_optimizer.optimizer
        assert optimizer.state, "no optimizer state was loaded"
        for state in optimizer.state.values():
            state.clear()


def rank1_gradient_off_by_a_quarter(stage, model, rank):
    """After backward, rank 1's gradient of its first column-parallel weight is 25 % too large: over bf16's gradient
    bound (4 ulps = 3.1 % of the scale), where the 1 % of `wrong_gradient_of_second_model` is noise."""
    if stage == "trained" and rank == 1:
        _column_parallel_layers(model)[0].weight.grad.mul_(1.25)


def rank1_smallest_gradient_off_by_ten_percent(stage, model, rank):
    """After backward, rank 1's column-parallel weight with the smallest gradient has it 10 % too large: a small
    tensor (in llama.faithful a q_proj at 0.3 % of the model's largest gradient) is judged against a floor of 1 bf16
    ulp of the largest (0.8 %), where 4 bf16 ulps forgive 7 % of it (the 1 % floor before: 9 %)."""
    if stage == "trained" and rank == 1:
        layer = min(_column_parallel_layers(model), key=lambda layer: layer.weight.grad.abs().max().item())
        layer.weight.grad.mul_(1.10)


def rank1_last_step_lr_doubled(stage, model, rank):
    """Rank 1's optimizer takes the last of 2 steps at twice the learning rate (ZeRO-3: the optimizer is reachable
    from a parameter): the gradients and losses stay right, the weight update is 50 % too large."""
    if stage == "trained" and rank == 1 and _count_calls(model, stage) == 2:
        for group in next(model.parameters())._z3_optimizer.optimizer.param_groups:
            group["lr"] *= 2


def adam_last_step_lr_raised(stage, model, rank):
    """Every rank's AdamW takes the last of 2 steps at 1.125 times the learning rate (ZeRO 1: the engine is found by
    its module; every rank alike, so replicated weights stay equal and ds_to_universal merges them): 6 % of the
    2-step update, which Adam's gain rule judges at 2x its bound (4 bf16 ulps)."""
    if stage == "trained" and _count_calls(model, stage) == 2:
        import gc

        from deepspeed.runtime.engine import DeepSpeedEngine

        engine = next(o for o in gc.get_objects() if isinstance(o, DeepSpeedEngine) and o.module is model)
        for group in engine.optimizer.param_groups:
            group["lr"] *= 1.125


def loss_scaled_by_one_percent(stage, model, rank):
    """The training loss every rank reports is 1 % too large: over bf16's loss bound (1/16 ulp = 4.9e-4), while its
    gradients (scaled alike) stay inside theirs."""
    if stage == "sharded":
        original = model.forward

        def forward(*args, **kwargs):
            output = original(*args, **kwargs)
            output.loss = output.loss * 1.01
            return output

        model.forward = forward


def row_parallel_bias_split(stage, model, rank):
    """DeepSpeed lists a row-parallel layer's 1-D bias split like its weight (each rank its slice of the output
    features); the layer still adds the whole bias after the all-reduce, so the forward and the numbers stay
    right and only the layout of the parameters a rank holds is wrong."""
    if stage != "sharded":
        return
    import torch.distributed as dist

    layer = next((m for m in _row_parallel_layers(model) if getattr(m, "bias", None) is not None), None)
    assert layer is not None, "no row-parallel layer with a bias"
    whole = layer.bias  # kept by the closure only, so it stays out of the module's parameters
    layer.bias = torch.nn.Parameter(whole.detach().chunk(dist.get_world_size())[rank].clone())
    original = layer.forward

    def forward(*args, **kwargs):
        split, layer._parameters["bias"] = layer._parameters["bias"], whole
        try:
            return original(*args, **kwargs)
        finally:
            layer._parameters["bias"] = split

    layer.forward = forward


def universal_parser_refuses(stage, model, rank):
    """The installed ds_to_universal's parser knows no `--num_merge_workers` (as a release that renamed it would):
    patched from `sharded` until the cell is `finished`, then restored for the next cell."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal

    if stage == "sharded" and not hasattr(ds_to_universal, "_autotp_saved_parse_arguments"):
        ds_to_universal._autotp_saved_parse_arguments = ds_to_universal.parse_arguments

        def parse_arguments():
            parser = argparse.ArgumentParser()
            for name in ("--input_folder", "--output_folder", "--num_extract_workers"):
                parser.add_argument(name)
            return parser.parse_args()

        ds_to_universal.parse_arguments = parse_arguments
    elif stage == "finished" and hasattr(ds_to_universal, "_autotp_saved_parse_arguments"):
        ds_to_universal.parse_arguments = ds_to_universal._autotp_saved_parse_arguments
        del ds_to_universal._autotp_saved_parse_arguments


# --- harness bugs: the harness's own code raises inside a stage (suites/engine/cell_runner.py `_stage_error`
# must call the class `setup`, never the stage's `shard`/`forward`, which would blame DeepSpeed) or while rank 0
# judges the cell (its judging `except`: `setup` too, never `crash`).


def _break_harness_name(module_name: str, attribute: str):
    """A fault that breaks one name the harness's own code calls (set to None) from `sharded` until the cell is
    `finished`, so the harness's frame raises the TypeError, as a harness bug would; the name is restored
    for the next cell."""

    def fault(stage, model, rank):
        module = importlib.import_module(module_name)
        saved = f"_autotp_saved_{attribute}"
        if stage == "sharded" and not hasattr(module, saved):
            setattr(module, saved, getattr(module, attribute))
            setattr(module, attribute, None)
        elif stage == "finished" and hasattr(module, saved):
            setattr(module, attribute, getattr(module, saved))
            delattr(module, saved)

    return fault


harness_bug_in_generation_probe = _break_harness_name("suites.checks.probes", "_greedy")
harness_bug_in_training_step = _break_harness_name("suites.variants.training", "step_batch")
harness_bug_in_logits_check = _break_harness_name("suites.checks.logits", "logits_allowance")


# --- reference faults (tests/suites/test_forked_reference.py): called through AUTOTP_STARTUP_FAULT as a reference's
# child of the fork server starts (`reference`) ---


def reference_reports_isolation(stage, rank):
    """Writes what the reference's process shares with ranks to $AUTOTP_TEST_ISOLATION_FILE: whether it holds an
    initialised process group, and which of the ranks' variables it sees."""
    if stage == "reference":
        import json

        from suites.engine.fork_server import DISTRIBUTED_VARIABLES

        seen = {
            "process_group": torch.distributed.is_available() and torch.distributed.is_initialized(),
            "variables": sorted(name for name in DISTRIBUTED_VARIABLES if name in os.environ),
        }
        with open(os.environ["AUTOTP_TEST_ISOLATION_FILE"], "w") as out:
            json.dump(seen, out)


def reference_killed(stage, rank):
    """The reference's process is killed by a signal (the OOM killer) before it answers."""
    if stage == "reference":
        os.kill(os.getpid(), signal.SIGKILL)


def _attention_modules(model):
    return [m for m in model.modules() if hasattr(m, "q_proj") and hasattr(m, "o_proj")]


def planted_norm_over_split_width(stage, model, rank):
    """Each attention gets a norm over the full width of its q_proj (`planted_norm`, as olmo2's q_norm), applied to
    q_proj's output: AutoTP splits q_proj and leaves the norm whole, so the norm meets a split width."""
    if stage == "loaded":
        for attention in _attention_modules(model):
            width = attention.q_proj.out_features
            attention.planted_norm = torch.nn.RMSNorm(width, dtype=attention.q_proj.weight.dtype)
            torch.nn.init.normal_(attention.planted_norm.weight, 1.0, 0.1)
    if stage == "sharded":
        for attention in _attention_modules(model):
            attention.q_proj.register_forward_hook(lambda _m, _i, out, norm=attention.planted_norm: norm(out))


def planted_per_head_buffer(stage, model, rank):
    """Each attention gets a buffer with one scale per query head (`head_scale`, as gpt_oss's sinks), applied to
    q_proj's output head by head: AutoTP splits the heads and leaves the buffer whole."""
    if stage == "loaded":
        for attention in _attention_modules(model):
            heads = attention.q_proj.out_features // attention.head_dim
            attention.register_buffer("head_scale", torch.linspace(0.5, 1.5, heads))
    if stage == "sharded":
        for attention in _attention_modules(model):

            def scaled(_module, _inputs, out, attention=attention):
                heads = out.unflatten(-1, (-1, attention.head_dim))
                return (heads * attention.head_scale[:, None]).flatten(-2)

            attention.q_proj.register_forward_hook(scaled)


def planted_one_kv_head(stage, model, rank):
    """The model's config says 1 kv head before sharding: DeepSpeed splits attention in kv-head units
    (tp_shard.py get_shard_size), so rank 0 gets every head and the others none; the numbers stay right."""
    if stage == "loaded":
        model.config.num_key_value_heads = 1


def noop_allreduce_in_second_mlp(stage, model, rank):
    """The second layer's MLP down_proj skips its all-reduce: each rank keeps its partial sum from there on."""
    if stage == "sharded":
        layer = model.get_submodule("model.layers.1.mlp.down_proj")
        assert type(layer).__name__ == "LinearAllreduce", type(layer).__name__
        layer.forward = types.MethodType(lambda self, x: F.linear(x, self.weight, self.bias), layer)


def announce_a_passing_cell(stage, model, rank):
    """Prints a line into each rank's log while the cell runs, and changes nothing."""
    if stage == "sharded":
        print("a passing cell ran here", flush=True)


def announce_and_raise_in_forward(stage, model, rank):
    """Prints a line into each rank's log, then every rank raises in the forward (the group lives on)."""
    if stage == "sharded":
        print("the failing cell ran here", flush=True)
        raise_in_forward(stage, model, rank)


# --- DeepSpeed-side faults planted in this cell's engine (a hook gets the engine's module; the engine is found by it,
# and only its own attributes change, so the next cell's engine is unharmed) ---


def _engine_of(model):
    """The DeepSpeed engine that trains `model`."""
    import gc

    from deepspeed import DeepSpeedEngine

    return next(o for o in gc.get_objects() if isinstance(o, DeepSpeedEngine) and o.module is model)


def deepspeed_scales_the_loss(stage, model, rank):
    """DeepSpeed's own ZeRO-0 loss scaling (its fp16 path: torch's GradScaler, here at 2^16) on an fp32 engine: the
    backward scales the loss, the gradients held after it are 65536 times the true ones, the step divides it out
    and applies the right update. What bf16 at ZeRO 0 did at releases that scaled its loss too: a correct release."""
    if stage == "sharded":
        _engine_of(model).torch_autocast_z0_gradscaler = torch.amp.GradScaler(device="cpu", init_scale=2.0**16)


def _scaled_update(model, factor):
    """The engine's optimizer applies `factor` times the update it computed (gradients untouched)."""
    engine = _engine_of(model)
    optimizer, real = engine.optimizer, engine.optimizer.step

    def step(*args, **kwargs):
        before = [param.detach().clone() for param in engine.module.parameters()]
        result = real(*args, **kwargs)
        with torch.no_grad():
            for param, start in zip(engine.module.parameters(), before):
                param.copy_(start + factor * (param - start))
        return result

    optimizer.step = step


def deepspeed_update_too_large_by_a_fifth(stage, model, rank):
    """DeepSpeed's step applies 1.2 times the update its gradients call for (a clipping norm or a scale wrong)."""
    if stage == "sharded":
        _scaled_update(model, 1.2)


def deepspeed_update_vanishes(stage, model, rank):
    """DeepSpeed's step applies no update at all (the weights stay where they were)."""
    if stage == "sharded":
        _scaled_update(model, 0.0)


def policy_inference_raises(stage, model, rank):
    """The harness's policy inference (suites/checks/policy_inference.py) raises in both of its parts: the walk of
    the unsharded model's graph and its comparison with what DeepSpeed made (restored after sharding). A diagnosis
    that could not be made: the cell runs on and passes with a note, never a `setup` failure."""
    import suites.checks.policy_inference as inference
    import suites.checks.sharding as sharding

    originals = {"walk": inference.__dict__["_writers"], "compare": sharding.__dict__["disagreements"]}
    originals = {name: getattr(found, "planted_over", found) for name, found in originals.items()}
    if stage == "loaded":

        def broken(*args, **kwargs):
            raise RuntimeError("planted: the policy inference broke")

        walk, compare = (types.FunctionType(broken.__code__, broken.__globals__) for _ in range(2))
        walk.planted_over, compare.planted_over = originals["walk"], originals["compare"]
        inference._writers, sharding.disagreements = walk, compare
    elif stage in ("sharded", "finished"):
        inference._writers, sharding.disagreements = originals["walk"], originals["compare"]

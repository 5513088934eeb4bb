"""The AutoTP training variant: one training step with `tensor_parallel.autotp_size` against the
same step on the unsharded model.

The unsharded step (loss, every parameter's gradient and weight) is computed in the driver, never
in a rank (see suites/reference.py), and cached on disk. Each rank then runs one step through
`deepspeed.initialize` and compares the gradient of each parameter it holds with the matching
slice of the unsharded gradient. The slice is found from the weights themselves (each shard row
is an exact row of the unsharded weight), so the comparison does not trust DeepSpeed's own
shard arithmetic. Dropout is off (eval mode) so both steps compute the same function.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from matrix.checkpoints import cache_root
from suites.inputs import ProbeSpec, build_inputs, load_tokenizer, probe_fingerprint
from suites.atomic import write_atomically
from suites.loading import load_model

TRAINING_FORMAT = 2
"""Bump when the unsharded step changes, so stale cached steps are not read (2: no KV cache)."""


def version_skip_reason() -> str | None:
    """AutoTP training (`tensor_parallel.autotp_size`) and its `set_autotp_mode` switch arrived
    together, in DeepSpeed 0.16.4."""
    import deepspeed
    from deepspeed.module_inject import layers

    if not hasattr(layers, "set_autotp_mode"):
        return (f"AutoTP training (tensor_parallel.autotp_size) needs deepspeed >= 0.16.4 (installed "
                f"{deepspeed.__version__} has no deepspeed.module_inject.layers.set_autotp_mode)")
    return None


def load_for_training(checkpoint: str, dtype: str, trust_remote_code: bool):
    """The model a training step runs: eval mode (no dropout) and no KV cache, as in real training.
    In eval mode some releases build a cache sized from the config's kv-head count inside forward
    (gemma2's HybridCache in transformers 4.4x), which AutoTP's per-rank heads do not fit."""
    model = load_model(checkpoint, dtype, trust_remote_code)
    model.config.use_cache = False
    return model


def batch(tokenizer_source: str | None, spec: ProbeSpec, trust_remote_code: bool) -> torch.Tensor:
    """One sequence of `ppl_window` corpus tokens; the step trains on it with labels = inputs."""
    return build_inputs(load_tokenizer(tokenizer_source, trust_remote_code), spec).corpus_ids[:, : spec.ppl_window]


def step_path(checkpoint: str, tokenizer: str | None, dtype: str, spec: ProbeSpec) -> Path:
    import transformers

    identity = json.dumps({"format": TRAINING_FORMAT, "checkpoint": checkpoint, "tokenizer": tokenizer, "dtype": dtype,
                           "spec": spec.as_dict(), "probes": probe_fingerprint(), "torch": torch.__version__,
                           "transformers": transformers.__version__}, sort_keys=True)
    return cache_root() / "training" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.pt"


def compute_unsharded_step(checkpoint: str, tokenizer: str | None, dtype: str, spec: ProbeSpec, trust_remote_code: bool) -> dict:
    from suites.reference import refuse_if_sharded

    refuse_if_sharded()
    torch.manual_seed(0)
    model = load_for_training(checkpoint, dtype, trust_remote_code)
    ids = batch(tokenizer, spec, trust_remote_code)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return {"loss": loss.float().item(),
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def cached_unsharded_step(checkpoint: str, tokenizer: str | None, dtype: str, spec: ProbeSpec, trust_remote_code: bool) -> Path:
    path = step_path(checkpoint, tokenizer, dtype, spec)
    if not path.exists():
        step = compute_unsharded_step(checkpoint, tokenizer, dtype, spec, trust_remote_code)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda staging: torch.save(step, staging))
    return path


@dataclass
class GradientReport:
    """One rank's comparison of its gradient shards with the unsharded gradients."""

    loss: float
    max_rel_error: float
    """Largest max|g_tp - g_ref| / max|g_ref| over this rank's parameters."""
    worst_parameter: str
    compared: int
    sharded: int
    """Parameters this rank holds only a slice of."""
    problems: list[str]
    """Parameters whose shard could not be matched to the unsharded weight, or that have no gradient."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _shard_rows(shard: torch.Tensor, full: torch.Tensor) -> tuple[int, list[int]] | None:
    """(split dim, indices into `full` along it) such that full[indices] == shard, or None."""
    split = [d for d in range(full.dim()) if shard.shape[d] != full.shape[d]]
    if len(split) != 1:
        return None
    dim = split[0]
    row_size = full.numel() // full.shape[dim]  # explicit: a rank may hold an empty shard (0 rows)
    full_rows = full.movedim(dim, 0).reshape(full.shape[dim], row_size)
    where = {}
    for index, row in enumerate(full_rows):
        where.setdefault(row.numpy().tobytes(), index)
    indices = [where.get(row.numpy().tobytes()) for row in shard.movedim(dim, 0).reshape(shard.shape[dim], row_size)]
    return None if None in indices else (dim, indices)


def compare_gradients(model, unsharded: dict, loss: float) -> GradientReport:
    worst, worst_name, compared, sharded, problems, layouts = 0.0, "", 0, 0, [], {}
    named = dict(model.named_parameters())
    for name in sorted(named, key=lambda n: n.endswith(".bias")):  # weights first: a bias reuses its weight's rows
        param = named[name]
        ref_grad, ref_weight = unsharded["grads"].get(name), unsharded["weights"].get(name)
        if ref_weight is None:
            problems.append(f"{name}: not a parameter of the unsharded model")
            continue
        if param.grad is None or ref_grad is None:
            if (param.grad is None) != (ref_grad is None):
                problems.append(f"{name}: gradient {'missing' if param.grad is None else 'unexpected'} on the sharded model")
            continue
        grad, weight = param.grad.detach().float().cpu(), param.detach().cpu()
        if grad.shape != ref_grad.shape:
            sibling = layouts.get(name[: -len(".bias")] + ".weight") if name.endswith(".bias") else None
            layout = sibling if sibling and weight.dim() == 1 else _shard_rows(weight, ref_weight)
            if layout is None:
                problems.append(f"{name}: shard {tuple(weight.shape)} is not a slice of the unsharded {tuple(ref_weight.shape)}")
                continue
            layouts[name] = layout
            dim, indices = layout
            ref_grad = ref_grad.movedim(dim, 0)[indices].movedim(0, dim)
            sharded += 1
        compared += 1
        if grad.numel() == 0:
            continue
        ref_grad = ref_grad.float()
        scale = ref_grad.abs().max().item()
        error = (grad - ref_grad).abs().max().item() / scale if scale else (grad.abs().max().item())
        if not math.isnan(worst) and (math.isnan(error) or error > worst):  # a NaN gradient is the worst
            worst, worst_name = error, name
    return GradientReport(loss, worst, worst_name, compared, sharded, problems)


def run_step(job: dict, world_size: int, fault_hook) -> GradientReport:
    """One AutoTP training step on this rank; `fault_hook(stage, model)` is the test-only hook."""
    import deepspeed
    from deepspeed.module_inject.layers import set_autotp_mode

    dtype = job["dtype"]
    unsharded = torch.load(job["training_step"], weights_only=False)
    model = load_for_training(job["checkpoint"], dtype, job["trust_remote_code"])
    config = {"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": world_size},
              "zero_optimization": {"stage": 0},
              # backward() needs an optimizer; torch's Adam needs no JIT-built op, and no step is taken.
              "optimizer": {"type": "Adam", "params": {"lr": 1e-6, "torch_adam": True}}, "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"}}
    set_autotp_mode(training=True)
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        engine.eval()
        fault_hook("sharded", engine.module)
        ids = batch(job["tokenizer"], ProbeSpec(**job["spec"]), job["trust_remote_code"]).to(engine.device)
        loss = engine(ids, labels=ids).loss
        engine.backward(loss)
        fault_hook("trained", engine.module)
        return compare_gradients(engine.module, unsharded, loss.float().item())
    finally:
        set_autotp_mode(training=False)  # the rank serves inference cells next

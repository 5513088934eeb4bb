"""The AutoTP training variants: N optimizer steps with `tensor_parallel.autotp_size` (the row's
partitioning source, ZeRO stage, tp_overlap_comm) against the same steps on the unsharded model,
optionally followed by the checkpoint round trip and with a second AutoTP model in the process.

The unsharded steps (each step's loss and gradients, the weights before and after) are computed in
the driver, never in a rank (see suites/reference.py), and cached on disk. Each rank runs the same
steps through `deepspeed.initialize` and compares the gradient and the weight update of each
parameter it holds with the matching slice of the unsharded one. The slice is found from the initial
weights themselves (each shard row is an exact row of the unsharded weight), so the comparison does
not trust DeepSpeed's own shard arithmetic. Dropout is off (eval mode) so both sides compute the same
function. The optimizer (OPTIMIZERS) keeps a step that is right to rounding right to rounding: SGD
with momentum is linear in the gradient; Adam runs with a large eps, because its g/sqrt(v) turns
rounding noise in near-zero gradients into full-size updates. Both keep state a resumed run must restore.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from matrix import cache_root
from matrix.json_records import write_record
from matrix.registry import DType
from matrix.variants import TRAINING_FEATURES, Variant
from suites.atomic import write_atomically
from suites.checks.inputs import ProbeSpec, build_inputs, load_tokenizer, probe_fingerprint
from suites.checks.probes import bytes_by_name, shapes_by_name, split_counts, tensor_kinds
from suites.checks.result import Finding
from suites.contracts import (
    ComparisonRecord,
    Job,
    RoundTripReport,
    TraineeReport,
    TrainingReport,
    UnshardedSteps,
)
from suites.outcome import LibraryOutputError
from suites.variants.loading import load_model, refuse_if_sharded

if TYPE_CHECKING:
    from collections.abc import Callable

    from deepspeed import DeepSpeedEngine

    from suites.model_types import CausalLM

    FaultHook = Callable[[str, torch.nn.Module], None]
    """suites/engine/cell_runner.py's test-only fault hook: `fault_hook(stage, model)`."""

TRAINING_FORMAT = 6
"""Bump when the unsharded steps change, so stale cached steps are not read (4: N optimizer steps; 5: bf16/fp16
steps on fp32 master weights, as DeepSpeed's mixed precision; 6: Adam's gradient units per step)."""
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}),
    # eps 1e-3: the update stays a smooth function of the gradient (see the module docstring).
    "adam": (
        torch.optim.AdamW,
        {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-3, "weight_decay": 0.0}},
    ),
}
"""Variant.optimizer -> (the torch class the unsharded side runs, DeepSpeed's optimizer config). DeepSpeed
builds the same torch class: any torch.optim name, and AdamW with `torch_adam` (see _deepspeed_optimizer)."""
GRADIENT_CLIPPING = 1.0
"""Clip-by-global-norm on both sides (DeepSpeed's default): the sharded side must count each shard once
and each replicated parameter once in the norm, or every update is scaled wrong."""
CHECKPOINT_TAG = "trained"


def _training_config_fields() -> set[str]:
    try:
        from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    except ImportError:
        return set()
    return set(getattr(TPTrainingConfig, "model_fields", None) or TPTrainingConfig.__fields__)  # pydantic 2 / 1


def _has_feature(feature: str) -> bool:
    """Whether the installed DeepSpeed has `feature` (matrix/variants.py TRAINING_FEATURES), asked of
    the package itself so any release or branch gets a real answer."""
    from deepspeed.module_inject import layers

    if feature == "autotp_training":
        return hasattr(layers, "set_autotp_mode")
    if feature == "gather_replaced_params":
        return hasattr(layers, "GatherReplacedLayerParams")
    if feature == "hf_tp_plan":
        return importlib.util.find_spec("deepspeed.module_inject.tp_plan_converter") is not None
    if feature == "universal_checkpoint":
        return (
            hasattr(layers, "collect_autotp_universal_checkpoint_info")
            and importlib.util.find_spec("deepspeed.checkpoint.ds_to_universal") is not None
        )
    return feature in _training_config_fields()  # preset_model, partition_config, tp_overlap_comm


def version_skip_reason(needs: tuple[str, ...] = ("autotp_training",)) -> str | None:
    """Why the installed DeepSpeed cannot run a training row needing `needs`, or None."""
    import deepspeed

    for feature in needs:
        if not _has_feature(feature):
            if feature == "autotp_training":  # it and set_autotp_mode arrived together, in 0.16.4
                return (
                    f"AutoTP training (tensor_parallel.autotp_size) needs deepspeed >= 0.16.4 (installed "
                    f"{deepspeed.__version__} has no deepspeed.module_inject.layers.set_autotp_mode)"
                )
            return f"installed deepspeed {deepspeed.__version__} lacks {TRAINING_FEATURES[feature]}"
    return None


def model_skip_reason(variant: Variant, checkpoint: str, model_type: str) -> str | None:
    """Why this row's partitioning source does not exist for this model (asked in the driver)."""
    if variant.partitioning == "tp_plan":
        from transformers import AutoConfig

        if not getattr(AutoConfig.from_pretrained(checkpoint), "base_model_tp_plan", None):
            return f"{model_type}: this transformers ships no tp_plan for it (config.base_model_tp_plan is empty)"
    if variant.partitioning == "preset":
        from deepspeed.module_inject.autotp_config import AutoTPPresets

        if AutoTPPresets.get_preset(model_type) is None:
            return f"{model_type}: deepspeed has no AutoTP preset of that name (AutoTPPresets.get_preset)"
    return None


def load_for_training(checkpoint: str, dtype: DType, trust_remote_code: bool) -> CausalLM:
    """The model a training step runs: eval mode (no dropout) and no KV cache, as in real training.
    In eval mode some releases build a cache sized from the config's kv-head count inside forward
    (gemma2's HybridCache in transformers 4.4x), which AutoTP's per-rank heads do not fit."""
    model = load_model(checkpoint, dtype, trust_remote_code)
    model.config.use_cache = False
    return model


def step_batch(tokenizer_source: str | None, spec: ProbeSpec, trust_remote_code: bool, step: int) -> torch.Tensor:
    """Step `step`'s sequence (labels = inputs): the corpus's windows of `ppl_window` tokens in turn, so
    consecutive steps see different data."""
    corpus = build_inputs(load_tokenizer(tokenizer_source, trust_remote_code), spec).corpus_ids
    windows = corpus.shape[1] // spec.ppl_window
    begin = (step % windows) * spec.ppl_window
    return corpus[:, begin : begin + spec.ppl_window]


def steps_path(
    *, checkpoint: str, tokenizer: str | None, dtype: DType, spec: ProbeSpec, steps: int, optimizer: str
) -> Path:
    import transformers

    identity = json.dumps(
        {
            "format": TRAINING_FORMAT,
            "checkpoint": checkpoint,
            "tokenizer": tokenizer,
            "dtype": dtype,
            "spec": write_record(spec),
            "steps": steps,
            "optimizer": OPTIMIZERS[optimizer][1],
            "clipping": GRADIENT_CLIPPING,
            "probes": probe_fingerprint(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        sort_keys=True,
    )
    return cache_root() / "training" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.pt"


def compute_unsharded_steps(
    *,
    checkpoint: str,
    tokenizer: str | None,
    dtype: DType,
    spec: ProbeSpec,
    trust_remote_code: bool,
    steps: int,
    optimizer_name: str,
) -> UnshardedSteps:
    """`steps` optimizer steps on the unsharded model: each step's loss and gradients, the weights before
    the first step and after each step, and each tensor's bytes and kind (for the memory check)."""
    refuse_if_sharded()
    torch.manual_seed(0)
    model = load_for_training(checkpoint, dtype, trust_remote_code)
    params = dict(model.named_parameters())
    # DeepSpeed's mixed precision (bf16/fp16 enabled): the optimizer steps fp32 master weights with the model's
    # gradients in fp32, clipped by their fp32 norm, and the model computes with the masters rounded to its dtype.
    # An optimizer stepping the low-precision weights themselves loses every update below a weight's ulp.
    stepped = params if dtype == "fp32" else {n: torch.nn.Parameter(p.detach().float()) for n, p in params.items()}
    optimizer_class, ds_optimizer = OPTIMIZERS[optimizer_name]
    optimizer = optimizer_class(stepped.values(), **ds_optimizer["params"])
    weights = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    losses: list[float] = []
    grads: list[dict[str, torch.Tensor]] = []
    adam_units: list[dict[str, torch.Tensor]] = []
    for step in range(steps):
        ids = step_batch(tokenizer, spec, trust_remote_code, step)
        loss = model(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.float().item())
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        if stepped is not params:
            for name, master in stepped.items():
                grad = params[name].grad
                master.grad = None if grad is None else grad.float()
        torch.nn.utils.clip_grad_norm_(stepped.values(), GRADIENT_CLIPPING)
        optimizer.step()
        if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            adam_units.append({name: adam_gradient_units(optimizer, master) for name, master in stepped.items()})
        optimizer.zero_grad()
        model.zero_grad()
        if stepped is not params:
            with torch.no_grad():
                for name, master in stepped.items():
                    params[name].copy_(master)
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
    lm_head, lm_head_weight = _lm_head_names(model)
    return UnshardedSteps(
        losses=losses,
        grads=grads,
        weights=weights,
        adam_gradient_units=adam_units,
        bytes_by_name=bytes_by_name(model),
        kinds=tensor_kinds(model),
        shapes_by_name=shapes_by_name(model),
        counts=asdict(split_counts(model)),
        lm_head=lm_head,
        lm_head_weight=lm_head_weight,
    )


def adam_gradient_units(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> torch.Tensor:
    """Per element, Adam's (sqrt(v_hat) + eps) / lr after the step just taken: an error of the element's update
    times it is the gradient error that would have caused it (ShardedTrainee.change_comparison). A parameter Adam
    never stepped (no gradient) keeps plain units."""
    state = optimizer.state.get(param)
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    if not state:
        return torch.ones_like(param, dtype=torch.float32)
    beta2: float = group["betas"][1]
    corrected = state["exp_avg_sq"].float() / (1 - beta2 ** float(state["step"]))
    units: torch.Tensor = (corrected.sqrt() + group["eps"]) / group["lr"]
    return units


def cached_unsharded_steps(
    *,
    checkpoint: str,
    tokenizer: str | None,
    dtype: DType,
    spec: ProbeSpec,
    trust_remote_code: bool,
    steps: int,
    optimizer: str,
) -> Path:
    path = steps_path(
        checkpoint=checkpoint, tokenizer=tokenizer, dtype=dtype, spec=spec, steps=steps, optimizer=optimizer
    )
    if not path.exists():
        unsharded = compute_unsharded_steps(
            checkpoint=checkpoint,
            tokenizer=tokenizer,
            dtype=dtype,
            spec=spec,
            trust_remote_code=trust_remote_code,
            steps=steps,
            optimizer_name=optimizer,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda staging: torch.save(unsharded, staging))
    return path


SCALE_FLOOR_ULPS = {torch.float32: 8, torch.bfloat16: 1, torch.float16: 1}
"""A tensor is judged against its own largest magnitude or this many ulps of its dtype at the largest magnitude over
the model, whichever is larger: fp32 8 ulps (2^-20 of the largest; the 1 % floor before was 10^5 of them), bf16
1 ulp (2^-7, was 1 %), fp16 bf16's count (unmeasured). A gradient that is analytically zero (a key projection's
bias: softmax ignores a constant added to every key) holds only the rounding noise of sums of large terms, which
its own scale would magnify without bound. Measured (benchmarks/noise.py, llama and qwen2 faithful, every training
row, tp 2 and 3, 2026-12-03), first-step gradients at floors 2^-7 … 2^-20: fp32 1.6e-6 at every floor from 2^-10
down (4.6x under its bound); bf16 0.015 at 2^-7 (2.0x) and 0.027 from 2^-10 down (1.2x: bf16's small tensors carry
3.5 of their own ulps, no room for a lower floor)."""
FLOOR_CANDIDATES = (7, 10, 13, 16, 20)
"""Floors 2^-k of the largest magnitude at which every comparison also records its error (`errors_at_floor`), so
benchmarks/noise.py shows how low the floor can go before a correct run's noise fails (#24)."""


VANISHED_SHARE = 2.0**-10
"""A sharded tensor at most this share of its unsharded one's largest magnitude is read as zero (vanished): far below
any scaling a bug applies, far above the rounding a correct tensor differs by."""


def scale_floor_share(dtype: torch.dtype) -> float:
    """SCALE_FLOOR_ULPS of `dtype` as a share of the largest magnitude."""
    return SCALE_FLOOR_ULPS[dtype] * torch.finfo(dtype).eps


def ulp(tensor: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of each element in the tensor's own dtype (|x| in [2^(e-1), 2^e): eps x 2^(e-1))."""
    _, exponent = torch.frexp(tensor.float())
    return torch.where(tensor == 0, 0.0, torch.finfo(tensor.dtype).eps * torch.exp2(exponent.float() - 1))


@dataclass
class Comparison:
    """Sharded tensors against the matching slices of unsharded ones, on one rank."""

    largest: float = 0.0
    """The largest unsharded magnitude over the tensors compared (the whole model's)."""
    floor_share: float = 0.0
    """The smallest scale an error is divided by, as a share of `largest` (`scale_floor_share`)."""
    max_rel_error: float = 0.0
    """Largest max|t_tp - t_ref| / max|t_ref| over the tensors compared."""
    worst_parameter: str = ""
    compared: int = 0
    problems: list[Finding] = field(default_factory=list)
    """Tensors that are missing, unexpected, or not slices of the unsharded ones."""
    errors_at_floor: dict[int, float] = field(default_factory=dict)
    """k -> the largest error had the floor been 2^-k of the largest magnitude (FLOOR_CANDIDATES)."""
    worst_vanished: bool = False
    """The worst parameter's sharded tensor is zero (at most VANISHED_SHARE of its unsharded scale) where the
    unsharded one is not: an update or gradient that vanished, another mechanism than one off by a factor."""
    loss_scale: float = 1.0
    """The factor the gradients read were divided by: the loss scale DeepSpeed's backward multiplied the loss by,
    which its step divides out (1 where it scales none; `ShardedTrainee.step`)."""

    def add(
        self, name: str, tensor: torch.Tensor, reference: torch.Tensor, rounding: torch.Tensor | float = 0.0
    ) -> None:
        """`rounding`: the absolute difference storing the tensors alone can cause (forgiven)."""
        self.compared += 1
        if tensor.shape != reference.shape:
            self.problems.append(
                Finding(f"{name}: shape", f"{tuple(tensor.shape)}, unsharded {tuple(reference.shape)}")
            )
            return
        if tensor.numel() == 0:
            return
        tensor, reference = tensor.float(), reference.float()
        own = reference.abs().max().item()
        scale = max(own, self.floor_share * self.largest)
        difference = ((tensor - reference).abs() - rounding).clamp(min=0).max().item()
        error = difference / scale if scale else difference
        if not math.isnan(self.max_rel_error) and (math.isnan(error) or error > self.max_rel_error):  # NaN is the worst
            self.max_rel_error, self.worst_parameter = error, name
            self.worst_vanished = 0 < own and tensor.abs().max().item() <= VANISHED_SHARE * own
        for k in FLOOR_CANDIDATES:
            floor = max(own, self.largest * 2.0**-k)
            self.errors_at_floor[k] = max(self.errors_at_floor.get(k, 0.0), difference / floor if floor else difference)

    def to_dict(self) -> ComparisonRecord:
        return ComparisonRecord(
            largest=self.largest,
            floor_share=self.floor_share,
            max_rel_error=self.max_rel_error,
            worst_parameter=self.worst_parameter,
            compared=self.compared,
            problems=self.problems,
            errors_at_floor=self.errors_at_floor,
            worst_vanished=self.worst_vanished,
            loss_scale=self.loss_scale,
        )


def _shard_rows(shard: torch.Tensor, full: torch.Tensor) -> tuple[int, list[int]] | None:
    """(split dim, indices into `full` along it) such that full[indices] == shard, or None."""
    split = [d for d in range(full.dim()) if shard.shape[d] != full.shape[d]]
    if len(split) != 1:
        return None
    dim = split[0]
    row_size = full.numel() // full.shape[dim]  # explicit: a rank may hold an empty shard (0 rows)
    full_rows = full.movedim(dim, 0).reshape(full.shape[dim], row_size)
    where: dict[bytes, int] = {}
    for index, row in enumerate(full_rows):
        where.setdefault(row.numpy().tobytes(), index)
    indices = [where.get(row.numpy().tobytes()) for row in shard.movedim(dim, 0).reshape(shard.shape[dim], row_size)]
    found = [index for index in indices if index is not None]
    return (dim, found) if len(found) == len(indices) else None


def _lm_head_names(model: CausalLM) -> tuple[str, str]:
    """The output head's module path and the name its weight is listed under (a weight tied to the
    input embedding is listed once, under the embedding's name); empty when the model has no head."""
    # transformers leaves get_output_embeddings unannotated.
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[no-untyped-call]
    if head is None:
        return "", ""
    return (
        next(name for name, module in model.named_modules() if module is head),
        next(name for name, param in model.named_parameters() if param is head.weight),
    )


def _held_bytes_by_name(model: torch.nn.Module) -> dict[str, int]:
    """Bytes per parameter/buffer this rank's model holds; ZeRO-3 moves a parameter's data into its
    partitions (`ds_numel` keeps the tensor-parallel shard's size), over a data-parallel group of 1 here."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return {name: getattr(tensor, "ds_numel", tensor.numel()) * tensor.element_size() for name, tensor in named}


def _local_weight(param: torch.nn.Parameter) -> torch.Tensor:
    """This rank's tensor-parallel shard of a parameter as the model computes with it; a ZeRO-3
    parameter holds no data outside GatheredParameters."""
    import deepspeed

    with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
        return param.detach().float().cpu().clone()


def _local_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    from deepspeed.utils import safe_get_full_grad

    grad: torch.Tensor | None = safe_get_full_grad(param)
    return None if grad is None else grad.detach().float().cpu()


class ShardedTrainee:
    """One model trained by a DeepSpeed engine on this rank, compared step by step with its
    unsharded steps (`unsharded`, see compute_unsharded_steps)."""

    def __init__(self, engine: DeepSpeedEngine, unsharded: UnshardedSteps, label: str, steps_taken: int = 0):
        """`steps_taken`: steps the engine's checkpoint holds (a resumed run), 0 for a fresh model."""
        self.engine, self.unsharded, self.label, self.steps_taken = engine, unsharded, label, steps_taken
        self.params = dict(engine.module.named_parameters())
        self.initial = {name: _local_weight(param) for name, param in self.params.items()}
        self.layouts, self.problems = self._find_layouts()
        self.losses: list[float] = []
        self.step_grads: list[ComparisonRecord] = []

    def _find_layouts(self) -> tuple[dict[str, tuple[int, list[int]] | None], list[Finding]]:
        """Where each local tensor sits in its unsharded one: None when whole, else (dim, rows)."""
        layouts: dict[str, tuple[int, list[int]] | None] = {}
        problems: list[Finding] = []
        unsharded = self.unsharded["weights"][0]
        for name in sorted(
            self.params, key=lambda n: n.endswith(".bias")
        ):  # weights first: a bias reuses its weight's rows
            weight, full = self.initial[name], unsharded.get(name)
            if full is None:
                problems.append(Finding(f"{name}: not a parameter of the unsharded model"))
            elif weight.shape == full.shape:
                layouts[name] = None
            else:
                sibling = layouts.get(name.removesuffix(".bias") + ".weight") if name.endswith(".bias") else None
                if sibling and weight.dim() == 1 and sibling[0] != 0:
                    # The weight is split along its input features (row-parallel): its output, and so its bias,
                    # is whole on every rank after the all-reduce; a split bias is no slice a rank could own.
                    problems.append(
                        Finding(
                            f"{name}: bias of a row-parallel layer split to",
                            f"{tuple(weight.shape)} of the unsharded {tuple(full.shape)} (its weight is "
                            f"split along dim {sibling[0]}; the bias is added after the all-reduce and "
                            "must stay whole)",
                        )
                    )
                    continue
                layout = sibling if sibling and weight.dim() == 1 else _shard_rows(weight, full.float())
                if layout is None:
                    problems.append(
                        Finding(
                            f"{name}: shard",
                            f"{tuple(weight.shape)} is not a slice of the unsharded {tuple(full.shape)}",
                        )
                    )
                else:
                    layouts[name] = layout
        return layouts, problems

    def slice(self, name: str, full: torch.Tensor) -> torch.Tensor:
        layout = self.layouts[name]
        if layout is None:
            return full
        dim, indices = layout
        return full.movedim(dim, 0)[indices].movedim(0, dim)

    def step(self, ids: torch.Tensor, fault_hook: FaultHook) -> None:
        """One optimizer step; the gradients are compared before the optimizer consumes them, as its step reads them:
        divided by the loss scale DeepSpeed's backward applied (fp16, and bf16 at releases that scaled it too: read
        before the step, a gradient is the loss scale times the true one; the step divides it out). The scale is
        read from the backward itself, as the gradient reaching the loss (loss scale / gradient accumulation steps,
        1 here), whichever DeepSpeed optimizer or release applied it."""
        engine = self.engine
        loss = engine(ids.to(engine.device), labels=ids.to(engine.device)).loss
        scales: list[float] = []
        loss.register_hook(lambda gradient: scales.append(gradient.item()))
        engine.backward(loss)
        fault_hook("trained", engine.module)
        reference = self.unsharded["grads"][self.steps_taken + len(self.losses)]
        grads = Comparison(
            largest=max((grad.abs().max().item() for grad in reference.values()), default=0.0),
            floor_share=scale_floor_share(next(iter(reference.values())).dtype),
            loss_scale=scales[0] if scales and math.isfinite(scales[0]) and scales[0] > 0 else 1.0,
        )
        for name in self.layouts:
            grad = _local_grad(self.params[name])
            if (grad is None) != (name not in reference):
                grads.problems.append(
                    Finding(f"{name}: gradient {'missing' if grad is None else 'unexpected'} on the sharded model")
                )
            elif grad is not None:
                grads.add(name, grad / grads.loss_scale, self.slice(name, reference[name]))
        engine.step()
        self.losses.append(loss.float().item())
        self.step_grads.append(grads.to_dict())

    def start_updates_here(self) -> None:
        """The weights held now (just loaded from a checkpoint) are where update_comparison starts."""
        self.initial = {name: _local_weight(param) for name, param in self.params.items()}

    def update_comparison(self) -> Comparison:
        """Each local weight's change over this engine's steps against the unsharded change (the optimizer
        and its state applied). A fresh engine starts from the very weights the unsharded steps did; after a
        checkpoint load each side starts from its own fp32 master weights rounded to the dtype (forgiven)."""
        current = {name: _local_weight(self.params[name]) for name in self.layouts}
        first = self.steps_taken
        return self.change_comparison(current, self.initial, first, first + len(self.losses))

    def change_comparison(
        self, weights: dict[str, torch.Tensor], starts: dict[str, torch.Tensor] | None, first: int, last: int
    ) -> Comparison:
        """Local `weights` changed from local `starts` (None: from the unsharded weights after step `first`)
        against the unsharded change from step `first` to step `last`.

        A change far smaller than its weight is known only to the weight's last bit on either side: one unit in
        the last place of the trained weight (in its dtype) is forgiven, and of the starting weight too when the
        engine's own start was loaded from a checkpoint (`first` > 0: its fp32 masters rounded).

        Adam's gain rule: Adam moves an element by lr * m_hat / (sqrt(v_hat) + eps), so a gradient error d moves it
        by about d * lr / (sqrt(v_hat) + eps) per step, up to d * lr / eps where the gradient is near zero (an
        embedding row seen once): there bf16 gradient noise of 1 % of the tensor's largest gradient becomes 6 % of
        the update's scale. Adam's changes are judged in the units of the gradient they normalise: multiplied by
        (sqrt(v_hat) + eps) / lr of the unsharded step `last` (adam_gradient_units)."""
        unsharded = self.unsharded["weights"]
        before, after = unsharded[first], unsharded[last]
        adam_units = self.unsharded["adam_gradient_units"]
        units = adam_units[last - 1] if adam_units else None
        changes = {
            name: (after[name].float() - before[name].float()) * (1.0 if units is None else units[name])
            for name in self.layouts
        }
        largest = max((change.abs().max().item() for change in changes.values()), default=0.0)
        comparison = Comparison(largest=largest, floor_share=scale_floor_share(next(iter(after.values())).dtype))
        own_start = starts is not None and first > 0
        for name in self.layouts:
            trained, start = self.slice(name, after[name]), self.slice(name, before[name])
            unit = 1.0 if units is None else self.slice(name, units[name])
            comparison.add(
                name,
                (weights[name] - (start.float() if starts is None else starts[name])) * unit,
                self.slice(name, changes[name]),
                rounding=(ulp(trained) + (ulp(start) if own_start else 0.0)) * unit,
            )
        return comparison

    def report(self) -> TraineeReport:
        module = self.engine.module
        head = self.unsharded["lm_head"]
        head_module = module.get_submodule(head) if head else None
        return TraineeReport(
            label=self.label,
            losses=self.losses,
            steps=self.step_grads,
            problems=self.problems,
            update=self.update_comparison().to_dict(),
            bytes_by_name=_held_bytes_by_name(module),
            sharded=sum(layout is not None for layout in self.layouts.values()),
            lm_head_mode=type(head_module).__name__ if head_module is not None else "none",
        )


def deepspeed_config(
    variant: Variant, tp_size: int, dtype: DType, model_type: str, load_universal: bool = False
) -> dict[str, Any]:
    """The cell's DeepSpeed config: the row's partitioning source, ZeRO stage and tp_overlap_comm."""
    tensor_parallel: dict[str, Any] = {"autotp_size": tp_size}
    if variant.partitioning == "preset":
        tensor_parallel["preset_model"] = model_type
    if variant.partitioning == "custom":
        tensor_parallel["partition_config"] = variant.partition_config
    if variant.tp_overlap_comm:
        tensor_parallel["tp_overlap_comm"] = True
    return {
        "train_micro_batch_size_per_gpu": 1,
        "tensor_parallel": tensor_parallel,
        # ZeRO-3 writes save_16bit_model's file only when told to gather the partitions for it.
        "zero_optimization": {"stage": variant.zero_stage, "stage3_gather_16bit_weights_on_model_save": True},
        # SGD is a torch.optim class, which DeepSpeed's ZeRO optimizers call "untested".
        "zero_allow_untested_optimizer": True,
        "optimizer": _deepspeed_optimizer(variant.optimizer),
        "gradient_clipping": GRADIENT_CLIPPING,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16"},
        "checkpoint": {"load_universal": load_universal},
    }


def _deepspeed_optimizer(name: str) -> dict[str, Any]:
    optimizer = OPTIMIZERS[name][1]
    if optimizer["type"] == "AdamW":  # torch's AdamW: no JIT-built op, and the class the unsharded side runs
        return {**optimizer, "params": {**optimizer["params"], "torch_adam": True}}
    return optimizer


def hide_tp_plan(model: CausalLM) -> None:
    """Make this model instance look like one that ships no HF tp_plan, so AutoTP's name heuristics
    shard it. DeepSpeed merges the config's plan, the class's plan and the instance's plan; the class
    plan is hidden by a subclass made for this instance alone (patching the class itself would leak
    into every later model of the class in this rank)."""
    model.config.base_model_tp_plan = None  # type: ignore[misc]  # the class's plan shadowed on this instance alone
    model.__dict__.pop("_tp_plan", None)
    model.__class__ = type(type(model).__name__, (type(model),), {"_tp_plan": None})


def build_engine(
    *, checkpoint: str, model_type: str, job: Job, tp_size: int, progress: Progress, load_universal: bool = False
) -> DeepSpeedEngine:
    """The model loaded (stage `setup`: loading a checkpoint is not DeepSpeed's), then deepspeed.initialize
    (stage `shard`, under the label the caller was in)."""
    import deepspeed

    variant, label = job.variant, progress.label
    progress.enter("setup", f"{label}: load model")
    model = load_for_training(checkpoint, job.dtype, job.trust_remote_code)
    if variant.partitioning == "heuristics":
        hide_tp_plan(model)
    config = deepspeed_config(variant, tp_size, job.dtype, model_type, load_universal)
    progress.enter("shard", label)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.eval()
    return engine


class Progress:
    """The stage a rank is in, for the verdict when it raises: `label` names it in the signature
    (`step 2`, `save`, `gather`, `load`, `resume`), `stage` is the cell_runner stage that sets the class."""

    def __init__(self) -> None:
        self.stage, self.label = "setup", "initialize"

    def enter(self, stage: str, label: str) -> None:
        self.stage, self.label = stage, label


def gather_full_weights(module: torch.nn.Module, zero_stage: int) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """Every parameter gathered whole with GatherReplacedLayerParams (and ZeRO-3's GatheredParameters),
    one module at a time as DeepSpeed's own 16-bit export does; plus the parameters the context left
    at another size than before it (a gather that does not partition again)."""
    import deepspeed
    from deepspeed.module_inject.layers import GatherReplacedLayerParams

    gathered: dict[str, torch.Tensor] = {}
    before = _held_bytes_by_name(module)
    for prefix, child in module.named_modules():
        params = list(child.parameters(recurse=False))
        if not params:
            continue
        with deepspeed.zero.GatheredParameters(params, enabled=zero_stage == 3):
            with GatherReplacedLayerParams(params, child, enabled=True):
                for local, param in child.named_parameters(recurse=False):
                    gathered[f"{prefix}.{local}" if prefix else local] = param.detach().float().cpu().clone()
    after = _held_bytes_by_name(module)
    problems = [
        Finding(f"{name}: {before[name]} bytes on this rank before the gather, {after[name]} after")
        for name in before
        if after.get(name) != before[name]
    ]
    return gathered, problems


def compare_whole(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], what: str) -> ComparisonRecord:
    """Full weights (gathered or saved) against the unsharded model's after the same steps."""
    comparison = Comparison()
    for name, full in reference.items():
        if name not in weights:
            comparison.problems.append(Finding(f"{name}: missing from the {what} weights"))
        else:
            comparison.add(name, weights[name], full)
    return comparison.to_dict()


def forget_parallel_groups() -> None:
    """Give an engine at another tp the parallel state of a fresh process, where a user resumes a run.
    DeepSpeed keeps its groups in module globals (deepspeed.utils.groups): an engine without AutoTP
    built after one with it reads the old tensor-parallel `mpu` from there and fails. Reloading the
    module resets them in place, for every module that imported it."""
    import importlib

    from deepspeed.utils import groups

    importlib.reload(groups)


def universal_arguments(scratch: Path) -> argparse.Namespace:
    """ds_to_universal's arguments for the saved checkpoint, parsed by the installed release's own parser (its
    names, its defaults: strict, no injected state), as its command line would be; one worker of each kind, so
    no child processes. A parser that refuses them is the harness's arguments not fitting this release."""
    from deepspeed.checkpoint import ds_to_universal

    argv = [
        "--input_folder",
        str(scratch / CHECKPOINT_TAG),
        "--output_folder",
        str(scratch / f"{CHECKPOINT_TAG}_universal"),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    saved, sys.argv = sys.argv, ["ds_to_universal.py", *argv]
    try:
        arguments: argparse.Namespace = ds_to_universal.parse_arguments()
        return arguments
    except SystemExit as refused:  # argparse exits on arguments it refuses; this process must go on
        raise ValueError(
            f"deepspeed.checkpoint.ds_to_universal.parse_arguments refused {' '.join(argv)} (exit "
            f"{refused.code}, its usage message is in the rank log)"
        ) from None
    finally:
        sys.argv = saved


def round_trip(
    *, trainee: ShardedTrainee, job: Job, world_size: int, scratch: Path, fault_hook: FaultHook, progress: Progress
) -> RoundTripReport:
    """save_checkpoint + save_16bit_model, the full weights gathered, the checkpoint loaded into a fresh
    engine (at the row's `resume_tp` through a universal checkpoint), and the step an uninterrupted run
    takes next."""
    import torch.distributed as dist

    engine, variant, rank = trainee.engine, job.variant, dist.get_rank()
    steps_taken = len(trainee.losses)
    trained = trainee.unsharded["weights"][steps_taken]
    progress.enter("forward", "save")
    engine.save_checkpoint(str(scratch), tag=CHECKPOINT_TAG)
    engine.save_16bit_model(str(scratch), "model_16bit.bin")
    dist.barrier()  # every rank's files are written before any rank reads them
    saved_file = scratch / "model_16bit.bin"
    if not saved_file.is_file():  # DeepSpeed's output, validated where it enters the harness, on every rank alike
        raise LibraryOutputError("numerics", "save_16bit_model wrote no file", str(saved_file))
    saved = compare_whole(torch.load(saved_file, weights_only=True), trained, "saved 16-bit") if rank == 0 else None
    if variant.resume_tp:
        if rank == 0:
            progress.enter("setup", "ds_to_universal: arguments")
            arguments = universal_arguments(scratch)
            progress.enter("forward", "ds_to_universal")
            from deepspeed.checkpoint import ds_to_universal

            ds_to_universal.main(arguments)
        dist.barrier()
    progress.enter("forward", "gather")
    fault_hook("saved", engine.module)
    gathered, problems = gather_full_weights(engine.module, variant.zero_stage)
    gather = compare_whole(gathered, trained, "gathered")
    gather["problems"] += problems
    progress.enter("shard", "load")
    if variant.resume_tp:
        forget_parallel_groups()
    resumed = ShardedTrainee(
        build_engine(
            checkpoint=job.trained[0].checkpoint,
            model_type=job.trained[0].model_type,
            job=job,
            tp_size=variant.resume_tp or world_size,
            progress=progress,
            load_universal=bool(variant.resume_tp),
        ),
        trainee.unsharded,
        trainee.label,
        steps_taken,
    )
    fault_hook("restoring", resumed.engine.module)
    resumed.engine.load_checkpoint(
        str(scratch), tag=f"{CHECKPOINT_TAG}_universal" if variant.resume_tp else CHECKPOINT_TAG
    )
    fault_hook("restored", resumed.engine.module)
    # The loaded shards themselves, not only the next step: on tiny random models a whole projection left untrained
    # moves the next loss by less than the loss tolerance. Judged by their change from the initial weights (the
    # trained update they hold), as train_update: in bf16 two steps move a weight by less than its ulp, so weights
    # left at their initial values would pass a comparison at the weight's scale.
    resumed.start_updates_here()
    loaded = resumed.change_comparison(resumed.initial, None, 0, steps_taken)
    loaded.problems[:0] = resumed.problems  # a resumed engine that holds no slice of a weight
    progress.enter("setup", "resume: step batch")
    batch = step_batch(job.tokenizer, job.spec, job.trust_remote_code, steps_taken)
    progress.enter("forward", "resume")
    resumed.step(batch, fault_hook)
    # The next step's loss and gradients depend on the weights alone; its update also on the optimizer
    # state (momentum, Adam's moments) the checkpoint must restore.
    return RoundTripReport(
        saved=saved,
        gathered=gather,
        loaded=loaded.to_dict(),
        resumed_step=steps_taken + 1,
        resumed_tp=variant.resume_tp or world_size,
        resumed_loss=resumed.losses[0],
        resumed_grads=resumed.step_grads[0],
        resumed_update=resumed.update_comparison().to_dict(),
    )


def run_training(job: Job, world_size: int, scratch: Path, fault_hook: FaultHook, progress: Progress) -> TrainingReport:
    """The row's training on this rank: the cell's model (and the second model, initialised after it)
    trained step by step, then the checkpoint round trip. `fault_hook(stage, model)` is the test-only hook."""
    from deepspeed.module_inject.layers import set_autotp_mode

    variant, spec = job.variant, job.spec
    set_autotp_mode(training=True)
    try:
        trainees: list[ShardedTrainee] = []
        for model in job.trained:
            engine = build_engine(
                checkpoint=model.checkpoint, model_type=model.model_type, job=job, tp_size=world_size, progress=progress
            )
            fault_hook("sharded", engine.module)
            trainees.append(
                ShardedTrainee(engine, torch.load(model.unsharded_steps, weights_only=False), model.model_type)
            )
        progress.enter("setup", "step batches")  # the tokenizer's work, not the sharded model's
        batches: list[torch.Tensor] = []
        for step in range(variant.training_steps):  # a loop, not a comprehension: its frame names run_training
            batches.append(step_batch(job.tokenizer, spec, job.trust_remote_code, step))
        for step, ids in enumerate(batches):
            progress.enter("forward", f"step {step + 1}")
            for trainee in trainees:
                trainee.step(ids, fault_hook)
        reports = [trainee.report() for trainee in trainees]
        if variant.checkpoint_round_trip:
            reports[0]["round_trip"] = round_trip(
                trainee=trainees[0],
                job=job,
                world_size=world_size,
                scratch=scratch,
                fault_hook=fault_hook,
                progress=progress,
            )
        return TrainingReport(models=reports)
    finally:
        set_autotp_mode(training=False)  # the rank serves inference cells next

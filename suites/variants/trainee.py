"""A rank's side of a training cell's comparison: how far a sharded tensor may differ from its unsharded one
(`SCALE_FLOOR_ULPS`, `Comparison`), the `ShardedTrainee` that finds each shard's slice of the unsharded weights and
compares its gradients and updates, and the checkpoint round trip's whole-weight gathers and comparisons
(suites/variants/training.py runs the steps and the round trip)."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from suites.checks.contracts import (
    ComparisonRecord,
    TraineeReport,
    UnshardedSteps,
)
from suites.checks.result import Finding

if TYPE_CHECKING:
    from collections.abc import Callable

    from deepspeed import DeepSpeedEngine

    from suites.base.model_types import CausalLM

    FaultHook = Callable[[str, torch.nn.Module], None]
    """suites/engine/cell_runner.py's test-only fault hook: `fault_hook(stage, model)`."""

CHECKPOINT_TAG = "trained"
"""The tag the round trip saves its checkpoint under (a folder of the cell's scratch)."""

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
    """Sharded tensors against the matching slices of unsharded ones, on one rank, compared one `add` at a time;
    `record` is what it found. The fields are `ComparisonRecord`'s (suites/checks/contracts.py), as they grow."""

    largest: float = 0.0
    floor_share: float = 0.0
    max_rel_error: float = 0.0
    worst_parameter: str = ""
    compared: int = 0
    problems: list[Finding] = field(default_factory=list)
    errors_at_floor: dict[int, float] = field(default_factory=dict)
    worst_vanished: bool = False
    loss_scale: float = 1.0

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

    def record(self) -> ComparisonRecord:
        """What the comparison found, frozen."""
        return ComparisonRecord(
            largest=self.largest,
            floor_share=self.floor_share,
            max_rel_error=self.max_rel_error,
            worst_parameter=self.worst_parameter,
            compared=self.compared,
            problems=tuple(self.problems),
            errors_at_floor={str(k): error for k, error in self.errors_at_floor.items()},
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


def lm_head_names(model: CausalLM) -> tuple[str, str]:
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


def held_bytes_by_name(model: torch.nn.Module) -> dict[str, int]:
    """Bytes per parameter/buffer this rank's model holds; ZeRO-3 moves a parameter's data into its
    partitions (`ds_numel` keeps the tensor-parallel shard's size), over a data-parallel group of 1 here."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return {name: getattr(tensor, "ds_numel", tensor.numel()) * tensor.element_size() for name, tensor in named}


def _local_weight(param: torch.nn.Parameter) -> torch.Tensor:
    """This rank's tensor-parallel shard of a parameter as the model computes with it; a ZeRO-3
    parameter holds no data outside GatheredParameters."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed

    with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
        return param.detach().float().cpu().clone()


def _local_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
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
        self.step_grads.append(grads.record())

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
            update=self.update_comparison().record(),
            bytes_by_name=held_bytes_by_name(module),
            sharded=sum(layout is not None for layout in self.layouts.values()),
            lm_head_mode=type(head_module).__name__ if head_module is not None else "none",
        )


def gather_full_weights(module: torch.nn.Module, zero_stage: int) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """Every parameter gathered whole with GatherReplacedLayerParams (and ZeRO-3's GatheredParameters),
    one module at a time as DeepSpeed's own 16-bit export does; plus the parameters the context left
    at another size than before it (a gather that does not partition again)."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed
    from deepspeed.module_inject.layers import GatherReplacedLayerParams

    gathered: dict[str, torch.Tensor] = {}
    before = held_bytes_by_name(module)
    for prefix, child in module.named_modules():
        params = list(child.parameters(recurse=False))
        if not params:
            continue
        with deepspeed.zero.GatheredParameters(params, enabled=zero_stage == 3):
            with GatherReplacedLayerParams(params, child, enabled=True):
                for local, param in child.named_parameters(recurse=False):
                    gathered[f"{prefix}.{local}" if prefix else local] = param.detach().float().cpu().clone()
    after = held_bytes_by_name(module)
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
    return comparison.record()


def forget_parallel_groups() -> None:
    """Give an engine at another tp the parallel state of a fresh process, where a user resumes a run.
    DeepSpeed keeps its groups in module globals (deepspeed.utils.groups): an engine without AutoTP
    built after one with it reads the old tensor-parallel `mpu` from there and fails. Reloading the
    module resets them in place, for every module that imported it."""

    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    from deepspeed.utils import groups

    importlib.reload(groups)


def universal_arguments(scratch: Path) -> argparse.Namespace:
    """ds_to_universal's arguments for the saved checkpoint, parsed by the installed release's own parser (its
    names, its defaults: strict, no injected state), as its command line would be; one worker of each kind, so
    no child processes. A parser that refuses them is the harness's arguments not fitting this release."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
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

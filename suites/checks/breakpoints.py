"""Where a cell broke (suites/verdicts/mechanism.py `BreakPoint`), found on the ranks.

- A forward that raised: the innermost module in the exception's traceback (each `nn.Module.__call__` frame holds
  its module), so finding it costs nothing until something raises.
- init_inference that raised: the module it was replacing and the DeepSpeed layer class it was building, read from
  the traceback's frames the same way.
- Logits that differ: the first module whose output diverges from the unsharded model's. The plain forward of
  every probe records a small summary of each module's output on both sides (`module_outputs`: the output's last
  dimension projected on 4 fixed random directions, per token); rank 0 compares the two in the order the sharded
  modules finished, only when a cell fails its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from types import FrameType, TracebackType

import torch

from suites.verdicts.mechanism import BreakPoint, origin_of

SUMMARY_DIRECTIONS = 4
"""Random directions each output is projected on: a difference anywhere in the output's last dimension shows."""
DIVERGENCE_ULPS = 16
"""A module's output diverges when its summary differs by more than this many times the cell's logits bound
(relative to the output's largest summary): the sharded and unsharded sums of one layer differ by rounding, a
wrong shard by the output's own size."""


@cache
def _directions(width: int) -> torch.Tensor:
    return torch.randn(width, SUMMARY_DIRECTIONS, generator=torch.Generator().manual_seed(width))


def _first_tensor(output: object) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() and output.dim() > 0 and output.numel() > 0 else None
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    return next((found for value in values if (found := _first_tensor(value)) is not None), None)


def summary(tensor: torch.Tensor) -> torch.Tensor:
    """[positions, SUMMARY_DIRECTIONS] float32: the tensor's last dimension projected on fixed random directions."""
    flat = tensor.detach().float().cpu().reshape(-1, tensor.shape[-1])
    return flat @ _directions(tensor.shape[-1])


@contextmanager
def module_outputs(model: torch.nn.Module) -> Iterator[dict[str, tuple[tuple[int, ...], torch.Tensor]]]:
    """Inside the block, each module's first output (shape, `summary`) by path, in the order the modules finished
    (the model itself left out: the logits checks compare it)."""
    recorded: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
    handles = []
    for path, module in model.named_modules():
        if not path:
            continue

        def keep(_module: torch.nn.Module, _inputs: tuple[object, ...], output: object, path: str = path) -> None:
            tensor = _first_tensor(output)
            if tensor is not None and path not in recorded:
                recorded[path] = (tuple(tensor.shape), summary(tensor))

        handles.append(module.register_forward_hook(keep))
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


def first_divergence(
    reference: dict[str, tuple[tuple[int, ...], torch.Tensor]],
    sharded: dict[str, tuple[tuple[int, ...], torch.Tensor]],
    logits_rel: float,
) -> tuple[str, str] | None:
    """(path, figures) of the first module, in the order the sharded modules finished, whose output has the
    unsharded shape and differs beyond DIVERGENCE_ULPS times the logits bound; None when none does (a split output,
    column-parallel, has another shape and is not compared)."""
    bound = DIVERGENCE_ULPS * logits_rel
    for path, (shape, values) in sharded.items():
        expected = reference.get(path)
        if expected is None or expected[0] != shape:
            continue
        scale = float(expected[1].abs().max())
        difference = float((values - expected[1]).abs().max())
        if not math.isfinite(difference) or difference > bound * max(scale, torch.finfo(torch.float32).tiny):
            return path, f"(max |Δ| {difference:.3g} at output scale {scale:.3g}; bound {bound * scale:.3g})"
    return None


def _module_classes(path: str, model: torch.nn.Module, classes: dict[str, str]) -> tuple[str, str]:
    """(class before AutoTP, DeepSpeed's layer class or "") of the module at `path` of the sharded model."""
    current = type(model.get_submodule(path)).__name__ if path else type(model).__name__
    if type(model.get_submodule(path)).__module__.startswith("deepspeed."):
        return classes.get(path, current), current
    return current, ""


def located(path: str, how: str, model: torch.nn.Module, classes: dict[str, str], detail: str = "") -> BreakPoint:
    module_class, layer_class = _module_classes(path, model, classes)
    origin = origin_of(path, layer_class, how)
    origin_class = _module_classes(origin, model, classes)[0] if origin != path else module_class
    return BreakPoint(
        path=path,
        module_class=module_class,
        layer_class=layer_class,
        how=how,
        origin=origin,
        origin_class=origin_class,
        detail=detail,
    )


def raising_module(error: BaseException, model: torch.nn.Module, classes: dict[str, str]) -> BreakPoint | None:
    """The innermost module of `model` whose forward is in the exception's traceback."""
    paths = {id(module): path for path, module in model.named_modules()}
    innermost = None
    for frame in _frames(error.__traceback__):
        module = frame.f_locals.get("self")
        if isinstance(module, torch.nn.Module) and id(module) in paths and frame.f_code.co_name == "_call_impl":
            innermost = paths[id(module)]
    return None if innermost is None else located(innermost, "raised", model, classes)


REPLACING = ("_replace", "_replace_with_config", "_slice_embedding")
"""DeepSpeed's auto_tp.py methods that replace one module: the module a frame of theirs holds is the one being
replaced (the parser's frames hold modules too, none of which it replaces)."""


def replacing_module(error: BaseException, model: torch.nn.Module, before: dict[int, str]) -> BreakPoint | None:
    """The module init_inference was replacing when it raised (the innermost frame of one of REPLACING) and the
    DeepSpeed layer class it was building for it (the innermost frame of a method of one, with its fused qkv layout);
    None when it raised elsewhere (the parser). `before`: the model's module paths by id, from before it began."""
    path, layer_class = None, ""
    for frame in _frames(error.__traceback__):
        layer = frame.f_locals.get("self")
        if isinstance(layer, torch.nn.Module) and type(layer).__module__.startswith("deepspeed.module_inject"):
            layer_class = type(layer).__name__
        if frame.f_code.co_name in REPLACING:
            for value in frame.f_locals.values():
                if isinstance(value, torch.nn.Module) and id(value) in before:
                    path = before[id(value)]
    if path is None:
        return None
    module_class = type(model.get_submodule(path)).__name__
    if "fused" in layer_class:
        layer_class = f"{layer_class}({fused_layout(model, path)})"
    return BreakPoint(
        path=path,
        module_class=module_class,
        layer_class=layer_class,
        how="replacing",
        origin=path,
        origin_class=module_class,
    )


def fused_layout(model: torch.nn.Module, path: str) -> str:
    """The fused qkv layout DeepSpeed chooses for the linear at `path` from its decoder layer's name (fusedqkv_utils.py
    `get_fused_qkv_type`); "" where this release has no such function."""
    try:
        # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
        from deepspeed.module_inject.fusedqkv_utils import get_fused_qkv_type
    except ImportError:
        return ""
    parts = path.split(".")
    layer_end = next((index for index, part in enumerate(parts) if part.isdigit()), None)
    if layer_end is None:
        return ""
    layer = model.get_submodule(".".join(parts[: layer_end + 1]))
    return get_fused_qkv_type(layer) or "bloomtype"  # its fallback for an unrecognised layer


def _frames(traceback: TracebackType | None) -> Iterator[FrameType]:
    while traceback is not None:
        yield traceback.tb_frame
        traceback = traceback.tb_next

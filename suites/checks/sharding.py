"""What AutoTP did to a rank's model (suites/verdicts/mechanism.py `AutoTPRecord`), read from the model before and after
`init_inference` and from the policy DeepSpeed's parser returned: which modules it replaced with which of its layer
classes, which decoder-layer kinds got no policy, and which parameters and buffers it left whole next to a split.

The parser's choice is read by asking the parser itself, `AutoTP.tp_parser(model)`, on the model init_inference is
about to shard (`parsed_policy`): the parser is a function of the model's structure, so init_inference's own call
chooses the same. Nothing of DeepSpeed's is wrapped or replaced, so a traceback from inside init_inference has
DeepSpeed's frames only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from suites.checks.breakpoints import fused_layout
from suites.checks.policy_inference import disagreements, parser_made
from suites.checks.probes import SplitCounts
from suites.verdicts.mechanism import LEFT_WHOLE_KINDS, AutoTPRecord, LeftWhole, Replaced, mask_indices, parent
from suites.verdicts.outcome import exception_signature
from suites.verdicts.policy import InferredBlock, Policy

ROTARY = "Rotary"
"""Rotary embedding modules hold per-frequency tables (head_dim / 2 entries), a size that can equal a head count by
coincidence: never a tensor left whole next to a split."""


@dataclass(frozen=True)
class Snapshot:
    """The model as it was before init_inference: what the record and the located failures compare with."""

    shapes: dict[str, tuple[int, ...]]
    """Every parameter and buffer's shape, by name."""
    classes: dict[str, str]
    """Every module's class name, by path."""
    paths: dict[int, str]
    """Every module's path, by id (the modules init_inference had in hand when it raised)."""
    layers: tuple[tuple[str, str, tuple[str, ...]], ...]
    """The decoder layers as DeepSpeed's parser walks them (auto_tp.py `get_module_list`: the children of the first
    ModuleLists found): (path, class, the linears inside it)."""


def snapshot(model: torch.nn.Module) -> Snapshot:
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    modules = list(model.named_modules())
    return Snapshot(
        {name: tuple(tensor.shape) for name, tensor in named},
        {path: type(module).__name__ for path, module in modules},
        {id(module): path for path, module in modules},
        tuple(_decoder_layers(model, "")),
    )


def _decoder_layers(module: torch.nn.Module, prefix: str) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, torch.nn.ModuleList):
            for index, layer in enumerate(child):
                linears = tuple(sub for sub, m in layer.named_modules() if isinstance(m, torch.nn.Linear))
                yield f"{path}.{index}", type(layer).__name__, linears
        else:
            yield from _decoder_layers(child, f"{path}.")


def parsed_policy(model: torch.nn.Module) -> list[Policy]:
    """The policies DeepSpeed's parser chooses for `model` (none when it raises: init_inference then raises the same
    from its own call, and that is the cell's failure)."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    from deepspeed.module_inject.auto_tp import AutoTP

    try:
        policy: list[tuple[type[torch.nn.Module], list[str]]] = AutoTP.tp_parser(model)
    except Exception:  # the parser's refusal is init_inference's to raise, in DeepSpeed's frames
        return []
    return [Policy(layer.__name__, tuple(sorted(linears))) for layer, linears in policy]


def unparsed_kinds(before: Snapshot, policies: list[Policy]) -> tuple[str, ...]:
    """Decoder-layer kinds the parser gave no policy: a class it found nothing to all-reduce in, and layers of a parsed
    class with linears the one instance it parsed (the first) does not have."""
    if not policies:
        return ()
    parsed = {p.layer_class for p in policies}
    first: dict[str, tuple[str, tuple[str, ...]]] = {}
    unparsed: dict[str, list[str]] = {}
    for path, layer_class, linears in before.layers:
        seen = first.setdefault(layer_class, (path, linears))
        if layer_class not in parsed:
            unparsed.setdefault(f"{layer_class}: nothing to all-reduce found", []).append(path)
        elif missing := [name for name in linears if name not in seen[1]]:
            what = f"{layer_class}: linears {', '.join(missing)} not in {seen[0]}, the one the parser read"
            unparsed.setdefault(what, []).append(path)
    return tuple(f"{_indices(paths)} ({what})" for what, paths in unparsed.items())


def _indices(paths: list[str]) -> str:
    """`model.layers.{1,3}` for model.layers.1 and model.layers.3."""
    indices = [path.rpartition(".")[2] for path in paths]
    return f"{parent(paths[0])}.{indices[0] if len(indices) == 1 else '{' + ','.join(indices) + '}'}"


def sharding_record(
    *,
    before: Snapshot,
    model: torch.nn.Module,
    policies: list[Policy],
    counts: SplitCounts,
    tp: int,
    complete: bool = True,
    inferred: tuple[InferredBlock, ...] = (),
    inference_note: str = "",
    chosen_by: str = "the parser",
) -> AutoTPRecord:
    """`inferred`: the policy the unsharded model needs (suites/checks/policy_inference.py), compared here with what
    DeepSpeed made of each linear (with what `policies` make of it when init_inference raised first); `chosen_by`
    whose policies they are (`the parser`, or `the injection_policy` a cell passed)."""
    replaced = _replaced(before, model) if complete else []
    try:
        made = (
            {path: r.layer_class for path, r in replaced}
            if complete
            else parser_made(inferred, {p.layer_class: p.allreduce for p in policies})
        )
        found = disagreements(inferred, made, chosen_by) if complete or policies else ()
    except Exception as raised:  # a diagnosis that could not be made is a note on the cell, never its failure
        found = ()
        inference_note = "; ".join(
            filter(None, (inference_note, f"policy not compared: {exception_signature(raised)}"))
        )
    return AutoTPRecord(
        tp=tp,
        heads=counts.heads,
        kv_heads=counts.kv_heads,
        head_dim=counts.head_dim,
        experts=counts.experts,
        policies=tuple(policies),
        unparsed=unparsed_kinds(before, policies),
        replaced=tuple(_once_per_role([r for _, r in replaced])),
        left_whole=tuple(_left_whole(before, model, replaced, counts.head_dim)) if complete else (),
        complete=complete,
        inferred=inferred,
        disagreements=found,
        inference_note=inference_note,
    )


def _replaced(before: Snapshot, model: torch.nn.Module) -> list[tuple[str, Replaced]]:
    """(path, what replaced it) for every module DeepSpeed's layer classes replaced that has a weight."""
    found = []
    for path, module in model.named_modules():
        weight = getattr(module, "weight", None)
        full = before.shapes.get(f"{path}.weight")
        if not type(module).__module__.startswith("deepspeed.") or not isinstance(weight, torch.Tensor) or not full:
            continue
        layer_class = type(module).__name__
        dim = 1 if "Allreduce" in layer_class and len(full) > 1 else 0
        held = tuple(weight.shape)[dim] if weight.dim() > dim else full[dim]
        layout = fused_layout(model, path) if "fused" in layer_class else ""
        replaced = Replaced(
            path=mask_indices(path),
            was=before.classes.get(path, ""),
            layer_class=layer_class,
            shape=full,
            dim=dim,
            held=held,
            layout=layout,
        )
        found.append((path, replaced))
    return found


def _once_per_role(replaced: list[Replaced]) -> list[Replaced]:
    return list({(r.path, r.layer_class): r for r in replaced}.values())


def _left_whole(
    before: Snapshot, model: torch.nn.Module, replaced: list[tuple[str, Replaced]], head_dim: int
) -> list[LeftWhole]:
    """Parameters and buffers in a split projection's block (its parent module) that no rank split, one of whose
    dimensions is that projection's full width along its split dimension, or its head count."""
    after = {name: tuple(t.shape) for name, t in [*model.named_parameters(), *model.named_buffers()]}
    replaced_paths = tuple(f"{path}." for path, _ in replaced)
    found: dict[str, LeftWhole] = {}
    for path, projection in replaced:
        block = parent(path)
        width = projection.shape[projection.dim]
        heads = width // head_dim if head_dim and width % head_dim == 0 else 0
        if not block:
            continue  # the output head: its block is the whole model
        for name, shape in before.shapes.items():
            owner = parent(name)
            if not name.startswith(f"{block}.") or name.startswith(replaced_paths) or after.get(name) != shape:
                continue
            owner_class = before.classes.get(owner, "")
            if ROTARY in owner_class:
                continue
            norm = "norm" in owner_class.lower()
            over = "width" if width in shape else "heads" if heads > 1 and heads in shape and not norm else ""
            masked = mask_indices(name)
            if over and (masked not in found or _named_alike(masked, path)):
                kind = "norm" if norm else "per-head" if over == "heads" else "per-channel"
                assert kind in LEFT_WHOLE_KINDS
                size = width if over == "width" else heads
                found[masked] = LeftWhole(masked, kind, size, mask_indices(path), over)
    return list(found.values())


def _named_alike(tensor: str, projection: str) -> bool:
    """`self_attn.k_norm.weight` and `self_attn.k_proj`: the tensor's module is named for that projection, so it is
    the one to name beside it when several split projections have its width (k_proj's and q_proj's with as many kv
    heads as query heads)."""
    return parent(tensor).rpartition(".")[2].split("_")[0] == projection.rpartition(".")[2].split("_")[0]

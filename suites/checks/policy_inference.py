"""Which linears of each decoder-block class write the residual stream (suites/verdicts/policy.py), read from the
unsharded model on rank 0 before init_inference shards it, and compared with what DeepSpeed made of them.

One forward of the model runs until the first instance of every block class of the decoder stack has run (the rest
of the model is skipped by raising out of it), with autograd on from each such block's input: every nn.Linear's
output node is noted, then the autograd graph is walked back from the block's output through the operations that
carry the residual (additions, scalings, norms, casts, reshapes, a MoE's combine), stopping at any other operation
and at the block's input. The first linear outputs reached are the writers; the other linears that ran are readers.
A MoE router's scores reach the output only through its softmax/top-k, where the walk stops: it reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from suites.verdicts.policy import InferredBlock, Parallel, PolicyDisagreement, deepspeed_name

CARRIES_RESIDUAL = re.compile(
    r"(Add|Sub|Mul|Div|Neg|ToCopy|Copy|Copys|Clone|Alias|View|UnsafeView|Reshape|ReshapeAlias|Expand|Squeeze|"
    r"Unsqueeze|Transpose|Permute|T|Slice|Select|Index|IndexAdd|IndexPut|Scatter|ScatterAdd|Cat|Stack|Split|"
    r"SplitWithSizes|Unbind|Sum|Mean|Pow|Rsqrt|Sqrt|NativeLayerNorm|FusedRmsNorm|NativeDropout|Where|MaskedFill)"
    r"\d*Backward\d*"
)
"""The autograd nodes a residual contribution flows through between a writer and the block's output (every other
node, a matmul, an activation, a softmax, a top-k, stops the walk)."""


class _AllBlocksRead(Exception):
    """Raised out of the model's forward once every block class has run once: the rest is not needed."""


@dataclass
class _Reading:
    """What the hooks collect during the one forward."""

    layers: dict[str, tuple[str, str]]
    """Block path → (its class, the path of the list that holds it)."""
    wanted: set[str] = field(default_factory=set)
    """The block classes of the list the forward entered first, not yet read."""
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    linear_nodes: dict[str, dict[int, str]] = field(default_factory=dict)
    """Block path → {id of a linear output's autograd node: the linear's path inside the block}."""
    ran: dict[str, set[str]] = field(default_factory=dict)


def infer_policies(
    model: torch.nn.Module, input_ids: torch.Tensor, layers: tuple[tuple[str, str, tuple[str, ...]], ...]
) -> tuple[InferredBlock, ...]:
    """Each block class's writers and readers (`layers`: suites/checks/sharding.py `Snapshot.layers`, the decoder
    layers as DeepSpeed's parser walks them). Raises where the model cannot be run this way; the caller records why."""
    firsts: dict[str, tuple[str, str]] = {}
    for path, layer_class, _ in layers:
        firsts.setdefault(layer_class, (path, path.rpartition(".")[0]))
    reading = _Reading({path: (layer_class, within) for layer_class, (path, within) in firsts.items()})
    with _hooks(model, reading), torch.enable_grad():
        try:
            model(input_ids[:1])
        except _AllBlocksRead:
            pass
    blocks = []
    for path, (layer_class, _) in reading.layers.items():
        if path not in reading.outputs:
            continue  # another stack's block (a vision tower's) the text forward never enters
        nodes = reading.linear_nodes.get(path, {})
        written = _writers(reading.outputs[path], reading.inputs[path], nodes)
        linears = [name for name, m in model.get_submodule(path).named_modules() if isinstance(m, torch.nn.Linear)]
        ran = reading.ran.get(path, set())
        blocks.append(
            InferredBlock(
                layer_class=layer_class,
                block=path,
                writers=tuple(name for name in linears if name in written),
                readers=tuple(name for name in linears if name in ran and name not in written),
                unrun=tuple(name for name in linears if name not in ran),
            )
        )
    return tuple(blocks)


@contextmanager
def _hooks(model: torch.nn.Module, reading: _Reading) -> Iterator[None]:
    handles = []
    for path in reading.layers:
        block = model.get_submodule(path)
        handles.append(block.register_forward_pre_hook(_block_input(reading, path), with_kwargs=True))
        handles.append(block.register_forward_hook(_block_output(reading, path)))
        for name, module in block.named_modules():
            if isinstance(module, torch.nn.Linear):
                handles.append(module.register_forward_hook(_linear_output(reading, path, name)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _block_input(reading: _Reading, path: str) -> Any:
    """The block's hidden states replaced by a leaf of their own, so the walk knows where the block begins."""

    def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not reading.wanted and not reading.outputs:
            within = reading.layers[path][1]
            reading.wanted = {layer_class for layer_class, stack in reading.layers.values() if stack == within}
        if path in reading.inputs:
            return None
        if args and isinstance(args[0], torch.Tensor):
            reading.inputs[path] = args[0].detach().requires_grad_()
            return (reading.inputs[path], *args[1:]), kwargs
        if isinstance(kwargs.get("hidden_states"), torch.Tensor):
            reading.inputs[path] = kwargs["hidden_states"].detach().requires_grad_()
            return args, {**kwargs, "hidden_states": reading.inputs[path]}
        raise TypeError(f"`{path}` is called without its hidden states as a first argument or `hidden_states`")

    return hook


def _block_output(reading: _Reading, path: str) -> Any:
    def hook(_module: torch.nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        if path in reading.outputs or path not in reading.inputs:
            return
        first = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(first, torch.Tensor):
            raise TypeError(f"`{path}` returned {type(first).__name__}, not its hidden states")
        reading.outputs[path] = first
        reading.wanted.discard(reading.layers[path][0])
        if not reading.wanted:
            raise _AllBlocksRead

    return hook


def _linear_output(reading: _Reading, path: str, name: str) -> Any:
    def hook(_module: torch.nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        if path in reading.outputs or not isinstance(output, torch.Tensor):
            return
        reading.ran.setdefault(path, set()).add(name)
        if output.grad_fn is not None:
            reading.linear_nodes.setdefault(path, {})[id(output.grad_fn)] = name

    return hook


def _writers(output: torch.Tensor, block_input: torch.Tensor, linear_nodes: dict[int, str]) -> set[str]:
    """The linears whose output node the walk back from `output` reaches through residual-carrying nodes only."""
    found: set[str] = set()
    if output.grad_fn is None:
        return found
    stack, seen = [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in linear_nodes:
            found.add(linear_nodes[id(node)])
            continue
        if getattr(node, "variable", None) is block_input or not CARRIES_RESIDUAL.fullmatch(type(node).__name__):
            continue
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    return found


def disagreements(
    inferred: tuple[InferredBlock, ...], made: dict[str, str], chosen_by: str
) -> tuple[PolicyDisagreement, ...]:
    """Where what DeepSpeed made of a linear (`made`: its full path → DeepSpeed's layer class; a linear left whole is
    absent) disagrees with the inference: a writer made anything but `*Allreduce`, a reader made `*Allreduce`."""
    found = []
    for block in inferred:
        for linear in (*block.writers, *block.readers):
            layer_class = made.get(f"{block.block}.{linear}")
            if layer_class is None:
                continue
            row = "Allreduce" in layer_class
            if (linear in block.writers) != row:
                parallel: Parallel = "row-parallel" if row else "column-parallel"
                found.append(PolicyDisagreement(block.layer_class, linear, parallel, chosen_by))
    return tuple(found)


def parser_made(inferred: tuple[InferredBlock, ...], allreduce: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """What the parser's policy (block class → its row-parallel names) makes of each linear the inference read, in
    DeepSpeed's layer classes: for a cell whose init_inference raised before replacing them. DeepSpeed also makes
    every `down_proj` row-parallel whatever the policy (auto_tp.py `_replace`)."""
    made = {}
    for block in inferred:
        names = allreduce.get(block.layer_class, ())
        for linear in (*block.writers, *block.readers):
            row = deepspeed_name(linear) in names or "down_proj" in deepspeed_name(linear)
            made[f"{block.block}.{linear}"] = "LinearAllreduce" if row else "LinearLayer"
    return made

"""The policy a model needs, inferred from the unsharded model, and where DeepSpeed's choice disagrees with it: the
typed records a cell's AutoTP record carries (suites/verdicts/mechanism.py `AutoTPRecord.inferred`, `.disagreements`)
and the `injection_policy` they yield, which a user can pass today and the remedies try first.

A decoder block reads the residual stream and adds its results back into it. A linear whose output reaches the
block's output through additions, scalings, norms and reshapes alone *writes* the residual: under tensor parallelism
it must be row-parallel (each rank a partial sum, all-reduced: DeepSpeed's `LinearAllreduce`). Every other linear
the block ran *reads* (the residual, or what was computed from it): column-parallel (`LinearLayer`), or whole.
suites/checks/policy_inference.py reads this from one forward of each block class's first instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from matrix.cell_arguments import CellArguments

Parallel = Literal["column-parallel", "row-parallel"]


@dataclass(frozen=True)
class Policy:
    """What DeepSpeed's parser (module_inject/auto_tp.py `AutoTP.tp_parser`) chose for one decoder-layer class."""

    layer_class: str
    allreduce: tuple[str, ...]
    """The linears it made row-parallel (`LinearAllreduce`), named as the parser names them (`.o_proj`)."""


def deepspeed_name(path: str) -> str:
    """A linear's path inside its block as DeepSpeed's AutoTP matches it against a policy (auto_tp.py
    `_replace_module` passes `prev_name + '.' + name`: the parent's own name and the linear's):
    `self_attn.o_proj` → `self_attn.o_proj`, `mlp.experts.0.w2` → `0.w2`, `dense` → `.dense`."""
    parts = path.split(".")
    return f"{parts[-2] if len(parts) > 1 else ''}.{parts[-1]}"


@dataclass(frozen=True)
class InferredBlock:
    """Which linears of one decoder-block class write the residual stream, read from one forward of its first
    instance on the unsharded model."""

    layer_class: str
    block: str
    """The instance read (`model.layers.0`)."""
    writers: tuple[str, ...]
    """Linears whose output reaches the block's output through residual additions, scalings, norms and reshapes
    only (paths inside the block: `self_attn.o_proj`): they must be row-parallel."""
    readers: tuple[str, ...]
    """The other linears the forward ran: column-parallel or whole (a MoE router reads, and stays whole)."""
    unrun: tuple[str, ...] = ()
    """Linears the forward did not run (experts no token was routed to): neither, nothing is said of them."""

    def row_parallel(self) -> tuple[str, ...]:
        """The writers as `init_inference(injection_policy=...)` names them (`deepspeed_name`), each once."""
        return tuple(dict.fromkeys(deepspeed_name(path) for path in self.writers))


PARSER = "the parser"
"""Who chose a split no injection_policy named: auto_tp.py `tp_parser` (`PolicyDisagreement.chosen_by`)."""


@dataclass(frozen=True)
class PolicyDisagreement:
    """A linear whose split the policy DeepSpeed applied gets wrong by the inference: a writer it made column-parallel
    (its partial results never summed) or a reader it made row-parallel (its input split where it is whole)."""

    layer_class: str
    linear: str
    """The linear's path inside its block (`multi_head_attention.dense`)."""
    made: Parallel
    """What DeepSpeed made it."""
    chosen_by: str
    """Whose policy it applied: `the parser` (auto_tp.py `tp_parser`) or `the injection_policy` a cell passed."""

    @property
    def text(self) -> str:
        does = "writes" if self.made == "column-parallel" else "reads"
        return f"{self.chosen_by} made `{self.linear}` {self.made}; it {does} the residual"


@dataclass(frozen=True)
class InjectionPolicy:
    """An `init_inference(injection_policy={Block: ("a.b", ...)})` as data: each block class by name with its
    row-parallel linears in DeepSpeed's names, in the shape a cell's arguments carry it."""

    blocks: tuple[tuple[str, tuple[str, ...]], ...]

    def arguments(self) -> CellArguments:
        """The cell arguments that pass it to init_inference (matrix/cell_arguments.py; `policy_text()` says it as a
        user writes it)."""
        return CellArguments(injection_policy=self.blocks)


def injection_policy_candidate(
    inferred: tuple[InferredBlock, ...], disagreements: tuple[PolicyDisagreement, ...]
) -> InjectionPolicy | None:
    """The first `injection_policy` to try for a model whose policy disagrees with the inference: every inferred
    block class with its writers as the row-parallel linears; None when nothing disagrees (or nothing was inferred)."""
    if not disagreements:
        return None
    return InjectionPolicy(tuple((block.layer_class, block.row_parallel()) for block in inferred if block.writers))


def _ordered(disagreements: tuple[PolicyDisagreement, ...]) -> list[PolicyDisagreement]:
    """Missed writers first, each linear once (a hybrid model's block classes may name one alike)."""
    unique = {(d.made, d.linear, d.chosen_by): d for d in disagreements}
    return sorted(unique.values(), key=lambda d: (d.made != "column-parallel", d.linear))


def disagreement_words(disagreements: tuple[PolicyDisagreement, ...]) -> str:
    """The disagreements in a cause's words: "the parser made `multi_head_attention.dense` column-parallel; it writes
    the residual"."""
    return "; ".join(d.text for d in _ordered(disagreements))


def policy_key(disagreements: tuple[PolicyDisagreement, ...]) -> str:
    """A cause's key (suites/verdicts/cause.py `Cause.mechanism_key`):
    `policy|column-parallel:multi_head_attention.dense|...`, the same for every cell and tp of a model whose policy
    disagrees alike."""
    return "|".join(["policy", *(f"{d.made}:{d.linear}" for d in _ordered(disagreements))])


def policy_title(parts: list[str], sentence: bool) -> str:
    """A policy cause from its key's parts: the sentence every cell shares, or a bug report's title."""
    found = [
        PolicyDisagreement("", linear, "row-parallel" if made == "row-parallel" else "column-parallel", PARSER)
        for made, _, linear in (p.partition(":") for p in parts)
    ]
    if sentence:
        return "; ".join(d.text for d in found)
    return ", ".join(f"`{d.linear}` made {d.made} by the parser" for d in found)


def policy_lines(policies: tuple[Policy, ...]) -> list[str]:
    """The policies init_inference sharded by, one line each, as a cell's AutoTP record says them."""
    lines = [f"policy {p.layer_class}: all-reduce {', '.join(p.allreduce) or 'nothing'}" for p in policies]
    return lines or ["policy: none recorded (the parser raised, or init_inference was given one)"]


def record_lines(
    inferred: tuple[InferredBlock, ...], disagreements: tuple[PolicyDisagreement, ...], note: str
) -> list[str]:
    """What a cell's AutoTP record says of the inferred policy (suites/verdicts/mechanism.py `AutoTPRecord.text`)."""
    lines = [f"inferred {block.layer_class}: writers {', '.join(block.writers) or 'none'}" for block in inferred]
    return lines + [d.text for d in disagreements] + ([note] if note else [])

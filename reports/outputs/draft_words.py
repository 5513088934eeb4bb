"""A draft issue's words (reports/outputs/draft_issue.py): the behaviour expected of each failure class, and for a
training row what it asked of DeepSpeed, what its failure means and what its attached script checks (an inference
script would reproduce nothing of a training bug)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matrix.registry import DEFAULT_TOLERANCES
from suites.records.run_records import launcher_command

if TYPE_CHECKING:
    from matrix.cells import Cell

EXPECTED = {
    "shard": "`deepspeed.init_inference` shards the model without raising, as it does the unsharded model's layers.",
    "forward": "The sharded model runs its forward pass, generation and loss like the unsharded one.",
    "numerics": "Every rank's logits and loss match the unsharded model within the tolerance (fp32: "
    f"{DEFAULT_TOLERANCES['fp32'].logits_rel:.2g}·max|logit|), and all ranks agree.",
    "generation": "Greedy generation gives the unsharded model's tokens, single and padded batch.",
    "memory": "Each rank holds its share of every attention/MLP weight and MoE expert (at most ceil(u/tp)/u of it, u "
    "the heads or 64-wide grains it splits into): AutoTP splits them, so tp ranks need about 1/tp of the memory.",
    "timeout": "Every rank finishes within the cell's time limit (no collective waits forever).",
    "crash": "Every rank process stays alive.",
}
TRAINING_SYMPTOMS = {
    "numerics": "the loss, a gradient shard, a weight update or the saved, gathered or resumed weights differ from the "
    "same steps on the unsharded model beyond tolerance",
}
"""A training row's failure in words, where suites/verdicts/vocabulary.py FAILURE_CLASSES has inference's."""
TRAINING_EXPECTED = {
    "shard": "`deepspeed.initialize` shards the model for training without raising.",
    "forward": "The sharded model runs the training steps (forward, backward, optimizer step, checkpoint save and "
    "load) like the unsharded one.",
    "numerics": "Every step's loss, each rank's gradient shard and weight update, and the saved, gathered and "
    "resumed weights match the same steps on the unsharded model within the tolerance.",
}
"""Expected behavior of a training row, where it differs from an inference cell's."""


def expected_behavior(failure_class: str, *, training: bool) -> str:
    """The draft's Expected behavior: a training row's where it differs, else the class's."""
    default = EXPECTED.get(failure_class, "The sharded model behaves like the unsharded one.")
    return TRAINING_EXPECTED.get(failure_class, default) if training else default


def training_script_name(cell: Cell) -> str:
    """The attached script of a training row, named by the model type, tp and row as a maintainer reads them."""
    return f"autotp-{cell.model.model_type}-tp{cell.tp}-{cell.variant.name}.py"


def what_ran(training: Cell | None, tp: int) -> str:
    """What the failing cell asked of DeepSpeed in its API's words: the training row it ran, or inference (None)."""
    if training is not None:
        return (
            f'AutoTP training (`deepspeed.initialize(model=model, config={{"tensor_parallel": {{"autotp_size": {tp}}}, '
            f"...}})`; {training.variant.description})"
        )
    return (
        f'AutoTP (`deepspeed.init_inference(model, tensor_parallel={{"tp_size": {tp}}}, '
        "replace_with_kernel_inject=False)`)"
    )


def training_script_lines(script: str, tp: int, failure_class: str) -> list[str]:
    """To Reproduce for a training row: its script runs the row's steps; what it does not check is said."""
    raises = failure_class in ("shard", "forward", "crash", "timeout")
    return [
        f"Attached: `{script}`, the same model and the same steps: `{launcher_command(tp, script)}` (torch, "
        "deepspeed and transformers only; a CPU-only machine works: DeepSpeed's CPU accelerator with gloo) runs the "
        "optimizer steps on the unsharded model, then through `deepspeed.initialize` with AutoTP, and compares what "
        "this report compares, with its tolerances: each step's loss, each rank's gradient shards, the weight update, "
        "each rank's share of the weights and, for a checkpoint round trip, the saved, gathered and loaded weights and "
        "the step after loading (a part of the row it leaves out, it names in a note); it prints `RESULT: MATCH` or "
        "`RESULT: MISMATCH`, or raises where DeepSpeed raises."
        + ("" if raises else " Actual behavior below lists what differed."),
    ]

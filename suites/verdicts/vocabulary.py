"""The harness's vocabulary of verdicts, typed: a cell's outcome and a failed cell's class. Every record and function
that holds one is annotated with these Literals, so the type checker refuses a misspelt class or a comparison with
a value it never takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

Outcome = Literal["pass", "fail", "skip", "unsupported"]
"""A cell's verdict (CellOutcome.outcome, the store's results). `skip`: the harness does not run the cell (the registry,
the run's options, a memory plan): no verdict on AutoTP. `unsupported`: DeepSpeed itself refuses what the cell asks
for here (a dtype its accelerator does not list): a verdict on the installed DeepSpeed, its message naming the
refusal and the release, that a history can bisect (`python -m reports bisect --mode supported`)."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

FailureClass = Literal["setup", "shard", "forward", "numerics", "generation", "memory", "timeout", "crash", "install"]
"""A failed cell's one class (FAILURE_CLASSES says what each means)."""
FailureClassIfFailed = FailureClass | Literal[""]
"""A failure class, "" where the cell (or check) did not fail."""

FAILURE_CLASSES: Mapping[str, str] = {
    "setup": "the harness failed: building or loading the model or its reference, or its own code raised in a stage "
    "(a harness bug for tiny checkpoints, or a model output it cannot read)",
    "shard": "deepspeed.init_inference raised",
    "forward": "the sharded model raised during forward, generate or the loss",
    "numerics": "logits, perplexity or rank agreement beyond tolerance",
    "generation": "greedy tokens or decode-step logits differ from the reference",
    "memory": "a weight AutoTP must split is left whole on every rank or split more unevenly than its heads or grains "
    "force, or a rank holds a tensor the unsharded model does not have",
    "timeout": "the rank group did not answer within the cell timeout (e.g. a deadlocked collective)",
    "crash": "a rank process died (signal, os._exit, segfault, OOM kill)",
    "install": "the session's environment could not be installed",
}
"""Each failure class and what it means (the report and issue drafts quote it), in the order messages list them;
looked up by the text a record holds (the reports' records hold a class as text: "unknown" from a JUnit file)."""
assert tuple(FAILURE_CLASSES) == get_args(FailureClass), "every failure class is described, in the Literal's order"

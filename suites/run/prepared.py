"""A cell as the driver works it out once, before anything is built for it (suites/run/driver.py `prepare_cell`): its
checkpoint resolved with its identity, the checkpoint's size, the memory plan against this runner (the references'
included) and the one skip verdict that follows from them. What comes after (the variant's setup, the references,
the job, the cell's record) reads it: nothing downstream resolves, hashes or plans the cell again."""

from __future__ import annotations

from dataclasses import dataclass

from matrix.cells import Cell
from matrix.checkpoints import Checkpoint
from matrix.registry import DType
from suites.reference.checkpoint_sizes import CheckpointSize
from suites.reference.memory_plan import MemoryPlan, ReferencePlan, Runner

QUANTIZED_BASELINE_DTYPE: DType = "fp32"
"""The dtype of a quantized variant's baseline reference: its relaxed checks compare with the unquantized model."""


@dataclass(frozen=True)
class PreparedCell:
    """One cell, its checkpoint known and its memory planned."""

    cell: Cell
    checkpoint: Checkpoint
    """The weights' folder and identity (`revision`: the hub commit, or a tiny checkpoint's content hash), read
    when it was resolved: the references' cache key and the record's revision. A hub checkpoint may still lack its
    weight files (`matrix.checkpoints.fetch_weights` brings them once the cell runs)."""
    size: CheckpointSize
    """What the checkpoint holds, read from its metadata: what `plan` was made from."""
    plan: MemoryPlan
    """The cell's processes against the runner that let it run (`runner`), the references' included
    (`plan.reference`, a quantized variant's `plan.baseline`): a reference offloads as this plan says."""
    skip: str | None
    """Why the cell does not run though its checkpoint is known: its plan's problem, or its variant's partitioning
    source missing for the model; None: it runs. What needs no checkpoint to tell is decided before one is resolved
    (suites/run/driver.py `skip_reason`)."""

    @property
    def runner(self) -> Runner:
        """What the plan may use: this machine, counting what this run's live rank group and reference process hold."""
        return self.plan.runner

    @property
    def baseline_plan(self) -> ReferencePlan:
        """The plan of a quantized variant's baseline reference (in QUANTIZED_BASELINE_DTYPE)."""
        if self.plan.baseline is None:
            raise ValueError(f"cell {self.cell.id} has no baseline reference to plan (not a quantized variant)")
        return self.plan.baseline

"""Driver side of one cell: decide skips, prepare the checkpoint and the reference, hand the cell
to a rank group and return its outcome. Nothing here raises for a cell's own failure."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import transformers

from matrix.cells import Cell
from matrix.checkpoints import tiny_checkpoint
from suites import variant_setup
from suites.inputs import ProbeSpec
from suites.outcome import CellOutcome, exception_signature, failed
from suites.rank_group import RankGroupPool
from suites.reference import cached_reference, cached_task_reference
from suites.task_probe import AccuracyTask


@dataclass(frozen=True)
class RunOptions:
    checkpoints: str = "tiny"
    """`tiny`: the registry's tiny random checkpoint; `hub`: the entry's first real hub id."""
    allow_remote_code: bool = False
    cell_timeout: float = 180.0
    faults: tuple[str, ...] = ()
    """Test-only fault hooks (`module:function`), see suites/cell_runner.py."""
    spec: ProbeSpec = ProbeSpec()
    accuracy_task: AccuracyTask | None = None
    """Also score this task on the sharded model against the unsharded one (checks/accuracy.py)."""


def skip_reason(cell: Cell, options: RunOptions) -> str | None:
    entry = cell.model
    if entry.skip_reason:
        return entry.skip_reason
    if entry.trust_remote_code and not options.allow_remote_code:
        return f"{entry.name} needs trust_remote_code; refused unless you pass --allow-remote-code"
    if options.checkpoints == "hub" and not entry.hub_ids:
        return f"{entry.name} has no hub_ids in matrix/models.toml"
    return entry.version_skip_reason(transformers.__version__)


def checkpoint_source(cell: Cell, options: RunOptions) -> tuple[str, str | None]:
    """(checkpoint to load, tokenizer source); tiny checkpoints use the byte tokenizer (None)."""
    if options.checkpoints == "hub":
        return cell.model.hub_ids[0], cell.model.hub_ids[0]
    return str(tiny_checkpoint(cell.model)), None


def prepare_job(cell: Cell, options: RunOptions) -> dict | CellOutcome:
    reason = skip_reason(cell, options)
    if reason:
        return CellOutcome("skip", message=reason)
    try:
        checkpoint, tokenizer = checkpoint_source(cell, options)
        variant_fields = variant_setup.prepare(cell, checkpoint, tokenizer, options.spec)
        if isinstance(variant_fields, CellOutcome):
            return variant_fields
        reference = variant_fields.pop("reference", None) or cached_reference(
            checkpoint, tokenizer, cell.dtype, options.spec, cell.model.trust_remote_code)
        # Quantized and training variants have references of their own; a task score is compared with
        # the unsharded model of the same weights only.
        if options.accuracy_task and not (cell.variant.training or cell.variant.quantization):
            variant_fields["accuracy_task"] = asdict(options.accuracy_task)
            variant_fields["accuracy_reference"] = str(cached_task_reference(
                checkpoint, tokenizer, cell.dtype, options.accuracy_task, cell.model.trust_remote_code))
    except Exception as error:  # the cell's setup failed; the run goes on
        return failed("setup", exception_signature(error), f"building the checkpoint or unsharded reference failed: {error!r}")
    return {"cell": cell.coordinates(), "checkpoint": checkpoint, "tokenizer": tokenizer, "dtype": cell.dtype,
            "load": cell.variant.load, "trust_remote_code": cell.model.trust_remote_code, "reference": str(reference),
            "tolerance": cell.model.tolerance_for(cell.dtype).__dict__, "spec": options.spec.as_dict(),
            "faults": list(options.faults), **variant_fields}


def run_cell(cell: Cell, pool: RankGroupPool, options: RunOptions) -> CellOutcome:
    job = prepare_job(cell, options)
    if isinstance(job, CellOutcome):
        return job
    return pool.run(cell.tp, job, options.cell_timeout)

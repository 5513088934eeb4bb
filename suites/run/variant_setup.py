"""Driver-side preparation a variant needs beyond the plain reference: its skip reasons (asked by the driver,
suites/run/driver.py, before and once the checkpoint is known), the `.bin` copy for the meta loader, the quantized
reference plus the fp32 baseline, the unsharded training step. Returns the job's variant fields, or the cell's
outcome when its quantization cannot run."""

from __future__ import annotations

from matrix.cells import Cell
from matrix.checkpoints import Checkpoint, tiny_checkpoint
from matrix.registry import ModelEntry, load_models
from suites.checks.contracts import MetaLoad, TrainedModel, VariantFields
from suites.checks.inputs import ProbeSpec
from suites.reference.cache import ReferenceForker, cached_reference
from suites.run.prepared import QUANTIZED_BASELINE_DTYPE, PreparedCell
from suites.variants.loading import checkpoint_copy, checkpoints_json, fresh_process_meta_failure
from suites.variants.quantization import QuantizationUnavailable
from suites.variants.training import model_skip_reason, version_skip_reason
from suites.variants.unsharded_cache import cached_unsharded_steps
from suites.verdicts.outcome import CellOutcome


def skip_reason(cell: Cell) -> str | None:
    """Why the installed DeepSpeed cannot run the cell's variant, or None (no checkpoint needed to tell)."""
    variant = cell.variant
    if variant.keep_module_on_host:
        # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
        from deepspeed.inference.config import DeepSpeedInferenceConfig

        known = (
            getattr(DeepSpeedInferenceConfig, "model_fields", None) or DeepSpeedInferenceConfig.__fields__
        )  # pydantic 2 / 1
        if "keep_module_on_host" not in known:
            return "this deepspeed's init_inference has no keep_module_on_host option"
    if variant.training:
        if loss := cell.model.probe_skips.get("perplexity"):  # the probe the model cannot run is the step's loss
            return f"training steps on the labels= loss, which {cell.model.name} cannot run: {loss}"
        return version_skip_reason(variant.needs)
    return None


def checkpoint_skip_reason(cell: Cell, checkpoint: Checkpoint) -> str | None:
    """Why a training row cannot run on this checkpoint: its partitioning source does not exist for the model, or
    its second model (a tiny checkpoint with a byte vocabulary) does not fit the cell's tokenizer; else None."""
    variant = cell.variant
    if not variant.training:
        return None
    reason = model_skip_reason(variant, checkpoint.folder, cell.model.model_type)
    if reason:
        return reason
    if variant.second_model and checkpoint.tokenizer is not None:
        return (
            f"the second model ({variant.second_model}) is a tiny checkpoint with a byte "
            "vocabulary; the cell's tokenizer does not fit it"
        )
    return None


def prepare(
    prepared: PreparedCell, spec: ProbeSpec, fork_server: ReferenceForker | None = None, longest_steps: int = 0
) -> VariantFields | CellOutcome:
    """The variant's job fields, computed in the driver (never in a rank) for a cell that runs (`prepared.skip` is
    None); references in a child of `fork_server` when the run has one (suites/reference/unsharded.py), offloaded as the
    cell's plan says; a training row's unsharded steps as the first of `longest_steps` (see cached_unsharded_steps)."""
    cell, checkpoint = prepared.cell, prepared.checkpoint
    variant, trust = cell.variant, cell.model.trust_remote_code
    meta, reference, baseline = None, None, None
    trained: tuple[TrainedModel, ...] = ()
    if variant.load == "meta":
        # Written here, once, not by the ranks: N ranks writing the same file raced (seen in CI on a fresh cache).
        copy = checkpoint_copy(checkpoint.folder, variant.checkpoint_format, variant.checkpoint_files)
        meta = MetaLoad(
            str(copy),
            str(checkpoints_json(copy, variant.checkpoint_format)),
            fresh_process_meta_failure(checkpoint.folder, cell.dtype, trust),
        )
    if variant.training:
        trained = _trained_models(cell, checkpoint, spec, longest_steps)
    if variant.quantization:
        try:
            reference = str(
                cached_reference(
                    checkpoint,
                    cell.dtype,
                    spec,
                    plan=prepared.plan.reference,
                    trust_remote_code=trust,
                    quantization=variant.quantization,
                    quant_group_size=variant.quant_group_size,
                    fork_server=fork_server,
                )
            )
        except QuantizationUnavailable as error:
            return CellOutcome("skip", message=f"not an AutoTP question here: {error}")
        baseline = str(
            cached_reference(
                checkpoint,
                QUANTIZED_BASELINE_DTYPE,
                spec,
                plan=prepared.baseline_plan,
                trust_remote_code=trust,
                fork_server=fork_server,
            )
        )
    return VariantFields(meta, trained, reference, baseline)


def _trained_models(
    cell: Cell, checkpoint: Checkpoint, spec: ProbeSpec, longest_steps: int
) -> tuple[TrainedModel, ...]:
    """The unsharded steps of the cell's model (and of the row's second model)."""
    variant = cell.variant
    steps = variant.unsharded_steps

    def trained(entry: ModelEntry, entry_checkpoint: str) -> TrainedModel:
        unsharded_steps = cached_unsharded_steps(
            checkpoint=entry_checkpoint,
            tokenizer=checkpoint.tokenizer,
            dtype=cell.dtype,
            spec=spec,
            trust_remote_code=entry.trust_remote_code,
            steps=steps,
            optimizer=variant.optimizer,
            longest=longest_steps,
        )
        return TrainedModel(entry_checkpoint, entry.model_type, str(unsharded_steps))

    second = [load_models()[variant.second_model]] if variant.second_model else []
    return (trained(cell.model, checkpoint.folder), *(trained(entry, str(tiny_checkpoint(entry))) for entry in second))

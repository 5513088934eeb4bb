"""Driver-side preparation a variant needs beyond the plain reference: skip reasons, the `.bin`
copy for the meta loader, the quantized reference plus the fp32 baseline, the unsharded training
step. Returns extra job fields, or the cell's outcome when it cannot run."""

from __future__ import annotations

from matrix.cells import Cell
from suites.inputs import ProbeSpec
from suites.loading import checkpoint_copy, checkpoints_json
from suites.outcome import CellOutcome
from suites.quantization import QuantizationUnavailable
from suites.reference import cached_reference


def skip_reason(cell: Cell) -> str | None:
    variant = cell.variant
    if variant.keep_module_on_host:
        from deepspeed.inference.config import DeepSpeedInferenceConfig

        known = getattr(DeepSpeedInferenceConfig, "model_fields", None) or DeepSpeedInferenceConfig.__fields__  # pydantic 2 / 1
        if "keep_module_on_host" not in known:
            return "this deepspeed's init_inference has no keep_module_on_host option"
    if variant.training:
        from suites.training import version_skip_reason

        return version_skip_reason()
    return None


def prepare(cell: Cell, checkpoint: str, tokenizer: str | None, spec: ProbeSpec) -> dict | CellOutcome:
    """Extra job fields for the variant, computed in the driver (never in a rank)."""
    variant, trust = cell.variant, cell.model.trust_remote_code
    reason = skip_reason(cell)
    if reason:
        return CellOutcome("skip", message=reason)
    fields = {"variant": variant.as_job()}
    if variant.load == "meta":
        # Written here, once, not by the ranks: N ranks writing the same file raced (seen in CI on a fresh cache).
        fields["checkpoint"] = str(checkpoint_copy(checkpoint, variant.checkpoint_format, variant.checkpoint_files))
        fields["checkpoints_json"] = str(checkpoints_json(fields["checkpoint"], variant.checkpoint_format))
    if variant.training:
        from suites.training import cached_unsharded_step

        fields["training_step"] = str(cached_unsharded_step(checkpoint, tokenizer, cell.dtype, spec, trust))
    if variant.quantization:
        try:
            fields["reference"] = str(cached_reference(checkpoint, tokenizer, cell.dtype, spec, trust,
                                                       variant.quantization, variant.quant_group_size))
        except QuantizationUnavailable as error:
            return CellOutcome("skip", message=f"not an AutoTP question here: {error}")
        fields["baseline"] = str(cached_reference(checkpoint, tokenizer, "fp32", spec, trust))
    return fields

"""The records that cross between the driver and the ranks: the `Job` a rank group runs (written by the driver
as `job-<seq>.json`, read by every rank) and the `RankSummary` each rank hands rank 0 for the verdict (with a
training cell's steps and reports in it: typed dicts of `ComparisonRecord`s, pickled across). Typed and frozen, so a
field is named once and no merge of dicts can overwrite another part's field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from matrix.cell_arguments import NO_ARGUMENTS, CellArguments
from matrix.registry import DType, Tolerance
from matrix.variants import Variant
from suites.checks.inputs import ProbeSpec
from suites.checks.probes import SplitCounts
from suites.checks.result import Finding
from suites.checks.task_probe import AccuracyTask
from suites.verdicts.outcome import RankError

if TYPE_CHECKING:
    import torch

    from suites.checks.probes import TensorKind


@dataclass(frozen=True)
class MetaLoad:
    """A `meta` variant's checkpoint copy in the variant's format and file count, written once by the driver
    (N ranks writing the same file raced), and what a user's fresh process hits building the model."""

    checkpoint: str
    """The copy the ranks build the model from and `init_inference` reads the weights of."""
    checkpoints_json: str
    fresh_process_failure: dict[str, str] | None
    """suites/variants/loading.py `fresh_process_meta_failure`: `signature` and `message`, or None."""


@dataclass(frozen=True)
class TrainedModel:
    """A model a training cell trains, with the unsharded steps it is compared with."""

    checkpoint: str
    model_type: str
    unsharded_steps: str
    """The file of the unsharded model's steps (suites/variants/unsharded_cache.py `cached_unsharded_steps`)."""


@dataclass(frozen=True)
class VariantFields:
    """What a variant adds to its cell's job, prepared in the driver (suites/run/variant_setup.py)."""

    meta: MetaLoad | None = None
    trained: tuple[TrainedModel, ...] = ()
    """Training: the cell's model first, then the row's second model."""
    reference: str | None = None
    """Quantized variants: the quantized unsharded reference (instead of the plain one)."""
    baseline: str | None = None
    """Quantized variants: the fp32 unsharded reference the relaxed checks compare with."""


@dataclass(frozen=True)
class Job:
    """One cell for a rank group."""

    cell_id: str
    checkpoint: str
    """The cell's checkpoint folder (a `meta` cell loads `meta.checkpoint`, its copy; see `loaded_checkpoint`)."""
    tokenizer: str | None
    dtype: DType
    variant: Variant
    trust_remote_code: bool
    tolerance: Tolerance
    spec: ProbeSpec
    reference: str | None = None
    """The unsharded reference's file; None for a training cell (it compares with `trained`)."""
    baseline: str | None = None
    meta: MetaLoad | None = None
    trained: tuple[TrainedModel, ...] = ()
    accuracy_task: AccuracyTask | None = None
    accuracy_reference: str | None = None
    real_counts: SplitCounts | None = None
    """A faithful cell's real checkpoint counts (suites/checks/probes.py `faithful_counts`): what its memory check
    judges each split by; None for a stress cell."""
    arguments: CellArguments = NO_ARGUMENTS
    """What the ranks pass besides the variant's: `injection_policy` to init_inference, keywords to the load, the
    mask-less forward's mask (matrix/cell_arguments.py)."""
    faults: tuple[str, ...] = ()
    """Test-only fault hooks (`module:function`), see suites/engine/cell_runner.py."""
    seq: int = 0
    """The rank group's sequence number of this cell (set by the group when it hands the job over)."""

    @property
    def loaded_checkpoint(self) -> str:
        return self.meta.checkpoint if self.meta else self.checkpoint


class UnshardedSteps(TypedDict):
    """suites/variants/training.py `compute_unsharded_steps`: what a training cell's ranks compare their steps with
    (the driver writes it with torch.save)."""

    losses: list[float]
    grads: list[dict[str, torch.Tensor]]
    """Each step's gradient of every parameter that has one."""
    weights: list[dict[str, torch.Tensor]]
    """The weights before the first step, then after each step."""
    adam_gradient_units: list[dict[str, torch.Tensor]]
    """`adam_gradient_units` after each step; empty for an optimizer other than Adam."""
    bytes_by_name: dict[str, int]
    kinds: dict[str, TensorKind]
    shapes_by_name: dict[str, tuple[int, ...]]
    counts: dict[str, int]
    """suites/checks/probes.py SplitCounts, as a dict."""
    lm_head: str
    """The output head's module path ("" without one); `lm_head_weight` the name its weight is listed under."""
    lm_head_weight: str


@dataclass(frozen=True)
class ComparisonRecord:
    """What a suites/variants/trainee.py `Comparison` found on one rank (sharded tensors against the matching slices
    of unsharded ones), as the rank hands it to rank 0; suites/checks/training.py judges the ranks' records."""

    largest: float
    """The largest unsharded magnitude over the tensors compared (the whole model's)."""
    floor_share: float
    """The smallest scale an error is divided by, as a share of `largest` (trainee.py `scale_floor_share`)."""
    max_rel_error: float
    """Largest max|t_tp - t_ref| / max|t_ref| over the tensors compared (NaN when one held a NaN)."""
    worst_parameter: str
    """The parameter `max_rel_error` is of ("" when none differed)."""
    compared: int
    """How many tensors were compared."""
    problems: tuple[Finding, ...]
    """Tensors that are missing, unexpected, or not slices of the unsharded ones."""
    errors_at_floor: dict[str, float]
    """k (as text: a JSON object's keys) -> the largest error had the scale floor been 2^-k of the largest magnitude
    (trainee.py FLOOR_CANDIDATES)."""
    worst_vanished: bool
    """The worst parameter's sharded tensor is zero (at most trainee.py VANISHED_SHARE of its unsharded scale) where
    the unsharded one is not: an update or gradient that vanished, another mechanism than one off by a factor."""
    loss_scale: float
    """The factor the gradients read were divided by: the loss scale DeepSpeed's backward multiplied the loss by,
    which its step divides out (1 where it scales none; trainee.py `ShardedTrainee.step`)."""


class RoundTripReport(TypedDict):
    """suites/variants/training.py `round_trip` on one rank: the checkpoint's weights and the resumed step, against the
    unsharded steps."""

    saved: ComparisonRecord | None
    """The saved 16-bit weights (rank 0 reads the file; None on the other ranks)."""
    gathered: ComparisonRecord
    loaded: ComparisonRecord
    resumed_step: int
    resumed_tp: int
    resumed_loss: float
    resumed_grads: ComparisonRecord
    resumed_update: ComparisonRecord


class _TraineeReportFields(TypedDict):
    label: str
    losses: list[float]
    steps: list[ComparisonRecord]
    """Each step's gradients."""
    problems: list[Finding]
    update: ComparisonRecord
    bytes_by_name: dict[str, int]
    sharded: int
    """Parameters this rank holds a slice of."""
    lm_head_mode: str


class TraineeReport(_TraineeReportFields, total=False):
    """suites/variants/trainee.py `ShardedTrainee.report` on one rank (suites/checks/training.py judges one per rank and
    model)."""

    round_trip: RoundTripReport
    """The cell's own model, for a row with the checkpoint round trip."""


class TrainingReport(TypedDict):
    """suites/variants/training.py `run_training`'s report of one rank: the cell's model first, then the row's second
    model."""

    models: list[TraineeReport]


@dataclass(frozen=True)
class RankSummary:
    """What each rank hands rank 0 (all_gather_object) after the cell's stages, for the verdict."""

    rank: int
    error: RankError | None
    rss_bytes: int
    rss_peak_bytes: int
    rss_before_load_bytes: int
    rss_peak_loaded_bytes: int
    """Peak RSS at the end of sharding (or training)."""
    training: TrainingReport | None
    """suites/variants/training.py `run_training`'s report, for a training cell."""
    bytes_by_name: dict[str, int] | None
    """The bytes this rank holds of each tensor (suites/checks/probes.py), for an inference cell."""
    last_logits: torch.Tensor | None
    """The last position's plain-prompt logits for an inference cell, else None."""
    shapes_by_name: dict[str, tuple[int, ...]] | None = None
    """The shape of each tensor this rank holds, for an inference cell: the memory check reads which dimension of a
    weight AutoTP split."""
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    """CPU seconds this rank spent in each stage it finished (`load`, `shard`, `forward`, `training`, `accuracy`) and in
    the whole `cell` up to this summary (suites/engine/cell_runner.py `StageClock`): summed over the ranks into the
    cell's `cpu_<stage>_s` metrics, what a stage costs on a shared machine where wall seconds do not tell."""

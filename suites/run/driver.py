"""Driver side of one cell: decide its skips, prepare it once (checkpoint resolved with its identity and size, memory
planned: a cell that cannot fit is a skip naming what would; suites/run/prepared.py `PreparedCell`), prepare its variant
and reference by that, hand the cell to a rank group and return its outcome with the plan and the checkpoint revision
it loaded. Nothing here raises for a cell's own failure."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import transformers

from matrix import cache_root
from matrix.cells import Cell, selection_options
from matrix.checkpoints import Checkpoint, cached_tiny_checkpoint, fetch_weights, resolve_checkpoint
from matrix.config_values import ExpansionError
from matrix.disk_space import disk_full_at, disk_full_line
from matrix.registry import DType
from suites.checks.contracts import Job
from suites.checks.inputs import ProbeSpec
from suites.checks.probes import faithful_counts
from suites.checks.task_probe import AccuracyTask
from suites.engine.rank_group import RankGroupPool
from suites.reference.cache import (
    ReferenceForker,
    cached,
    cached_task_reference,
    observations_request,
    reference_process_pids,
    start_reference_process,
)
from suites.reference.checkpoint_sizes import CheckpointSize, checkpoint_size
from suites.reference.memory_plan import (
    GiB,
    MemoryPlan,
    Runner,
    TrainingShape,
    anonymous_bytes,
    gib,
    plan_cell,
    session_pids,
)
from suites.reference.unsharded import ObservationsRequest, reference_record
from suites.run import variant_setup
from suites.run.ahead import AheadForker, RunAhead
from suites.run.command import CELL_TIMEOUT_S
from suites.run.prepared import QUANTIZED_BASELINE_DTYPE, PreparedCell
from suites.variants.loading import TORCH_DTYPES
from suites.verdicts.mechanism import Failure, cause_of
from suites.verdicts.outcome import CellOutcome, exception_signature, failed, harness_failure, mask_numbers

Provenance = dict[str, Any]
"""What a cell's record says about its weights and memory (`_provenance`): `checkpoint` and `metrics`."""


@dataclass(frozen=True)
class RunOptions:
    checkpoints: str = "tiny"
    """`tiny`: the registry's tiny random checkpoint; `hub`: the entry's first real hub id (at its pinned revision)."""
    allow_remote_code: bool = False
    cell_timeout: float = CELL_TIMEOUT_S
    faults: tuple[str, ...] = ()
    """Test-only fault hooks (`module:function`), see suites/engine/cell_runner.py."""
    spec: ProbeSpec = ProbeSpec()
    accuracy_task: AccuracyTask | None = None
    """Also score this task on the sharded model against the unsharded one (checks/accuracy.py)."""
    unsharded_steps: dict[str, int] = field(default_factory=dict)
    """Training: optimizer -> the most unsharded steps a cell of the run compares with under it (`longest_steps`);
    the driver computes that many once per model and gives a row needing fewer their first steps."""


def skip_reason(cell: Cell, options: RunOptions) -> str | None:
    """Why the cell does not run, as far as that is known without its checkpoint: a harness skip
    (`harness_skip_reason`) or DeepSpeed's refusal of its dtype (`dtype_refusal`). Decided before anything is
    resolved or built; what needs the checkpoint is `PreparedCell.skip` (`prepare_cell`)."""
    return harness_skip_reason(cell, options) or dtype_refusal(cell.dtype)


def longest_steps(cells: list[Cell]) -> dict[str, int]:
    """`RunOptions.unsharded_steps` of a run of `cells`: per optimizer, the most unsharded steps a training cell
    compares with."""
    longest: dict[str, int] = {}
    for variant in {cell.variant for cell in cells if cell.variant.training}:
        longest[variant.optimizer] = max(longest.get(variant.optimizer, 0), variant.unsharded_steps)
    return longest


def harness_skip_reason(cell: Cell, options: RunOptions) -> str | None:
    """Why the harness does not run the cell: the registry's entry, the run's options, the installed transformers
    and DeepSpeed's training features (the variant)."""
    entry = cell.model
    if entry.skip_reason:
        return entry.skip_reason
    if entry.trust_remote_code and not options.allow_remote_code:
        return f"{entry.name} needs trust_remote_code; refused unless you pass --allow-remote-code"
    if options.checkpoints == "hub" and not entry.hub_ids:
        return f"{entry.name} has no hub_ids in matrix/models.toml"
    return entry.version_skip_reason(transformers.__version__) or variant_setup.skip_reason(cell)


def dtype_refusal(dtype: DType) -> str | None:
    """Why the installed DeepSpeed refuses `dtype` on the ranks' accelerator (its `supported_dtypes`), naming the
    release and what it lists, or None: the cell's outcome is then `unsupported`, a state the history can bisect."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    supported = accelerator.supported_dtypes()
    if TORCH_DTYPES[dtype] not in supported:
        listed = ", ".join(str(d).removeprefix("torch.") for d in supported)
        return (
            f"DeepSpeed {deepspeed.__version__} does not support {dtype} on its {accelerator.device_name()} "
            f"accelerator here (supported_dtypes: {listed})"
        )
    return None


def prepare_cell(cell: Cell, options: RunOptions, runner: Runner) -> PreparedCell:
    """The cell worked out once: its checkpoint resolved (a hub snapshot without its weights: the plan reads its
    config and weight index, so a cell the plan skips never downloads them; one without an index is sized from its
    weights, fetched first), sized, planned against `runner`, and its skip verdict."""
    checkpoint = resolve_checkpoint(cell.model, options.checkpoints, weights=False)
    size = _size(cell, checkpoint)
    plan = plan_for(cell, size, runner, options)
    skip = f"memory plan: {plan.problem}" if plan.problem else variant_setup.checkpoint_skip_reason(cell, checkpoint)
    return PreparedCell(cell=cell, checkpoint=checkpoint, size=size, plan=plan, skip=skip)


def _size(cell: Cell, checkpoint: Checkpoint) -> CheckpointSize:
    try:
        return checkpoint_size(checkpoint.folder)
    except FileNotFoundError:  # no index: only the weight files themselves tell the size
        fetch_weights(cell.model, checkpoint)
        return checkpoint_size(checkpoint.folder)


def plan_for(cell: Cell, size: CheckpointSize, runner: Runner, options: RunOptions) -> MemoryPlan:
    """The cell's memory plan from its checkpoint's size: its ranks and its references, against `runner`."""
    return plan_cell(
        size,
        cell.dtype,
        tp=cell.tp,
        load=cell.variant.load,
        runner=runner,
        meta_files=cell.variant.checkpoint_files,
        training=TrainingShape.of(cell.variant, options.unsharded_steps.get(cell.variant.optimizer, 0)),
        baseline_dtype=QUANTIZED_BASELINE_DTYPE if cell.variant.quantization else None,
    )


def prepare_job(
    cell: Cell,
    options: RunOptions,
    runner: Runner | None = None,
    fork_server: ReferenceForker | None = None,
    prepared: PreparedCell | None = None,
) -> tuple[Job, Provenance] | CellOutcome:
    """The job for the rank group with the driver's provenance for the cell's record (see `_provenance`), or the
    cell's outcome when it cannot run (skip, or `setup` failure), stamped with the same provenance once the
    checkpoint is known. `runner`: what the plan may use (default: detected, as if this run held nothing);
    `fork_server`: the run's, where references are computed (else by the reference process); `prepared`: the cell
    as the run's work ahead prepared it (suites/run/ahead.py), else prepared here."""
    if cell.model.expansion_error:
        return expansion_failure(cell.model.expansion_error)
    if reason := harness_skip_reason(cell, options):
        return CellOutcome("skip", message=reason)
    if refusal := dtype_refusal(cell.dtype):
        return CellOutcome("unsupported", message=refusal)
    if (
        fork_server is None
        and options.checkpoints == "tiny"
        and not cell.variant.training
        and cached_tiny_checkpoint(cell.model) is None
    ):
        # A tiny checkpoint written now has no reference yet (references are keyed by the checkpoint's content):
        # the reference process imports torch/transformers while the driver writes it.
        start_reference_process()
    try:
        prepared = prepared or prepare_cell(cell, options, runner or Runner.detect())
    except Exception as error:  # the cell's setup failed; the run goes on
        return _setup_failure(error)
    if prepared.skip:
        return _stamped(CellOutcome("skip", message=prepared.skip), _provenance(prepared.checkpoint, prepared.plan))
    return _job(prepared, options, fork_server)


def _job(
    prepared: PreparedCell, options: RunOptions, fork_server: ReferenceForker | None
) -> tuple[Job, Provenance] | CellOutcome:
    """The job of a prepared cell that runs: its weights, its variant's fields and its references, computed by its
    plan."""
    cell, checkpoint = prepared.cell, prepared.checkpoint
    try:
        fetch_weights(cell.model, checkpoint)  # now that the cell fits
        longest = options.unsharded_steps.get(cell.variant.optimizer, 0)
        variant_fields = variant_setup.prepare(prepared, cell_spec(cell, options), fork_server, longest)
        if isinstance(variant_fields, CellOutcome):
            return _stamped(variant_fields, _provenance(checkpoint, prepared.plan))
        # A training cell compares with the unsharded steps (variant_fields), never with an inference reference.
        reference = (
            None
            if cell.variant.training
            else variant_fields.reference
            or str(cached(plain_reference_request(prepared, options), prepared.plan.reference, fork_server))
        )
        # Quantized and training variants have references of their own; a task score is compared with
        # the unsharded model of the same weights only.
        accuracy_task, accuracy_reference = None, None
        if options.accuracy_task and not (cell.variant.training or cell.variant.quantization):
            accuracy_task = options.accuracy_task
            accuracy_reference = str(
                cached_task_reference(
                    checkpoint, cell.dtype, options.accuracy_task, cell.model.trust_remote_code, fork_server
                )
            )
        real_counts = faithful_counts(cell.model, cell.tp)
    except Exception as error:  # the cell's setup failed; the run goes on
        return _stamped(_setup_failure(error), _provenance(checkpoint))
    job = Job(
        cell_id=cell.id,
        checkpoint=checkpoint.folder,
        tokenizer=checkpoint.tokenizer,
        dtype=cell.dtype,
        variant=cell.variant,
        trust_remote_code=cell.model.trust_remote_code,
        tolerance=cell.model.tolerance_for(cell.dtype),
        spec=cell_spec(cell, options),
        reference=reference,
        baseline=variant_fields.baseline,
        meta=variant_fields.meta,
        trained=variant_fields.trained,
        accuracy_task=accuracy_task,
        accuracy_reference=accuracy_reference,
        real_counts=real_counts,
        arguments=cell.arguments,
        faults=options.faults,
    )
    return job, _provenance(checkpoint, prepared.plan, reference)


def cell_spec(cell: Cell, options: RunOptions) -> ProbeSpec:
    """The run's probes as this cell's model runs them: without a probe its architecture cannot run (its reason)."""
    return replace(options.spec, perplexity_skipped=cell.model.probe_skips.get("perplexity", ""))


def plain_reference_request(prepared: PreparedCell, options: RunOptions) -> ObservationsRequest:
    """The unsharded reference of the cell's checkpoint in its dtype, offloaded as its plan says: what an inference
    cell compares with, unless its variant computes one of its own (a quantized variant)."""
    cell = prepared.cell
    return observations_request(
        prepared.checkpoint,
        cell.dtype,
        cell_spec(cell, options),
        plan=prepared.plan.reference,
        trust_remote_code=cell.model.trust_remote_code,
    )


def _setup_failure(error: Exception) -> CellOutcome:
    signature = getattr(error, "signature", None) or exception_signature(error)  # the reference process's own
    full = disk_full_at(error)
    said = "" if full is None or "disk full at" in str(error) else disk_full_line(full, "rerun the cell") + "\n"
    return failed("setup", signature, f"{said}building the checkpoint or unsharded reference failed: {error!r}")


def expansion_failure(error: ExpansionError) -> CellOutcome:
    """The `setup` failure of a cell whose architecture's expansion raised (a harness bug, matrix/config_values.py),
    signed like any exception the harness raises: type, masked message, the frame that raised."""
    return failed("setup", f"{error.error_type}: {mask_numbers(error.message)} @ {error.where}", error.describe())


def _provenance(checkpoint: Checkpoint, plan: MemoryPlan | None = None, reference: str | None = None) -> Provenance:
    """What the cell's record says about its weights and memory: the checkpoint revision, the plan's
    numbers and, for a reference the reference process measured, its peak RSS."""
    metrics = plan.metrics() if plan else {}
    measured = reference_record(reference) if reference else {}
    if "peak_rss_bytes" in measured:  # none for a training step's reference
        metrics["reference_peak_rss_bytes"] = float(measured["peak_rss_bytes"])
    return {"checkpoint": {"source": checkpoint.source, "revision": checkpoint.revision}, "metrics": metrics}


def _stamped(outcome: CellOutcome, provenance: Provenance) -> CellOutcome:
    outcome.checkpoint = provenance["checkpoint"]
    outcome.metrics.update(provenance["metrics"])
    return outcome


def held_by_run(pool: RankGroupPool | None) -> tuple[int, int]:
    """Private memory of this run's live rank group, and of its reference process (see Runner.detect)."""
    group = pool.group if pool is not None else None
    pids = session_pids(group.session) if group is not None and group.alive else []
    return anonymous_bytes(pids), anonymous_bytes(reference_process_pids())


def run_cell(cell: Cell, pool: RankGroupPool | None, options: RunOptions, ahead: RunAhead | None = None) -> CellOutcome:
    """The cell's outcome; `pool` None only for a cell that never reaches a rank group (a skip, a setup failure);
    `ahead`: the run's cold work, done together when the first cell asks for a reference (suites/run/ahead.py).
    Whatever the harness's own work raises (a file another process removed, a full disk) is the cell's `setup`
    failure, its rank group is restarted, and the run goes on: every cell ends with a record."""
    try:
        return _run_cell(cell, pool, options, ahead)
    except Exception as error:  # the harness's, whatever raised it: the cell is `setup`, the next cell runs
        if pool is not None:
            pool.discard_group()  # in an unknown state: the next cell starts a fresh one
        outcome = with_cause(harness_failure(error, f"nox -s matrix -- {selection_options(cell)}"))
        if pool is not None:
            try:
                outcome = pool.keep_text(cell.id, outcome, "driver.log", outcome.message)
            except OSError:  # the results folder itself failed: the record still says it all
                pass
        return outcome


def _run_cell(cell: Cell, pool: RankGroupPool | None, options: RunOptions, ahead: RunAhead | None) -> CellOutcome:
    forker: ReferenceForker | None = pool.fork_server if pool is not None else None
    prepared_ahead = ahead.take(cell) if ahead is not None else None
    if forker is not None and ahead is not None and pool is not None:
        forker = AheadForker(forker, ahead, WorkAhead(options, pool))
    runner = None if prepared_ahead else Runner.detect(*held_by_run(pool))
    prepared = prepare_job(cell, options, runner, forker, prepared_ahead)
    if isinstance(prepared, CellOutcome):
        prepared = with_cause(prepared)
        if prepared.outcome == "fail" and pool is not None:  # its setup failed: the driver's account is its log
            return pool.keep_text(cell.id, prepared, "setup.log", prepared.message)
        return prepared
    if pool is None:
        raise ValueError(f"cell {cell.id} runs, and no rank group was given to run it")
    job, provenance = prepared  # the provenance is the driver's, not the ranks'
    return with_cause(_stamped(pool.run(cell.tp, job, options.cell_timeout), provenance))


def run_ahead(cells: list[Cell], options: RunOptions) -> RunAhead | None:
    """The cold work of the run's cells that run, for `run_cell`'s `ahead` (None for hub checkpoints): their tiny
    checkpoints, and the plain references of those that compare with one (a training or quantized variant computes
    its own)."""
    if options.checkpoints != "tiny":
        return None
    running = [cell for cell in cells if cell.model.expansion_error is None and skip_reason(cell, options) is None]
    return RunAhead(running, (not (cell.variant.training or cell.variant.quantization) for cell in running))


@dataclass(frozen=True)
class WorkAhead:
    """How the run's work ahead (suites/run/ahead.py `CellWork`) prepares later cells and asks for their references: as
    their own turns would, planned against the machine as it is when the work starts."""

    options: RunOptions
    pool: RankGroupPool

    def runner(self) -> Runner:
        return Runner.detect(*held_by_run(self.pool))

    def prepare(self, cell: Cell, runner: Runner) -> PreparedCell:
        return prepare_cell(cell, self.options, runner)

    def reference_request(self, prepared: PreparedCell) -> ObservationsRequest:
        return plain_reference_request(prepared, self.options)


def with_cause(outcome: CellOutcome) -> CellOutcome:
    """A failed cell's outcome with its cause (suites/verdicts/mechanism.py `cause_of`), and the message naming where it
    broke."""
    if outcome.outcome != "fail":
        return outcome
    outcome.cause = cause_of(Failure(outcome.failed_class, outcome.signature, outcome.autotp, outcome.broke_at))
    if outcome.broke_at and outcome.broke_at.text not in outcome.message:
        outcome.message = f"{outcome.broke_at.text}\n{outcome.message}"
    return outcome


@dataclass(frozen=True)
class CacheContents:
    """What the harness cache holds that cells write when they first need it (the cache is shared by
    pytest-xdist workers, so counting it before and after tells what a whole run wrote)."""

    tiny_checkpoints: int
    references: int

    @classmethod
    def now(cls) -> "CacheContents":
        root = cache_root()
        tiny = [path for path in (root / "tiny").glob("*") if path.is_dir() and not path.name.startswith(".")]
        return cls(len(tiny), len(list((root / "references").glob("*.pt"))))

    def written_since(self, before: "CacheContents") -> str:
        """One line for the end of a run ("" when the cells wrote nothing)."""
        tiny, references = self.tiny_checkpoints - before.tiny_checkpoints, self.references - before.references
        if tiny <= 0 and references <= 0:
            return ""
        return (
            f"cache {cache_root()}: the run wrote {tiny} tiny checkpoints and {references} unsharded references "
            "its cells needed"
        )


LARGE_PROCESS_BYTES = 1 * GiB
"""Models whose processes all stay below this share one summary line in the plan printed at the start."""


def memory_plan_lines(cells: list[Cell], options: RunOptions, ahead: bool = False) -> list[str]:
    """The memory plan of every model of the run, printed before the first cell: one line per model
    that needs a large process or has a cell that does not fit, one line for all the small ones; `ahead`: this process
    runs the cells with their cold work done ahead (`run_ahead`), which the line about unwritten checkpoints says."""
    runner = Runner.detect()
    devices = (
        f", {len(runner.device_bytes)} x {gib(min(runner.device_bytes))} {runner.accelerator}"
        if runner.device_bytes
        else ""
    )
    lines = [f"memory plan: host RAM {gib(runner.host_bytes)} ({runner.host_source}){devices}"]
    small: list[str] = []
    by_model: dict[str, list[Cell]] = {}
    unwritten: list[str] = []
    for cell in cells:
        if skip_reason(cell, options) is None and cell.model.expansion_error is None:
            by_model.setdefault(cell.model.name, []).append(cell)
    for name, model_cells in by_model.items():
        if options.checkpoints == "tiny" and cached_tiny_checkpoint(model_cells[0].model) is None:
            # Writing it here would hold back the first cell (~70 of them: ~50 s); its cell plans it once written.
            unwritten.append(name)
            continue
        try:  # one checkpoint per model, sized once; each cell planned once
            checkpoint = resolve_checkpoint(model_cells[0].model, options.checkpoints, weights=False)
            size = _size(model_cells[0], checkpoint)
            plans = [(cell, plan_for(cell, size, runner, options)) for cell in model_cells]
        except Exception as error:  # the cell itself reports it as its setup failure
            lines.append(f"  {name}: no plan ({exception_signature(error)})")
            continue
        largest = max(max(plan.reference.host_bytes, plan.rank_host_bytes, plan.rank_device_bytes) for _, plan in plans)
        if largest < LARGE_PROCESS_BYTES and not any(plan.problem for _, plan in plans):
            small.append(name)
            continue
        lines.append(f"  {name} ({checkpoint.source}@{checkpoint.revision}):")
        lines += [f"    {cell.variant.name} {cell.dtype} tp{cell.tp}: {plan.summary()}" for cell, plan in plans]
    if small:
        lines.append(f"  {len(small)} models need < {gib(LARGE_PROCESS_BYTES)} per process and fit: {', '.join(small)}")
    if unwritten:
        when = (
            "the first cell writes them all and computes their references, one per core, before any ranks run"
            if ahead
            else "before their cells run"
        )
        lines.append(
            f"  {len(unwritten)} models are planned once their tiny checkpoint is written, {when}: "
            f"{', '.join(unwritten)}"
        )
    return lines

"""One cell on one rank: load, shard with AutoTP, observe, and (on rank 0) judge.

All ranks run the same stages in lockstep. A rank that raises writes its error to disk at once,
so the driver can name the failure even when the other ranks are left waiting in a collective.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import shutil
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from packaging.version import Version

from matrix.cell_arguments import resolve_injection_policy
from matrix.json_records import write_record
from suites.base.atomic import write_text_atomically
from suites.checks import judge
from suites.checks.breakpoints import first_divergence, located, raising_module, replacing_module
from suites.checks.contracts import Job, RankSummary
from suites.checks.inputs import ProbeInputs, build_inputs, load_tokenizer
from suites.checks.interface import CheckInputs
from suites.checks.policy_inference import infer_policies
from suites.checks.probes import Observations, bytes_by_name, observe, shapes_by_name, split_counts
from suites.checks.sharding import Snapshot, parsed_policy, sharding_record, snapshot
from suites.checks.task_probe import answer_correctness
from suites.engine import doorbells
from suites.reference.unsharded import ReferenceRead, load_reference, read_once
from suites.variants.loading import TORCH_DTYPES, load_meta_model, load_model, mark_process_sharded
from suites.variants.quantization import apply_post_init, hf_quantization_config
from suites.variants.training import Progress, load_unsharded_steps, run_training
from suites.verdicts.mechanism import BreakPoint
from suites.verdicts.outcome import (
    STAGE_CLASS,
    CellOutcome,
    LibraryOutputError,
    RankError,
    exception_signature,
    failed,
    first_error,
    harness_frame,
)
from suites.verdicts.policy import InferredBlock, Policy

Model = Any
"""A transformers model, or DeepSpeed's engine's module: the libraries' own types are not annotated."""


def _run_fault_hooks(job: Job, stage: str, model: Model, rank: int) -> Model:
    """Test-only fault injection: `module:function` names from the job, called at each stage."""
    for name in job.faults:
        module_name, function_name = name.split(":")
        replacement = getattr(importlib.import_module(module_name), function_name)(stage=stage, model=model, rank=rank)
        if replacement is not None:
            model = replacement
    return model


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _stage_error(
    stage: str, error: BaseException, rank: int, label: str = "", broke_at: BreakPoint | None = None
) -> RankError:
    """`label` names where inside the stage it raised (a training cell's `step 2`, `save`, `load`, ...); `broke_at`
    the module it raised in, where the rank found one."""
    where = f"{label}: " if label else ""
    failure_class, signature, whose = STAGE_CLASS[stage], exception_signature(error), ""
    if isinstance(error, LibraryOutputError):
        failure_class, signature = error.failure_class, error.signature
        whose = f"; {error.explanation}, so the class is {failure_class}"
    elif frame := harness_frame(error):
        # The harness's own code raised (a harness bug): never DeepSpeed's fault, and named by the harness frame.
        failure_class, signature = "setup", exception_signature(error, at=frame)
        if stage != "setup":
            whose = f"; the harness's own code raised it at {frame}, so the class is setup, not {STAGE_CLASS[stage]}"
    located_at = f"; {broke_at.text}" if broke_at and failure_class != "setup" else ""
    return RankError(
        rank=rank,
        stage=stage,
        failure_class=failure_class,
        signature=where + signature,
        message=f"rank {rank} raised in {stage} ({label or stage}){whose}{located_at}:\n"
        + "".join(traceback.format_exception(error))[-4000:],
        broke_at=broke_at if failure_class != "setup" else None,
    )


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so a long-lived rank can measure one cell's peak.
    Memory freed by earlier cells goes back to the OS first (malloc_trim), or a new cell would reuse
    it without its RSS growing and look cheaper than it is.

    The previous cell's model (reference cycles) is collected here, not at the end of its own cell: the driver has
    that verdict one collection sooner. What survives the collection outlives every cell (caches, lazily imported
    modules) and moves to the permanent generation, as at group start (worker.import_cell_machinery): a rank's
    every later collection would walk it again (~10-25 ms a collection after a few cells at tp 3-4 here)."""
    gc.collect()
    gc.freeze()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _load(job: Job) -> Model:
    """The variant's load mode: eager `from_pretrained` (with the HF-side quantization) or meta."""
    model_kwargs = dict(job.arguments.model_kwargs)
    if job.meta:
        return load_meta_model(job.loaded_checkpoint, job.dtype, job.trust_remote_code, model_kwargs)
    return load_model(
        job.loaded_checkpoint,
        job.dtype,
        job.trust_remote_code,
        hf_quantization_config(job.variant.quantization),
        model_kwargs=model_kwargs,
    )


def _shard(job: Job, model: Model, world_size: int) -> tuple[Any, Model]:
    """init_inference (meta: it reads the weights from the checkpoint files), then DeepSpeed's
    post-init quantization of this rank's shard."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed

    variant = job.variant
    options: dict[str, object] = {}
    if job.meta:
        options["checkpoint"] = job.meta.checkpoints_json
    if variant.keep_module_on_host:
        options["keep_module_on_host"] = True
    if job.arguments.injection_policy:  # resolved here: a class is this process's, the job names it
        classes = {type(module).__name__: type(module) for module in model.modules()}
        options["injection_policy"] = resolve_injection_policy(job.arguments.injection_policy, classes)
    mark_process_sharded()
    engine = deepspeed.init_inference(
        model,
        tensor_parallel={"tp_size": world_size},
        dtype=TORCH_DTYPES[job.dtype],
        replace_with_kernel_inject=False,
        **options,
    )
    return engine, apply_post_init(engine.module, variant.quantization, variant.quant_group_size)


def _policies(job: Job, model: Model) -> list[Policy]:
    """The policies init_inference shards by: the cell's own `injection_policy` where it passes one (the parser
    then does not run), else the parser's choice."""
    if job.arguments.injection_policy:
        return [Policy(block, tuple(sorted(names))) for block, names in job.arguments.injection_policy]
    return parsed_policy(model)


def _record_sharding(
    workdir: Path,
    job: Job,
    before: Snapshot,
    model: Model,
    *,
    policies: list[Policy],
    inferred: tuple[tuple[InferredBlock, ...], str],
    world_size: int,
    complete: bool,
) -> None:
    """What AutoTP did, written by rank 0 at once (`autotp-<seq>.json`): the driver reads it for the cell's record
    even when a rank later raises and the others hang."""
    record = sharding_record(
        before=before,
        model=model,
        policies=policies,
        counts=split_counts(model),
        tp=world_size,
        complete=complete,
        inferred=inferred[0],
        inference_note=inferred[1],
        chosen_by="the injection_policy" if job.arguments.injection_policy else "the parser",
    )
    write_text_atomically(workdir / f"autotp-{job.seq}.json", json.dumps(write_record(record)))


def _inferred_policy(
    job: Job, model: Model, inputs: ProbeInputs, before: Snapshot
) -> tuple[tuple[InferredBlock, ...], str]:
    """The policy the unsharded model needs (one forward of each block class's first instance), and why none was
    inferred: a meta-loaded model has no weights to run; a model the walk cannot run is named, never the cell's
    failure (the cell's verdict is the sharded model's)."""
    if job.meta:
        return (), "policy not inferred: the model is on the meta device until init_inference loads it"
    try:
        return infer_policies(model, inputs.batch_ids[:1], before.layers), ""
    except Exception as raised:  # a diagnosis that could not be made is said, and the cell runs on
        return (), f"policy not inferred: {exception_signature(raised)}"


def _divergence(
    job: Job, reference: ReferenceRead, observed: Observations | None, model: Model, classes: dict[str, str]
) -> BreakPoint | None:
    """The first module whose plain-forward output diverges from the unsharded model's (rank 0, on a failed cell)."""
    if job.reference is None or observed is None:
        return None
    found = first_divergence(reference().module_outputs, observed.module_outputs, job.tolerance.logits_rel)
    return located(found[0], "diverged", model, classes, found[1]) if found else None


def _shard_recorded(
    job: Job,
    workdir: Path,
    model: Model,
    before: Snapshot,
    inferred: tuple[tuple[InferredBlock, ...], str],
    rank: int,
    world_size: int,
) -> tuple[Any, Model]:
    """`init_inference`, with what AutoTP did recorded by rank 0 whether or not it raised."""
    engine = None
    policies = _policies(job, model) if rank == 0 else []
    try:
        engine, model = _shard(job, model, world_size)
    finally:
        if rank == 0:
            _record_sharding(
                workdir,
                job,
                before,
                model,
                policies=policies,
                inferred=inferred,
                world_size=world_size,
                complete=engine is not None,
            )
    return engine, model


def _verdict(
    job: Job,
    observed: Observations | None,
    summaries: list[RankSummary],
    timings: dict[str, float],
    task_correct: list[bool] | None,
    model: Model,
    before: Snapshot | None,
) -> CellOutcome:
    """Rank 0's verdict on the cell; a harness bug while judging is the cell's `setup` failure."""
    try:
        reference = read_once(job.reference)
        outcome = _judge(job, reference, observed, summaries, timings, task_correct)
        if outcome.failure_class in ("numerics", "generation") and before is not None and outcome.broke_at is None:
            outcome.broke_at = _divergence(job, reference, observed, model, before.classes)
        return as_a_fresh_process_would(outcome, job.meta.fresh_process_failure if job.meta else None)
    except Exception as raised:  # a harness bug must still end as this cell's verdict
        return failed(
            "setup",
            exception_signature(raised, at=harness_frame(raised)),  # its harness frame, as _stage_error names it
            "judging the cell failed (harness bug):\n" + "".join(traceback.format_exception(raised))[-4000:],
        )


class StageClock:
    """Wall seconds (rank 0's `time_<stage>_s` metrics, as the cell's record always had them) and this rank's CPU
    seconds (`RankSummary.cpu_seconds`) of each stage of a cell that finished."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._cell_cpu = time.process_time()

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Times the block; a stage that raises is not recorded (as the record never had it)."""
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall[f"time_{stage}_s"] = time.perf_counter() - wall
        self.cpu[stage] = time.process_time() - cpu

    def cell_cpu(self) -> dict[str, float]:
        """Each finished stage's CPU seconds, and the cell's up to now."""
        return {**self.cpu, "cell": time.process_time() - self._cell_cpu}


def run_on_rank(job: Job, workdir: Path, rank: int, world_size: int, device: torch.device | str) -> None:
    # torch's: deepspeed.comm lacks all_gather_object before 0.17.0; init_distributed() set up torch's group anyway
    import torch.distributed as dist

    stage, clock = "setup", StageClock()
    model = engine = observed = held_bytes_by_name = held_shapes = error = training = task_correct = None
    before = None
    progress = Progress() if job.variant.training else None
    scratch = workdir / f"training-{job.seq}"  # the checkpoint round trip's files, shared by the ranks
    rss_peak_loaded = 0
    _reset_peak_rss()
    rss_before_load = _rss_bytes()
    try:
        if progress:
            mark_process_sharded()
            with clock.stage("training"):
                training = run_training(
                    job, world_size, scratch, lambda stage, model: _run_fault_hooks(job, stage, model, rank), progress
                )
            rss_peak_loaded = _peak_rss_bytes()
        else:
            tokenizer = load_tokenizer(job.tokenizer, job.trust_remote_code)
            inputs = build_inputs(tokenizer, job.spec)
            if job.meta:
                stage = "shard"  # construction under deepspeed.OnDevice(device="meta") is DeepSpeed's, like the load
            with clock.stage("load"):
                model = _run_fault_hooks(job, "loaded", _load(job), rank)
            before = snapshot(model)
            inferred = _inferred_policy(job, model, inputs, before) if rank == 0 else ((), "")
            if not job.meta:  # the others wait for rank 0's reading: none may fail in init_inference (the group then
                dist.barrier()  # ends within a second) before rank 0 has recorded what AutoTP did
            stage = "shard"
            with clock.stage("shard"):
                engine, model = _shard_recorded(job, workdir, model, before, inferred, rank, world_size)
            rss_peak_loaded = _peak_rss_bytes()
            model = _run_fault_hooks(job, "sharded", model, rank)
            held_bytes_by_name, held_shapes = bytes_by_name(model), shapes_by_name(model)
            stage = "forward"
            with clock.stage("forward"):
                forward_mask = bool(job.arguments.forward_mask)
                observed = observe(model, inputs, job.spec, device, unsharded=False, mask_plain=forward_mask)
            if job.accuracy_task:
                with clock.stage("accuracy"):
                    task_correct = answer_correctness(job.accuracy_task, model, tokenizer, device)
    except Exception as raised:  # any exception is the cell's verdict, never the worker's end
        if progress:
            error = _stage_error(progress.stage, raised, rank, progress.label)
        else:
            error = _stage_error(stage, raised, rank, broke_at=_broke_at(stage, raised, model, before))
        write_text_atomically(workdir / f"error-{job.seq}.{rank}.json", json.dumps(write_record(error)))
        doorbells.ring(doorbells.events_path(workdir))

    summary = RankSummary(
        rank=rank,
        error=error,
        rss_bytes=_rss_bytes(),
        rss_peak_bytes=_peak_rss_bytes(),
        rss_before_load_bytes=rss_before_load,
        rss_peak_loaded_bytes=rss_peak_loaded,
        training=training,
        bytes_by_name=held_bytes_by_name,
        last_logits=observed.logits_plain[0, -1] if observed else None,
        shapes_by_name=held_shapes,
        cpu_seconds=clock.cell_cpu(),
    )
    summaries: list[RankSummary] = [summary] * world_size  # each rank's, once gathered
    dist.all_gather_object(summaries, summary)
    if rank == 0:
        shutil.rmtree(scratch, ignore_errors=True)  # every rank is past its training: nobody reads it any more
        outcome = _verdict(job, observed, summaries, clock.wall, task_correct, model, before)
        write_text_atomically(workdir / f"result-{job.seq}.json", json.dumps(write_record(outcome)))
    _run_fault_hooks(job, "finished", None, rank)
    # The driver accepts rank 0's verdict only once every rank got here: a rank that dies after the
    # verdict was written still fails this cell (`crash`), instead of leaving it `pass`.
    write_text_atomically(workdir / f"done-{job.seq}.{rank}", "")
    doorbells.ring(doorbells.events_path(workdir))


def _broke_at(stage: str, error: BaseException, model: Model, before: Snapshot | None) -> BreakPoint | None:
    """Where a stage's exception broke the cell: the module whose forward raised, or the one init_inference was
    replacing."""
    if before is None or model is None:
        return None
    if stage == "forward":
        return raising_module(error, model, before.classes)
    return replacing_module(error, model, before.paths) if stage == "shard" else None


def as_a_fresh_process_would(outcome: CellOutcome, fresh_process_failure: dict[str, str] | None) -> CellOutcome:
    """The verdict a user's fresh process gets: a failure only a fresh process hits (building the model on the
    meta device, suites/variants/loading.py `fresh_process_meta_failure`) comes first, as `shard`; what the
    rank found past it (with torch._dynamo imported first) stays in the message and metrics."""
    if not fresh_process_failure or outcome.outcome == "skip" or outcome.failure_class == "setup":
        return outcome  # a harness bug stays the harness's, whatever a user's process would hit first
    found = (
        "passed every check" if outcome.outcome == "pass" else f"failed {outcome.failure_class}: {outcome.signature}"
    )
    return failed(
        "shard",
        fresh_process_failure["signature"],
        # A draft issue quotes this message: it says what a process does to get past, not whose process did.
        f"{fresh_process_failure['message']}\nWith torch._dynamo imported before deepspeed.OnDevice, the same model "
        f"{found}.",
        {**outcome.metrics, "fresh_process_failed": 1.0},
    )


def _deepspeed_release() -> tuple[int, ...]:
    """The DeepSpeed release this rank sharded with (a commit checkout: the release its version names)."""
    import deepspeed  # as _shard does

    return Version(deepspeed.__version__).release


def _check_inputs(
    job: Job,
    reference: ReferenceRead,
    observed: Observations | None,
    summaries: list[RankSummary],
    metrics: dict[str, float],
    task_correct: list[bool] | None,
) -> CheckInputs:
    """Everything the checks read, loaded once from what the job names and what the ranks handed rank 0."""
    if job.variant.training:
        return CheckInputs(
            job.tolerance,
            tuple(summaries),
            unsharded_steps=tuple(load_unsharded_steps(model.unsharded_steps) for model in job.trained),
        )
    if job.reference is None or observed is None:
        raise ValueError(f"inference cell {job.cell_id} has no reference or no observations (a harness bug)")
    if job.accuracy_reference and task_correct is None:
        raise ValueError(f"cell {job.cell_id} has an accuracy reference but its ranks answered no task (a harness bug)")
    return CheckInputs(
        job.tolerance,
        tuple(summaries),
        reference=reference(),
        sharded=observed,
        perplexity_skipped=job.spec.perplexity_skipped,
        real_counts=job.real_counts,
        meta_load=job.meta is not None,
        deepspeed_release=_deepspeed_release(),
        load_peak_growth=metrics["rss_load_peak_growth_max_bytes"],
        baseline=load_reference(job.baseline) if job.baseline else None,
        accuracy_reference=(
            tuple(json.loads(Path(job.accuracy_reference).read_text())) if job.accuracy_reference else None
        ),
        task_correct=tuple(task_correct) if task_correct is not None else None,
    )


def _stages(summaries: list[RankSummary]) -> list[str]:
    """The stages any rank timed, in the order the ranks name them."""
    return list(dict.fromkeys(stage for summary in summaries for stage in summary.cpu_seconds))


def _judge(
    job: Job,
    reference: ReferenceRead,
    observed: Observations | None,
    summaries: list[RankSummary],
    timings: dict[str, float],
    task_correct: list[bool] | None,
) -> CellOutcome:
    metrics = {
        **timings,
        **{f"cpu_{stage}_s": sum(s.cpu_seconds.get(stage, 0.0) for s in summaries) for stage in _stages(summaries)},
        "rss_max_bytes": float(max(s.rss_bytes for s in summaries)),
        "rss_peak_max_bytes": float(max(s.rss_peak_bytes for s in summaries)),
        # Peak RSS growth from before loading to the end of sharding: what the load mode costs a rank.
        "rss_load_peak_growth_max_bytes": float(
            max(s.rss_peak_loaded_bytes - s.rss_before_load_bytes for s in summaries)
        ),
    }
    errors = [s.error for s in summaries if s.error]
    if errors:
        first = first_error(errors)
        return failed(first.failure_class, first.signature, first.message, metrics, first.broke_at)
    results = judge.judge(_check_inputs(job, reference, observed, summaries, metrics, task_correct))
    for result in results:
        metrics.update(result.metrics)
    failing = [r for r in results if not r.passed]
    notes = "; ".join(r.reason for r in results if r.reason)
    if failing:
        return failed(failing[0].failure_class, failing[0].cell_signature, notes, metrics)
    return CellOutcome("pass", message=notes, metrics=metrics)

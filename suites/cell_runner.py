"""One cell on one rank: load, shard with AutoTP, observe, and (on rank 0) judge.

All ranks run the same stages in lockstep. A rank that raises writes its error to disk at once,
so the driver can name the failure even when the other ranks are left waiting in a collective.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import time
import traceback
from pathlib import Path

import torch

from matrix.registry import Tolerance
from suites import checks
from suites.checks import quantization as quantization_checks
from suites.checks import training as training_checks
from suites.inputs import ProbeSpec, build_inputs, load_tokenizer
from suites.loading import TORCH_DTYPES, checkpoints_json, load_meta_model, load_model
from suites.quantization import apply_post_init, hf_quantization_config
from suites.outcome import CellOutcome, exception_signature, failed
from suites.probes import observe
from suites.reference import load_reference, mark_process_sharded
from suites.training import run_step

STAGE_CLASS = {"setup": "setup", "shard": "shard", "forward": "forward"}


def write_json_atomically(path: Path, data: dict) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data))
    staging.replace(path)


def _run_fault_hooks(job: dict, stage: str, model, rank: int):
    """Test-only fault injection: `module:function` names from the job, called at each stage."""
    for name in job.get("faults", []):
        module_name, function_name = name.split(":")
        replacement = getattr(importlib.import_module(module_name), function_name)(stage=stage, model=model, rank=rank)
        if replacement is not None:
            model = replacement
    return model


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _stage_error(stage: str, error: BaseException, rank: int) -> dict:
    return {"rank": rank, "stage": stage, "failure_class": STAGE_CLASS[stage], "signature": exception_signature(error),
            "message": f"rank {rank} raised in {stage}:\n" + "".join(traceback.format_exception(error))[-4000:]}


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so a long-lived rank can measure one cell's peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _dtype_skip_reason(dtype: str) -> str | None:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if TORCH_DTYPES[dtype] not in accelerator.supported_dtypes():
        return f"{dtype} is not supported by the {accelerator.device_name()} accelerator (supported_dtypes)"
    return None


def _load_and_shard(job: dict, world_size: int, rank: int, timings: dict):
    """The variant's way to a sharded model: load (eager or meta), init_inference, post-init quantization."""
    import deepspeed

    variant = job["variant"]
    started = time.perf_counter()
    if variant["load"] == "meta":
        model = load_meta_model(job["checkpoint"], job["dtype"], job["trust_remote_code"])
    else:
        model = load_model(job["checkpoint"], job["dtype"], job["trust_remote_code"], hf_quantization_config(variant["quantization"]))
    timings["time_load_s"] = time.perf_counter() - started
    model = _run_fault_hooks(job, "loaded", model, rank)
    options = {}
    if variant["load"] == "meta":
        options["checkpoint"] = str(checkpoints_json(job["checkpoint"], variant["checkpoint_format"]))
    if variant["keep_module_on_host"]:
        options["keep_module_on_host"] = True
    mark_process_sharded()
    started = time.perf_counter()
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": world_size}, dtype=TORCH_DTYPES[job["dtype"]],
                                      replace_with_kernel_inject=False, **options)
    model = apply_post_init(engine.module, variant["quantization"], variant["quant_group_size"])
    timings["time_shard_s"] = time.perf_counter() - started
    return engine, model


def run_cell(job: dict, workdir: Path, rank: int, world_size: int, device) -> None:
    import deepspeed.comm as dist

    spec = ProbeSpec(**job["spec"])
    timings, stage, model, engine, observed, error, training = {}, "setup", None, None, None, None, None
    skip = _dtype_skip_reason(job["dtype"])
    _reset_peak_rss()
    rss_before_load = _rss_bytes()
    try:
        if skip:
            pass
        elif job["variant"]["training"]:
            stage = "shard"
            mark_process_sharded()
            training = run_step(job, world_size, lambda stage, model: _run_fault_hooks(job, stage, model, rank)).to_dict()
        else:
            inputs = build_inputs(load_tokenizer(job["tokenizer"], job["trust_remote_code"]), spec)
            stage = "shard"
            engine, model = _load_and_shard(job, world_size, rank, timings)
            model = _run_fault_hooks(job, "sharded", model, rank)
            stage = "forward"
            observed = observe(model, inputs, spec, device)
            timings["time_forward_s"] = observed.forward_seconds
    except Exception as raised:  # any exception is the cell's verdict, never the worker's end
        error = _stage_error(stage, raised, rank)
        write_json_atomically(workdir / f"error-{job['seq']}.{rank}.json", error)

    summary = {"rank": rank, "error": error, "rss_bytes": _rss_bytes(), "rss_peak_bytes": _peak_rss_bytes(),
               "rss_before_load_bytes": rss_before_load, "training": training,
               "param_bytes": observed.param_bytes if observed else None,
               "last_logits": observed.logits_plain[0, -1] if observed else None}
    summaries = [None] * world_size
    dist.all_gather_object(summaries, summary)
    if rank == 0:
        try:
            outcome = CellOutcome("skip", message=skip) if skip else _judge(job, observed, summaries, timings)
        except Exception as raised:  # a harness bug must still end as this cell's verdict
            outcome = failed("setup", exception_signature(raised), "judging the cell failed (harness bug):\n"
                             + "".join(traceback.format_exception(raised))[-4000:])
        write_json_atomically(workdir / f"result-{job['seq']}.json", outcome.to_dict())
    del model, engine, observed
    gc.collect()


def _judge(job: dict, observed, summaries: list[dict], timings: dict) -> CellOutcome:
    metrics = {**timings, "rss_max_bytes": float(max(s["rss_bytes"] for s in summaries)),
               "rss_peak_max_bytes": float(max(s["rss_peak_bytes"] for s in summaries)),
               "rss_load_growth_max_bytes": float(max(s["rss_peak_bytes"] - s["rss_before_load_bytes"] for s in summaries))}
    errors = [s["error"] for s in summaries if s["error"]]
    if errors:
        first = min(errors, key=lambda e: list(STAGE_CLASS).index(e["stage"]))
        return failed(first["failure_class"], first["signature"], first["message"], metrics)
    tolerance = Tolerance(**job["tolerance"])
    if job["variant"]["training"]:
        unsharded = torch.load(job["training_step"], weights_only=False)
        results = training_checks.check(unsharded["loss"], [s["training"] for s in summaries], tolerance)
    else:
        reference = load_reference(job["reference"])
        results = checks.run_all(reference, observed, [s["last_logits"] for s in summaries],
                                 [s["param_bytes"] for s in summaries], tolerance)
        if job.get("baseline"):
            results += quantization_checks.check(load_reference(job["baseline"]), observed, tolerance)
    for result in results:
        metrics.update(result.metrics)
    failing = [r for r in results if not r.passed]
    notes = "; ".join(r.reason for r in results if r.reason)
    if failing:
        return failed(failing[0].failure_class, f"{failing[0].name}: {failing[0].reason.split(' (')[0]}", notes, metrics)
    return CellOutcome("pass", message=notes, metrics=metrics)

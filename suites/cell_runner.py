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
from suites.inputs import ProbeSpec, build_inputs, load_tokenizer
from suites.loading import TORCH_DTYPES, load_model
from suites.outcome import CellOutcome, exception_signature, failed
from suites.probes import observe
from suites.reference import load_reference, mark_process_sharded

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


def run_cell(job: dict, workdir: Path, rank: int, world_size: int, device) -> None:
    import deepspeed
    import deepspeed.comm as dist

    spec = ProbeSpec(**job["spec"])
    timings, stage, model, engine, observed, error = {}, "setup", None, None, None, None
    try:
        inputs = build_inputs(load_tokenizer(job["tokenizer"], job["trust_remote_code"]), spec)
        started = time.perf_counter()
        model = load_model(job["checkpoint"], job["dtype"], job["trust_remote_code"])
        timings["time_load_s"] = time.perf_counter() - started
        model = _run_fault_hooks(job, "loaded", model, rank)
        stage = "shard"
        mark_process_sharded()
        started = time.perf_counter()
        engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": world_size}, dtype=TORCH_DTYPES[job["dtype"]],
                                          replace_with_kernel_inject=False)
        model = engine.module
        timings["time_shard_s"] = time.perf_counter() - started
        model = _run_fault_hooks(job, "sharded", model, rank)
        stage = "forward"
        observed = observe(model, inputs, spec, device)
        timings["time_forward_s"] = observed.forward_seconds
    except Exception as raised:  # any exception is the cell's verdict, never the worker's end
        error = _stage_error(stage, raised, rank)
        write_json_atomically(workdir / f"error-{job['seq']}.{rank}.json", error)

    summary = {"rank": rank, "error": error, "rss_bytes": _rss_bytes(),
               "param_bytes": observed.param_bytes if observed else None,
               "last_logits": observed.logits_plain[0, -1] if observed else None}
    summaries = [None] * world_size
    dist.all_gather_object(summaries, summary)
    if rank == 0:
        try:
            outcome = _judge(job, observed, summaries, timings)
        except Exception as raised:  # a harness bug must still end as this cell's verdict
            outcome = failed("setup", exception_signature(raised), "judging the cell failed (harness bug):\n"
                             + "".join(traceback.format_exception(raised))[-4000:])
        write_json_atomically(workdir / f"result-{job['seq']}.json", outcome.to_dict())
    del model, engine, observed
    gc.collect()


def _judge(job: dict, observed, summaries: list[dict], timings: dict) -> CellOutcome:
    metrics = {**timings, "rss_max_bytes": float(max(s["rss_bytes"] for s in summaries))}
    errors = [s["error"] for s in summaries if s["error"]]
    if errors:
        first = min(errors, key=lambda e: list(STAGE_CLASS).index(e["stage"]))
        return failed(first["failure_class"], first["signature"], first["message"], metrics)
    reference = load_reference(job["reference"])
    results = checks.run_all(reference, observed, [s["last_logits"] for s in summaries],
                             [s["param_bytes"] for s in summaries], Tolerance(**job["tolerance"]))
    for result in results:
        metrics.update(result.metrics)
    failing = [r for r in results if not r.passed]
    notes = "; ".join(r.reason for r in results if r.reason)
    if failing:
        return failed(failing[0].failure_class, f"{failing[0].name}: {failing[0].reason.split(' (')[0]}", notes, metrics)
    return CellOutcome("pass", message=notes, metrics=metrics)

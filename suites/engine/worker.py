"""A long-lived rank of a rank group: forked by suites/engine/fork_server.py on CPU, started by DeepSpeed's
launcher (`deepspeed --num_gpus N`) on accelerators; either way it meets the others through
`deepspeed.init_distributed()`.

It serves many cells: it polls its work folder for `job-<seq>.json`, runs the cell, and goes on to
the next sequence number until the driver kills the group. Every rank reads the same job file, so no
collective is needed to hand out work and an idle group holds no collective open.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from matrix.json_records import read_record, write_record
from matrix.redaction import load_detectors
from suites.base.atomic import write_text_atomically
from suites.base.elementwise_math import settle_elementwise_math
from suites.engine import doorbells
from suites.engine.processes import pid_alive
from suites.engine.rank_waits import naps_for, wait_strategy
from suites.verdicts.outcome import death_record

JOB_WAIT_SECONDS = 1.0
"""How often an idle rank looks for a job file when no ring came (the driver rings each rank's job pipe)."""


LATER_LIBRARY_MODULES = (
    "deepspeed.module_inject.auto_ep_layer",
    "transformers.models.gpt2.modeling_gpt2",
)
"""Modules `init_inference` imports on its first call (DeepSpeed >= 0.19 its expert-parallel layer map; AutoTP
compares each layer with GPT2Block): imported in the server, no group's first cell pays them (~0.5 s of a core a
rank). Where a release lacks one, nothing is imported."""


ModuleState = list[tuple[ModuleType, dict[str, Any]]]
"""Module-level values of each module, as `_snapshot_module_state` took them."""


def _redirect_output(log_path: Path) -> TextIO:
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    faulthandler.enable(file=log)
    return log


def _snapshot_module_state(modules: Iterable[ModuleType]) -> ModuleState:
    """Module-level values DeepSpeed keeps between injections (tp_shard globals in older releases)."""
    return [
        (
            module,
            {
                k: v
                for k, v in vars(module).items()
                if not k.startswith("__") and isinstance(v, (int, float, str, type(None), list, tuple))
            },
        )
        for module in modules
    ]


def _restore_module_state(snapshot: ModuleState) -> None:
    for module, values in snapshot:
        for key, value in values.items():
            setattr(module, key, list(value) if isinstance(value, list) else value)


def import_cell_machinery() -> None:
    """Import at group start what the first cell would import lazily (transformers' model loading, generation, masking,
    quantizers: 2-5 s), so no cell's timings carry it; settle the elementwise math (suites/base/elementwise_math.py);
    then move everything alive into the permanent generation. A long-lived rank holds millions of module-level objects,
    and without the freeze every cell's gc.collect() walks them all (~0.3 s a call at tp 3 here)."""

    # Before any cell, so no verdict depends on which cell ran first (a first import of torch._dynamo inside
    # deepspeed.OnDevice fails on torch 2.13; what a fresh user process hits there is probed on its own:
    # suites/variants/loading.py fresh_process_meta_failure).
    import torch._dynamo  # noqa: F401
    import transformers.generation.utils  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    # Modules a cell's model loading imports (each reference child imported modeling_layers and processing_utils on
    # its own: ~0.1 s each), imported where the release has them: older releases do this work inside each model.
    later_modules = ("masking_utils", "modeling_layers", "processing_utils", "conversion_mapping")
    for later_module in (*(f"transformers.{name}" for name in later_modules), *LATER_LIBRARY_MODULES):
        if importlib.util.find_spec(later_module) is None:
            continue
        try:
            importlib.import_module(later_module)
        except ImportError:  # an optional dependency it needs is missing: the cell that imports it meets the
            pass  # error in its own phase, where it is classified, instead of the fork server ending for every cell
    # transformers 5 builds its table of checkpoint renamings (a regex per model type, ~60 ms) on the first load;
    # built here, every reference child and rank inherits it.
    conversion_mapping = sys.modules.get("transformers.conversion_mapping")
    if conversion_mapping is not None and hasattr(conversion_mapping, "get_checkpoint_conversion_mapping"):
        conversion_mapping.get_checkpoint_conversion_mapping("llama")
    # DeepSpeed >= 0.19.8 probes which ops this machine can build on first access (init_distributed asks), each
    # probe a compile and link of a test program (async_io: gcc -laio); probed once here, a forked rank inherits it
    # instead of every rank of every group running the compilers again. Older releases computed it at import.
    import deepspeed.ops

    getattr(deepspeed.ops, "__compatible_ops__", None)
    # The harness's own cell machinery (checks, variants, the reference's loader): imported once by the fork server,
    # each rank and reference child it forks inherits it instead of importing it again (~0.2 s of a core a rank).
    import suites.engine.cell_runner  # noqa: F401

    # A failing cell's message is redacted on its rank (suites/verdicts/outcome.py): detect-secrets' import and its
    # patterns (~0.4 s of a core) were paid by every rank of a group at its first failing cell.
    load_detectors()
    settle_elementwise_math()
    gc.collect()
    gc.freeze()


def import_modeling_modules(model_types: Iterable[str]) -> list[str]:
    """Import the transformers modeling module of each model type (a run's models, asked by the driver: fork_server
    PRELOAD_KIND), so every rank and reference child forked afterwards inherits it. Imported by a cell, each rank of
    every group paid it at the model's first cell (0.05-0.3 s of a core a rank, as much as the cell's probes at tp 3
    and 4 on 2 cores; docs/findings.md "#58 where a warm cell's time goes"). Returns the modules that could not be
    imported: the cell that loads such a model meets the error in its own phase, where it is classified."""
    # lazily: the fork server imports this module before torch (suites/base/elementwise_math.py settles first)
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    failed = []
    for model_type in model_types:
        name = model_type_to_module_name(model_type)
        module = f"transformers.models.{name}.modeling_{name}"
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - any import error is the cell's to meet, never the server's end
            failed.append(module)
    return failed


def _exit_when_orphaned(driver_pid: int, launcher_pid: int) -> None:
    """If the driver or the launcher dies (killed, Ctrl-C), end this rank even when it is stuck in a
    collective: a rank must never linger as an orphan holding cores and memory."""
    while pid_alive(driver_pid) and os.getppid() == launcher_pid:
        time.sleep(1)
    os._exit(3)


STARTUP_FAULT_ENV = "AUTOTP_STARTUP_FAULT"
"""Harness self-test only: `module:function` called as function(stage=..., rank=...) while the fork
server (`server`) and each rank (`rank`) start, to prove whose fault a failed start is reported as."""


def run_startup_fault_hook(stage: str, rank: int | None = None) -> None:
    if hook := os.environ.get(STARTUP_FAULT_ENV):
        module_name, function_name = hook.split(":")
        getattr(importlib.import_module(module_name), function_name)(stage=stage, rank=rank)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--driver-pid", type=int, required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _redirect_output(args.workdir / f"rank{rank}.log")
    threading.Thread(target=_exit_when_orphaned, args=(args.driver_pid, os.getppid()), daemon=True).start()

    try:
        _serve_cells(args.workdir, rank, world_size)
    except Exception as error:
        # Outside a cell's stages (those end as the cell's verdict): the driver reads whose fault it was.
        write_text_atomically(
            args.workdir / f"died.{rank}.json", json.dumps(write_record(death_record(error, f"rank {rank}")))
        )
        doorbells.ring(doorbells.events_path(args.workdir))
        raise


def _serve_cells(workdir: Path, rank: int, world_size: int) -> None:
    run_startup_fault_hook("rank", rank)
    naps = naps_for(world_size)  # first: a rank wait strategy that names none ends the group before it starts
    print(f"rank wait strategy {wait_strategy().name}: naps {'in each cell' if naps else 'never'}", flush=True)
    # The libraries and the harness's cell machinery (torch behind it) are imported inside main's try, after the
    # startup fault hook: a rank that cannot import them writes its death record (whose fault it is) to the driver.
    import deepspeed
    import deepspeed.comm as dist
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.module_inject import tp_shard

    from suites.checks.contracts import Job
    from suites.engine.cell_runner import run_on_rank

    # A forked rank inherits its server's thread pool size; the launcher's ranks read OMP_NUM_THREADS.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    deepspeed.init_distributed()
    accelerator = get_accelerator()
    device = accelerator.device_name(int(os.environ.get("LOCAL_RANK", 0)))
    if accelerator.device_name() != "cpu":
        accelerator.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    # The first all-reduce JIT-builds DeepSpeed's CPU comm op (~60 s once); pay it at group start,
    # not inside the first cell's timeout.
    warmup = torch.ones(4, device=device)
    dist.inference_all_reduce(warmup) if hasattr(dist, "inference_all_reduce") else dist.all_reduce(warmup)
    import_cell_machinery()
    jobs = doorbells.Listener(doorbells.job_path(workdir, rank))  # open before `ready`: the driver rings it after
    write_text_atomically(
        workdir / f"ready.{rank}",
        json.dumps({"backend": torch.distributed.get_backend(), "accelerator": accelerator.device_name()}),
    )
    doorbells.ring(doorbells.events_path(workdir))
    module_state = _snapshot_module_state([tp_shard])

    seq = 0
    while True:
        job_file = workdir / f"job-{seq}.json"
        while not job_file.exists():
            jobs.wait(JOB_WAIT_SECONDS)
        job = read_record(Job, json.loads(job_file.read_text()))
        print(f"--- cell {job.cell_id} (seq {seq})", flush=True)
        if naps:
            naps.arm()
        run_on_rank(job, workdir, rank, world_size, device)
        if naps:
            naps.disarm()  # an idle rank sleeps until the next job: nothing to hand over, nothing to wake it for
        _restore_module_state(module_state)
        seq += 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root
    main()

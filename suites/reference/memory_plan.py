"""A cell's memory plan, made before anything loads: will the reference process and the rank group
fit this runner, and what would fit if not.

Sizes come from the checkpoint's metadata only (suites/reference/checkpoint_sizes.py): safetensors headers,
else a `*.index.json`'s total size with config.json's dtype (a hub snapshot whose weights are not
downloaded yet), else the weight files' sizes. Peaks per process are the measured shape of each load
path (benchmarks/memory_plan.py measures them; the constants below say where each term comes from):

- reference process (its own, before the rank group starts): runtime + the whole model, or, when that
  does not fit, runtime + what accelerate keeps in memory (`max_memory`) + the layer being computed,
  the rest offloaded to disk;
- eager rank: `from_pretrained` on every rank, so each holds the whole model before AutoTP shards it;
- meta rank: ideally its shard plus the checkpoint file DeepSpeed's loader has open (it reads files
  whole); measured on CPU (DeepSpeed 0.19.8), 1.7 times the whole model, which is what is planned.

Capacity: host RAM is MemAvailable, bounded by the cgroup's limit minus its usage (a container's
limit, not the machine's); accelerator memory per device from DeepSpeed's accelerator. Both can be
overridden (`AUTOTP_HOST_MEMORY`, `AUTOTP_DEVICE_MEMORY`, e.g. `64GiB`) to plan for another runner
or to test what a small one does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from matrix.cells import DEFAULT_VARIANTS
from matrix.registry import DType
from matrix.variants import Variant, load_variants
from suites.reference.checkpoint_sizes import CheckpointSize, activation_bytes

GiB = 1 << 30
MiB = 1 << 20
HOST_MEMORY_ENV = "AUTOTP_HOST_MEMORY"
DEVICE_MEMORY_ENV = "AUTOTP_DEVICE_MEMORY"

PROCESS_RUNTIME_BYTES = 384 * MiB
"""RSS of a process that imported torch, transformers and DeepSpeed, before it loads a model: the
intercepts of the benchmark's fits on CPU were 0.33-0.45 GiB (reference process, ranks)."""
EAGER_LOAD_FACTOR = 1.25
"""An eager rank's peak growth over its runtime, in model sizes: from_pretrained's full copy plus the
shards AutoTP allocates while layers are being replaced (benchmark slopes on CPU, tp 2: 1.17-1.21)."""
META_LOAD_FACTOR = 1.8
"""A meta rank's peak growth on CPU, in model sizes (benchmark slopes, DeepSpeed 0.19.8, tp 2, 4 files:
1.71-1.73): more than eager, which is what the meta variants' `meta_memory` check fails on."""
SAFETY = 0.9
"""Share of the capacity a plan may use: the driver, page cache and allocator slack need the rest."""


def parse_bytes(text: str, name: str) -> int:
    """`64GiB`, `512MiB`, `1.5GB` or a byte count."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?i?B?)\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{name}={text!r} is not a size; write e.g. 64GiB, 512MiB or a byte count")
    unit = match.group(2).upper().rstrip("B").rstrip("I")
    return int(float(match.group(1)) * 1024 ** " KMGT".index(unit or " "))


def _cgroup_headroom(root: Path, membership: Path = Path("/proc/self/cgroup")) -> int | None:
    """Bytes this process's cgroup may still allocate (v2 memory.max, v1 memory.limit_in_bytes), or
    None without a limit. The process's own group is the path /proc/self/cgroup names under `root`
    (under `root/memory` for v1); in a container with a cgroup namespace that path is `/`."""
    candidates = []
    try:
        for line in membership.read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            if controllers == "":
                candidates.append((root / group.lstrip("/"), "memory.max", "memory.current"))
            elif "memory" in controllers.split(","):
                candidates.append(
                    (root / "memory" / group.lstrip("/"), "memory.limit_in_bytes", "memory.usage_in_bytes")
                )
    except (OSError, ValueError):
        pass
    candidates += [
        (root, "memory.max", "memory.current"),
        (root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
    ]
    for folder, limit_file, usage_file in candidates:
        try:
            limit = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as a huge number
            continue
        return int(limit) - usage
    return None


def host_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """(bytes the run may still use in host RAM, where that number comes from)."""
    if os.environ.get(HOST_MEMORY_ENV):
        return parse_bytes(os.environ[HOST_MEMORY_ENV], HOST_MEMORY_ENV), HOST_MEMORY_ENV
    available = 0
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    headroom = _cgroup_headroom(cgroup)
    if headroom is not None and headroom < available:
        return headroom, "cgroup limit"
    return available, "MemAvailable"


def anonymous_bytes(pids: list[int]) -> int:
    """Private memory (RssAnon) of these processes: what they give back when they end, or what a
    process reusing them (a rank serving its next cell) already holds."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue  # ended meanwhile
        total += sum(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("RssAnon:"))
    return total


def session_pids(session: int) -> list[int]:
    """Every process of a session (a rank group's leader and its ranks)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # state, ppid, pgrp, session, ...
            pids.append(int(stat.parent.name))
    return pids


def device_memory() -> tuple[str, list[int]]:
    """(accelerator name, free bytes per device); `cpu` and [] when the ranks run on host memory."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    name = accelerator.device_name()
    if name == "cpu":
        return name, []
    count = accelerator.device_count()
    if os.environ.get(DEVICE_MEMORY_ENV):
        return name, [parse_bytes(os.environ[DEVICE_MEMORY_ENV], DEVICE_MEMORY_ENV)] * count
    return name, [int(accelerator.available_memory(index)) for index in range(count)]


def default_variants(checkpoints: str) -> str:
    """The variant a run takes when --variants is not given. Tiny checkpoints: `eager`. Hub checkpoints:
    `meta` on accelerator runners: each rank builds the model on the meta device and DeepSpeed reads its
    weights from the checkpoint files, so a rank's host RAM holds a checkpoint file instead of the whole
    model (eager: every rank holds it, 8 x 140 GB for a 70B model in bf16). `eager` on CPU runners: the
    weights live in host RAM either way, and DeepSpeed 0.19.8's meta loader peaks higher there (1.7 times
    the model per rank against eager's 1.2, benchmarks/memory_plan.py). Without DeepSpeed to ask (a
    session whose install failed) the runner counts as CPU."""
    if checkpoints != "hub":
        return ",".join(DEFAULT_VARIANTS)
    try:
        accelerator = device_memory()[0]
    except ImportError:
        accelerator = "cpu"
    return ",".join(DEFAULT_VARIANTS) if accelerator == "cpu" else "meta"


@dataclass(frozen=True)
class Runner:
    """What this machine can give a run: host RAM and free memory per accelerator (none on CPU)."""

    host_bytes: int
    host_source: str
    accelerator: str
    device_bytes: tuple[int, ...]
    live_group_bytes: int = 0
    """Of `host_bytes`, what this run's live rank group holds: the next group reuses it or replaces the group,
    but the group still holds it while the driver computes the unsharded training steps or the reference."""

    @classmethod
    def detect(cls, group_bytes: int = 0, reference_bytes: int = 0) -> "Runner":
        """`group_bytes`, `reference_bytes`: memory this run's own live rank group and idle reference process hold
        now: the next cell reuses it or it is freed before the next group starts, so it counts as available to the
        group (the plan's peaks include each process's runtime); what the driver computes first gets the group's
        memory only once the group is gone (`beside_group_bytes`)."""
        host, source = host_memory()
        held = group_bytes + reference_bytes
        if held and source != HOST_MEMORY_ENV:
            host, source = host + held, f"{source} + {gib(held)} held by this run"
        else:
            group_bytes = 0  # an explicit runner size is the whole budget, whoever holds it
        accelerator, devices = device_memory()
        return cls(host, source, accelerator, tuple(devices), group_bytes)

    @property
    def beside_group_bytes(self) -> int:
        """Host RAM for what runs while the live rank group still holds its memory: the reference process and the
        driver's unsharded training steps."""
        return self.host_bytes - self.live_group_bytes


@dataclass(frozen=True)
class ReferencePlan:
    """How the unsharded reference process loads the model, and its planned host peak."""

    host_bytes: int
    offload: str
    """`none`: the whole model in memory (accelerators first, when there are any); `disk`: accelerate
    keeps `cpu_bytes` of weights in host RAM and reads the rest from disk layer by layer."""
    cpu_bytes: int
    runner: Runner
    model_bytes: int
    """The whole model in the reference's dtype: the reference process ends after a large one (suites/reference/cache.py
    REFERENCE_PROCESS_REUSE_BELOW)."""

    def max_memory(self) -> dict[str, int] | None:
        """accelerate's `max_memory` (device_map="auto") as it crosses to the reference's process (JSON: a device's
        index as a string, `cpu` for host RAM), or None: a plain load into host RAM."""
        if self.offload == "none" and not self.runner.device_bytes:
            return None
        devices = {str(index): int(free * SAFETY) for index, free in enumerate(self.runner.device_bytes)}
        return {**devices, "cpu": self.cpu_bytes}


def plan_reference(size: CheckpointSize, dtype: DType, runner: Runner) -> ReferencePlan:
    model, layer, working = size.model_bytes(dtype), size.layer_bytes(dtype), activation_bytes(size, dtype)
    whole = PROCESS_RUNTIME_BYTES + model + working
    if whole <= runner.beside_group_bytes * SAFETY and not runner.device_bytes:
        return ReferencePlan(whole, "none", model, runner, model)
    # accelerate fills the accelerators, then host RAM up to its share, then disk; the layer being
    # computed is materialised on top of what stays resident (benchmark: the offloaded reference's peak
    # is flat in model size, runtime + one layer).
    off_host = model - sum(int(free * SAFETY) for free in runner.device_bytes)
    resident_budget = int(runner.beside_group_bytes * SAFETY) - PROCESS_RUNTIME_BYTES - working - layer
    cpu_bytes = max(0, min(off_host, resident_budget))
    if cpu_bytes >= off_host:
        return ReferencePlan(PROCESS_RUNTIME_BYTES + max(off_host, 0) + working, "none", cpu_bytes, runner, model)
    return ReferencePlan(PROCESS_RUNTIME_BYTES + cpu_bytes + working + layer, "disk", cpu_bytes, runner, model)


OPTIMIZER_STATE_COPIES = {"sgd": 1, "adam": 2}
"""Copies of the weights each training optimizer keeps (suites/variants/training.py OPTIMIZERS: SGD with
momentum keeps one buffer, AdamW exp_avg and exp_avg_sq)."""


@dataclass(frozen=True)
class TrainingShape:
    """What a training row holds besides the weights, counted in copies of the model."""

    steps: int
    """Unsharded steps the cell compares with (`Variant.unsharded_steps`)."""
    optimizer_copies: int
    round_trip: bool
    """Save, gather every weight whole on each rank, load into a second engine and take one more step."""
    resume_tp: int = 0
    """The second engine's tp (0: the cell's; 1: every rank holds the whole model)."""
    computed_steps: int = 0
    """The unsharded steps the driver computes for it: the run's longest under its optimizer, whose first `steps` it
    compares with (suites/variants/unsharded_cache.py `cached_unsharded_steps`); 0: `steps`."""

    @classmethod
    def of(cls, variant: Variant, longest: int = 0) -> TrainingShape | None:
        """`longest`: the most unsharded steps a cell of the run compares with under the variant's optimizer."""
        if not variant.training:
            return None
        return cls(
            variant.unsharded_steps,
            OPTIMIZER_STATE_COPIES[variant.optimizer],
            variant.checkpoint_round_trip,
            variant.resume_tp,
            longest if longest > variant.unsharded_steps else 0,
        )

    @property
    def unsharded_copies(self) -> int:
        """The driver's unsharded steps: weights, gradients and optimizer state, plus what it keeps to compare
        with: the weights before the first step and after each, and each step's gradients."""
        computed = max(self.steps, self.computed_steps)
        return 2 + self.optimizer_copies + (computed + 1) + computed

    @property
    def compared_copies(self) -> int:
        """What each rank loads to compare its steps with: the driver's saved weights and gradients."""
        return 2 * self.steps + 1

    def rank_copies(self, tp: int) -> float:
        """A rank's peak growth in copies of the model, its phases held at once (nothing is freed before the
        cell ends): the eager load, the compared steps, its engine's shard (weights, gradients, optimizer
        state, the weights it started from) and, with the round trip, the saved shard (weights and optimizer
        state, which saving and the universal conversion hold: the measured remainder), every weight
        gathered whole, and the second engine at `resume_tp`. benchmarks/memory_plan.py, llama-shaped
        0.28-0.46 GiB fp32 at tp 2, planned/measured peak: train 0.93-1.01, train_universal 1.01-1.02."""
        engine = (3 + self.optimizer_copies) / tp
        saved = (1 + self.optimizer_copies) / tp
        second = saved + 1 + (3 + self.optimizer_copies) / (self.resume_tp or tp) if self.round_trip else 0
        return EAGER_LOAD_FACTOR + self.compared_copies + engine + second


@dataclass(frozen=True)
class MemoryPlan:
    """Planned peaks of one cell's processes against one runner, in bytes."""

    load: str
    dtype: DType
    tp: int
    model_bytes: int
    layer_bytes: int
    reference: ReferencePlan
    rank_host_bytes: int
    rank_device_bytes: int
    runner: Runner
    training_host_bytes: int = 0
    """Training rows: what the driver's unsharded steps add to its own process (TrainingShape)."""
    baseline: ReferencePlan | None = None
    """Quantized variants: the unsharded reference in the baseline's dtype (fp32) that the relaxed checks compare
    with, computed in a process of its own like the cell's (quantized) reference."""
    problem: str = ""
    """Empty when the cell fits; else which resource is short, by how much, and what would fit."""

    @property
    def group_host_bytes(self) -> int:
        return self.tp * self.rank_host_bytes

    def metrics(self) -> dict[str, float]:
        values = {
            "plan_model_bytes": self.model_bytes,
            "plan_rank_host_bytes": self.rank_host_bytes,
            "plan_group_host_bytes": self.group_host_bytes,
            "plan_host_available_bytes": self.runner.host_bytes,
        }
        if self.training_host_bytes:
            values["plan_training_host_bytes"] = self.training_host_bytes
        else:
            values["plan_reference_host_bytes"] = self.reference.host_bytes
        if self.runner.device_bytes:
            values.update(
                plan_rank_device_bytes=self.rank_device_bytes, plan_device_available_bytes=min(self.runner.device_bytes)
            )
        return {key: float(value) for key, value in values.items()}

    def summary(self) -> str:
        reference = f"reference {gib(self.reference.host_bytes)}" + (
            f" (offloaded to disk, {gib(self.reference.cpu_bytes)} of weights in RAM)"
            if self.reference.offload == "disk"
            else ""
        )
        if self.training_host_bytes:
            reference = f"unsharded training steps {gib(self.training_host_bytes)} in the driver"
        ranks = f"{self.load} ranks {self.tp} x {gib(self.rank_host_bytes)} host"
        if self.runner.device_bytes:
            ranks += f" + {gib(self.rank_device_bytes)} {self.runner.accelerator}"
        verdict = f"does not fit: {self.problem}" if self.problem else "fits"
        return f"model {gib(self.model_bytes)} {self.dtype}; {reference}; {ranks}; {verdict}"


def gib(count: float) -> str:
    return f"{count / GiB:.2f} GiB" if count >= GiB / 10 else f"{count / MiB:.0f} MiB"


def _peaks(
    size: CheckpointSize,
    dtype: DType,
    *,
    tp: int,
    load: str,
    meta_files: int,
    runner: Runner,
    training: TrainingShape | None = None,
    baseline_dtype: DType | None = None,
) -> MemoryPlan:
    model, working = size.model_bytes(dtype), activation_bytes(size, dtype)
    shard = -(-model // tp)
    # The meta loader holds one checkpoint file at a time; a meta variant with `checkpoint_files` > 1
    # reads a copy re-split into that many files (suites/variants/loading.py checkpoint_copy).
    open_file = size.largest_file_bytes if meta_files == 1 else -(-size.stored_bytes // meta_files)
    if runner.device_bytes:
        # Weights end on the device; eager still builds the whole model in host RAM first. Not measured
        # yet on accelerators: the meta rank's host side is its ideal (one open file).
        rank_host = PROCESS_RUNTIME_BYTES + (model if load == "eager" else open_file)
        rank_device = shard + working
    else:
        grown = model * (EAGER_LOAD_FACTOR if load == "eager" else META_LOAD_FACTOR)
        rank_host, rank_device = int(PROCESS_RUNTIME_BYTES + grown + working), 0
    training_host = 0
    if training:
        if (
            runner.device_bytes
        ):  # not measured on accelerators: the compared steps stay on the host, the rest on the device
            rank_host = max(rank_host, PROCESS_RUNTIME_BYTES + model * training.compared_copies)
            rank_device = (
                int(model * (training.rank_copies(tp) - training.compared_copies - EAGER_LOAD_FACTOR)) + working
            )
        else:
            rank_host = int(PROCESS_RUNTIME_BYTES + model * training.rank_copies(tp) + working)
        training_host = model * training.unsharded_copies + working
    # A training cell's reference is the driver's unsharded steps; no reference process runs for it.
    reference = ReferencePlan(0, "none", 0, runner, 0) if training else plan_reference(size, dtype, runner)
    return MemoryPlan(
        load=load,
        dtype=dtype,
        tp=tp,
        model_bytes=model,
        layer_bytes=size.layer_bytes(dtype),
        reference=reference,
        rank_host_bytes=rank_host,
        rank_device_bytes=rank_device,
        runner=runner,
        training_host_bytes=training_host,
        baseline=plan_reference(size, baseline_dtype, runner) if baseline_dtype else None,
    )


def plan_cell(
    size: CheckpointSize,
    dtype: DType,
    *,
    tp: int,
    load: str,
    runner: Runner,
    meta_files: int = 1,
    training: TrainingShape | None = None,
    baseline_dtype: DType | None = None,
) -> MemoryPlan:
    """The cell's plan; `problem` names the first resource that is short, by how much, and what fits.
    `baseline_dtype`: a quantized variant's baseline reference is planned too (`MemoryPlan.baseline`)."""
    plan = _peaks(
        size,
        dtype,
        tp=tp,
        load=load,
        meta_files=meta_files,
        runner=runner,
        training=training,
        baseline_dtype=baseline_dtype,
    )
    host_budget, beside_group = int(runner.host_bytes * SAFETY), int(runner.beside_group_bytes * SAFETY)
    have = f"runner has {gib(runner.host_bytes)} ({runner.host_source}; a plan uses at most {SAFETY:.0%})"
    if runner.live_group_bytes:
        have += f", {gib(runner.live_group_bytes)} of it held by the live rank group until it ends"
    if training is not None and plan.training_host_bytes > beside_group:
        return replace(
            plan,
            problem=f"needs {gib(plan.training_host_bytes)} host RAM for the unsharded training steps in the "
            f"driver ({training.unsharded_copies} copies of the model: weights, gradients, optimizer "
            f"state and what the ranks compare with), {have}",
        )
    if plan.reference.host_bytes > beside_group:
        return replace(
            plan,
            problem=f"needs {gib(plan.reference.host_bytes)} host RAM for the reference even with disk "
            f"offload (runtime + the largest layer, {gib(plan.layer_bytes)}), {have}",
        )
    if plan.group_host_bytes > host_budget:
        problem = (
            f"needs {gib(plan.group_host_bytes)} host RAM for {tp} {load} ranks ({gib(plan.rank_host_bytes)} each), "
            f"{have}"
        )
        return replace(
            plan, problem=f"{problem}: {_alternatives(size, dtype, tp=tp, load=load, runner=runner, training=training)}"
        )
    if runner.device_bytes and plan.rank_device_bytes > min(runner.device_bytes) * SAFETY:
        problem = (
            f"needs {gib(plan.rank_device_bytes)} {runner.accelerator} memory per rank at tp {tp}, a device has "
            f"{gib(min(runner.device_bytes))} free"
        )
        return replace(
            plan, problem=f"{problem}: {_alternatives(size, dtype, tp=tp, load=load, runner=runner, training=training)}"
        )
    return plan


def _fits(plan: MemoryPlan) -> bool:
    budget, beside_group = plan.runner.host_bytes * SAFETY, plan.runner.beside_group_bytes * SAFETY
    devices_fit = not plan.runner.device_bytes or plan.rank_device_bytes <= min(plan.runner.device_bytes) * SAFETY
    return (
        plan.group_host_bytes <= budget
        and max(plan.reference.host_bytes, plan.training_host_bytes) <= beside_group
        and devices_fit
    )


def _alternatives(
    size: CheckpointSize, dtype: DType, *, tp: int, load: str, runner: Runner, training: TrainingShape | None = None
) -> str:
    """What would fit this runner instead: the registry's `meta` variant at this tp, then other tp sizes
    (up to the accelerators there are); training rows load eagerly, so only other tp sizes."""
    meta_files = load_variants()["meta"].checkpoint_files
    largest_tp = max(len(runner.device_bytes) or 8, tp)
    modes = ("eager",) if training else ("eager", "meta")
    options = [("meta", tp)] if load == "eager" and not training else []
    options += [(mode, other) for other in (2, 4, 8) if other != tp and other <= largest_tp for mode in modes]
    fitting = [
        " ".join(([] if training else [f"--variants {mode}"]) + ([] if other == tp else [f"--tp {other}"]))
        for mode, other in options
        if _fits(_peaks(size, dtype, tp=other, load=mode, meta_files=meta_files, runner=runner, training=training))
    ]
    if not fitting:
        return f"no load mode fits at tp 2-{largest_tp}: use a runner with more memory"
    return "use " + " or ".join(fitting[:3])

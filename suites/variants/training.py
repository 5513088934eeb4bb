"""The AutoTP training variants: N optimizer steps with `tensor_parallel.autotp_size` (the row's
partitioning source, ZeRO stage, tp_overlap_comm) against the same steps on the unsharded model,
optionally followed by the checkpoint round trip and with a second AutoTP model in the process.

The unsharded steps (each step's loss and gradients, the weights before and after) are computed in
the driver, never in a rank (see suites/reference/unsharded.py), and cached on disk. Each rank runs the same
steps through `deepspeed.initialize` and compares the gradient and the weight update of each
parameter it holds with the matching slice of the unsharded one. The slice is found from the initial
weights themselves (each shard row is an exact row of the unsharded weight), so the comparison does
not trust DeepSpeed's own shard arithmetic. Dropout is off (eval mode) so both sides compute the same
function. The optimizer (OPTIMIZERS) keeps a step that is right to rounding right to rounding: SGD
with momentum is linear in the gradient; Adam runs with a large eps, because its g/sqrt(v) turns
rounding noise in near-zero gradients into full-size updates. Both keep state a resumed run must restore.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from transformers import AutoConfig

from matrix.registry import DType
from matrix.variants import TRAINING_FEATURES, Variant
from suites.checks.contracts import (
    Job,
    RoundTripReport,
    TrainingReport,
    UnshardedSteps,
)
from suites.checks.inputs import ProbeSpec, build_inputs, load_tokenizer
from suites.checks.probes import bytes_by_name, shapes_by_name, split_counts, tensor_kinds
from suites.variants.loading import load_model, refuse_if_sharded
from suites.variants.trainee import (
    CHECKPOINT_TAG,
    ShardedTrainee,
    compare_whole,
    forget_parallel_groups,
    gather_full_weights,
    lm_head_names,
    universal_arguments,
)
from suites.verdicts.outcome import LibraryOutputError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from deepspeed import DeepSpeedEngine

    from suites.base.model_types import CausalLM

    FaultHook = Callable[[str, torch.nn.Module], None]
    """suites/engine/cell_runner.py's test-only fault hook: `fault_hook(stage, model)`."""

OPTIMIZERS: dict[str, dict[str, Any]] = {
    "sgd": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
    # eps 1e-3: the update stays a smooth function of the gradient (see the module docstring).
    "adam": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-3, "weight_decay": 0.0}},
}
"""Variant.optimizer -> DeepSpeed's optimizer config. DeepSpeed builds the torch.optim class of its name (AdamW with
`torch_adam`, see deepspeed_optimizer), and so does the unsharded side (torch_optimizer)."""
GRADIENT_CLIPPING = 1.0
"""Clip-by-global-norm on both sides (DeepSpeed's default): the sharded side must count each shard once
and each replicated parameter once in the norm, or every update is scaled wrong."""


def _training_config_fields() -> set[str]:
    try:
        # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
        from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    except ImportError:
        return set()
    return set(getattr(TPTrainingConfig, "model_fields", None) or TPTrainingConfig.__fields__)  # pydantic 2 / 1


def _has_feature(feature: str) -> bool:
    """Whether the installed DeepSpeed has `feature` (matrix/variants.py TRAINING_FEATURES), asked of
    the package itself so any release or branch gets a real answer."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    from deepspeed.module_inject import layers

    if feature == "autotp_training":
        return hasattr(layers, "set_autotp_mode")
    if feature == "gather_replaced_params":
        return hasattr(layers, "GatherReplacedLayerParams")
    if feature == "hf_tp_plan":
        return importlib.util.find_spec("deepspeed.module_inject.tp_plan_converter") is not None
    if feature == "universal_checkpoint":
        return (
            hasattr(layers, "collect_autotp_universal_checkpoint_info")
            and importlib.util.find_spec("deepspeed.checkpoint.ds_to_universal") is not None
        )
    return feature in _training_config_fields()  # preset_model, partition_config, tp_overlap_comm


def version_skip_reason(needs: tuple[str, ...] = ("autotp_training",)) -> str | None:
    """Why the installed DeepSpeed cannot run a training row needing `needs`, or None."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed

    for feature in needs:
        if not _has_feature(feature):
            if feature == "autotp_training":  # it and set_autotp_mode arrived together, in 0.16.4
                return (
                    f"AutoTP training (tensor_parallel.autotp_size) needs deepspeed >= 0.16.4 (installed "
                    f"{deepspeed.__version__} has no deepspeed.module_inject.layers.set_autotp_mode)"
                )
            return f"installed deepspeed {deepspeed.__version__} lacks {TRAINING_FEATURES[feature]}"
    return None


def model_skip_reason(variant: Variant, checkpoint: str, model_type: str) -> str | None:
    """Why this row's partitioning source does not exist for this model (asked in the driver)."""
    if variant.partitioning == "tp_plan":
        if not getattr(AutoConfig.from_pretrained(checkpoint), "base_model_tp_plan", None):
            return f"{model_type}: this transformers ships no tp_plan for it (config.base_model_tp_plan is empty)"
    if variant.partitioning == "preset":
        # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
        from deepspeed.module_inject.autotp_config import AutoTPPresets

        if AutoTPPresets.get_preset(model_type) is None:
            return f"{model_type}: deepspeed has no AutoTP preset of that name (AutoTPPresets.get_preset)"
    return None


def load_for_training(checkpoint: str, dtype: DType, trust_remote_code: bool) -> CausalLM:
    """The model a training step runs: eval mode (no dropout) and no KV cache, as in real training.
    In eval mode some releases build a cache sized from the config's kv-head count inside forward
    (gemma2's HybridCache in transformers 4.4x), which AutoTP's per-rank heads do not fit."""
    model = load_model(checkpoint, dtype, trust_remote_code)
    model.config.use_cache = False
    return model


def step_batch(tokenizer_source: str | None, spec: ProbeSpec, trust_remote_code: bool, step: int) -> torch.Tensor:
    """Step `step`'s sequence (labels = inputs): the corpus's windows of `ppl_window` tokens in turn, so
    consecutive steps see different data."""
    corpus = build_inputs(load_tokenizer(tokenizer_source, trust_remote_code), spec).corpus_ids
    windows = corpus.shape[1] // spec.ppl_window
    begin = (step % windows) * spec.ppl_window
    return corpus[:, begin : begin + spec.ppl_window]


def compute_unsharded_steps(
    *,
    checkpoint: str,
    tokenizer: str | None,
    dtype: DType,
    spec: ProbeSpec,
    trust_remote_code: bool,
    steps: int,
    optimizer_name: str,
) -> UnshardedSteps:
    """`steps` optimizer steps on the unsharded model (`take_steps`, the loop a training row's repro script copies by
    its source, so the two cannot step differently): each step's loss and gradients, the weights before the first
    step and after each step, and each tensor's bytes and kind (for the memory check)."""
    refuse_if_sharded()
    torch.manual_seed(0)
    model = load_for_training(checkpoint, dtype, trust_remote_code)
    batches = [step_batch(tokenizer, spec, trust_remote_code, step) for step in range(steps)]
    taken = take_steps(model, batches, deepspeed_optimizer(optimizer_name), GRADIENT_CLIPPING, dtype != "fp32")
    lm_head, lm_head_weight = lm_head_names(model)
    return UnshardedSteps(
        losses=taken.losses,
        grads=taken.grads,
        weights=taken.weights,
        adam_gradient_units=taken.adam_gradient_units,
        bytes_by_name=bytes_by_name(model),
        kinds=tensor_kinds(model, split_counts(model).experts),
        shapes_by_name=shapes_by_name(model),
        counts=asdict(split_counts(model)),
        lm_head=lm_head,
        lm_head_weight=lm_head_weight,
    )


@dataclass(frozen=True)
class StepsTaken:
    """The unsharded model's optimizer steps as `take_steps` took them."""

    losses: list[float]
    """Each step's loss."""
    grads: list[dict[str, torch.Tensor]]
    """Each step's gradient of every parameter that has one."""
    weights: list[dict[str, torch.Tensor]]
    """The weights before the first step, then after each step."""
    adam_gradient_units: list[dict[str, torch.Tensor]]
    """`adam_gradient_units` after each step; empty for an optimizer other than Adam."""


def torch_optimizer(config: dict[str, Any], params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer DeepSpeed builds from its config's `optimizer` section: the torch.optim class of that name with
    its params (`torch_adam` is DeepSpeed's switch to that class, not one of its arguments)."""
    optimizer_class: type[torch.optim.Optimizer] = getattr(torch.optim, config["type"])
    return optimizer_class(params, **{name: value for name, value in config["params"].items() if name != "torch_adam"})


def take_steps(
    model: CausalLM, batches: list[torch.Tensor], optimizer_config: dict[str, Any], clipping: float, mixed: bool
) -> StepsTaken:
    """One optimizer step per batch (labels = inputs) on the unsharded model, with DeepSpeed's optimizer config and
    gradient clipping: each step's loss and gradients, and the weights before the first step and after each step.

    `mixed`: DeepSpeed's mixed precision (bf16/fp16 enabled): the optimizer steps fp32 master weights with the
    model's gradients in fp32, clipped by their fp32 norm, and the model computes with the masters rounded to its
    dtype. An optimizer stepping the low-precision weights themselves loses every update below a weight's ulp."""
    params = dict(model.named_parameters())
    stepped = {n: torch.nn.Parameter(p.detach().float()) for n, p in params.items()} if mixed else params
    optimizer = torch_optimizer(optimizer_config, stepped.values())
    losses: list[float] = []
    grads: list[dict[str, torch.Tensor]] = []
    weights = [{n: p.detach().clone() for n, p in params.items()}]
    adam_units: list[dict[str, torch.Tensor]] = []
    for ids in batches:
        loss = model(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.float().item())
        grads.append({n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None})
        if mixed:
            for name, master in stepped.items():
                grad = params[name].grad
                master.grad = None if grad is None else grad.float()
        torch.nn.utils.clip_grad_norm_(stepped.values(), clipping)
        optimizer.step()
        if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            adam_units.append({n: adam_gradient_units(optimizer, m) for n, m in stepped.items()})
        optimizer.zero_grad()
        model.zero_grad()
        if mixed:
            with torch.no_grad():
                for name, master in stepped.items():
                    params[name].copy_(master)
        weights.append({n: p.detach().clone() for n, p in params.items()})
    return StepsTaken(losses=losses, grads=grads, weights=weights, adam_gradient_units=adam_units)


def adam_gradient_units(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> torch.Tensor:
    """Per element, Adam's (sqrt(v_hat) + eps) / lr after the step just taken: an error of the element's update
    times it is the gradient error that would have caused it (ShardedTrainee.change_comparison). A parameter Adam
    never stepped (no gradient) keeps plain units."""
    state = optimizer.state.get(param)
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    if not state:
        return torch.ones_like(param, dtype=torch.float32)
    beta2: float = group["betas"][1]
    corrected = state["exp_avg_sq"].float() / (1 - beta2 ** float(state["step"]))
    units: torch.Tensor = (corrected.sqrt() + group["eps"]) / group["lr"]
    return units


def load_unsharded_steps(path: str) -> UnshardedSteps:
    """The driver's unsharded steps as a rank reads them: mapped, not copied. Every rank of the group reads the whole
    file (and rank 0 again to judge), and compares only its slices of it."""
    unsharded: UnshardedSteps = torch.load(path, weights_only=False, mmap=True)
    return unsharded


def deepspeed_config(
    variant: Variant, tp_size: int, dtype: DType, model_type: str, load_universal: bool = False
) -> dict[str, Any]:
    """The cell's DeepSpeed config: the row's partitioning source, ZeRO stage and tp_overlap_comm."""
    tensor_parallel: dict[str, Any] = {"autotp_size": tp_size}
    if variant.partitioning == "preset":
        tensor_parallel["preset_model"] = model_type
    if variant.partitioning == "custom":
        tensor_parallel["partition_config"] = variant.partition_config
    if variant.tp_overlap_comm:
        tensor_parallel["tp_overlap_comm"] = True
    return {
        "train_micro_batch_size_per_gpu": 1,
        "tensor_parallel": tensor_parallel,
        # ZeRO-3 writes save_16bit_model's file only when told to gather the partitions for it.
        "zero_optimization": {"stage": variant.zero_stage, "stage3_gather_16bit_weights_on_model_save": True},
        # SGD is a torch.optim class, which DeepSpeed's ZeRO optimizers call "untested".
        "zero_allow_untested_optimizer": True,
        "optimizer": deepspeed_optimizer(variant.optimizer),
        "gradient_clipping": GRADIENT_CLIPPING,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16"},
        "checkpoint": {"load_universal": load_universal},
    }


def deepspeed_optimizer(name: str) -> dict[str, Any]:
    """The row's optimizer as DeepSpeed's config names it (OPTIMIZERS)."""
    optimizer = OPTIMIZERS[name]
    if optimizer["type"] == "AdamW":  # torch's AdamW: no JIT-built op, and the class the unsharded side runs
        return {**optimizer, "params": {**optimizer["params"], "torch_adam": True}}
    return optimizer


def hide_tp_plan(model: CausalLM) -> None:
    """Make this model instance look like one that ships no HF tp_plan, so AutoTP's name heuristics
    shard it. DeepSpeed merges the config's plan, the class's plan and the instance's plan; the class
    plan is hidden by a subclass made for this instance alone (patching the class itself would leak
    into every later model of the class in this rank)."""
    model.config.base_model_tp_plan = None  # type: ignore[misc]  # the class's plan shadowed on this instance alone
    model.__dict__.pop("_tp_plan", None)
    model.__class__ = type(type(model).__name__, (type(model),), {"_tp_plan": None})


def build_engine(
    *, checkpoint: str, model_type: str, job: Job, tp_size: int, progress: Progress, load_universal: bool = False
) -> DeepSpeedEngine:
    """The model loaded (stage `setup`: loading a checkpoint is not DeepSpeed's), then deepspeed.initialize
    (stage `shard`, under the label the caller was in)."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed

    variant, label = job.variant, progress.label
    progress.enter("setup", f"{label}: load model")
    model = load_for_training(checkpoint, job.dtype, job.trust_remote_code)
    if variant.partitioning == "heuristics":
        hide_tp_plan(model)
    config = deepspeed_config(variant, tp_size, job.dtype, model_type, load_universal)
    progress.enter("shard", label)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.eval()
    return engine


class Progress:
    """The stage a rank is in, for the verdict when it raises: `label` names it in the signature
    (`step 2`, `save`, `gather`, `load`, `resume`), `stage` is the cell_runner stage that sets the class."""

    def __init__(self) -> None:
        self.stage, self.label = "setup", "initialize"

    def enter(self, stage: str, label: str) -> None:
        self.stage, self.label = stage, label


def round_trip(
    *, trainee: ShardedTrainee, job: Job, world_size: int, scratch: Path, fault_hook: FaultHook, progress: Progress
) -> RoundTripReport:
    """save_checkpoint + save_16bit_model, the full weights gathered, the checkpoint loaded into a fresh
    engine (at the row's `resume_tp` through a universal checkpoint), and the step an uninterrupted run
    takes next."""

    engine, variant, rank = trainee.engine, job.variant, dist.get_rank()
    steps_taken = len(trainee.losses)
    trained = trainee.unsharded["weights"][steps_taken]
    progress.enter("forward", "save")
    engine.save_checkpoint(str(scratch), tag=CHECKPOINT_TAG)
    engine.save_16bit_model(str(scratch), "model_16bit.bin")
    dist.barrier()  # every rank's files are written before any rank reads them
    saved_file = scratch / "model_16bit.bin"
    if not saved_file.is_file():  # DeepSpeed's output, validated where it enters the harness, on every rank alike
        raise LibraryOutputError("numerics", "save_16bit_model wrote no file", str(saved_file))
    saved = compare_whole(torch.load(saved_file, weights_only=True), trained, "saved 16-bit") if rank == 0 else None
    if variant.resume_tp:
        if rank == 0:
            progress.enter("setup", "ds_to_universal: arguments")
            arguments = universal_arguments(scratch)
            progress.enter("forward", "ds_to_universal")
            # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
            from deepspeed.checkpoint import ds_to_universal

            ds_to_universal.main(arguments)
        dist.barrier()
    progress.enter("forward", "gather")
    fault_hook("saved", engine.module)
    gathered, problems = gather_full_weights(engine.module, variant.zero_stage)
    gather = compare_whole(gathered, trained, "gathered")
    gather = replace(gather, problems=(*gather.problems, *problems))
    progress.enter("shard", "load")
    if variant.resume_tp:
        forget_parallel_groups()
    resumed = ShardedTrainee(
        build_engine(
            checkpoint=job.trained[0].checkpoint,
            model_type=job.trained[0].model_type,
            job=job,
            tp_size=variant.resume_tp or world_size,
            progress=progress,
            load_universal=bool(variant.resume_tp),
        ),
        trainee.unsharded,
        trainee.label,
        steps_taken,
    )
    fault_hook("restoring", resumed.engine.module)
    resumed.engine.load_checkpoint(
        str(scratch), tag=f"{CHECKPOINT_TAG}_universal" if variant.resume_tp else CHECKPOINT_TAG
    )
    fault_hook("restored", resumed.engine.module)
    # The loaded shards themselves, not only the next step: on tiny random models a whole projection left untrained
    # moves the next loss by less than the loss tolerance. Judged by their change from the initial weights (the
    # trained update they hold), as train_update: in bf16 two steps move a weight by less than its ulp, so weights
    # left at their initial values would pass a comparison at the weight's scale.
    resumed.start_updates_here()
    loaded = resumed.change_comparison(resumed.initial, None, 0, steps_taken)
    loaded.problems[:0] = resumed.problems  # a resumed engine that holds no slice of a weight
    progress.enter("setup", "resume: step batch")
    batch = step_batch(job.tokenizer, job.spec, job.trust_remote_code, steps_taken)
    progress.enter("forward", "resume")
    resumed.step(batch, fault_hook)
    # The next step's loss and gradients depend on the weights alone; its update also on the optimizer
    # state (momentum, Adam's moments) the checkpoint must restore.
    return RoundTripReport(
        saved=saved,
        gathered=gather,
        loaded=loaded.record(),
        resumed_step=steps_taken + 1,
        resumed_tp=variant.resume_tp or world_size,
        resumed_loss=resumed.losses[0],
        resumed_grads=resumed.step_grads[0],
        resumed_update=resumed.update_comparison().record(),
    )


def run_training(job: Job, world_size: int, scratch: Path, fault_hook: FaultHook, progress: Progress) -> TrainingReport:
    """The row's training on this rank: the cell's model (and the second model, initialised after it)
    trained step by step, then the checkpoint round trip. `fault_hook(stage, model)` is the test-only hook."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    from deepspeed.module_inject.layers import set_autotp_mode

    variant, spec = job.variant, job.spec
    set_autotp_mode(training=True)
    try:
        trainees: list[ShardedTrainee] = []
        for model in job.trained:
            engine = build_engine(
                checkpoint=model.checkpoint, model_type=model.model_type, job=job, tp_size=world_size, progress=progress
            )
            fault_hook("sharded", engine.module)
            trainees.append(ShardedTrainee(engine, load_unsharded_steps(model.unsharded_steps), model.model_type))
        progress.enter("setup", "step batches")  # the tokenizer's work, not the sharded model's
        batches: list[torch.Tensor] = []
        for step in range(variant.training_steps):  # a loop, not a comprehension: its frame names run_training
            batches.append(step_batch(job.tokenizer, spec, job.trust_remote_code, step))
        for step, ids in enumerate(batches):
            progress.enter("forward", f"step {step + 1}")
            for trainee in trainees:
                trainee.step(ids, fault_hook)
        reports = [trainee.report() for trainee in trainees]
        if variant.checkpoint_round_trip:
            reports[0]["round_trip"] = round_trip(
                trainee=trainees[0],
                job=job,
                world_size=world_size,
                scratch=scratch,
                fault_hook=fault_hook,
                progress=progress,
            )
        return TrainingReport(models=reports)
    finally:
        set_autotp_mode(training=False)  # the rank serves inference cells next

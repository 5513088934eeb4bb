"""Standalone AutoTP repro written by autotp-matrix; attach it to a DeepSpeed issue.

Run it with as many ranks as the cell's tp (CELL["tp"]): `LOCAL_SIZE=<tp> deepspeed --num_gpus <tp> <this file>` (on a
CPU-only machine too: DeepSpeed's CPU accelerator with gloo), or `LOCAL_SIZE=<tp> torchrun --nproc-per-node <tp> <this
file>`. LOCAL_SIZE tells DeepSpeed's CPU accelerator how many devices it has: without it, its launcher counts them with
`numactl --hardware` and fails where numactl is not installed (DeepSpeed 0.14.4 to 0.18.9 at least; a GPU ignores it).
It needs only torch, deepspeed and transformers (and huggingface_hub for `--checkpoint`).

It builds the model the cell ran (the same seeded tiny random checkpoint, or with `--checkpoint <hub id>` a real
checkpoint from the Hugging Face hub), runs the unsharded model first (no AutoTP state exists yet in the process),
loads it the way the cell's variant does (eager; on the meta device with init_inference reading the checkpoint
files; quantized), shards it with AutoTP, runs the same probes and compares:

- shapes and logits: a padded batch with its attention mask and one prompt without, within the cell's tolerance;
- ranks agree: every rank's logits equal rank 0's;
- generation: greedy tokens with the KV cache, one prompt and the left-padded batch (a divergence passes only where
  the unsharded model's top two logits are within the tolerance: a near-tie);
- loss: the `labels=` path (not run where the model cannot: `CELL["loss_skipped"]` says why);
- memory: every attention/MLP weight and MoE expert split across the ranks, no rank holding more than its share, and
  the output head split where DeepSpeed splits it, judged by the harness's own rules (copied in below); a faithful
  tiny checkpoint's splits by the counts of the real checkpoint it stands for (CELL["real_counts"]).

Training rows (`CELL["training"]`) run their optimizer steps with `deepspeed.initialize` instead, against the same
steps on the unsharded model, and judge what the cell judged with its tolerances: each step's loss, each rank's
gradient shards, the weight update, each rank's share of the weights, and for a checkpoint round trip the
save_16bit_model file, the gathered weights, the loaded weights and the step taken after loading (the harness's own
comparison code, copied in below). It prints one line per check, then `RESULT: MATCH` (exit 0) or `RESULT: MISMATCH`
(exit 1); where every check it runs passes but the cell failed on a part it leaves out (CELL["note"]), `RESULT: NOT
REPRODUCED HERE` (exit 2). An exception is printed as `RESULT: RAISED <stage> <type>` and raised.
"""

from __future__ import annotations

import argparse
import importlib  # noqa: F401 (a training row's harness code, copied in above, uses it)
import inspect
import math  # noqa: F401 (the memory rules, copied in above, use it)
import os
import re  # noqa: F401 (layer_groups, copied in above, uses it)
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace  # noqa: F401 (field: the training code copied in above)
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, TypeVar

import torch

if TYPE_CHECKING:
    # What AutoModelForCausalLM.from_pretrained returns: a PreTrainedModel with `generate` (transformers names the
    # pair privately; only a type checker reads this line).
    from transformers.models.auto.modeling_auto import _BaseModelWithGenerate as CausalLM


class ConfigNames(TypedDict):
    """The config attribute names of each count, in the order the harness reads them (matrix/shapes/)."""

    heads: tuple[str, ...]
    kv_heads: tuple[str, ...]
    hidden: tuple[str, ...]
    head_dim: tuple[str, ...]
    experts: tuple[str, ...]
    nested: tuple[str, ...]
    mla: str


class _CellFields(TypedDict):
    id: str
    verdict: str
    versions: dict[str, str]
    note: str
    model: str
    model_type: str
    tiny: dict[str, Any]
    """The tiny checkpoint's config keywords (any value a config field takes)."""
    seed: int
    init_seed: int
    spread: float
    checkpoints: list[str]
    hub_id: str | None
    revision: str | None
    dtype: str
    tp: int
    load: str
    checkpoint_format: str
    checkpoint_files: int
    keep_module_on_host: bool
    quantization: str
    quant_group_size: int
    training: bool
    text: str
    prompt_tokens: int
    left_pad: int
    new_tokens: int
    loss_tokens: int
    loss_skipped: str
    """Why the model cannot run the `labels=` loss (an image-to-text model's), "" when it runs."""
    logits_rel: float
    loss_rel: float
    config_names: ConfigNames
    real_counts: dict[str, int] | None
    """The counts (SplitCounts' fields) of the real checkpoint a faithful tiny checkpoint stands for; None otherwise."""
    command: str
    injection_policy: dict[str, list[str]]
    """init_inference's `injection_policy`: block class name -> its row-parallel linears ({} when none is passed)."""
    model_kwargs: dict[str, Any]
    """Keywords from_pretrained is given besides the dtype ({} when none)."""
    forward_mask: str
    """`all-ones`: the mask-less forward is given an all-ones attention mask; "" when it is given none."""


class CellSpec(_CellFields, total=False):
    """What the script knows of its cell (`CELL`); a training row's keys besides."""

    steps: int
    partitioning: str
    window: int
    train_loss_rel: float
    train_grad_rel: float
    """A first step's gradients; `train_later_grad_rel` a later step's (the weights already differ by rounding)."""
    train_later_grad_rel: float
    train_update_rel: float
    train_weight_rel: float
    """Whole weights saved by save_16bit_model or gathered by GatherReplacedLayerParams."""
    round_trip: bool
    """save_checkpoint + save_16bit_model, the gather, load_checkpoint at the same tp, and one more step."""
    cell_failed: bool
    """The cell's verdict was a failure: what a script that leaves part of the row out cannot call a match."""
    ds_config: dict[str, Any]
    """DeepSpeed's config, as the cell passed it to deepspeed.initialize."""


CELL: CellSpec = {}  # type: ignore[typeddict-item]  # the cell's values, written by autotp-matrix

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
Lines = list[tuple[bool, str]]
"""What a check prints: (passed, line) for each thing it compared."""


Gathered = TypeVar("Gathered")


class Observed(NamedTuple):
    """What the checks compare, from one model: its tensors by probe, and its loss."""

    tensors: dict[str, torch.Tensor]
    loss: float


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint",
        metavar="HUB_ID",
        default=CELL["hub_id"],
        help="run a real checkpoint from the Hugging Face hub instead of the tiny one (default: what the cell ran; "
        f"it stands for {', '.join(CELL['checkpoints']) or 'no recorded checkpoint'})",
    )
    parser.add_argument("--revision", default=None, help="the hub revision (default: the cell's pinned one, or main)")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # older launchers pass it
    return parser.parse_args()


def dtype_kwargs() -> dict[str, torch.dtype]:
    """transformers 4.56 renamed from_pretrained's `torch_dtype` to `dtype` (the config's __init__ names
    the field from then on); older releases ignore `dtype` without a word and load fp32."""
    from transformers import PretrainedConfig

    name = "dtype" if "dtype" in inspect.signature(PretrainedConfig.__init__).parameters else "torch_dtype"
    return {name: DTYPES[CELL["dtype"]]}


def environment_report() -> str:
    """The parts of `ds_report` a bug report needs, and the other libraries' versions."""
    import deepspeed
    import transformers
    from deepspeed.accelerator import get_accelerator

    rows = [
        ("torch version", torch.__version__),
        ("deepspeed info", f"{deepspeed.__version__}, {deepspeed.__git_hash__}, {deepspeed.__git_branch__}"),
        ("accelerator", get_accelerator().device_name()),
        ("transformers version", transformers.__version__),
        ("python version", sys.version.split()[0]),
    ]
    return "\n".join(f"{name} {'.' * (33 - len(name))} {value}" for name, value in rows)


if TYPE_CHECKING:  # harness functions, written by autotp-matrix (a type checker reads the harness's own)
    from matrix.checkpoints import randomise_constant_parameters
    from suites.checks.contracts import ComparisonRecord, UnshardedSteps
    from suites.checks.memory import memory_findings
    from suites.checks.probes import PAIRED_HEADS, Footprint, SplitCounts, bytes_by_name, shapes_by_name, tensor_kinds
    from suites.variants.trainee import (
        CHECKPOINT_TAG,
        ShardedTrainee,
        compare_whole,
        gather_full_weights,
        held_bytes_by_name,
    )
    from suites.variants.training import hide_tp_plan, take_steps


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def from_every_rank(value: Gathered) -> list[Gathered]:
    """Every rank's `value`, in rank order."""
    gathered: list[Any] = [None] * torch.distributed.get_world_size()  # one slot per rank, filled by the gather
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def checkpoint_folder(hub_id: str | None, revision: str | None) -> str:
    """The checkpoint's local folder: the harness's seeded tiny checkpoint, written by rank 0 in the cell's
    checkpoint format and about its number of weight files, or the hub checkpoint's snapshot."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if hub_id:
        from huggingface_hub import snapshot_download

        return snapshot_download(hub_id, revision=revision)
    folder = f"repro_checkpoint_{CELL['model']}_{CELL['checkpoint_format']}_{CELL['checkpoint_files']}"
    if rank() == 0 and not os.path.exists(os.path.join(folder, "config.json")):
        torch.manual_seed(CELL["seed"])
        config = AutoConfig.for_model(CELL["model_type"], **CELL["tiny"])
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        randomise_constant_parameters(model, CELL["init_seed"], CELL["spread"])
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        model.save_pretrained(
            folder,
            safe_serialization=CELL["checkpoint_format"] == "safetensors",
            max_shard_size=max(1, size // CELL["checkpoint_files"]) if CELL["checkpoint_files"] > 1 else "50GB",
        )
    torch.distributed.barrier()
    return folder


def load_model(folder: str) -> CausalLM:
    from transformers import AutoModelForCausalLM

    extra: dict[str, object] = {}
    if CELL["quantization"] == "torchao_int8":  # HF-side quantization at load, before AutoTP (and the reference)
        from torchao.quantization import Int8WeightOnlyConfig
        from transformers import TorchAoConfig

        extra["quantization_config"] = TorchAoConfig(Int8WeightOnlyConfig())
    model = AutoModelForCausalLM.from_pretrained(folder, **dtype_kwargs(), **extra, **CELL["model_kwargs"])
    model.eval()  # type: ignore[no-untyped-call]  # transformers leaves eval unannotated
    return model


def post_init_quantization(model: CausalLM) -> CausalLM:
    """DeepSpeed's group-wise weight-only quantization (ds_int8/ds_int4): applied alike to the unsharded model and,
    after init_inference, to each rank's shard."""
    if CELL["quantization"] not in ("deepspeed_int8", "deepspeed_int4"):
        return model
    from deepspeed.inference.quantization.quantization import _init_group_wise_weight_quantization

    bits = 8 if CELL["quantization"] == "deepspeed_int8" else 4
    config = {"num_bits": bits, "group_size": CELL["quant_group_size"], "group_dim": 1, "symmetric": False}
    quantized: CausalLM = _init_group_wise_weight_quantization(
        model, {"weight_quantization": {"post_init_quant": {"": config}}}
    )
    return quantized


def meta_model(folder: str) -> tuple[CausalLM, dict[str, object]]:
    """meta load: the architecture on the meta device (no weights anywhere) and DeepSpeed's checkpoints
    json listing the weight files, which init_inference reads shard by shard."""
    import json

    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    with deepspeed.OnDevice(dtype=DTYPES[CELL["dtype"]], device="meta"):
        model: CausalLM = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]  # unannotated, as above
            AutoConfig.from_pretrained(folder), **dtype_kwargs(), **CELL["model_kwargs"]
        )
        model.eval()  # type: ignore[no-untyped-call]  # transformers leaves eval unannotated
    suffix = ".safetensors" if CELL["checkpoint_format"] == "safetensors" else ".bin"
    files = sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(suffix))
    listing = os.path.join(folder, f"ds_checkpoints_{CELL['checkpoint_format']}.json")
    if rank() == 0:
        with open(listing, "w") as stream:
            json.dump({"type": "ds_model", "checkpoints": files, "version": 1.0}, stream)
    torch.distributed.barrier()
    options: dict[str, object] = {"checkpoint": listing}
    if CELL["keep_module_on_host"]:
        options["keep_module_on_host"] = True
    return model, options


def token_ids(hub_id: str | None) -> list[int]:
    """The cell's text as token ids: bytes for a tiny checkpoint (it has no tokenizer), else the hub tokenizer's."""
    if not hub_id:
        return list(CELL["text"].encode("utf-8"))
    from transformers import AutoTokenizer

    ids: list[int] = AutoTokenizer.from_pretrained(hub_id).encode(CELL["text"])
    return ids


def inputs(hub_id: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch ids [2, T], its attention mask, corpus ids [1, N]): the first prompt, and a second one shorter by
    `left_pad` tokens and left-padded with id 0, as the harness feeds them."""
    ids, length, pad = token_ids(hub_id), CELL["prompt_tokens"], CELL["left_pad"]
    first, second = ids[:length], ids[length : 2 * length - pad]
    batch = torch.tensor([first, [0] * pad + second])
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    return batch, mask, torch.tensor([ids[: CELL["loss_tokens"]]])


@torch.no_grad()
def observe(model: CausalLM, batch: torch.Tensor, mask: torch.Tensor, corpus: torch.Tensor, device: str) -> Observed:
    """Everything the checks compare, from one model."""
    batch, mask = batch.to(device), mask.to(device)
    seen = {"masked": model(batch, attention_mask=mask).logits.float().cpu()[mask.bool().cpu()]}
    plain_mask = {"attention_mask": torch.ones_like(batch[:1])} if CELL["forward_mask"] == "all-ones" else {}
    seen["plain"] = model(batch[:1], **plain_mask).logits.float().cpu()
    for name, ids, ids_mask in (("gen", batch[:1], mask[:1]), ("gen_padded", batch, mask)):
        generated = model.generate(
            ids,
            attention_mask=ids_mask,
            max_new_tokens=CELL["new_tokens"],
            min_new_tokens=CELL["new_tokens"],
            do_sample=False,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        seen[f"{name}_tokens"] = generated.sequences[:, ids.shape[1] :].cpu()
        seen[f"{name}_logits"] = torch.stack(generated.logits, dim=1).float().cpu()
    loss = math.nan if CELL["loss_skipped"] else float(model(corpus.to(device), labels=corpus.to(device)).loss)
    return Observed(seen, loss)


# ---- The checks ------------------------------------------------------------------------------------------------


def compare_logits(reference: Observed, sharded: Observed) -> Lines:
    """Each logits probe within CELL["logits_rel"] of the reference's largest logit."""
    lines: Lines = []
    for name in ("masked", "plain"):
        want, got = reference.tensors[name], sharded.tensors[name]
        if want.shape != got.shape:
            lines.append((False, f"shapes: {name} logits {tuple(got.shape)} vs {tuple(want.shape)}"))
            continue
        difference = (got - want).abs().max().item()
        allowed = CELL["logits_rel"] * want.abs().max().item()
        ok = difference <= allowed
        lines.append((ok, f"logits ({name}): max |difference| {difference:.3g} (allowed {allowed:.3g})"))
    return lines


def compare_generation(reference: Observed, sharded: Observed) -> Lines:
    """Greedy tokens equal, or the first divergence at a near-tie of the reference's top two logits."""
    lines: Lines = []
    for name in ("gen", "gen_padded"):
        want, got = reference.tensors[f"{name}_tokens"], sharded.tensors[f"{name}_tokens"]
        logits = reference.tensors[f"{name}_logits"]
        if want.shape != got.shape:
            lines.append((False, f"generation ({name}): tokens {tuple(got.shape)} vs {tuple(want.shape)}"))
            continue
        differ = (want != got).nonzero()
        if len(differ) == 0:
            lines.append((True, f"generation ({name}): greedy tokens equal {want.tolist()}"))
            continue
        row, step = differ[0].tolist()
        top = logits[row, step].topk(2).values
        margin, allowed = (top[0] - top[1]).item(), CELL["logits_rel"] * logits.abs().max().item()
        lines.append(
            (
                margin <= allowed,
                f"generation ({name}): row {row} differs from step {step} ({want[row].tolist()} vs {got[row].tolist()});"
                f" the reference's top-2 margin there is {margin:.3g} ({'a near-tie' if margin <= allowed else 'no tie'})",
            )
        )
    return lines


def compare_loss(reference: Observed, sharded: Observed) -> Lines:
    if CELL["loss_skipped"]:
        return [(True, f"loss (labels=): not run: {CELL['loss_skipped']}")]
    delta = abs(sharded.loss - reference.loss) / max(abs(reference.loss), 1e-12)
    ok = delta <= CELL["loss_rel"]
    return [(ok, f"loss (labels=): {sharded.loss:.6g} vs {reference.loss:.6g}, relative {delta:.3g}")]


def compare_ranks(sharded: Observed) -> Lines:
    """Every rank holds the same logits: the all-reduce joined the shards everywhere."""
    gathered = from_every_rank(sharded.tensors["plain"])
    spread = max((other - gathered[0]).abs().max().item() for other in gathered if other.shape == gathered[0].shape)
    same_shape = all(other.shape == gathered[0].shape for other in gathered)
    allowed = 4 * torch.finfo(torch.float32).eps * gathered[0].abs().max().item()
    return [(same_shape and spread <= allowed, f"ranks agree: largest difference from rank 0 {spread:.3g}")]


def split_counts(model: CausalLM) -> SplitCounts:
    """The model's (text) config's counts, read under the config names the harness reads them by (matrix/shapes/
    `read_shape`): the counts DeepSpeed's design rules depend on."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    values: dict[str, Any] = config.to_dict()  # a config's values: any JSON value
    names = CELL["config_names"]
    for nested in names["nested"]:
        if isinstance(values.get(nested), dict):
            values = {**values, **values[nested]}

    def first(keys: tuple[str, ...]) -> int:
        found = (values[key] for key in keys if isinstance(values.get(key), int) and not isinstance(values[key], bool))
        count: int = next(found, 0)
        return count

    heads, hidden = first(names["heads"]), first(names["hidden"])
    multi_query = values.get("multi_query") is True and not values.get("new_decoder_architecture")
    kv_heads = 1 if multi_query else (first(names["kv_heads"]) or heads)
    head_dim = values["v_head_dim"] if names["mla"] in values else (first(names["head_dim"]) or hidden // max(heads, 1))
    experts = first(names["experts"])
    paired = values.get("model_type") in PAIRED_HEADS
    return SplitCounts(heads, kv_heads, head_dim, experts if experts > 1 else 0, paired)


def unsharded_footprint(model: CausalLM) -> Footprint:
    """The unsharded model's tensors as the harness's memory check reads them (its readers, copied in above)."""
    counts = split_counts(model)
    return Footprint(bytes_by_name(model), tensor_kinds(model, counts.experts), shapes_by_name(model), counts)


def compare_memory(unsharded: Footprint, sharded_model: torch.nn.Module, real: SplitCounts | None) -> Lines:
    """Each weight AutoTP must split is split, no rank holding more than its split's pieces allow nor all of it while
    another holds none, none left whole on every rank outside DeepSpeed's named design rules, the output head split
    where DeepSpeed's design splits it, and every tensor a rank holds one the unsharded model has: the harness's own
    judgement (suites/checks/memory.py `memory_findings`, copied in above)."""
    import deepspeed
    from packaging.version import Version

    gathered = from_every_rank((bytes_by_name(sharded_model), shapes_by_name(sharded_model)))
    release = Version(deepspeed.__version__).release
    held, held_shapes = [by_name for by_name, _ in gathered], [shapes for _, shapes in gathered]
    problems, notes = memory_findings(unsharded, held, held_shapes, real, release, CELL["load"] == "meta")
    lines: Lines = [(False, f"memory: {problem.text}") for problem in problems]
    lines += [(True, f"memory (note): {note}") for note in notes]
    return (
        lines
        if problems
        else [(True, f"memory: every weight AutoTP must split is split across {len(held)} ranks"), *lines]
    )


# ---- Running it ------------------------------------------------------------------------------------------------


class Stage:
    """The stage a failure happened in, printed with it (`shard`: init_inference raised; `forward`: the sharded
    model raised)."""

    name = "setup"


def infer(hub_id: str | None, revision: str | None, device: str) -> Lines:
    import deepspeed

    folder = checkpoint_folder(hub_id, revision)
    model = post_init_quantization(load_model(folder))
    batch, mask, corpus = inputs(hub_id)
    # The reference comes first: this process has not sharded anything yet, so no AutoTP state can reach it.
    unsharded = unsharded_footprint(model)
    real = SplitCounts.read(CELL["real_counts"]) if CELL["real_counts"] and not hub_id else None
    # functools.wraps on transformers' `to` hides from mypy that it is a method (here and below).
    reference = observe(model.to(device), batch, mask, corpus, device)  # type: ignore[arg-type]
    options: dict[str, object] = {}
    if CELL["load"] == "meta":
        del model
        model, options = meta_model(folder)
    Stage.name = "shard"
    engine = deepspeed.init_inference(
        model,
        tensor_parallel={"tp_size": torch.distributed.get_world_size()},
        dtype=DTYPES[CELL["dtype"]],
        replace_with_kernel_inject=False,
        injection_policy=injection_policy(model),
        **options,
    )
    sharded_model = post_init_quantization(engine.module)
    Stage.name = "forward"
    sharded = observe(sharded_model, batch, mask, corpus, device)
    Stage.name = "compare"
    return [
        *compare_logits(reference, sharded),
        *compare_ranks(sharded),
        *compare_generation(reference, sharded),
        *compare_loss(reference, sharded),
        # A quantized weight is stored packed (int4: two to a byte): its element count says nothing about its split.
        *([] if CELL["quantization"] else compare_memory(unsharded, sharded_model, real)),
    ]


def injection_policy(model: CausalLM) -> dict[type, tuple[str, ...]] | None:
    """CELL["injection_policy"] with each block class found among the model's modules by name: which linears of
    each block init_inference makes row-parallel (None: its parser chooses)."""
    if not CELL["injection_policy"]:
        return None
    classes = {type(module).__name__: type(module) for module in model.modules()}
    return {classes[block]: tuple(names) for block, names in CELL["injection_policy"].items()}


def training_model(folder: str, device: str) -> CausalLM:
    """The model a training step runs, as the harness loads it: no KV cache; under `heuristics` the model's HF
    tp_plan hidden (hide_tp_plan, copied in above) so AutoTP's name heuristics shard it."""
    model: CausalLM = load_model(folder).to(device)  # type: ignore[arg-type]  # transformers' `to` is wrapped
    model.config.use_cache = False
    if CELL["partitioning"] == "heuristics":
        hide_tp_plan(model)
    return model


def unsharded_steps(folder: str, batches: list[torch.Tensor], device: str) -> UnshardedSteps:
    """The row's optimizer steps on the unsharded model, taken by the harness's own loop (suites/variants/training.py
    `take_steps`, copied in above) with the optimizer and the clipping of the cell's DeepSpeed config: each step's
    loss and gradients, the weights before and after each step; in bf16 and fp16 the optimizer steps fp32 master
    weights, as DeepSpeed's mixed precision does."""
    torch.manual_seed(0)
    model = training_model(folder, device)
    config = CELL["ds_config"]
    taken = take_steps(model, batches, config["optimizer"], config["gradient_clipping"], CELL["dtype"] != "fp32")
    footprint = unsharded_footprint(model)
    return {
        "losses": taken.losses,
        "grads": taken.grads,
        "weights": taken.weights,
        "adam_gradient_units": taken.adam_gradient_units,
        "bytes_by_name": footprint.bytes_by_name,
        "kinds": footprint.kinds,
        "shapes_by_name": footprint.shapes_by_name,
        "counts": asdict(footprint.counts),
        "lm_head": "",
        "lm_head_weight": "",
    }


def step_batches(hub_id: str | None, device: str) -> list[torch.Tensor]:
    """Each step's sequence (labels = inputs), one more for the step after a checkpoint is loaded: the corpus's
    windows of CELL["window"] tokens in turn, as the harness feeds them (suites/variants/training.py `step_batch`)."""
    _, _, corpus = inputs(hub_id)
    window = CELL["window"]
    windows = [corpus[:, begin : begin + window] for begin in range(0, corpus.shape[1] - window + 1, window)]
    return [windows[step % len(windows)].to(device) for step in range(CELL["steps"] + 1)]


def engine_for(folder: str, device: str) -> Any:
    """deepspeed.initialize over a freshly loaded model with the cell's config (a DeepSpeedEngine)."""
    import deepspeed

    model = training_model(folder, device)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CELL["ds_config"])
    engine.eval()
    return engine


def judged(check: str, records: list[ComparisonRecord], allowed: float) -> Lines:
    """One comparison per rank judged as the harness judges it (suites/checks/training.py): a tensor missing, or
    not a slice of its unsharded one, fails; else the worst rank's largest relative error against `allowed` (a NaN
    fails)."""
    problems = [f"rank {rank}: {found.text}" for rank, record in enumerate(records) for found in record.problems]
    if problems:
        return [(False, f"{check}: {'; '.join(problems[:3])}")]
    worst = max(range(len(records)), key=lambda r: (math.isnan(records[r].max_rel_error), records[r].max_rel_error))
    error, name = records[worst].max_rel_error, records[worst].worst_parameter
    where = f" ({name} on rank {worst})" if name else ""
    return [(error <= allowed, f"{check}: largest relative error {error:.3g}{where}, allowed {allowed:.3g}")]


def loss_lines(what: str, losses: list[list[float]], reference: list[float]) -> Lines:
    """Each step's loss on every rank against the unsharded step's (CELL["train_loss_rel"], relative)."""
    lines: Lines = []
    for step, want in enumerate(reference):
        got = [rank_losses[step] for rank_losses in losses]
        delta = max((abs(value - want) / abs(want) for value in got), key=lambda d: (math.isnan(d), d))
        label = what.format(step=step + 1)
        lines.append((delta <= CELL["train_loss_rel"], f"{label}: {got[0]:.6g} vs {want:.6g}, relative {delta:.3g}"))
    return lines


def trained_lines(trainee: ShardedTrainee, unsharded: UnshardedSteps, steps: int) -> Lines:
    """The cell's train_loss, train_grads, train_update and memory checks over every rank."""
    everyone = from_every_rank(
        (trainee.losses, trainee.problems, trainee.step_grads, trainee.update_comparison().record())
    )
    held = from_every_rank(held_bytes_by_name(trainee.engine.module))
    lines = loss_lines("train_loss: step {step} loss", [losses for losses, *_ in everyone], unsharded["losses"][:steps])
    layout = [f"rank {rank}: {found.text}" for rank, (_, found_here, *_) in enumerate(everyone) for found in found_here]
    lines += [(False, f"train_grads: sharded: {'; '.join(layout[:3])}")] if layout else []
    for step in range(steps):
        bound = CELL["train_grad_rel"] if step == 0 else CELL["train_later_grad_rel"]
        lines += judged(f"train_grads: step {step + 1} gradient", [grads[step] for _, _, grads, _ in everyone], bound)
    lines += judged(f"train_update: after step {steps}", [update for *_, update in everyone], CELL["train_update_rel"])
    counts = SplitCounts.read(unsharded["counts"])
    footprint = Footprint(unsharded["bytes_by_name"], unsharded["kinds"], unsharded["shapes_by_name"], counts)
    # As the harness's training memory check: each rank's bytes alone (no shapes, no real counts, no release rules).
    problems, notes = memory_findings(footprint, held, None, None, None, False)
    lines += [(False, f"memory: {problem.text}") for problem in problems]
    lines += [(True, f"memory (note): {note}") for note in notes]
    split = f"memory: every weight AutoTP must split is split across {len(held)} ranks"
    return lines if problems else [*lines, (True, split)]


def round_trip_lines(
    trainee: ShardedTrainee, unsharded: UnshardedSteps, folder: str, batch: torch.Tensor, device: str
) -> Lines:
    """The checkpoint round trip at the cell's tp (suites/variants/training.py `round_trip`): save_checkpoint and
    save_16bit_model, the saved and the gathered whole weights against the unsharded trained ones, load_checkpoint
    into a fresh engine, its loaded weights' update, and the step an uninterrupted run takes next."""
    steps, engine = len(trainee.losses), trainee.engine
    trained = unsharded["weights"][steps]
    scratch = from_every_rank(tempfile.mkdtemp(prefix="repro_checkpoint_") if rank() == 0 else "")[0]
    Stage.name = "forward (save)"
    engine.save_checkpoint(scratch, tag=CHECKPOINT_TAG)
    engine.save_16bit_model(scratch, "model_16bit.bin")
    torch.distributed.barrier()
    saved_file = os.path.join(scratch, "model_16bit.bin")
    lines: Lines = []
    if rank() == 0:
        if not os.path.isfile(saved_file):
            lines.append((False, "save: save_16bit_model wrote no file"))
        else:
            saved = compare_whole(torch.load(saved_file, weights_only=True), trained, "saved 16-bit")
            lines += judged("save: save_16bit_model weight", [saved], CELL["train_weight_rel"])
    Stage.name = "forward (gather)"
    gathered, size_problems = gather_full_weights(engine.module, CELL["ds_config"]["zero_optimization"]["stage"])
    gather = compare_whole(gathered, trained, "gathered")
    gather = replace(gather, problems=(*gather.problems, *size_problems))
    lines += judged("gather: GatherReplacedLayerParams weight", from_every_rank(gather), CELL["train_weight_rel"])
    Stage.name = "shard (load)"
    resumed = ShardedTrainee(engine_for(folder, device), unsharded, CELL["model"], steps)
    resumed.engine.load_checkpoint(scratch, tag=CHECKPOINT_TAG)
    resumed.start_updates_here()
    loaded = resumed.change_comparison(resumed.initial, None, 0, steps)
    loaded.problems[:0] = resumed.problems
    lines += judged("load: load_checkpoint weight update", from_every_rank(loaded.record()), CELL["train_update_rel"])
    Stage.name = "forward (resume)"
    resumed.step(batch, lambda stage, model: None)
    what = f"resume: step {steps + 1} after load_checkpoint"
    lines += loss_lines(what + " loss", from_every_rank(resumed.losses), unsharded["losses"][steps : steps + 1])
    lines += judged(what + " gradient", from_every_rank(resumed.step_grads[0]), CELL["train_later_grad_rel"])
    update = resumed.update_comparison().record()
    lines += judged(what + " weight update", from_every_rank(update), CELL["train_update_rel"])
    return lines


def train(hub_id: str | None, revision: str | None, device: str) -> Lines:
    """The row's optimizer steps with tensor_parallel.autotp_size against the same steps on the unsharded model
    (every rank takes those first, before any AutoTP state exists), judged as the cell judged them."""
    from deepspeed.module_inject.layers import set_autotp_mode

    folder = checkpoint_folder(hub_id, revision)
    batches, steps = step_batches(hub_id, device), CELL["steps"]
    unsharded = unsharded_steps(folder, batches[: steps + 1 if CELL["round_trip"] else steps], device)
    Stage.name = "shard"
    set_autotp_mode(training=True)
    trainee = ShardedTrainee(engine_for(folder, device), unsharded, CELL["model"])
    for step in range(steps):
        Stage.name = f"forward (step {step + 1})"
        trainee.step(batches[step], lambda stage, model: None)
    Stage.name = "compare"
    lines = trained_lines(trainee, unsharded, steps)
    if CELL["round_trip"]:
        lines += round_trip_lines(trainee, unsharded, folder, batches[steps], device)
    return lines


def main() -> None:
    args = options()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator: gloo, no GPU needed
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed()
    world_size = torch.distributed.get_world_size()
    device = get_accelerator().device_name(int(os.environ.get("LOCAL_RANK", "0")))
    if rank() == 0:
        print(f"autotp-matrix cell {CELL['id']} (reported: {CELL['verdict']})\n{environment_report()}")
        if CELL["note"]:
            print(f"note: {CELL['note']}")
        if world_size != CELL["tp"]:
            print(f"note: running {world_size} ranks; the cell ran tp {CELL['tp']} ({CELL['command']})")
    revision = args.revision or (CELL["revision"] if args.checkpoint == CELL["hub_id"] else None)
    try:
        lines = (train if CELL["training"] else infer)(args.checkpoint, revision, device)
    except Exception as error:
        print(f"RESULT: RAISED {Stage.name} {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        raise
    ok = all(passed for passed, _ in lines)
    # Every check this script runs passed, but the cell failed on what the script leaves out (CELL["note"]).
    unreproduced = ok and CELL["note"] != "" and CELL.get("cell_failed", False)
    if rank() == 0:
        for passed, line in lines:
            print(f"{'ok  ' if passed else 'FAIL'} {line}")
        print("RESULT:", "NOT REPRODUCED HERE" if unreproduced else "MATCH" if ok else "MISMATCH")
        if unreproduced:
            print(f"the cell failed ({CELL['verdict']}); {CELL['note']}")
    # Tear the process groups down while Python is whole: left to interpreter exit, gloo's worker threads free
    # tensors that need the GIL and abort the process ("terminate called without an active exception", exit -6),
    # which hides the result above (pytorch/pytorch#190489).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.exit(2 if unreproduced else 0 if ok else 1)


if __name__ == "__main__":
    main()

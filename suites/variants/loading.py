"""Loading a cell's model the way users do, per load mode of the variant.

`eager`: `from_pretrained` from a checkpoint folder or hub id (every rank holds the full model).
`meta`: `from_config` under `deepspeed.OnDevice(device="meta")` (no weights anywhere), then
`init_inference(checkpoint=<checkpoints json>)` reads the checkpoint files shard by shard; the
json is DeepSpeed's `{"type": "ds_model", "checkpoints": [files], "version": 1.0}`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from suites.atomic import write_text_atomically

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WEIGHT_SUFFIXES = {"safetensors": ".safetensors", "bin": ".bin"}
_process_sharded = False


class ContaminatedProcessError(RuntimeError):
    pass


def mark_process_sharded() -> None:
    """Called before the first `init_inference` of a process: no unsharded model (a reference, the
    training baseline) may be loaded by it after."""
    global _process_sharded
    _process_sharded = True


def refuse_if_sharded() -> None:
    if _process_sharded:
        raise ContaminatedProcessError("refusing to compute an unsharded reference in a process that ran "
                                       "deepspeed.init_inference: AutoTP state could leak into it")


def dtype_kwargs(dtype: str) -> dict:
    """The dtype keyword of `from_pretrained`/`from_config`. transformers 4.56 renamed `torch_dtype`
    to `dtype` (the config's `__init__` names the field from then on); older releases ignore `dtype`
    without a word and load fp32."""
    import inspect

    from transformers import PretrainedConfig

    name = "dtype" if "dtype" in inspect.signature(PretrainedConfig.__init__).parameters else "torch_dtype"
    return {name: TORCH_DTYPES[dtype]}


def load_model(source: str, dtype: str, trust_remote_code: bool, quantization_config=None, big_model: dict | None = None):
    """`big_model`: accelerate's keywords (`device_map`, `max_memory`, `offload_folder`) for a model
    loaded over devices, host RAM and disk (the reference of a model larger than memory)."""
    from transformers import AutoModelForCausalLM

    extra = {"quantization_config": quantization_config} if quantization_config is not None else {}
    extra.update(big_model or {})
    try:
        model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=trust_remote_code, **dtype_kwargs(dtype), **extra)
    except OSError as error:
        raise OSError(f"could not load checkpoint {source!r}: {error}. If it is a hub id, check HF_HOME and network/"
                      "HF_HUB_OFFLINE; if the cached files are corrupt, delete that model's folder under HF_HOME/hub "
                      "and run again") from error
    return model.eval()


def load_meta_model(source: str, dtype: str, trust_remote_code: bool):
    """The architecture with every parameter on the meta device: no rank materialises weights here."""
    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    # OnDevice patches torch.Tensor.__new__; on torch 2.13 the first import of torch._dynamo (which
    # transformers triggers lazily inside from_config) then fails with "Signature mismatch between
    # OnDevice...new_tensor and tensor_pynew". Importing it first makes a cell's verdict independent
    # of which cell a long-lived rank ran before (a fresh user process does hit it: see README).
    import torch._dynamo  # noqa: F401

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    with deepspeed.OnDevice(dtype=TORCH_DTYPES[dtype], device="meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, **dtype_kwargs(dtype))
    return model.eval()


def checkpoints_json(folder: str | Path, checkpoint_format: str) -> Path:
    """Writes (once) and returns the checkpoints json listing the folder's weight files of that format."""
    folder = Path(folder)
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES[checkpoint_format]))
    if not files:
        raise FileNotFoundError(f"{folder} has no {WEIGHT_SUFFIXES[checkpoint_format]} weight files for the meta loader")
    path = folder / f"ds_checkpoints_{checkpoint_format}.json"
    content = json.dumps({"type": "ds_model", "checkpoints": [str(folder / name) for name in files], "version": 1.0})
    if not path.exists() or path.read_text() != content:
        write_text_atomically(path, content)
    return path


def checkpoint_copy(folder: str | Path, checkpoint_format: str, files: int) -> Path:
    """The checkpoint re-written as `files` weight files of about equal size in `checkpoint_format`
    (a sibling folder, built once); the folder itself when it already is one safetensors file.
    DeepSpeed's meta loader reads each listed file whole, so a rank's peak memory is one file plus
    its shard: real checkpoints come in many files, and this lets a tiny one do the same."""
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    if checkpoint_format == "safetensors" and files == 1:
        return folder
    target = folder.with_name(f"{folder.name}-{checkpoint_format}-{files}files")
    if (target / "config.json").exists():
        return target
    state = {}
    for weights in sorted(folder.glob("*.safetensors")):
        state.update(load_file(weights))
    budget = sum(t.numel() * t.element_size() for t in state.values()) / files
    groups, size = [[]], 0
    for name, tensor in state.items():
        if size >= budget and len(groups) < files:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += tensor.numel() * tensor.element_size()
    staging = folder.with_name(f".{target.name}.tmp{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    for index, names in enumerate(groups):
        part = {name: state[name].contiguous() for name in names}
        stem = f"model-{index + 1:05d}-of-{len(groups):05d}"
        if checkpoint_format == "safetensors":
            save_file(part, staging / f"{stem}.safetensors", metadata={"format": "pt"})
        else:
            torch.save(part, staging / f"{stem}.bin")
    (staging / "config.json").write_text((folder / "config.json").read_text())
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process finished the same copy first
    return target

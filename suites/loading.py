"""Loading a cell's model the way users do, per load mode of the variant.

`eager`: `from_pretrained` from a checkpoint folder or hub id (every rank holds the full model).
`meta`: `from_config` under `deepspeed.OnDevice(device="meta")` (no weights anywhere), then
`init_inference(checkpoint=<checkpoints json>)` reads the checkpoint files shard by shard; the
json is DeepSpeed's `{"type": "ds_model", "checkpoints": [files], "version": 1.0}`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WEIGHT_SUFFIXES = {"safetensors": ".safetensors", "bin": ".bin"}


def dtype_kwargs(dtype: str) -> dict:
    """transformers renamed `torch_dtype` to `dtype` in 4.56; older releases only know the old name."""
    import transformers
    from packaging.version import Version

    name = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {name: TORCH_DTYPES[dtype]}


def load_model(source: str, dtype: str, trust_remote_code: bool, quantization_config=None):
    from transformers import AutoModelForCausalLM

    extra = {"quantization_config": quantization_config} if quantization_config is not None else {}
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
        staging = path.with_name(f".{path.name}.tmp")
        staging.write_text(content)
        staging.replace(path)
    return path


def bin_copy(folder: str | Path) -> Path:
    """A sibling folder holding the same checkpoint as `pytorch_model.bin` (torch.save), built once."""
    from safetensors.torch import load_file

    folder = Path(folder)
    target = folder.with_name(folder.name + "-bin")
    if (target / "pytorch_model.bin").exists():
        return target
    staging = folder.with_name(f".{target.name}.tmp")
    staging.mkdir(parents=True, exist_ok=True)
    state = {}
    for weights in sorted(folder.glob("*.safetensors")):
        state.update(load_file(weights))
    torch.save(state, staging / "pytorch_model.bin")
    (staging / "config.json").write_text((folder / "config.json").read_text())
    try:
        staging.rename(target)
    except OSError:
        pass  # another process finished the same copy first
    return target

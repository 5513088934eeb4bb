"""Loading a cell's model the way users do: `from_pretrained` from a checkpoint folder or hub id."""

from __future__ import annotations

import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_kwargs(dtype: str) -> dict:
    """transformers renamed `torch_dtype` to `dtype` in 4.56; older releases only know the old name."""
    import transformers
    from packaging.version import Version

    name = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {name: TORCH_DTYPES[dtype]}


def load_model(source: str, dtype: str, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=trust_remote_code, **dtype_kwargs(dtype))
    except OSError as error:
        raise OSError(f"could not load checkpoint {source!r}: {error}. If it is a hub id, check HF_HOME and network/"
                      "HF_HUB_OFFLINE; if the cached files are corrupt, delete that model's folder under HF_HOME/hub "
                      "and run again") from error
    return model.eval()

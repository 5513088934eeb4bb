"""Weight-only quantization variants, applied the same way to the unsharded reference (in the
driver) and to the sharded model (on the ranks), so the strict checks compare like with like.

- `deepspeed_int8` / `deepspeed_int4`: DeepSpeed's group-wise post-init quantization
  (`deepspeed.inference.quantization`), asymmetric, groups along the input dimension; on the
  ranks it runs on each rank's shard after `init_inference`.
- `torchao_int8`: HF `TorchAoConfig(Int8WeightOnlyConfig())` at `from_pretrained`, before AutoTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch
import transformers

if TYPE_CHECKING:
    from transformers import TorchAoConfig

Model = TypeVar("Model", bound=torch.nn.Module)

DEEPSPEED_BITS = {"deepspeed_int8": 8, "deepspeed_int4": 4}


class QuantizationUnavailable(RuntimeError):
    """The backend cannot quantize even the unsharded model here, so there is no AutoTP question to ask."""


def hf_quantization_config(quantization: str) -> TorchAoConfig | None:
    """The `quantization_config` for `from_pretrained`, or None when the backend is not HF-side."""
    if quantization != "torchao_int8":
        return None

    try:
        # lazily: torchao is optional (the variants group): without it the torchao cells skip with the reason
        from torchao.quantization import Int8WeightOnlyConfig
    except ImportError as error:
        raise QuantizationUnavailable(
            f"torchao_int8 needs the torchao package ({error}); pip install torchao"
        ) from error
    if not hasattr(transformers, "TorchAoConfig"):  # absent in 4.41, there in 4.46
        raise QuantizationUnavailable(f"transformers {transformers.__version__} has no TorchAoConfig")
    try:
        return transformers.TorchAoConfig(Int8WeightOnlyConfig())
    except (
        ValueError,
        ImportError,
    ) as error:  # 4.46 takes only quant_type names, which torchao 0.18 no longer has (4.52 takes objects)
        raise QuantizationUnavailable(
            f"transformers {transformers.__version__}'s TorchAoConfig takes no torchao config object: {error}"
        ) from error


def deepspeed_config(quantization: str, group_size: int) -> dict[str, Any]:
    """DeepSpeed's ds_config for post-init quantization of every Linear/Embedding (the empty key
    matches every module name)."""
    return {
        "weight_quantization": {
            "post_init_quant": {
                "": {
                    "num_bits": DEEPSPEED_BITS[quantization],
                    "group_size": group_size,
                    "group_dim": 1,
                    "symmetric": False,
                }
            }
        }
    }


def apply_post_init(model: Model, quantization: str, group_size: int) -> Model:
    """DeepSpeed post-init quantization (of the model in place, which it returns); a no-op for the other backends."""
    if quantization not in DEEPSPEED_BITS:
        return model
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    from deepspeed.inference.quantization.quantization import _init_group_wise_weight_quantization

    quantized: Model = _init_group_wise_weight_quantization(model, deepspeed_config(quantization, group_size))
    return quantized

"""A checkpoint's size from its metadata only, before anything loads (suites/reference/memory_plan.py plans with it):
safetensors headers (tensor names, dtypes, shapes), else a `*.index.json`'s total size with config.json's dtype (a hub
snapshot whose weights are not downloaded yet), else the weight files' sizes."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matrix.registry import DType

GiB = 1 << 30
ELEMENT_BYTES = {
    "F64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CONFIG_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
LAYER_NAME = re.compile(r"\.(?:layers|layer|h|blocks|block|decoder_layers)\.(\d+)\.")
"""Where a transformer block's index sits in a parameter name (llama `model.layers.3.`, gpt2 `h.3.`)."""


@dataclass(frozen=True)
class CheckpointSize:
    """What a checkpoint holds, read from its metadata (no weights loaded)."""

    parameters: int
    """Elements of all stored tensors (the model's parameters and persistent buffers)."""
    largest_layer_parameters: int
    """Elements of the largest transformer block (or the embeddings, when they are larger)."""
    largest_file_bytes: int
    """The largest weight file on disk: what DeepSpeed's meta loader holds at once."""
    stored_bytes: int
    """Bytes of the weight files (their own dtype): what a re-split copy of the checkpoint divides."""
    vocab_size: int
    hidden_size: int

    def model_bytes(self, dtype: DType) -> int:
        return self.parameters * DTYPE_BYTES[dtype]

    def layer_bytes(self, dtype: DType) -> int:
        return self.largest_layer_parameters * DTYPE_BYTES[dtype]


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as stream:
        (length,) = struct.unpack("<Q", stream.read(8))
        header: dict[str, Any] = json.loads(stream.read(length))
        return header


def checkpoint_size(folder: str | Path) -> CheckpointSize:
    """The checkpoint's size from safetensors headers, an index json, or `.bin` file sizes."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    text_config = config.get("text_config", config)
    layers = int(text_config.get("num_hidden_layers") or text_config.get("n_layer") or 1)
    common = {
        "vocab_size": int(text_config.get("vocab_size") or 0),
        "hidden_size": int(text_config.get("hidden_size") or text_config.get("n_embd") or 0),
    }
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        per_layer: dict[str, int] = {}
        total = 0
        for path in safetensors:
            for name, info in _safetensors_header(path).items():
                if name == "__metadata__":
                    continue
                elements = 1
                for dim in info["shape"]:
                    elements *= dim
                total += elements
                match = LAYER_NAME.search(name)
                key = match.group(1) if match else name  # a tensor outside the blocks is its own unit
                per_layer[key] = per_layer.get(key, 0) + elements
        sizes = [p.stat().st_size for p in safetensors]
        return CheckpointSize(total, max(per_layer.values()), max(sizes), sum(sizes), **common)
    stored_bytes = CONFIG_DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), 4)
    indexes = sorted(folder.glob("*.safetensors.index.json")) or sorted(folder.glob("*.bin.index.json"))
    weights = sorted(folder.glob("*.bin"))
    if indexes:  # weights not downloaded (yet): the index knows the total, the files' sizes are unknown
        total_bytes = int(json.loads(indexes[0].read_text())["metadata"]["total_size"])
        files = len(set(json.loads(indexes[0].read_text())["weight_map"].values()))
        largest_file = max([p.stat().st_size for p in weights] or [total_bytes // files])
    elif weights:
        total_bytes, largest_file = sum(p.stat().st_size for p in weights), max(p.stat().st_size for p in weights)
    else:
        raise FileNotFoundError(f"{folder}: no safetensors, .bin or index files to size the checkpoint from")
    parameters = total_bytes // stored_bytes
    # Without tensor shapes: the blocks share the parameters evenly, or the embeddings are larger.
    largest_layer = max(parameters // (layers + 1), common["vocab_size"] * common["hidden_size"])
    return CheckpointSize(parameters, largest_layer, largest_file, total_bytes, **common)


def activation_bytes(size: CheckpointSize, dtype: DType) -> int:
    """Working memory of the probes beyond the weights: the longest forward is a perplexity window of 64
    tokens, whose fp32 logits exist ~4 times (logits, upcast, log-softmax, loss), plus hidden states."""
    tokens = 64
    return tokens * size.vocab_size * 4 * 4 + tokens * size.hidden_size * DTYPE_BYTES[dtype] * 64

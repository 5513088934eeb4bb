"""Run by a DeepSpeed layer's own python (stdlib, torch and DeepSpeed only): what DeepSpeed's CPU comm op is
built from (`describe`), and its build under the import name of a prebuilt op (`build`). Prints one JSON
object. sessions/deepspeed_ops.py keys the build by what `describe` prints."""

from __future__ import annotations

import json
import os
import sys

import torch
from deepspeed.git_version_info import accelerator_name
from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder


def builder() -> ShareMemCommBuilder:
    return ShareMemCommBuilder()


def describe() -> dict[str, object]:
    if torch.cuda.is_available():
        return {"skip": "torch sees CUDA: the cells all-reduce with NCCL, not DeepSpeed's CPU comm op"}
    if accelerator_name != "cpu":
        return {"skip": f"DeepSpeed was installed for accelerator {accelerator_name!r}, not cpu"}
    op = builder()
    return {
        "name": op.name,
        "module": op.absolute_name(),
        "torch": torch.__version__,
        "sources": [os.path.abspath(op.deepspeed_src_path(path)) for path in op.strip_empty_entries(op.sources())],
        "include_dirs": [
            os.path.abspath(op.deepspeed_src_path(path)) for path in op.strip_empty_entries(op.include_paths())
        ],
        "flags": [*op.strip_empty_entries(op.cxx_args()), *op.strip_empty_entries(op.extra_ldflags())],
    }


def build() -> dict[str, str]:
    """JIT-builds the op into $TORCH_EXTENSIONS_DIR named after its prebuilt module (`deepspeed_shm_comm_op`),
    the name DeepSpeed imports an installed op by."""
    op = builder()
    op.name = op.absolute_name().rsplit(".", 1)[1]
    module = op.jit_load(verbose=False)
    return {"library": module.__file__}


if __name__ == "__main__":
    print(json.dumps({"describe": describe, "build": build}[sys.argv[1]]()))

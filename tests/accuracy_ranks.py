"""Rank program for tests/test_accuracy.py: shard a checkpoint with AutoTP and run the task probe on
every rank in lockstep, healthy and then with the sharded lm_head's all-reduce skipped (each rank
scores with a partial sum over its slice of the hidden features); rank 0 writes both prediction
lists as JSON.

    python -m deepspeed.launcher.runner --num_gpus 2 tests/accuracy_ranks.py CHECKPOINT TASK OUT
"""

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.module_inject import layers

from suites.inputs import load_tokenizer
from suites.loading import load_model
from suites.task_probe import load_task, predict


def skip_lm_head_allreduce(model) -> None:
    heads = [m for m in model.modules() if type(m).__name__ == "LmHeadLinearAllreduce"]
    assert heads, "no sharded lm_head to break"
    for head in heads:
        def forward(input, original=head.forward):
            real = layers.dist.inference_all_reduce
            layers.dist.inference_all_reduce = lambda tensor, *args, **kwargs: tensor
            try:
                return original(input)
            finally:
                layers.dist.inference_all_reduce = real
        head.forward = forward


def main(checkpoint: str, task_file: str, out: str) -> None:
    deepspeed.init_distributed()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = get_accelerator().device_name(int(os.environ.get("LOCAL_RANK", 0)))
    task, tokenizer = load_task(Path(task_file)), load_tokenizer(None)
    engine = deepspeed.init_inference(load_model(checkpoint, "fp32", False), tensor_parallel={"tp_size": world_size},
                                      dtype=torch.float32, replace_with_kernel_inject=False)
    healthy = predict(engine.module, tokenizer, task, device)
    skip_lm_head_allreduce(engine.module)
    faulty = predict(engine.module, tokenizer, task, device)
    if rank == 0:
        Path(out).write_text(json.dumps({"healthy": healthy, "faulty": faulty}))


if __name__ == "__main__":
    main(*[arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")])  # the launcher appends it

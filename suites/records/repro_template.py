"""Standalone AutoTP repro written by autotp-matrix; attach it to a DeepSpeed issue.

Run it with the launcher line in CELL["command"] (e.g. `deepspeed --num_gpus 3 repro_llama-eager-fp32-tp3.py`).
It needs only torch, deepspeed and transformers. It builds the model (the same seeded tiny random
checkpoint the harness used, or the real hub checkpoint), computes the unsharded logits and greedy
tokens before any sharding, loads the model the way the cell's variant does (eager, or on the meta
device with init_inference reading the checkpoint files), shards with AutoTP, and compares. Exit code 0 = match, 1 = mismatch.
"""

import inspect
import os
import sys

import torch

CELL: dict = {}  # written by autotp-matrix

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PROMPT = (
    "Tensor parallelism splits each large matrix of a model across several devices. Every device keeps "
    "a slice of the weights, computes its share of each product, and the slices are joined again."
)


def dtype_kwargs():
    """transformers 4.56 renamed from_pretrained's `torch_dtype` to `dtype` (the config's __init__ names
    the field from then on); older releases ignore `dtype` without a word and load fp32."""
    from transformers import PretrainedConfig

    name = "dtype" if "dtype" in inspect.signature(PretrainedConfig.__init__).parameters else "torch_dtype"
    return {name: DTYPES[CELL["dtype"]]}


# harness functions, written by autotp-matrix


def checkpoint_folder():
    """The checkpoint's local folder: the harness's seeded tiny checkpoint, written by rank 0 in the cell's
    checkpoint format and about its number of weight files, or the hub checkpoint's snapshot."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if CELL["hub_id"]:
        from huggingface_hub import snapshot_download

        return snapshot_download(CELL["hub_id"], revision=CELL["revision"])  # the commit the cell loaded
    folder = f"repro_checkpoint_{CELL['model']}_{CELL['checkpoint_format']}_{CELL['checkpoint_files']}"
    if int(os.environ.get("RANK", "0")) == 0 and not os.path.exists(os.path.join(folder, "config.json")):
        torch.manual_seed(CELL["seed"])
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(CELL["model_type"], **CELL["tiny"]))
        randomise_constant_parameters(model, CELL["init_seed"], CELL["spread"])  # noqa: F821 (copied in above)
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        model.save_pretrained(
            folder,
            safe_serialization=CELL["checkpoint_format"] == "safetensors",
            max_shard_size=max(1, size // CELL["checkpoint_files"]) if CELL["checkpoint_files"] > 1 else "50GB",
        )
    torch.distributed.barrier()
    return folder


def load_model(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, **dtype_kwargs()).eval()


def meta_model(folder):
    """meta load: the architecture on the meta device (no weights anywhere) and DeepSpeed's checkpoints
    json listing the weight files, which init_inference reads shard by shard."""
    import json

    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    with deepspeed.OnDevice(dtype=DTYPES[CELL["dtype"]], device="meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), **dtype_kwargs()).eval()
    suffix = ".safetensors" if CELL["checkpoint_format"] == "safetensors" else ".bin"
    files = sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(suffix))
    listing = os.path.join(folder, f"ds_checkpoints_{CELL['checkpoint_format']}.json")
    if int(os.environ.get("RANK", "0")) == 0:
        with open(listing, "w") as stream:
            json.dump({"type": "ds_model", "checkpoints": files, "version": 1.0}, stream)
    torch.distributed.barrier()
    options = {"checkpoint": listing}
    if CELL["keep_module_on_host"]:
        options["keep_module_on_host"] = True
    return model, options


def prompt_ids():
    if CELL["hub_id"]:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(CELL["hub_id"])(PROMPT, return_tensors="pt").input_ids[:, :24]
    return torch.tensor([list(PROMPT.encode())[:24]])


@torch.no_grad()
def observe(model, ids, device):
    ids = ids.to(device)
    logits = model(ids).logits.float().cpu()
    tokens = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    return logits, tokens[0, ids.shape[1] :].cpu()


def main():
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = get_accelerator().device_name(int(os.environ.get("LOCAL_RANK", "0")))
    folder = checkpoint_folder()
    model = load_model(folder)
    ids = prompt_ids()
    # The reference comes first: this process has not sharded anything yet, so no AutoTP state can reach it.
    ref_logits, ref_tokens = observe(model.to(device), ids, device)
    options = {}
    if CELL["load"] == "meta":
        del model
        model, options = meta_model(folder)
    engine = deepspeed.init_inference(
        model,
        tensor_parallel={"tp_size": world_size},
        dtype=DTYPES[CELL["dtype"]],
        replace_with_kernel_inject=False,
        **options,
    )
    tp_logits, tp_tokens = observe(engine.module, ids, device)
    max_abs = (tp_logits - ref_logits).abs().max().item()
    allowed = CELL["logits_rel"] * ref_logits.abs().max().item()
    tokens_equal = bool((tp_tokens == ref_tokens).all())
    if rank == 0:
        print(
            f"cell {CELL['id']}: max |logit difference| {max_abs:.3g} (allowed {allowed:.3g}); "
            f"greedy tokens {'equal' if tokens_equal else 'DIFFER'}: reference {ref_tokens.tolist()} "
            f"vs sharded {tp_tokens.tolist()}"
        )
        print("RESULT:", "MATCH" if max_abs <= allowed and tokens_equal else "MISMATCH")
    sys.exit(0 if max_abs <= allowed and tokens_equal else 1)


if __name__ == "__main__":
    main()

"""Loading a cell's model the way users do, per load mode of the variant.

`eager`: `from_pretrained` from a checkpoint folder or hub id (every rank holds the full model).
`meta`: `from_config` under `deepspeed.OnDevice(device="meta")` (no weights anywhere), then
`init_inference(checkpoint=<checkpoints json>)` reads the checkpoint files shard by shard; the
json is DeepSpeed's `{"type": "ds_model", "checkpoints": [files], "version": 1.0}`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from matrix import PROJECT_ROOT, cache_root
from matrix.cells import is_dtype
from matrix.harness_cache import used
from matrix.registry import DType
from suites.base.atomic import write_text_atomically
from suites.verdicts.outcome import exception_signature

if TYPE_CHECKING:
    from suites.base.model_types import CausalLM

TORCH_DTYPES: dict[DType, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
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
        raise ContaminatedProcessError(
            "refusing to compute an unsharded reference in a process that ran "
            "deepspeed.init_inference: AutoTP state could leak into it"
        )


def dtype_kwargs(dtype: DType) -> dict[str, torch.dtype]:
    """The dtype keyword of `from_pretrained`/`from_config`. transformers 4.56 renamed `torch_dtype`
    to `dtype` (the config's `__init__` names the field from then on); older releases ignore `dtype`
    without a word and load fp32."""

    name = "dtype" if "dtype" in inspect.signature(PretrainedConfig.__init__).parameters else "torch_dtype"
    return {name: TORCH_DTYPES[dtype]}


def load_model(
    source: str,
    dtype: DType,
    trust_remote_code: bool,
    quantization_config: object | None = None,
    big_model: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
) -> CausalLM:
    """`big_model`: accelerate's keywords (`device_map`, `max_memory`, `offload_folder`) for a model
    loaded over devices, host RAM and disk (the reference of a model larger than memory); `model_kwargs`: what a
    user passes besides (a remedy's, matrix/cell_arguments.py)."""

    extra: dict[str, Any] = {"quantization_config": quantization_config} if quantization_config is not None else {}
    extra.update(big_model or {})
    extra.update(model_kwargs or {})
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, trust_remote_code=trust_remote_code, **dtype_kwargs(dtype), **extra
        )
    except OSError as error:
        raise OSError(
            f"could not load checkpoint {source!r}: {error}. If it is a hub id, check HF_HOME and network/"
            "HF_HUB_OFFLINE; if the cached files are corrupt, delete that model's folder under HF_HOME/hub "
            "and run again"
        ) from error
    model.eval()  # type: ignore[no-untyped-call]  # transformers leaves eval unannotated; it works in place
    return model


def load_meta_model(
    source: str, dtype: DType, trust_remote_code: bool, model_kwargs: dict[str, Any] | None = None
) -> CausalLM:
    """The architecture with every parameter on the meta device: no rank materialises weights here."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    with deepspeed.OnDevice(dtype=TORCH_DTYPES[dtype], device="meta"):
        # transformers leaves from_config unannotated; it builds what from_pretrained loads.
        model: CausalLM = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, trust_remote_code=trust_remote_code, **dtype_kwargs(dtype), **(model_kwargs or {})
        )
    model.eval()  # type: ignore[no-untyped-call]  # transformers leaves eval unannotated
    return model


FRESH_PROCESS_TIMEOUT_S = 600


def fresh_process_meta_failure(source: str, dtype: DType, trust_remote_code: bool) -> dict[str, str] | None:
    """What a user's fresh process hits building this checkpoint's architecture under
    `deepspeed.OnDevice(device="meta")`, as {"signature", "message"}, or None when it builds.

    Ranks are long-lived and import torch._dynamo before any cell (suites/engine/worker.py), so a cell's verdict
    does not depend on which cell ran before. But on torch 2.13 OnDevice's patched `torch.Tensor.__new__` makes
    the *first* import of torch._dynamo fail ("Signature mismatch between OnDevice...new_tensor and
    tensor_pynew"), and transformers' from_config does that import lazily: a user's script fails where a rank
    would not. This asks a fresh interpreter, once per architecture, dtype and library versions (cached); the
    cell's verdict is then that failure, with what the rank's run found in its message (cell_runner)."""
    # lazily: deepspeed (+506 modules past torch and transformers) loads when a cell runs, not on import
    import deepspeed

    config = (
        json.loads((Path(source) / "config.json").read_text()) if (Path(source) / "config.json").is_file() else source
    )
    key = json.dumps(
        {
            "config": config,
            "dtype": dtype,
            "deepspeed": deepspeed.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "probe": 1,
        },
        sort_keys=True,
    )
    cached = used(cache_root() / "fresh-process" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json")
    if cached.is_file():
        cached_failure: dict[str, str] | None = json.loads(cached.read_text())["failure"]
        return cached_failure
    command = [
        sys.executable,
        "-m",
        "suites.variants.loading",
        source,
        dtype,
        "--trust-remote-code" if trust_remote_code else "",
    ]

    done = subprocess.run(
        [part for part in command if part],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=FRESH_PROCESS_TIMEOUT_S,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"the fresh-process meta probe itself failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    failure: dict[str, str] | None = json.loads(lines[-1])["failure"]
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(cached, json.dumps({"failure": failure}))
    return failure


def _fresh_process_main(argv: list[str]) -> None:
    """Build the model on the meta device as a user's script would, in this fresh interpreter; print the result."""

    source, dtype, trust = argv[0], argv[1], "--trust-remote-code" in argv
    if not is_dtype(dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    failure: dict[str, str] | None
    try:
        load_meta_model(source, dtype, trust)
        failure = None
    except Exception as error:  # the verdict of the probe, printed for the driver
        failure = {
            "signature": exception_signature(error),
            "message": "in a fresh process (as a user's script runs it), building the model under "
            "deepspeed.OnDevice(device='meta') raised:\n" + "".join(traceback.format_exception(error))[-3000:],
        }
    print(json.dumps({"failure": failure}))


def checkpoints_json(folder: str | Path, checkpoint_format: str) -> Path:
    """Writes (once) and returns the checkpoints json listing the folder's weight files of that format."""
    folder = Path(folder)
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES[checkpoint_format]))
    if not files:
        raise FileNotFoundError(
            f"{folder} has no {WEIGHT_SUFFIXES[checkpoint_format]} weight files for the meta loader"
        )
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

    folder = Path(folder)
    if checkpoint_format == "safetensors" and files == 1:
        return folder
    target = folder.with_name(f"{folder.name}-{checkpoint_format}-{files}files")
    if (target / "config.json").exists():
        return target
    state: dict[str, torch.Tensor] = {}
    for weights in sorted(folder.glob("*.safetensors")):
        state.update(load_file(weights))
    budget = sum(t.numel() * t.element_size() for t in state.values()) / files
    groups: list[list[str]] = [[]]
    size = 0
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


if __name__ == "__main__":
    _fresh_process_main(sys.argv[1:])

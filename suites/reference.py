"""The unsharded reference a cell is compared against, computed where AutoTP cannot reach it.

AutoTP leaves state behind in a process (module globals in `tp_shard` in older releases, helpers
patched onto model classes), so a reference computed after any injection can differ from the true
unsharded model. References are therefore computed only in processes that never shard (the pytest
driver), guarded by `mark_process_sharded`, and cached on disk per checkpoint, dtype, probes and
library versions so every rank group and every later run reuses them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from matrix.checkpoints import cache_root
from suites.atomic import write_atomically, write_text_atomically
from suites.inputs import ProbeSpec, build_inputs, load_tokenizer, probe_fingerprint
from suites.loading import load_model
from suites.outcome import exception_signature
from suites.quantization import QuantizationUnavailable, apply_post_init, hf_quantization_config
from suites.probes import Observations, observe
from suites.task_probe import AccuracyTask, answer_correctness

_process_sharded = False
REFERENCE_FORMAT = 4
"""Bump when `Observations` changes, so stale cached references are not read."""


class ContaminatedProcessError(RuntimeError):
    pass


def mark_process_sharded() -> None:
    """Called before the first `init_inference` of a process: no reference may come from it after."""
    global _process_sharded
    _process_sharded = True


def reference_path(checkpoint: str, tokenizer: str | None, dtype: str, spec: ProbeSpec, quantization: str = "",
                   quant_group_size: int = 0) -> Path:
    import deepspeed
    import transformers

    # The quantized reference depends on the quantizer's code too, so its versions join the key.
    quant = {"quantization": quantization, "group_size": quant_group_size, "deepspeed": deepspeed.__version__,
             "torchao": _torchao_version()} if quantization else {}
    identity = json.dumps({"format": REFERENCE_FORMAT, "checkpoint": checkpoint, "tokenizer": tokenizer, "dtype": dtype,
                           "spec": spec.as_dict(), "probes": probe_fingerprint(), "torch": torch.__version__,
                           "transformers": transformers.__version__, **quant}, sort_keys=True)
    return cache_root() / "references" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.pt"


def _torchao_version() -> str:
    try:
        import torchao

        return torchao.__version__
    except ImportError:
        return ""


def refuse_if_sharded() -> None:
    if _process_sharded:
        raise ContaminatedProcessError("refusing to compute an unsharded reference in a process that ran "
                                       "deepspeed.init_inference: AutoTP state could leak into it")


def compute_reference(checkpoint: str, tokenizer: str | None, dtype: str, spec: ProbeSpec,
                      trust_remote_code: bool = False, quantization: str = "", quant_group_size: int = 0) -> Observations:
    """The unsharded model's observations; with `quantization`, of the unsharded model quantized the
    way the variant quantizes the sharded one (QuantizationUnavailable when that fails)."""
    refuse_if_sharded()
    torch.manual_seed(0)
    try:
        model = load_model(checkpoint, dtype, trust_remote_code, hf_quantization_config(quantization))
        model = apply_post_init(model, quantization, quant_group_size)
    except QuantizationUnavailable:
        raise
    except Exception as error:
        if not quantization:
            raise
        raise QuantizationUnavailable(f"{quantization} cannot quantize the unsharded {dtype} model: "
                                      f"{exception_signature(error)}") from error
    return observe(model, build_inputs(load_tokenizer(tokenizer, trust_remote_code), spec), spec, "cpu")


def cached_reference(checkpoint: str, tokenizer: str | None, dtype: str, spec: ProbeSpec,
                     trust_remote_code: bool = False, quantization: str = "", quant_group_size: int = 0) -> Path:
    """Path of the reference observations on disk, computed in this process on a cache miss."""
    path = reference_path(checkpoint, tokenizer, dtype, spec, quantization, quant_group_size)
    if not path.exists():
        observations = compute_reference(checkpoint, tokenizer, dtype, spec, trust_remote_code, quantization, quant_group_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda staging: torch.save(observations.to_dict(), staging))
    return path


def cached_task_reference(checkpoint: str, tokenizer: str | None, dtype: str, task: AccuracyTask,
                          trust_remote_code: bool = False) -> Path:
    """Path of the unsharded model's per-item correctness on an accuracy task (JSON list of bools)."""
    import transformers

    identity = json.dumps({"format": REFERENCE_FORMAT, "checkpoint": checkpoint, "tokenizer": tokenizer, "dtype": dtype,
                           "task": task.fingerprint, "torch": torch.__version__, "transformers": transformers.__version__},
                          sort_keys=True)
    path = cache_root() / "references" / f"task-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json"
    if not path.exists():
        refuse_if_sharded()
        model = load_model(checkpoint, dtype, trust_remote_code)
        correct = answer_correctness(task, model, load_tokenizer(tokenizer, trust_remote_code), "cpu")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(correct))
    return path


def load_reference(path: str | Path) -> Observations:
    return Observations.from_dict(torch.load(path, weights_only=False))

"""The driver's unsharded training steps on disk: one file per (checkpoint, dtype, probes, steps, optimizer), a run's
longest count per optimizer computed once and each shorter row's file written as its first steps."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import transformers

from matrix import cache_root
from matrix.harness_cache import used
from matrix.json_records import write_record
from matrix.registry import DType
from suites.base.atomic import write_atomically
from suites.checks.contracts import UnshardedSteps
from suites.checks.inputs import ProbeSpec, probe_fingerprint
from suites.variants.training import GRADIENT_CLIPPING, OPTIMIZERS, compute_unsharded_steps

TRAINING_FORMAT = 6
"""Bump when the unsharded steps change, so stale cached steps are not read (4: N optimizer steps; 5: bf16/fp16
steps on fp32 master weights, as DeepSpeed's mixed precision; 6: Adam's gradient units per step)."""


def steps_path(
    *, checkpoint: str, tokenizer: str | None, dtype: DType, spec: ProbeSpec, steps: int, optimizer: str
) -> Path:
    identity = json.dumps(
        {
            "format": TRAINING_FORMAT,
            "checkpoint": checkpoint,
            "tokenizer": tokenizer,
            "dtype": dtype,
            "spec": write_record(spec),
            "steps": steps,
            "optimizer": OPTIMIZERS[optimizer],
            "clipping": GRADIENT_CLIPPING,
            "probes": probe_fingerprint(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        sort_keys=True,
    )
    return used(cache_root() / "training" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.pt")


def cached_unsharded_steps(
    *,
    checkpoint: str,
    tokenizer: str | None,
    dtype: DType,
    spec: ProbeSpec,
    trust_remote_code: bool,
    steps: int,
    optimizer: str,
    longest: int = 0,
) -> Path:
    """The file of `steps` unsharded steps. `longest`: the most steps any cell of the run compares with under this
    optimizer (suites/run/driver.py `RunOptions.unsharded_steps`). A run of that length is computed once and every
    shorter one is written as its first steps: the first k steps of a longer run are the k-step run, the same
    operations on the same data from the same seed (tests/suites/variants/test_unsharded_prefix.py: bit for bit), so
    the 1-, 2- and 3-step rows of a model pay for 3 steps, not 6."""

    def path_for(count: int) -> Path:
        return steps_path(
            checkpoint=checkpoint, tokenizer=tokenizer, dtype=dtype, spec=spec, steps=count, optimizer=optimizer
        )

    path = path_for(steps)
    if path.exists():
        return path
    longer = next((path_for(count) for count in range(steps + 1, longest + 1) if path_for(count).exists()), None)
    if longer is not None:
        unsharded: UnshardedSteps = torch.load(longer, weights_only=False)
    else:
        unsharded = compute_unsharded_steps(
            checkpoint=checkpoint,
            tokenizer=tokenizer,
            dtype=dtype,
            spec=spec,
            trust_remote_code=trust_remote_code,
            steps=max(steps, longest),
            optimizer_name=optimizer,
        )
        if longest > steps:
            _save_steps(path_for(longest), unsharded)
    _save_steps(path, first_steps(unsharded, steps))
    return path


def first_steps(unsharded: UnshardedSteps, steps: int) -> UnshardedSteps:
    """The first `steps` steps of a longer run of unsharded steps."""
    return UnshardedSteps(
        losses=unsharded["losses"][:steps],
        grads=unsharded["grads"][:steps],
        weights=unsharded["weights"][: steps + 1],
        adam_gradient_units=unsharded["adam_gradient_units"][:steps],
        bytes_by_name=unsharded["bytes_by_name"],
        kinds=unsharded["kinds"],
        shapes_by_name=unsharded["shapes_by_name"],
        counts=unsharded["counts"],
        lm_head=unsharded["lm_head"],
        lm_head_weight=unsharded["lm_head_weight"],
    )


def _save_steps(path: Path, unsharded: UnshardedSteps) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda staging: torch.save(unsharded, staging))

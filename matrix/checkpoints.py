"""Where a cell's weights come from.

Tiny checkpoints: seeded random weights of the registry's tiny config, written once as a real HF
checkpoint folder (config.json + safetensors) into a persistent cache keyed by transformers version
and config hash, and loaded by every process through `from_pretrained`, exactly like a real one.
A manifest of file sizes and hashes catches a truncated or corrupted cache entry, which is rebuilt.

Real checkpoints: the registry's hub id, loaded through the normal HF cache (`HF_HOME`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from matrix.registry import ModelEntry

MANIFEST = "autotp-manifest.json"
SEED = 1234
INIT = 2
"""How tiny weights are made; part of the cache key. 2: constant parameters (transformers' init leaves
biases at 0 and norm weights at 1) get seeded random values, see randomise_constant_parameters."""
SPREAD = 0.1


def cache_root() -> Path:
    return Path(os.environ.get("AUTOTP_CACHE", Path.home() / ".cache" / "autotp-matrix"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest_problem(folder: Path) -> str | None:
    """None when every file the manifest lists is present with its size and hash."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        return f"manifest unreadable ({error})"
    for name, expected in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["size"]:
            return f"{name} has {path.stat().st_size} bytes, expected {expected['size']} (truncated?)"
        if _sha256(path) != expected["sha256"]:
            return f"{name} does not match its recorded sha256 (corrupted?)"
    return None


def tiny_key(entry: ModelEntry) -> str:
    import transformers

    identity = json.dumps({"model_type": entry.model_type, "tiny": entry.tiny, "seed": SEED, "init": INIT,
                           "transformers": transformers.__version__}, sort_keys=True)
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def tiny_config(entry: ModelEntry):
    from transformers import AutoConfig

    return AutoConfig.for_model(entry.model_type, **entry.tiny)


def randomise_constant_parameters(model, seed: int, spread: float) -> list[str]:
    """Give every parameter that transformers' init leaves constant seeded random values: biases at 0,
    norm weights at 1 (Gemma's at 0, used as 1 + w), layer scales, expert biases. With them constant, a
    bias added on every rank after a row-parallel all-reduce, a column-parallel bias not sliced with its
    weight, or a norm weight sliced or permuted computes exactly the right numbers, and no check can see
    it. Persistent buffers (router score biases) likewise. Values stay near the original (zeros get
    N(0, spread), others c * (1 + N(0, spread))), so the model still computes a sensible function. Returns the names changed. Standalone (its source is copied
    into repro scripts, see suites/repro.py), so its only import is its own."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    changed = []
    with torch.no_grad():
        # What save_pretrained writes: parameters and persistent buffers (e.g. deepseek_v3's zero
        # e_score_correction_bias); a tied parameter comes twice and is no longer constant the second time.
        for name, parameter in model.state_dict(keep_vars=True).items():
            if not parameter.is_floating_point() or parameter.numel() == 0:
                continue
            first = parameter.reshape(-1)[0]
            if not bool((parameter == first).all()):
                continue
            noise = torch.randn(parameter.shape, generator=generator).to(parameter.dtype) * spread
            parameter.copy_(noise if first == 0 else first * (1 + noise))
            changed.append(name)
    return changed


def tiny_checkpoint(entry: ModelEntry, log=print) -> Path:
    """The folder of the entry's tiny checkpoint, built (or rebuilt when corrupt) on first use."""
    folder = cache_root() / "tiny" / f"{entry.name}-{tiny_key(entry)}"
    if folder.exists():
        problem = _manifest_problem(folder)
        if problem is None:
            return folder
        log(f"rebuilding tiny checkpoint {folder}: {problem}")
        shutil.rmtree(folder, ignore_errors=True)
    _write_tiny(entry, folder)
    return folder


def _write_tiny(entry: ModelEntry, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(tiny_config(entry), trust_remote_code=entry.trust_remote_code)
        randomise_constant_parameters(model, SEED + INIT, SPREAD)
        model.save_pretrained(staging, safe_serialization=True)
        files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(staging.iterdir()) if p.is_file()}
        (staging / MANIFEST).write_text(json.dumps({"files": files}, indent=1))
        try:
            staging.rename(folder)
        except OSError:
            # Another process (a parallel worker) finished the same checkpoint first; theirs is identical.
            if _manifest_problem(folder) is not None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)

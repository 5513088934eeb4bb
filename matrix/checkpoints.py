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

    identity = json.dumps({"model_type": entry.model_type, "tiny": entry.tiny, "seed": SEED,
                           "transformers": transformers.__version__}, sort_keys=True)
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def tiny_config(entry: ModelEntry):
    from transformers import AutoConfig

    return AutoConfig.for_model(entry.model_type, **entry.tiny)


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

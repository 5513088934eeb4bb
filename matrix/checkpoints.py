"""Where a cell's weights come from.

Tiny checkpoints: seeded random weights of the registry's tiny config, written once as a real HF
checkpoint folder (config.json + safetensors) into a persistent cache keyed by transformers version
and config hash, and loaded by every process through `from_pretrained`, exactly like a real one.
A manifest of file sizes and hashes catches a truncated or corrupted cache entry, which is rebuilt.

Real checkpoints: the registry's hub id at its pinned revision, fetched into the normal HF cache
(`HF_HOME`) and loaded from that snapshot folder.

Either way a cell records which weights it loaded (`Checkpoint.revision`): the hub commit, or for a
tiny checkpoint the hash of its manifest (the sha256 of every file it holds).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging

from matrix import cache_root
from matrix.harness_cache import used
from matrix.installed import cache_identity
from matrix.prefetch import fetch_snapshot
from matrix.registry import ModelEntry

if TYPE_CHECKING:  # torch and transformers load only where a checkpoint is written
    import torch
    from transformers import PretrainedConfig

    from matrix.prefetch import Downloader

MANIFEST = "autotp-manifest.json"
SEED = 1234
INIT = 2
"""How tiny weights are made; part of the cache key. 2: constant parameters (transformers' init leaves
biases at 0 and norm weights at 1) get seeded random values, see randomise_constant_parameters."""
SPREAD = 0.1


@dataclass(frozen=True)
class Checkpoint:
    """The weights a cell loads: a checkpoint folder on disk and what identifies its content."""

    folder: str
    """What `from_pretrained`, the meta loader and the memory plan read (a hub snapshot folder for hub ids)."""
    tokenizer: str | None
    """Tokenizer source; None: the byte tokenizer of tiny checkpoints."""
    source: str
    """`tiny` or the hub id."""
    revision: str
    """The hub commit sha loaded, or `sha256:<16 hex>` of a tiny checkpoint's manifest."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


FileState = tuple[tuple[str, int, int], ...]
"""(name, size, modification time) of every file of a folder."""

_HASHED: dict[Path, FileState] = {}
"""Tiny checkpoint folders this process hashed (writing them, or checking them against their manifest), with the
state of their files then. Three cells (tp 2, 3, 4) load each checkpoint of a matrix: hashing it once per matrix
finds the faults three times would (~2 GB, ~70 checkpoints), and a file changed since is hashed again."""


def _files_state(folder: Path) -> FileState:
    return tuple(
        sorted((path.name, path.stat().st_size, path.stat().st_mtime_ns) for path in folder.iterdir() if path.is_file())
    )


def _manifest_problem(folder: Path, hashes: bool = True) -> str | None:
    """None when every file the manifest lists is present with its size and (`hashes`) its sha256; the
    hashes are read once per process while no file of the folder changed."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        state = _files_state(folder)
    except (OSError, ValueError) as error:
        return f"manifest unreadable ({error})"
    for name, expected in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["size"]:
            return f"{name} has {path.stat().st_size} bytes, expected {expected['size']} (truncated?)"
    if not hashes or _HASHED.get(folder) == state:
        return None
    for name, expected in manifest["files"].items():
        if _sha256(folder / name) != expected["sha256"]:
            return f"{name} does not match its recorded sha256 (corrupted?)"
    _HASHED[folder] = state
    return None


def tiny_key(entry: ModelEntry) -> str:
    identity = {
        "model_type": entry.model_type,
        "tiny": entry.tiny,
        "seed": SEED,
        "init": INIT,
        **cache_identity("transformers"),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def tiny_config(entry: ModelEntry) -> PretrainedConfig:
    config: PretrainedConfig = AutoConfig.for_model(entry.model_type, **entry.tiny)
    return config


def randomise_constant_parameters(model: "torch.nn.Module", seed: int, spread: float) -> list[str]:
    """Give every parameter that transformers' init leaves constant seeded random values: biases at 0, norm weights at 1
    (Gemma's at 0, used as 1 + w), layer scales, expert biases. With them constant, a bias added on every rank after a
    row-parallel all-reduce, a column-parallel bias not sliced with its weight, or a norm weight sliced or permuted
    computes exactly the right numbers, and no check can see it. Persistent buffers (router score biases) likewise.
    Values stay near the original (zeros get N(0, spread), others c * (1 + N(0, spread))), so the model still computes a
    sensible function. Returns the names changed. Standalone (its source is copied into repro scripts, see
    suites/records/repro.py), so its only import is its own (and its annotation a string)."""
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


def tiny_revision(folder: Path) -> str:
    """Content hash of a tiny checkpoint: its manifest lists the sha256 of every file it holds."""
    return "sha256:" + _sha256(Path(folder) / MANIFEST)[:16]


def folder_checkpoint(folder: str | Path) -> Checkpoint:
    """A checkpoint folder given by path alone (a tool's argument, not a cell's entry), with its identity
    (`checkpoint_identity`) and the byte tokenizer: cells resolve theirs with `resolve_checkpoint`."""
    source, revision = checkpoint_identity(folder)
    return Checkpoint(str(folder), None, source, revision)


def checkpoint_identity(folder: str | Path) -> tuple[str, str]:
    """(source, revision) of a checkpoint folder: `tiny` and its content hash, a hub id and the commit
    of its HF-cache snapshot (`models--org--name/snapshots/<commit>`), or for any other folder its path
    and a hash of its files' names, sizes and modification times."""
    folder = Path(folder)
    if (folder / MANIFEST).is_file():
        return "tiny", tiny_revision(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.removeprefix("models--").replace("--", "/"), folder.name
    stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    return str(folder.resolve()), "files:" + hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]


def resolve_checkpoint(
    entry: ModelEntry, kind: str, download: Downloader | None = None, weights: bool = True
) -> Checkpoint:
    """The checkpoint a cell of `entry` loads: `tiny` (built on first use) or `hub` (`hub_ids[0]` at its
    pinned revision, fetched into the HF cache like `nox -s prefetch` does; `download` stands in for
    huggingface_hub.snapshot_download in tests). `weights=False`: a hub snapshot holds only what the memory
    plan reads (matrix/prefetch.py PLAN_FILES), so a cell the plan skips never downloads its weights; its
    weights come later with `fetch_weights`."""
    if kind == "tiny":
        folder = tiny_checkpoint(entry)
        return Checkpoint(str(folder), None, "tiny", tiny_revision(folder))
    snapshot_path, revision = _hub_snapshot(entry, download, plan_files_only=not weights)
    return Checkpoint(snapshot_path, snapshot_path, entry.hub_ids[0], revision)


def fetch_weights(entry: ModelEntry, checkpoint: Checkpoint, download: Downloader | None = None) -> None:
    """Bring the weights of a checkpoint resolved without them (`resolve_checkpoint(weights=False)`) into its
    folder: a hub snapshot's weight files at the revision already resolved; a tiny checkpoint holds them already."""
    if checkpoint.source == "tiny":
        return
    folder, revision = _hub_snapshot(entry, download, plan_files_only=False)
    if (folder, revision) != (checkpoint.folder, checkpoint.revision):
        raise OSError(
            f"{checkpoint.source}: resolved at {checkpoint.revision} ({checkpoint.folder}), its weights came from "
            f"{revision} ({folder})"
        )


def _hub_snapshot(entry: ModelEntry, download: Downloader | None, plan_files_only: bool) -> tuple[str, str]:
    """(folder, commit) of the entry's first hub id at its pinned revision in the HF cache, fetched as needed."""

    if download is None:
        # lazily: only fetching from the hub needs huggingface_hub (`nox -s prefetch`, `--checkpoints hub`)
        from huggingface_hub import snapshot_download

        download = snapshot_download
    hub_id = entry.hub_ids[0]
    pinned = entry.revisions.get(hub_id)
    snapshot = fetch_snapshot(hub_id, pinned, download, plan_files_only=plan_files_only)
    if snapshot.status == "error":
        raise OSError(
            f"could not fetch {hub_id}" + (f" at revision {pinned}" if pinned else "") + f": {snapshot.message}"
        )
    if pinned and snapshot.revision != pinned:
        raise OSError(f"{hub_id}: asked for revision {pinned}, the HF cache gave {snapshot.revision}")
    return snapshot.path, snapshot.revision


def tiny_folder(entry: ModelEntry) -> Path:
    """Where the entry's tiny checkpoint lives in the cache (written or not)."""
    return used(cache_root() / "tiny" / f"{entry.name}-{tiny_key(entry)}")


def cached_tiny_checkpoint(entry: ModelEntry) -> Path | None:
    """The entry's tiny checkpoint when the cache holds all its files at their sizes, else None (nothing is
    written, nothing hashed: the cell that loads it checks the hashes)."""
    folder = tiny_folder(entry)
    return folder if folder.exists() and _manifest_problem(folder, hashes=False) is None else None


def tiny_checkpoint(entry: ModelEntry, log: Callable[[str], object] = print) -> Path:
    """The folder of the entry's tiny checkpoint, written (or rebuilt when corrupt) when a cell first needs
    it. Written once: parallel drivers (pytest-xdist workers) that need the same one wait for the first."""
    folder = tiny_folder(entry)
    if folder.exists() and _manifest_problem(folder) is None:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if its holder dies
        if folder.exists():
            problem = _manifest_problem(folder)
            if problem is None:
                return folder  # another process wrote it while this one waited
            log(f"rebuilding tiny checkpoint {folder}: {problem}")
            shutil.rmtree(folder, ignore_errors=True)
        _write_tiny(entry, folder)
    return folder


@contextmanager
def _without_progress_bars() -> Iterator[None]:
    """transformers draws a "Writing model shards" bar per save (5.x); a cold matrix writes ~70 checkpoints,
    whose progress the harness reports in one line of its own (see conftest.py)."""

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()  # type: ignore[no-untyped-call]


_WRITING = threading.Lock()
"""Held while a tiny checkpoint's weights are made: their seeded init draws from torch's global random generator, so
two threads writing at once (suites/run/ahead.py's workers, a cell rebuilding a corrupt one) would mix their draws."""


def _write_tiny(entry: ModelEntry, folder: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        with _WRITING:
            torch.manual_seed(SEED)
            model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                tiny_config(entry), trust_remote_code=entry.trust_remote_code
            )
            randomise_constant_parameters(model, SEED + INIT, SPREAD)
        with _without_progress_bars():
            model.save_pretrained(staging, safe_serialization=True)
        files = {
            p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(staging.iterdir()) if p.is_file()
        }
        (staging / MANIFEST).write_text(json.dumps({"files": files}, indent=1))
        staging.rename(folder)
        _HASHED[folder] = _files_state(folder)  # just hashed for its manifest: not read again by this process
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""Download the registry's real checkpoints into the HuggingFace cache once, before a GPU run.

`--checkpoints hub` cells load `hub_ids[0]` of their model through the normal HF cache (HF_HOME), at
the commit `revisions` pins in matrix/models.toml (else the repository's current `main`). Without a
persistent HF_HOME every run downloads every checkpoint again; this step fills the cache up front and
says what it already held (hit), what it had to fetch (miss), how many bytes each and which commit.
The cells fetch through the same `fetch_snapshot`, so a run without this step loads the same files.

    python -m matrix.prefetch [--models llama,qwen2] [--all-hub-ids]      (or: nox -s prefetch -- ...)

huggingface_hub reads HF_HOME, HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE itself; the token is only
ever reported as set or not set, and every message printed here passes through the secret redaction
the results use.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matrix.cells import parse_names
from matrix.redaction import redact
from matrix.registry import RegistryError, load_models, pick

# Files from_pretrained never reads when safetensors weights exist (original/ holds Meta's own
# consolidated.pth copy of llama 3: without this the download doubles).
NEVER_LOADED = ("*.pth", "*.pt", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf", "original/*")
LEGACY_WEIGHTS = "*.bin"  # loaded only when the repository has no safetensors

PLAN_FILES = ("*.json",)
"""What the memory plan sizes a checkpoint from before its weights are fetched: config.json and the weights'
index (`*.safetensors.index.json`, `*.bin.index.json`)."""

Downloader = Callable[..., Any]
"""huggingface_hub.snapshot_download, or a stand-in with its signature (tests)."""


@dataclass(frozen=True)
class PrefetchResult:
    hub_id: str
    status: str  # "hit": everything was cached; "miss": files were downloaded; "error": see message
    files: int = 0
    cached_bytes: int = 0  # already in the cache before this run
    downloaded_bytes: int = 0
    path: str = ""
    message: str = ""
    pinned: str | None = None  # the revision asked for (models.toml `revisions`); None: the current main

    @property
    def revision(self) -> str:
        """The commit the snapshot holds: huggingface_hub names a snapshot folder by its commit sha."""
        return Path(self.path).name if self.path else ""


def hub_ids(models: str = "registry", all_hub_ids: bool = False) -> list[tuple[str, str | None]]:
    """(hub id, pinned revision or None) of the checkpoints `--checkpoints hub` loads (each model's
    first hub id), or of every listed one. Only registry entries have hub ids: `registry` and `all`
    select the same checkpoints, `derived` none (deriving needs transformers, which this session does
    not install)."""
    names = parse_names(models)
    if names == ["derived"]:
        return []
    entries = pick(load_models(), ["all"] if names in (["registry"], ["all"]) else names, "model")
    ids = [
        (hub_id, entry.revisions.get(hub_id))
        for entry in entries
        for hub_id in (entry.hub_ids if all_hub_ids else entry.hub_ids[:1])
    ]
    return list(dict.fromkeys(ids))


def fetch_snapshot(
    hub_id: str, revision: str | None, download: Downloader, plan_files_only: bool = False
) -> PrefetchResult:
    """The snapshot of `hub_id` at `revision` (None: the current main) in the HF cache, downloading
    what it lacks; offline, the cached snapshot of exactly that revision, or an error. `plan_files_only`: only
    PLAN_FILES (the memory plan decides whether the weights are worth fetching)."""
    if plan_files_only:
        try:
            path = download(hub_id, revision=revision, allow_patterns=list(PLAN_FILES))
        except Exception as error:
            return _cached_only(hub_id, revision, download, error)
        return PrefetchResult(hub_id, "hit", path=str(path), pinned=revision, message="plan files only")
    try:
        plan = download(hub_id, revision=revision, ignore_patterns=list(NEVER_LOADED), dry_run=True)
    except Exception as error:  # offline or hub unreachable: the cache alone must hold the snapshot
        return _cached_only(hub_id, revision, download, error)
    ignore = list(NEVER_LOADED)
    if any(info.filename.endswith(".safetensors") for info in plan):
        ignore.append(LEGACY_WEIGHTS)
        plan = [info for info in plan if not fnmatch.fnmatch(info.filename, LEGACY_WEIGHTS)]
    try:
        path = download(hub_id, revision=revision, ignore_patterns=ignore)
    except Exception as error:
        return PrefetchResult(
            hub_id, "error", message=f"download failed: {type(error).__name__}: {error}", pinned=revision
        )
    fetched = [info for info in plan if info.will_download]
    return PrefetchResult(
        hub_id,
        "miss" if fetched else "hit",
        files=len(plan),
        cached_bytes=sum(info.file_size or 0 for info in plan if not info.will_download),
        downloaded_bytes=sum(info.file_size or 0 for info in fetched),
        path=str(path),
        pinned=revision,
    )


def _cached_only(hub_id: str, revision: str | None, download: Downloader, hub_error: Exception) -> PrefetchResult:
    try:
        path = download(hub_id, revision=revision, local_files_only=True)
    except Exception:
        at = f" at revision {revision}" if revision else ""
        return PrefetchResult(
            hub_id,
            "error",
            pinned=revision,
            message=f"not in the cache{at}, and the hub refused or could not be reached: "
            f"{type(hub_error).__name__}: {hub_error}",
        )
    files = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]
    return PrefetchResult(
        hub_id,
        "hit",
        files=len(files),
        cached_bytes=sum(os.path.getsize(f) for f in files),
        path=str(path),
        message="hub unreachable; cached snapshot used as is",
        pinned=revision,
    )


def prefetch(ids: Iterable[tuple[str, str | None]], download: Downloader) -> list[PrefetchResult]:
    return [fetch_snapshot(hub_id, revision, download) for hub_id, revision in ids]


def report(results: list[PrefetchResult]) -> str:
    token = "set (HF_TOKEN)" if os.environ.get("HF_TOKEN") else "not set (gated models will fail)"
    lines = [
        f"HF cache: {_hub_cache()}   token: {token}",
        f"{'status':<6} {'files':>5} {'cached':>10} {'downloaded':>10}  {'revision':<12}  checkpoint",
    ]
    for result in results:
        revision = result.revision[:10] + (" (pinned)" if result.pinned else " (main)") if result.revision else "-"
        lines.append(
            f"{result.status:<6} {result.files:>5} {_size(result.cached_bytes):>10} "
            f"{_size(result.downloaded_bytes):>10}  {revision:<17}  {result.hub_id}"
            + (f"  ({result.message})" if result.message else "")
        )
    counts = {status: sum(r.status == status for r in results) for status in ("hit", "miss", "error")}
    lines.append(
        f"{counts['hit']} hit, {counts['miss']} miss, {counts['error']} error; "
        f"{_size(sum(r.cached_bytes for r in results))} cached, "
        f"{_size(sum(r.downloaded_bytes for r in results))} downloaded"
    )
    return redact("\n".join(lines))


def _hub_cache() -> str:
    # lazily: only fetching from the hub needs huggingface_hub (`nox -s prefetch`, `--checkpoints hub`)
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    exponent = min(3, (count.bit_length() - 1) // 10)  # 1: KiB, 2: MiB, 3: GiB and above
    return f"{count / 1024**exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"


def main(argv: list[str] | None = None, download: Downloader | None = None) -> int:
    parser = argparse.ArgumentParser(description="Download the registry's real checkpoints into the HF cache.")
    parser.add_argument(
        "--models", default="registry", help="comma-separated model names from matrix/models.toml, or 'registry'"
    )
    parser.add_argument(
        "--all-hub-ids",
        action="store_true",
        help="every hub id listed per model, not only the first (the one hub cells load)",
    )
    args = parser.parse_args(argv)
    if download is None:
        # lazily: only fetching from the hub needs huggingface_hub (`nox -s prefetch`, `--checkpoints hub`)
        from huggingface_hub import snapshot_download

        download = snapshot_download
    try:
        ids = hub_ids(args.models, args.all_hub_ids)
    except RegistryError as error:
        parser.error(str(error))
    results = prefetch(ids, download)
    print(report(results))
    return 1 if any(result.status == "error" for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Pinned revisions: `revisions` in models.toml is validated naming file, entry and field; hub cells
load exactly the pinned snapshot and record the commit; add-model pins the commit it read; tiny
checkpoints record their content hash. No hub access: the HF cache is laid out by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT
from matrix.checkpoints import checkpoint_identity, resolve_checkpoint, tiny_checkpoint, tiny_revision
from matrix.registry import ModelEntry, RegistryError, load_models

PINNED = "a" * 40
MAIN = "b" * 40
ENTRY = '[models.x]\nmodel_type = "llama"\ntiny = {}\nhub_ids = ["org/x"]\n'


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            'revisions = { "org/y" = "' + PINNED + '" }',
            r"models.toml: entry \[models.x\] field 'revisions' pins 'org/y', "
            r"which is not in hub_ids \['org/x'\]",
        ),
        (
            'revisions = { "org/x" = "main" }',
            r"models.toml: entry \[models.x\] field 'revisions.\"org/x\"' must be a full commit sha",
        ),
        ('revisions = { "org/x" = "' + PINNED.upper() + '" }', r"must be a full commit sha \(40 lowercase hex digits"),
        ('revisions = ["' + PINNED + '"]', r"entry \[models.x\] field 'revisions' must be a table"),
    ],
)
def test_bad_revisions_name_file_entry_and_field(tmp_path, extra, message):
    path = tmp_path / "models.toml"
    path.write_text(ENTRY + extra + "\n")
    with pytest.raises(RegistryError, match=message):
        load_models(path)


def test_a_pinned_revision_is_read(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(ENTRY + f'revisions = {{ "org/x" = "{PINNED}" }}\n')
    assert load_models(path)["x"].revisions == {"org/x": PINNED}


def hf_cache_snapshot(cache: Path, hub_id: str, revision: str, files: dict[str, str]) -> Path:
    """A snapshot folder as huggingface_hub lays it out (refs/main names the commit main points at)."""
    repo = cache / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


class CacheOnly:
    """huggingface_hub.snapshot_download offline: the cache holds what it holds."""

    def __init__(self, cache: Path):
        self.cache = cache

    def __call__(self, repo_id, *, revision=None, ignore_patterns=(), dry_run=False, local_files_only=False):
        if not local_files_only:
            raise ConnectionError("offline")
        snapshots = self.cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
        folder = snapshots / (revision or (snapshots.parent / "refs" / "main").read_text())
        if not folder.is_dir():
            raise FileNotFoundError(f"{repo_id}@{revision} is not cached")
        return str(folder)


def test_hub_cell_loads_the_pinned_snapshot_not_main(tmp_path):
    for revision in (PINNED, MAIN):
        hf_cache_snapshot(tmp_path, "org/x", revision, {"config.json": json.dumps({"revision": revision})})
    (tmp_path / "models--org--x" / "refs").mkdir()
    (tmp_path / "models--org--x" / "refs" / "main").write_text(MAIN)
    pinned = ModelEntry("x", "llama", {}, hub_ids=("org/x",), revisions={"org/x": PINNED})
    checkpoint = resolve_checkpoint(pinned, "hub", download=CacheOnly(tmp_path))
    assert (checkpoint.source, checkpoint.revision) == ("org/x", PINNED)
    assert json.loads((Path(checkpoint.folder) / "config.json").read_text())["revision"] == PINNED
    assert checkpoint_identity(checkpoint.folder) == ("org/x", PINNED)
    unpinned = resolve_checkpoint(ModelEntry("x", "llama", {}, hub_ids=("org/x",)), "hub", download=CacheOnly(tmp_path))
    assert unpinned.revision == MAIN  # what main pointed at, recorded so the run can be repeated
    missing = ModelEntry("x", "llama", {}, hub_ids=("org/x",), revisions={"org/x": "c" * 40})
    with pytest.raises(OSError, match=f"could not fetch org/x at revision {'c' * 40}"):
        resolve_checkpoint(missing, "hub", download=CacheOnly(tmp_path))


def test_tiny_checkpoint_revision_is_its_content_hash():
    entry = load_models()["llama"]
    folder = tiny_checkpoint(entry)
    assert tiny_revision(folder).startswith("sha256:")
    assert checkpoint_identity(folder) == ("tiny", tiny_revision(folder))
    assert resolve_checkpoint(entry, "tiny").revision == tiny_revision(folder)


def test_add_model_pins_the_commit_it_read_the_config_from(tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "num_hidden_layers": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    }
    hf_cache_snapshot(tmp_path / "hub", "org/llama-x", PINNED, {"config.json": json.dumps(config)})
    (tmp_path / "hub" / "models--org--llama-x" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--llama-x" / "refs" / "main").write_text(PINNED)
    models_file = tmp_path / "models.toml"
    models_file.write_text((PROJECT_ROOT / "matrix" / "models.toml").read_text())
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "sessions.add_model", "org/llama-x", "--no-run", "--models-file", str(models_file)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    entry = load_models(models_file)["llama_x"]
    assert entry.hub_ids == ("org/llama-x",) and entry.revisions == {"org/llama-x": PINNED}

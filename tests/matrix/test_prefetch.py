"""`nox -s prefetch`: hit/miss/bytes report, format choice, offline fallback, token never printed,
pinned revisions fetched exactly.

No hub access here: FakeHub stands in for huggingface_hub.snapshot_download with its signature and
a real on-disk cache laid out like huggingface_hub's (`snapshots/<commit>`), so a second prefetch
really finds what the first one wrote.
"""

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

from matrix import prefetch
from matrix.prefetch import fetch_snapshot, hub_ids, main

TOKEN = "hf_SECRETsecret1234567890"
MAIN = "1" * 40
OLD = "0" * 40


@dataclass
class DryRunInfo:  # the fields of huggingface_hub.file_download.DryRunFileInfo that prefetch reads
    filename: str
    file_size: int
    will_download: bool


class FakeHub:
    def __init__(self, cache: Path, repos: dict[str, dict[str, int]], online: bool = True):
        self.cache, self.repos, self.online = cache, repos, online
        self.downloaded: list[str] = []

    def folder(self, repo_id, revision=None):
        return self.cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / (revision or MAIN)

    def __call__(self, repo_id, *, revision=None, ignore_patterns=(), dry_run=False, local_files_only=False):
        folder = self.folder(repo_id, revision)
        if local_files_only:
            if not folder.is_dir():
                raise FileNotFoundError(f"{repo_id} is not cached")
            return str(folder)
        if not self.online:
            raise ConnectionError(f"hub unreachable (Authorization: Bearer {TOKEN})")
        files = {
            name: size
            for name, size in self.repos[repo_id].items()
            if not any(fnmatch.fnmatch(name, pattern) for pattern in ignore_patterns)
        }
        if dry_run:
            return [DryRunInfo(name, size, not (folder / name).exists()) for name, size in files.items()]
        for name, size in files.items():
            path = folder / name
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"w" * size)
                self.downloaded.append(f"{repo_id}@{revision or 'main'}/{name}")
        return str(folder)


def prefetch_one(hub_id, download, revision=None):
    return fetch_snapshot(hub_id, revision, download)


SAFETENSORS_REPO = {
    "config.json": 100,
    "model.safetensors": 5000,
    "pytorch_model.bin": 5000,
    "original/consolidated.pth": 5000,
    "tokenizer.json": 300,
}
BIN_ONLY_REPO = {"config.json": 100, "pytorch_model.bin": 4000}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "_hub_cache", lambda: str(tmp_path / "hub"))
    return FakeHub(tmp_path / "hub", {"org/llama": SAFETENSORS_REPO, "org/old": BIN_ONLY_REPO})


def test_miss_then_hit_with_bytes(hub):
    first = prefetch_one("org/llama", hub)
    assert (first.status, first.files, first.cached_bytes, first.downloaded_bytes) == ("miss", 3, 0, 5400)
    # safetensors present: neither the .bin copy nor Meta's original/ weights are fetched
    assert sorted(hub.downloaded) == [
        "org/llama@main/config.json",
        "org/llama@main/model.safetensors",
        "org/llama@main/tokenizer.json",
    ]
    assert first.revision == MAIN  # the commit main pointed at, recorded by cells that load it
    second = prefetch_one("org/llama", hub)
    assert (second.status, second.cached_bytes, second.downloaded_bytes) == ("hit", 5400, 0)
    assert len(hub.downloaded) == 3


def test_partial_cache_downloads_only_the_missing_file(hub):
    prefetch_one("org/llama", hub)
    (hub.folder("org/llama") / "model.safetensors").unlink()  # e.g. an interrupted download
    result = prefetch_one("org/llama", hub)
    assert (result.status, result.cached_bytes, result.downloaded_bytes) == ("miss", 400, 5000)


def test_repository_without_safetensors_gets_its_bin_weights(hub):
    result = prefetch_one("org/old", hub)
    assert (result.status, result.downloaded_bytes) == ("miss", 4100)
    assert "org/old@main/pytorch_model.bin" in hub.downloaded


def test_offline_uses_the_cache_or_reports_an_error(hub):
    prefetch_one("org/llama", hub)
    hub.online = False
    cached = prefetch_one("org/llama", hub)
    assert (cached.status, cached.cached_bytes) == ("hit", 5400)
    missing = prefetch_one("org/old", hub)
    assert missing.status == "error"
    assert "not in the cache" in missing.message


def test_report_and_exit_code_never_show_the_token(hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(prefetch, "hub_ids", lambda models, all_hub_ids: [("org/llama", None), ("org/old", OLD)])
    assert main([], download=hub) == 0
    out = capsys.readouterr().out
    assert "token: set (HF_TOKEN)" in out
    assert "0 hit, 2 miss, 0 error; 0 B cached, 9.3 KiB downloaded" in out  # 5400 + 4100 bytes
    assert "1111111111 (main)" in out and "0000000000 (pinned)" in out
    hub.online = False
    hub.repos["org/new"] = {"config.json": 1}
    monkeypatch.setattr(prefetch, "hub_ids", lambda models, all_hub_ids: [("org/llama", None), ("org/new", None)])
    assert main([], download=hub) == 1  # an error is a failed prefetch
    out = capsys.readouterr().out
    assert "1 hit, 0 miss, 1 error" in out
    assert "Bearer ***" in out and TOKEN not in out


def test_pinned_revision_is_fetched_exactly_and_offline_only_that_one_counts(hub):
    prefetch_one("org/llama", hub)  # main is cached, the pinned commit is not
    pinned = prefetch_one("org/llama", hub, revision=OLD)
    assert (pinned.status, pinned.revision, pinned.downloaded_bytes) == ("miss", OLD, 5400)
    assert "org/llama@" + OLD + "/model.safetensors" in hub.downloaded
    hub.online = False
    assert prefetch_one("org/llama", hub, revision=OLD).revision == OLD
    missing = prefetch_one("org/old", hub, revision=OLD)
    assert missing.status == "error" and f"not in the cache at revision {OLD}" in missing.message


def test_hub_ids_are_what_hub_cells_load_unless_all_requested():
    def ids(selection, **options):
        return [hub_id for hub_id, _ in hub_ids(selection, **options)]

    assert ids("llama") == ["meta-llama/Llama-2-7b-hf"]
    assert ids("llama,qwen3", all_hub_ids=True) == [
        "meta-llama/Llama-2-7b-hf",
        "meta-llama/Meta-Llama-3-8B",
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-0.6B",
    ]
    # The workflow passes its --models input here too: every selection keyword must work.
    assert hub_ids("registry") == hub_ids("all") and "meta-llama/Llama-2-7b-hf" in ids("all")
    assert hub_ids("derived") == []


def test_unknown_model_is_a_usage_error(hub, capsys):
    with pytest.raises(SystemExit):
        main(["--models", "lama"], download=hub)
    assert "unknown model 'lama'" in capsys.readouterr().err

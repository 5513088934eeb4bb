"""`nox -s prefetch`: hit/miss/bytes report, format choice, offline fallback, token never printed.

No hub access here: FakeHub stands in for huggingface_hub.snapshot_download with its signature and
a real on-disk cache, so a second prefetch really finds what the first one wrote.
"""

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

from matrix import prefetch
from matrix.prefetch import hub_ids, main, prefetch_one

TOKEN = "hf_SECRETsecret1234567890"


@dataclass
class DryRunInfo:  # the fields of huggingface_hub.file_download.DryRunFileInfo that prefetch reads
    filename: str
    file_size: int
    will_download: bool


class FakeHub:
    def __init__(self, cache: Path, repos: dict[str, dict[str, int]], online: bool = True):
        self.cache, self.repos, self.online = cache, repos, online
        self.downloaded: list[str] = []

    def folder(self, repo_id):
        return self.cache / repo_id.replace("/", "--")

    def __call__(self, repo_id, *, ignore_patterns=(), dry_run=False, local_files_only=False):
        if local_files_only:
            if not self.folder(repo_id).is_dir():
                raise FileNotFoundError(f"{repo_id} is not cached")
            return str(self.folder(repo_id))
        if not self.online:
            raise ConnectionError(f"hub unreachable (Authorization: Bearer {TOKEN})")
        files = {name: size for name, size in self.repos[repo_id].items()
                 if not any(fnmatch.fnmatch(name, pattern) for pattern in ignore_patterns)}
        if dry_run:
            return [DryRunInfo(name, size, not (self.folder(repo_id) / name).exists()) for name, size in files.items()]
        for name, size in files.items():
            path = self.folder(repo_id) / name
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"w" * size)
                self.downloaded.append(f"{repo_id}/{name}")
        return str(self.folder(repo_id))


SAFETENSORS_REPO = {"config.json": 100, "model.safetensors": 5000, "pytorch_model.bin": 5000,
                    "original/consolidated.pth": 5000, "tokenizer.json": 300}
BIN_ONLY_REPO = {"config.json": 100, "pytorch_model.bin": 4000}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "_hub_cache", lambda: str(tmp_path / "hub"))
    return FakeHub(tmp_path / "hub", {"org/llama": SAFETENSORS_REPO, "org/old": BIN_ONLY_REPO})


def test_miss_then_hit_with_bytes(hub):
    first = prefetch_one("org/llama", hub)
    assert (first.status, first.files, first.cached_bytes, first.downloaded_bytes) == ("miss", 3, 0, 5400)
    # safetensors present: neither the .bin copy nor Meta's original/ weights are fetched
    assert sorted(hub.downloaded) == ["org/llama/config.json", "org/llama/model.safetensors", "org/llama/tokenizer.json"]
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
    assert "org/old/pytorch_model.bin" in hub.downloaded


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
    monkeypatch.setattr(prefetch, "hub_ids", lambda models, all_hub_ids: ["org/llama", "org/old"])
    assert main([], download=hub) == 0
    out = capsys.readouterr().out
    assert "token: set (HF_TOKEN)" in out
    assert "0 hit, 2 miss, 0 error; 0 B cached, 9.3 KiB downloaded" in out  # 5400 + 4100 bytes
    hub.online = False
    hub.repos["org/new"] = {"config.json": 1}
    monkeypatch.setattr(prefetch, "hub_ids", lambda models, all_hub_ids: ["org/llama", "org/new"])
    assert main([], download=hub) == 1  # an error is a failed prefetch
    out = capsys.readouterr().out
    assert "1 hit, 0 miss, 1 error" in out
    assert "Bearer ***" in out and TOKEN not in out


def test_hub_ids_are_what_hub_cells_load_unless_all_requested():
    assert hub_ids("llama") == ["meta-llama/Llama-2-7b-hf"]
    assert hub_ids("llama,qwen3", all_hub_ids=True) == [
        "meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B", "Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"]
    # The workflow passes its --models input here too: every selection keyword must work.
    assert hub_ids("registry") == hub_ids("all") and "meta-llama/Llama-2-7b-hf" in hub_ids("all")
    assert hub_ids("derived") == []


def test_unknown_model_is_a_usage_error(hub, capsys):
    with pytest.raises(SystemExit):
        main(["--models", "lama"], download=hub)
    assert "unknown model 'lama'" in capsys.readouterr().err

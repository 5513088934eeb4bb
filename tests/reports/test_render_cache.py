"""The render cache (reports/outputs/render_cache.py, #58 "the run around the cells"): a render served from it writes
the bytes an uncached render writes; changing any input of its key (the harness's source, the installed packages,
the redaction rules, the cell's arguments) writes the scripts again; an entry never holds a secret the uncached
render would redact; a damaged or lost cache costs time only."""

from __future__ import annotations

import json
import os
import shutil
import time
from importlib import metadata
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

import suites.records.repro
from matrix import HARNESS_PACKAGES, PROJECT_ROOT
from matrix.harness_cache import cache_entries, prune
from reports.__main__ import main
from reports.outputs import render_cache
from reports.outputs.render_cache import MANIFEST, SCRIPT, ScriptRequest, entry_folder, script_arguments, source_digest
from reports.store import CellKey, Run, Versions

pytestmark = pytest.mark.usefixtures("no_github")

SECRET = "plainvalue4242xyzw"
"""A credential by name only (no known shape): only the environment's value says it is one."""
FAILURES = [
    fail("llama", "forward", f"RuntimeError: shape mismatch near {SECRET}"),
    fail("bloom", "shard", "AssertionError: heads % tp != 0", tp=3),
]

ALL_SCRIPTS = [  # each failing cell's, and each draft issue's full script
    "autotp-bloom-tp3-full.py",
    "autotp-llama-tp2-full.py",
    "repro_bloom-eager-fp32-tp3.py",
    "repro_llama-eager-fp32-tp2.py",
]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    junit = write_junit(
        tmp_path / "junit" / "night.xml",
        [*FAILURES, Cell("qwen2")],
        run_id="nightly@2026-12-01T00:00:00Z@runner-1",
        started="2026-12-01T00:00:00Z",
        deepspeed="0.19.8",
        transformers=metadata.version("transformers"),  # the scripts are written where the cells' transformers is
        torch="2.13.0+cpu",
    )
    path = tmp_path / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(path)]) == 0
    return path


@pytest.fixture
def scripts_written(monkeypatch) -> list[str]:
    """The scripts the uncached path writes (suites.records.repro.write_repro), by file name."""
    written: list[str] = []
    write = suites.records.repro.write_repro

    def counted(*args, **kwargs):
        script = write(*args, **kwargs)
        written.append(script.name)
        return script

    monkeypatch.setattr(suites.records.repro, "write_repro", counted)
    return written


def render(store: Path, out: Path) -> dict[str, bytes]:
    """Every file render writes into `out`, its moment of rendering masked."""
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    generated_at = json.loads((out / "report.json").read_text())["generated_at"].encode()
    return {
        path.relative_to(out).as_posix(): path.read_bytes().replace(generated_at, b"<generated_at>")
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def cached_bytes(tmp_path: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted((tmp_path / "render-cache").rglob("*")) if path.is_file())


def test_a_render_from_the_cache_writes_the_bytes_an_uncached_render_writes(store, tmp_path, scripts_written):
    uncached = render(store, tmp_path / "first")
    assert sorted(scripts_written) == ALL_SCRIPTS
    assert [name for name in ALL_SCRIPTS if not any(path.endswith(f"/{name}") for path in uncached)] == []
    scripts_written.clear()
    assert render(store, tmp_path / "second") == uncached
    assert scripts_written == []  # every script came from the cache


def test_a_warm_run_of_the_same_cells_reads_the_entries_of_the_previous_run(tmp_path):
    """A new run differs in its session, host and start only: none of them is in a script, so none is in the key."""
    versions = Versions("0.19.8", "5.24.0", "2.13.0+cpu", "3.11.7")
    runs = [
        Run(f"{session}@{started}@{host}", session, host, started, "cpu", "gloo", versions, harness_git="abc123")
        for session, host, started in (("matrix", "vm", "2026-12-01T00:00:00Z"), ("nightly", "runner-2", "2026-12-02"))
    ]
    cell = CellKey("llama", "eager", "fp32", 2)
    first, second = (ScriptRequest.of(cell, run, "forward", "RuntimeError: x") for run in runs)
    assert entry_folder(SCRIPT, script_arguments(first)) == entry_folder(SCRIPT, script_arguments(second))


@pytest.mark.parametrize("change", ["secret", "source", "packages", "verdict", "harness commit"])
def test_changing_an_input_of_the_key_writes_the_scripts_again(change, store, tmp_path, monkeypatch, scripts_written):
    uncached = render(store, tmp_path / "first")
    first = sorted(scripts_written)
    scripts_written.clear()
    if change == "secret":
        monkeypatch.setenv("MY_API_KEY", SECRET)
    elif change == "source":
        monkeypatch.setattr(render_cache, "source_digest", lambda: "another harness")
        render_cache.installed_fingerprint.cache_clear()
    elif change == "packages":
        monkeypatch.setattr(render_cache, "packages_digest", lambda: "other packages")
        render_cache.installed_fingerprint.cache_clear()
    else:
        junit = tmp_path / "junit" / "night.xml"
        edited = "RuntimeError: another mismatch" if change == "verdict" else "def456"
        original = FAILURES[0].signature if change == "verdict" else 'name="run.harness_git" value=""'
        replacement = edited if change == "verdict" else f'name="run.harness_git" value="{edited}"'
        text = junit.read_text()
        assert original in text
        again = junit.with_name("again.xml")
        again.write_text(text.replace(original, replacement).replace("2026-12-01", "2026-12-02"))
        junit.unlink()
        assert main(["merge", str(again), "--store", str(store)]) == 0
    try:
        again_rendered = render(store, tmp_path / "second")
    finally:
        render_cache.installed_fingerprint.cache_clear()
    # every script records the harness's commit; only llama's its verdict
    rewritten = ["autotp-llama-tp2-full.py", "repro_llama-eager-fp32-tp2.py"] if change == "verdict" else ALL_SCRIPTS
    assert first == ALL_SCRIPTS
    assert sorted(scripts_written) == rewritten
    if change in ("source", "packages"):  # nothing else changed: the same bytes, written again
        assert again_rendered == uncached


def test_an_entry_never_holds_a_secret_the_uncached_render_redacts(store, tmp_path, monkeypatch):
    assert SECRET.encode() in render(store, tmp_path / "unknown")["repro/repro_llama-eager-fp32-tp2.py"]
    monkeypatch.setenv("MY_API_KEY", SECRET)  # now the environment says it is a credential
    outputs = render(store, tmp_path / "known")
    assert [name for name, data in outputs.items() if SECRET.encode() in data] == []
    assert b"RuntimeError: shape mismatch near ***" in outputs["repro/repro_llama-eager-fp32-tp2.py"]
    shutil.rmtree(tmp_path / "render-cache")  # the entries written under these rules alone
    assert render(store, tmp_path / "again") == outputs
    assert SECRET.encode() not in cached_bytes(tmp_path)
    assert str(tmp_path).encode() not in cached_bytes(tmp_path)  # nor a folder of this host


@pytest.mark.parametrize("damage", ["truncated", "manifest lost", "cache lost"])
def test_a_damaged_or_lost_cache_costs_time_only(damage, store, tmp_path, scripts_written):
    uncached = render(store, tmp_path / "first")
    entries = sorted((tmp_path / "render-cache").glob(f"*/{MANIFEST}"))
    scripts = [manifest.parent for manifest in entries if any(manifest.parent.glob("repro_llama*.py"))]
    assert len(scripts) == 1
    scripts_written.clear()
    if damage == "truncated":
        script = next(scripts[0].glob("*.py"))
        script.write_bytes(script.read_bytes()[:100])
    elif damage == "manifest lost":
        (scripts[0] / MANIFEST).unlink()
    else:
        shutil.rmtree(tmp_path / "render-cache")
    assert render(store, tmp_path / "second") == uncached
    assert sorted(scripts_written) == (ALL_SCRIPTS if damage == "cache lost" else ["repro_llama-eager-fp32-tp2.py"])


def test_the_source_digest_covers_every_file_of_the_harness(tmp_path):
    for package in HARNESS_PACKAGES:
        shutil.copytree(PROJECT_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    digest = source_digest(tmp_path)
    assert digest == source_digest(PROJECT_ROOT)
    template = tmp_path / "suites" / "records" / "repro_template.py"
    template.write_text(template.read_text() + "\n")
    assert source_digest(tmp_path) != digest
    template.write_text(template.read_text()[:-1])
    (tmp_path / "matrix" / "models_extra.toml").write_text("")  # a new file (a registry of models) too
    assert source_digest(tmp_path) != digest


def test_render_entries_are_evicted_least_recently_used_with_the_rest_of_the_harness_cache(
    store, tmp_path, monkeypatch, scripts_written
):
    root = tmp_path / "cache"
    monkeypatch.setattr(render_cache, "cache_folder", lambda: root / "render")
    uncached = render(store, tmp_path / "first")
    entries = cache_entries(root)
    scripts = sorted(entry.path for entry in entries if any(entry.path.glob("repro_*.py")))
    assert len(scripts) == 2 and all(entry.path.parent == root / "render" for entry in entries)
    evicted_script = next(scripts[0].glob("repro_*.py")).name  # listed before its times are set: a listing reads it
    an_hour_ago = time.time() - 3600
    for entry in entries:  # all written and used before a live run's guard, the first script longest ago
        written = an_hour_ago - (3600 if entry.path == scripts[0] else 0)
        os.utime(entry.path, (written, written))
    evicted = prune(root, limit=sum(entry.size for entry in entries) - 1).evicted
    assert [entry.path for entry in evicted] == [scripts[0]]
    scripts_written.clear()
    assert render(store, tmp_path / "second") == uncached
    assert scripts_written == [evicted_script]

"""The harness cache's bound (matrix/harness_cache.py): least recently used regenerable entries are evicted down to the
limit, entries a live run uses or that were used a moment ago are kept, and nothing that is not regenerable (release
data, results, files the harness does not know) is ever touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT
from matrix.harness_cache import (
    GUARD_SECONDS,
    PRUNE_EVERY_SECONDS,
    CacheLimitError,
    RunPruning,
    cache_entries,
    live_run,
    main,
    parse_size,
    prune,
    used,
)

HOUR = 3600.0


def entry(root: Path, name: str, size: int, used_hours_ago: float) -> Path:
    """A file of `size` bytes at `root/name`, last written and read `used_hours_ago` hours ago."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    when = time.time() - used_hours_ago * HOUR
    os.utime(path, (when, when))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("AUTOTP_CACHE", str(root))
    monkeypatch.delenv("AUTOTP_CACHE_LIMIT", raising=False)
    return root


def test_least_recently_used_entries_go_first_down_to_the_limit_and_nothing_else_is_touched(cache):
    oldest = entry(cache, "tiny/llama-1/model.safetensors", 40_000, 5).parent
    os.utime(oldest, (time.time() - 5 * HOUR, time.time() - 5 * HOUR))
    older = entry(cache, "references/a.pt", 40_000, 4)
    recent = entry(cache, "training/b.pt", 40_000, 2)
    releases = entry(cache, "releases/deepspeed.json", 40_000, 9)  # fetched from PyPI: not regenerable offline
    foreign = entry(cache, "notes/mine.txt", 40_000, 9)  # not the harness's
    staging = entry(cache, "references/.c.pt.tmp123", 40_000, 9)  # a writer's own
    pruned = prune(cache, limit=50_000)
    assert [kept.path for kept in pruned.evicted] == [oldest, older]
    assert not oldest.exists() and not older.exists()
    assert recent.exists() and releases.exists() and foreign.exists() and staging.exists()
    assert pruned.kept <= 50_000
    assert "evicted 2 least recently used entries" in pruned.line()


def test_marking_an_entry_used_moves_it_last_in_the_eviction_order_and_keeps_its_write_time(cache):
    first = entry(cache, "references/first.pt", 40_000, 5)
    second = entry(cache, "references/second.pt", 40_000, 4)
    written = first.stat().st_mtime_ns
    assert used(first) == first
    assert first.stat().st_mtime_ns == written  # sessions/atlas.py reads what was written when
    past_the_guard = time.time() + GUARD_SECONDS + 1
    assert [evicted.path for evicted in prune(cache, limit=50_000, now=past_the_guard).evicted] == [second]
    assert used(cache / "references" / "never-written.pt").name == "never-written.pt"  # nothing to mark yet


def test_entries_used_since_a_live_run_began_survive_until_it_ends(cache):
    before = entry(cache, "tiny/before", 40_000, 3)
    with live_run(cache):
        during = entry(cache, "references/during.pt", 40_000, 0)
        later = time.time() + GUARD_SECONDS + 60  # past the guard: only the live run's lock protects `during`
        pruned = prune(cache, limit=0, now=later)
        assert [evicted.path for evicted in pruned.evicted] == [before]
        assert during.exists()
        assert "used by a live run or in the last 10 minutes stays" in pruned.line()
    assert [evicted.path for evicted in prune(cache, limit=0, now=later).evicted] == [during]


def test_a_run_pruning_while_it_goes_on_evicts_its_own_older_entries_but_not_another_live_runs(cache):
    """train-all writes GBs of unsharded steps a model and uses them for that model's rows only: protected by its own
    lock, a run's working set would fill the disk before the run ends."""
    held = subprocess.Popen(
        [sys.executable, "-c", "from matrix.harness_cache import live_run\nwith live_run():\n    input()"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "AUTOTP_CACHE": str(cache)},
        stdin=subprocess.PIPE,
    )
    try:
        while not list((cache / ".runs").glob("*.lock")):
            time.sleep(0.05)
        time.sleep(0.05)
        with live_run(cache):
            done_model = entry(cache, "training/done-model.pt", 40_000, 0)
            current_model = entry(cache, "training/current-model.pt", 40_000, 0)
            later = time.time() + GUARD_SECONDS + 60
            os.utime(current_model, (later, later))  # the model whose rows run now marked it used
            assert not prune(cache, limit=0, now=later).evicted  # at the end of a run: the other run protects both
            assert not prune(cache, limit=0, now=later, during_own_run=True).evicted  # the other run began first
        held.communicate(b"\n", timeout=30)
        with live_run(cache):
            pruned = prune(cache, limit=0, now=later, during_own_run=True)
            assert [evicted.path for evicted in pruned.evicted] == [done_model]
            assert current_model.exists()
            assert not prune(cache, limit=0, now=later).evicted  # outside its own pruning the run's lock still holds
    finally:
        held.kill()


def test_a_run_prunes_after_a_cell_at_most_once_a_minute_and_says_what_it_evicted(cache, monkeypatch):
    monkeypatch.setenv("AUTOTP_CACHE_LIMIT", "0")
    pruning = RunPruning()
    with live_run(cache):
        old = entry(cache, "references/old.pt", 40_000, 3)
        pruning.after_cell()
        assert not old.exists()
        again = entry(cache, "references/again.pt", 40_000, 3)
        pruning.after_cell()
        assert again.exists()  # within PRUNE_EVERY_SECONDS of the last pruning
        pruning.after_cell(now=time.time() + PRUNE_EVERY_SECONDS)
        assert not again.exists()
    assert pruning.line().endswith("evicted 2 least recently used entries (80.0 KiB) while the run went on")
    assert RunPruning().line() == ""


def test_a_killed_runs_lock_does_not_pin_the_cache(cache):
    """A run killed mid-way leaves its lock file; no process holds its lock, so its entries are evictable."""
    held = subprocess.run(
        [
            sys.executable,
            "-c",
            "from matrix.harness_cache import live_run\nwith live_run():\n    import os; os._exit(9)",
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "AUTOTP_CACHE": str(cache)},
        check=False,
    )
    assert held.returncode == 9 and list((cache / ".runs").glob("*.lock"))
    stale = entry(cache, "tiny/stale", 40_000, 0)
    assert [evicted.path for evicted in prune(cache, limit=0, now=time.time() + GUARD_SECONDS + 1).evicted] == [stale]
    assert not list((cache / ".runs").glob("*.lock"))


def test_an_entry_used_a_moment_ago_is_kept_even_with_no_live_run(cache):
    fresh = entry(cache, "tiny-shapes/x.json", 40_000, 0)
    pruned = prune(cache, limit=0)
    assert not pruned.evicted and fresh.exists()


def test_sizes_parse_and_a_bad_limit_names_the_variable_and_what_to_write(cache, monkeypatch, capsys):
    assert parse_size("10G", "x") == 10 * 2**30
    assert parse_size("500mib", "x") == 500 * 2**20
    assert parse_size("1234", "x") == 1234
    with pytest.raises(CacheLimitError, match=r"AUTOTP_CACHE_LIMIT='lots' is not a size: .*10G"):
        parse_size("lots", "AUTOTP_CACHE_LIMIT")
    entry(cache, "tiny/a", 10, 1)
    monkeypatch.setenv("AUTOTP_CACHE_LIMIT", "-3G")
    assert main([]) == 2
    assert "AUTOTP_CACHE_LIMIT='-3G' is not a size" in capsys.readouterr().err


def test_the_command_shows_each_kind_and_prunes_to_a_given_limit(cache, capsys):
    folder = entry(cache, "tiny/a/model.safetensors", 3 * 2**20, 3).parent
    os.utime(folder, (time.time() - 3 * HOUR, time.time() - 3 * HOUR))
    entry(cache, "references/b.pt", 2**20, 2)
    entry(cache, "releases/deepspeed.json", 100, 1)
    assert main([]) == 0
    shown = capsys.readouterr().out
    assert "limit 10.0 GiB (AUTOTP_CACHE_LIMIT)" in shown
    assert "tiny/" in shown and "references/" in shown and "never evicted: releases" in shown
    assert main(["--prune", "--limit", "2M"]) == 0
    pruned = capsys.readouterr().out
    assert "evicted 1 least recently used entries (3.0 MiB)" in pruned
    assert [e.kind for e in cache_entries(cache)] == ["references"]

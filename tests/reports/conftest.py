"""Fixtures for the reports tests."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

from reports.outputs import render_cache

GITHUB_VARIABLES = ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY", "GITHUB_REPOSITORY")


@pytest.fixture(autouse=True)
def empty_render_cache(monkeypatch, tmp_path):
    """Each test renders with a render cache of its own (reports.outputs.render_cache), empty: what one test
    rendered never stands in for what another's render would write (tests/reports/test_render_cache.py proves
    that a cached output is the uncached one)."""
    monkeypatch.setattr(render_cache, "cache_folder", lambda: tmp_path / "render-cache")


@pytest.fixture
def no_github(monkeypatch):
    """Outside GitHub Actions, whatever runs the tests: no token, no step summary, no repository."""
    for name in GITHUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def session(tmp_path):
    """write a session file under tmp_path/junit with a fresh run id and a later start time each call."""
    counter = itertools.count(1)

    def write(cells: list[Cell], folder: str = "junit", **versions) -> Path:
        n = next(counter)
        run_id = versions.pop("run_id", f"session{n}@2025-01-{n:02d}T00:00:00Z@runner-1")
        started = versions.pop("started", f"2025-01-{n:02d}T00:00:00Z")
        return write_junit(tmp_path / folder / f"session{n}.xml", cells, run_id=run_id, started=started, **versions)

    return write


def _m(value: float) -> dict[str, float]:
    return {"logits_max_abs": value}


@pytest.fixture
def scenario(session, tmp_path) -> Path:
    """Five days of history with known transitions (see test_history.py for the expected report)."""
    session(
        [
            Cell("llama", metrics=_m(1e-6)),
            fail("gpt-neox", "forward"),
            fail("opt", "shard"),
            Cell("bloom"),
            Cell("falcon"),
        ],
        deepspeed="0.9.5",
    )
    session(
        [
            Cell("llama", metrics=_m(2e-6)),
            Cell("gpt-neox"),
            fail("opt", "shard"),
            Cell("bloom"),
            Cell("falcon", "skip"),
        ],
        deepspeed="0.10.0",
    )
    session([fail("bloom", "forward", "RuntimeError: NCCL timeout")], deepspeed="0.10.0", host="runner-2")
    for transformers in ("4.44.0", "4.45.0"):
        # 0.10.1 only at 4.44.0; 0.11.0 at both transformers releases
        for deepspeed in ("0.10.1", "0.11.0") if transformers == "4.44.0" else ("0.11.0",):
            broken_import = fail("qwen2", "setup", "ImportError: cannot import name X")
            qwen = Cell("qwen2") if transformers == "4.44.0" else broken_import
            session(
                [
                    fail("llama", "shard", "AssertionError: heads % tp != 0", metrics=_m(0.5)),
                    Cell("gpt-neox"),
                    fail("opt", "numerics", "logits_max_rel 0.3 > 0.01"),
                    Cell("bloom"),
                    Cell("falcon"),
                    qwen,
                ],
                deepspeed=deepspeed,
                transformers=transformers,
            )
    return tmp_path / "junit"

"""An evicted cache entry is only ever computed again: a run after the harness cache was pruned to nothing writes the
tiny checkpoints and references anew and gives the same verdicts, and a run over its cache limit prunes at its end,
keeping what it has just used. Real runs of the suites on a cache of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT
from matrix.harness_cache import GUARD_SECONDS, cache_entries, prune

pytestmark = pytest.mark.autotp

CELLS = "llama.faithful,gpt2.faithful"
"""One cell that passes and one AutoTP fails (gpt2's Conv1D at tp 2: `shard`), so a verdict of each kind is compared."""


def run_suites(cache: Path, results: Path, limit: str) -> tuple[str, list[tuple[str, str, str, str]]]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--models", CELLS, "--tp", "2", "--results", str(results), "-q"]
        + ["-p", "no:cacheprovider"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "AUTOTP_CACHE": str(cache), "AUTOTP_CACHE_LIMIT": limit},
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout + done.stderr
    records = [json.loads(line) for line in (results / "cells.jsonl").read_text().splitlines()]
    verdicts = [(r["cell"]["id"], r["outcome"], r["failure_class"], r["signature"]) for r in records]
    return output, sorted(verdicts)


def test_a_run_after_the_cache_was_evicted_recomputes_it_and_gives_the_same_verdicts(tmp_path):
    cache = tmp_path / "cache"
    first_output, first = run_suites(cache, tmp_path / "first", "10G")
    assert [outcome for _, outcome, _, _ in first] == ["fail", "pass"], first_output[-3000:]
    assert "evicted" not in first_output  # within its limit: nothing to prune

    pruned = prune(cache, limit=0, now=time.time() + GUARD_SECONDS + 1)  # as if the run were long over
    assert {"tiny", "references"} <= {entry.kind for entry in pruned.evicted}
    assert not cache_entries(cache)

    second_output, second = run_suites(cache, tmp_path / "second", "1")
    assert "the run wrote 2 tiny checkpoints and 2 unsharded references" in second_output, second_output[-3000:]
    assert second == first
    # Over its 1-byte limit, the run prunes at its end but keeps what it has just used.
    assert f"cache {cache}: evicted 0 least recently used entries" in second_output, second_output[-3000:]
    assert "used by a live run or in the last 10 minutes stays" in second_output
    assert {"tiny", "references"} <= {entry.kind for entry in cache_entries(cache)}

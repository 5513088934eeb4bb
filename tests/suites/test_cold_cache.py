"""A run on an empty cache starts its first cell at once: tiny checkpoints and references are written when the first
cell needs a reference (suites/run/ahead.py; not by the plan before the first cell), with no per-save progress bar, and
the end of the run says in one line what was written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from matrix import PROJECT_ROOT

pytestmark = pytest.mark.autotp


def test_a_cold_run_writes_each_checkpoint_and_reference_in_the_cell_that_needs_it(tmp_path):
    cache, results = tmp_path / "cache", tmp_path / "results"
    env = {**os.environ, "AUTOTP_CACHE": str(cache)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "suites",
            "--models",
            "llama.faithful,mistral.faithful",
            "--tp",
            "2",
            "--results",
            str(results),
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    plan, _, after_plan = output.partition(
        "models are planned once their tiny checkpoint is written, the first cell writes them all and computes their "
        "references, one per core, before any ranks run: "
    )
    assert plan.splitlines()[-1].strip() == "2" and after_plan.startswith("llama.faithful, mistral.faithful")
    assert "Writing model shards" not in output
    assert f"cache {cache}: the run wrote 2 tiny checkpoints and 2 unsharded references its cells needed" in output
    records = [json.loads(line) for line in (results / "cells.jsonl").read_text().splitlines()]
    assert [(r["cell"]["id"], r["outcome"]) for r in records] == [
        ("llama.faithful-eager-fp32-tp2", "pass"),
        ("mistral.faithful-eager-fp32-tp2", "pass"),
    ]
    assert all(
        r["checkpoint"]["source"] == "tiny" and r["checkpoint"]["revision"].startswith("sha256:") for r in records
    )

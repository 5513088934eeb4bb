"""Version combinations really built as nox environments, the way CI runs them.

- The oldest combination the axes pick (`min`: DeepSpeed 0.14.4, transformers 4.41.2) and the latest
  (0.19.8, 5.24.0), torch 2.13.0, each get their own `autotp(<id>)` environment and run one cell,
  which must pass: the harness itself works at both ends of every axis, and the versions recorded in
  cells.jsonl are the pinned ones, with no commit as DeepSpeed's (they are releases). Slow: two
  environments (cold ~1-3 min each, reused afterwards in .nox/envs/) and two rank group launches.
- An environment that cannot be installed (unreachable package index) must record every selected
  cell as an `install` failure with pip's own message, in cells.jsonl and JUnit, and the history
  store must import that JUnit. Fast: pip fails at once.

Release data comes from tests/matrix/fixtures (offline; the session names do not depend on the day).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT
from matrix.releases import CACHE_DIR_ENV, MAX_AGE_ENV
from matrix.versions import combinations
from sessions.environments import ENV_ROOT_ENV, env_root

ROOT = PROJECT_ROOT
RELEASE_FIXTURES = ROOT / "tests" / "matrix" / "fixtures"
OFFLINE_ENV = {**os.environ, CACHE_DIR_ENV: str(RELEASE_FIXTURES), MAX_AGE_ENV: "inf"}


def autotp_session(pins: str) -> str:
    overrides = dict(pin.split("=", 1) for pin in pins.split(","))
    (combo,) = combinations("latest", overrides=overrides, cache_dir=RELEASE_FIXTURES)
    return f"autotp({combo.id})"


def run_nox(session: str, pins: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nox", "-s", session, *args],
        cwd=ROOT,
        env={**OFFLINE_ENV, "AUTOTP_PINS": pins, **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )


def records(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "cells.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.autotp
@pytest.mark.parametrize("deepspeed, transformers", [("0.14.4", "4.41.2"), ("0.19.8", "5.24.0")], ids=["min", "latest"])
def test_oldest_and_latest_combination_each_get_an_environment_and_a_true_verdict(tmp_path, deepspeed, transformers):
    pins = f"deepspeed={deepspeed},transformers={transformers}"
    session = autotp_session(pins)
    start = time.perf_counter()
    run = run_nox(session, pins, "--", "--models", "llama.faithful", "--tp", "2", "--results", str(tmp_path))
    print(f"{session}: {time.perf_counter() - start:.1f} s")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (record,) = records(tmp_path)
    assert record["versions"]["deepspeed"] == deepspeed
    assert record["versions"]["transformers"] == transformers
    assert record["versions"]["deepspeed_git"] == "", "a release install must not carry any repository's commit"
    assert record["run"]["session"] == session
    assert record["outcome"] == "pass", record["message"]
    # the session really ran in its combination's environment, not in the one running these tests
    combo_id = session.removeprefix("autotp(").removesuffix(")")
    assert (env_root() / combo_id).is_dir()


UNREACHABLE_INDEX = {
    "PIP_CONFIG_FILE": os.devnull,  # no config file: no local wheel folder, no extra index
    "PIP_FIND_LINKS": "",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # the discard port: connection refused
    "PIP_RETRIES": "0",
}


def test_an_environment_that_cannot_be_installed_records_install_failures(tmp_path):
    pins = "deepspeed=0.19.8,transformers=5.24.0"
    session = autotp_session(pins)
    results = tmp_path / "results"
    run = run_nox(
        session,
        pins,
        "--",
        "--models",
        "llama.faithful,opt",
        "--tp",
        "2,3",
        "--results",
        str(results),
        env={**UNREACHABLE_INDEX, ENV_ROOT_ENV: str(tmp_path / "envs")},
    )
    assert run.returncode != 0
    assert "4 cells recorded as 'install' failures" in run.stderr

    cells = records(results)
    assert sorted(record["cell"]["id"] for record in cells) == [
        "llama.faithful-eager-fp32-tp2",
        "llama.faithful-eager-fp32-tp3",
        "opt.faithful-eager-fp32-tp2",
        "opt.faithful-eager-fp32-tp3",
    ]
    for record in cells:
        assert (record["outcome"], record["failure_class"]) == ("fail", "install")
        assert "No matching distribution found for torch==2.13.0" in record["message"]  # pip's own words
        assert record["versions"]["deepspeed"] == "0.19.8"

    (junit,) = (results / "junit").glob("*.xml")
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    for case in cases:
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert properties["failure_class"] == "install"
        failure = case.find("failure")
        assert failure.get("message").startswith("install: environment could not be installed")
        assert "No matching distribution found" in failure.text

    store = tmp_path / "history.sqlite"
    merge = subprocess.run(
        [sys.executable, "-m", "reports", "merge", str(results / "junit"), "--store", str(store)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert merge.returncode == 0, merge.stderr
    imported = sqlite3.connect(store).execute("select failure_class, count(*) from results group by 1").fetchall()
    assert imported == [("install", 4)]


def test_environment_names_are_built_from_each_axis_short_prefix(monkeypatch):
    """Environment names come from matrix/versions.toml's `short` prefixes (the combination ids' own), not from
    prefixes written again in sessions/environments.py."""
    from pathlib import Path

    from sessions import environments

    pins = {"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0"}
    released = environments.release_environment(pins)
    assert (released.key, released.base.key) == ("ds0.19.8-tf5.24.0-pt2.13.0", "base-ds0.19.8-pt2.13.0")
    monkeypatch.setattr(environments, "short_prefixes", lambda: {"deepspeed": "D", "transformers": "T", "torch": "P"})
    assert environments.release_environment(pins).key == "D0.19.8-T5.24.0-P2.13.0"
    built = [
        environments.commit_environment(Path("/envs"), Path("/clone"), "a" * 40, pins, axis)
        for axis in ("deepspeed", "transformers")
    ]
    assert [(env.key, env.base.key) for env in built] == [
        ("D@aaaaaaaaaaaa-T5.24.0-P2.13.0", "base-D@aaaaaaaaaaaa-P2.13.0"),
        ("D0.19.8-T@aaaaaaaaaaaa-P2.13.0", "base-D0.19.8-P2.13.0"),
    ]


def test_a_new_version_axis_is_installed_by_the_combination_layer_without_editing_the_environments(monkeypatch):
    """Axes as data: an axis beyond DeepSpeed and torch (here a toy `accelerate`) is in the combination layer's name
    and requirements, for releases and for either axis built from a commit."""
    from pathlib import Path

    from sessions import environments

    monkeypatch.setattr(environments, "COMBINATION_AXES", ("transformers", "accelerate"))
    monkeypatch.setattr(
        environments,
        "short_prefixes",
        lambda: {"deepspeed": "ds", "transformers": "tf", "torch": "pt", "accelerate": "acc"},
    )
    pins = {"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0", "accelerate": "1.12.0"}
    release = environments.release_environment(pins)
    assert release.key == "ds0.19.8-tf5.24.0-acc1.12.0-pt2.13.0"
    assert release.installs[0][:2] == ("transformers==5.24.0", "accelerate==1.12.0")  # transformers first (as-of)
    built = {
        axis: environments.commit_environment(Path("/envs"), Path("/clone"), "a" * 40, pins, axis)
        for axis in ("deepspeed", "transformers")
    }
    assert built["deepspeed"].key == "ds@aaaaaaaaaaaa-tf5.24.0-acc1.12.0-pt2.13.0"
    assert built["transformers"].key == "ds0.19.8-tf@aaaaaaaaaaaa-acc1.12.0-pt2.13.0"
    assert all("accelerate==1.12.0" in env.installs[0] for env in built.values())


@pytest.mark.slow
def test_coverage_collected_only_expands_every_architecture_and_records_nothing(tmp_path):
    """`nox -s coverage -- --collect-only` (what the nightly runs at every combination): every causal-LM architecture
    of the installed transformers expands into cells, deepseek_v4 included (issue 47: its config stopped the whole
    session with an INTERNALERROR), and nothing is recorded or merged (no cell ran)."""
    pins = "deepspeed=0.19.8,transformers=5.24.0"
    run = run_nox("coverage", pins, "--", "--collect-only", "-q", "--results", str(tmp_path / "results"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "INTERNALERROR" not in run.stdout + run.stderr
    assert "test_cell[deepseek_v4.faithful-eager-fp32-tp2]" in run.stdout
    collected = int(re.search(r"(\d+) tests collected", run.stdout)[1])
    assert collected > 500, collected  # the registry's 213 cells and the derived architectures'
    assert not (tmp_path / "results").exists()

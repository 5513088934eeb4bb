"""Reading the noxfile installs and fetches nothing: `nox -l` on a new machine, offline, lists every session, and the
version-matrix ones from cached release data only (however old)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from matrix import PROJECT_ROOT
from matrix.releases import CACHE_DIR_ENV, MAX_AGE_ENV
from sessions.environments import ENV_ROOT_ENV

RELEASE_FIXTURES = PROJECT_ROOT / "tests" / "matrix" / "fixtures"


def nox_list(tmp_path: Path, release_cache: Path) -> subprocess.CompletedProcess[str]:
    """`nox -l --json -k ""` (every session, not only the default ones) with an empty environment root, the given
    release cache, every fetch pointed at a closed port."""
    env = {key: value for key, value in os.environ.items() if key not in ("UV", "AUTOTP_PINS")}
    env |= {
        ENV_ROOT_ENV: str(tmp_path / "envs"),
        CACHE_DIR_ENV: str(release_cache),
        MAX_AGE_ENV: "0",  # stale: a reader that refreshed would try the network
        "https_proxy": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9",
        "PIP_NO_INDEX": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json", "-k", ""],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


def sessions_of(listing: subprocess.CompletedProcess[str]) -> set[str]:
    return {entry["session"] for entry in json.loads(listing.stdout[listing.stdout.index("[") :])}


def test_nox_l_on_a_new_machine_offline_lists_the_sessions_and_installs_nothing(tmp_path):
    listing = nox_list(tmp_path, tmp_path / "no-release-data")
    assert listing.returncode == 0, listing.stderr
    assert {"matrix", "tests", "report", "gate", "bisect", "triage", "coverage"} <= sessions_of(listing)
    assert not any(name.startswith("autotp(") for name in sessions_of(listing))
    assert "the version-matrix sessions are not listed: no cached release data for" in listing.stdout
    assert not (tmp_path / "envs").exists()  # no uv, no environment
    assert not (tmp_path / "no-release-data").exists()  # nothing fetched


def test_cached_release_data_of_any_age_lists_the_combinations_without_the_network(tmp_path):
    cache = tmp_path / "releases"
    shutil.copytree(RELEASE_FIXTURES, cache)
    before = {path.name: path.read_bytes() for path in cache.iterdir()}
    listing = nox_list(tmp_path, cache)
    assert listing.returncode == 0, listing.stderr
    assert any(name.startswith("autotp(ds") for name in sessions_of(listing))
    assert "failed" not in listing.stdout + listing.stderr  # no refresh was tried
    assert {path.name: path.read_bytes() for path in cache.iterdir()} == before
    assert not (tmp_path / "envs").exists()

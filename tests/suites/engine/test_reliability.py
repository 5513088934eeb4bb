"""An interrupted run keeps every finished cell, leaves no rank process behind, and resumes where it
stopped. Real pytest drivers and rank groups, killed with real signals."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT

CELLS = ["llama-eager-fp32-tp2", "opt-eager-fp32-tp2", "gpt_neox-eager-fp32-tp2"]

pytestmark = pytest.mark.autotp


@pytest.fixture(autouse=True)
def free_cores(rank_pool):
    rank_pool.close()  # these tests start pytest drivers with rank groups of their own


def start_driver(results: Path, hang_flag: Path) -> subprocess.Popen:
    """Cells llama, opt, gpt_neox; the opt cell hangs while `hang_flag` exists, so the driver is
    stopped after llama finished and before the run could complete."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "suites",
        "--models",
        "llama,opt,gpt_neox",
        "--shapes",
        "stress",
        "--tp",
        "2",
        "--results",
        str(results),
        "--session-name",
        "reliability",
        "-q",
        "-p",
        "no:cacheprovider",
        "--inject-fault",
        "tests.faults:rank1_hangs_on_opt_while_flagged",
    ]
    # A shell runs background jobs with SIGINT ignored and children inherit that: give the driver
    # the default disposition so Ctrl-C reaches it however the test suite itself was started.
    return subprocess.Popen(
        command,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "AUTOTP_TEST_HANG_FLAG": str(hang_flag)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def records(results: Path) -> list[dict]:
    path = results / "cells.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_records(results: Path, count: int, driver: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(records(results)) < count:
        assert driver.poll() is None, driver.stdout.read()
        assert time.monotonic() < deadline, "no cell finished in time"
        time.sleep(0.2)


def rank_processes_of(driver_pid: int) -> str:
    found = subprocess.run(["pgrep", "-af", f"--driver-pid {driver_pid}"], capture_output=True, text=True).stdout
    return found.strip()


def wait_until_no_ranks(driver_pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while rank_processes_of(driver_pid):
        assert time.monotonic() < deadline, f"orphan ranks left behind:\n{rank_processes_of(driver_pid)}"
        time.sleep(0.5)


@pytest.fixture
def hang_flag(tmp_path) -> Path:
    flag = tmp_path / "hang"
    flag.write_text("")
    return flag


@pytest.fixture
def driver_in_the_middle(tmp_path, hang_flag) -> subprocess.Popen:
    """A driver that finished the first cell and hangs on the second until `hang_flag` is removed."""
    driver = start_driver(tmp_path, hang_flag)
    wait_for_records(tmp_path, 1, driver)
    return driver


def test_killed_driver_leaves_no_orphans_and_the_rerun_resumes(tmp_path, hang_flag, driver_in_the_middle):
    driver = driver_in_the_middle
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    wait_until_no_ranks(driver.pid)
    hang_flag.unlink()
    before = records(tmp_path)
    assert [r["cell"]["id"] for r in before] == CELLS[:1]
    assert json.loads((tmp_path / "run-state.json").read_text())["complete"] is False

    rerun = start_driver(tmp_path, hang_flag)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output
    after = records(tmp_path)
    assert after[: len(before)] == before  # nothing finished earlier was lost or rewritten
    assert sorted(r["cell"]["id"] for r in after) == sorted(CELLS)  # each cell exactly once
    assert {r["run"]["id"] for r in after} == {before[0]["run"]["id"]}  # one run, continued
    junit = (tmp_path / "junit" / "reliability.xml").read_text()
    assert all(cell in junit for cell in CELLS)
    assert json.loads((tmp_path / "run-state.json").read_text())["complete"] is True


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_cleanly_keeps_partial_results_and_lists_the_cells_without_one(
    tmp_path, driver_in_the_middle, stop
):
    driver = driver_in_the_middle
    driver.send_signal(stop)
    output, _ = driver.communicate(timeout=60)
    assert driver.returncode == pytest.ExitCode.INTERRUPTED, output
    assert not rank_processes_of(driver.pid), f"{stop.name} left rank processes behind"
    assert records(tmp_path) and records(tmp_path)[0]["outcome"] == "pass"
    assert "2 of 3 cells of this run have no result: opt-eager-fp32-tp2, gpt_neox-eager-fp32-tp2" in output, output
    assert "the same command continues this run" in output

"""README's first command on a new machine, end to end, for harness revisions side by side:

    python benchmarks/fresh_clone.py --scratch DIR --harness base=698f84a --harness new=HEAD [--repeat 2] \\
        [--warm-downloads] [-- <pytest args of the matrix session>]

Each run is a new user's first `nox -s matrix`: a `git clone` of the revision (its own empty `.nox/envs`), an
empty harness cache (AUTOTP_CACHE) but for the PyPI release data copied from this machine's (so every run expands
the same combination, offline or not), and an empty uv download cache of its own (`--warm-downloads`: this
machine's, to leave the index's speed out). Runs alternate between the harnesses, round by round, so they share
the machine's state as nearly as one after the other can. Printed per run: seconds end to end, the environment
phase (nox's start to its pytest command), pytest's own seconds, the cells passed/failed, the load at its end and
its verdicts compared cell by cell (outcome, failure class, signature) with the first harness's first run;
then the means and their ratios against the first harness. Everything is appended to DIR/fresh.jsonl as each run
ends and each run's nox output is kept (DIR/<harness>-<round>/nox.txt; nox-timed.txt has every line's second).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from benchmarks.nightly import layout_environment, pytest_summary  # noqa: E402

RECORDS = "fresh.jsonl"
PYTEST_COMMAND = " -m pytest suites"
"""How nox prints the matrix session's pytest command: the environment phase ends at that line."""


@dataclass(frozen=True)
class FreshRun:
    """One first `nox -s matrix` of one harness revision."""

    harness: str
    revision: str
    round: int
    seconds: float
    environment_seconds: float | None
    """From the nox command's start to its pytest command (layers, comm op, bytecode); None if it never got there."""
    pytest_seconds: float | None
    passed: int
    failed: int
    exit_code: int
    differing_cells: list[str]
    """Cell ids whose (outcome, failure class, signature) differ from the first harness's first run (or that one
    of the two lacks)."""
    load: float
    """1-minute load average when the run ended (2 cores here: above 2, something else competed)."""


def verdicts(results: Path) -> dict[str, list[str]]:
    """cell id: [outcome, failure class, signature] from the run's cells.jsonl files."""
    found = {}
    for cells in sorted(results.rglob("cells.jsonl")):
        for line in cells.read_text().splitlines():
            record = json.loads(line)
            found[record["cell"]["id"]] = [record["outcome"], record["failure_class"], record["signature"]]
    return found


def fresh_run(
    name: str, revision: str, round_number: int, scratch: Path, nox: str, pytest_args: list[str], warm_downloads: bool
) -> tuple[FreshRun, dict[str, list[str]]]:
    folder = scratch / f"{name}-{round_number}"
    shutil.rmtree(folder, ignore_errors=True)
    checkout = folder / "checkout"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(PROJECT_ROOT), str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "checkout", "--quiet", "--detach", revision], check=True)
    env = layout_environment(f"{name}-{round_number}", scratch)
    env["AUTOTP_ENV_ROOT"] = str(checkout / ".nox" / "envs")  # the clone's own, as a new user has it
    if not warm_downloads:
        env["UV_CACHE_DIR"] = str(folder / "uv-cache")
    log, timed_log = folder / "nox.txt", folder / "nox-timed.txt"
    environment_seconds = None
    start = time.perf_counter()
    with (
        log.open("w") as output,
        timed_log.open("w") as timed_output,
        subprocess.Popen(
            [nox, "-s", "matrix", "--", *pytest_args],
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as nox_process,
    ):
        assert nox_process.stdout is not None
        for line in nox_process.stdout:
            second = time.perf_counter() - start
            if environment_seconds is None and PYTEST_COMMAND in line:
                environment_seconds = second
            output.write(line)
            timed_output.write(f"{second:7.1f} {line}")
    seconds = time.perf_counter() - start
    summary = pytest_summary(log)
    found = verdicts(checkout / "results")
    run = FreshRun(
        harness=name,
        revision=subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip(),
        round=round_number,
        seconds=seconds,
        environment_seconds=environment_seconds,
        pytest_seconds=summary.seconds if summary else None,
        passed=summary.counts.get("passed", 0) if summary else 0,
        failed=summary.counts.get("failed", 0) if summary else 0,
        exit_code=nox_process.returncode,
        differing_cells=[],
        load=os.getloadavg()[0],
    )
    return run, found


def describe(run: FreshRun) -> str:
    environment = f"{run.environment_seconds:5.1f}" if run.environment_seconds is not None else "  -  "
    pytest_seconds = f"{run.pytest_seconds:6.1f}" if run.pytest_seconds is not None else "   -  "
    return (
        f"{run.harness:>8} {run.revision:>9} round {run.round}: {run.seconds:6.1f} s end to end "
        f"(environments {environment} s, pytest {pytest_seconds} s), {run.passed} passed {run.failed} failed, "
        f"exit {run.exit_code}, {len(run.differing_cells)} cells differ, load {run.load:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--harness", action="append", required=True, help="name=git revision of this repository")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each runs every harness once")
    parser.add_argument("--warm-downloads", action="store_true", help="use this machine's uv download cache")
    parser.add_argument("--nox", default=shutil.which("nox") or "nox")
    parser.add_argument("pytest_args", nargs="*", help="after --: the matrix session's pytest arguments")
    args = parser.parse_args()
    harnesses = [tuple(entry.split("=", 1)) for entry in args.harness]
    if any(len(entry) != 2 for entry in harnesses):
        parser.error("--harness takes name=revision, e.g. --harness base=698f84a")
    args.scratch.mkdir(parents=True, exist_ok=True)
    first: dict[str, list[str]] | None = None
    runs: list[FreshRun] = []
    for round_number in range(1, args.repeat + 1):
        for name, revision in harnesses:
            run, found = fresh_run(
                name, revision, round_number, args.scratch, args.nox, args.pytest_args, args.warm_downloads
            )
            first = found if first is None else first
            differing = sorted(cell for cell in first.keys() | found.keys() if first.get(cell) != found.get(cell))
            run = FreshRun(**{**asdict(run), "differing_cells": differing})
            runs.append(run)
            with (args.scratch / RECORDS).open("a") as records:
                records.write(json.dumps(asdict(run)) + "\n")
            print(describe(run), flush=True)
    baseline = [run.seconds for run in runs if run.harness == harnesses[0][0]]
    for name, _ in harnesses:
        own = [run.seconds for run in runs if run.harness == name]
        mean = sum(own) / len(own)
        print(
            f"{name}: mean {mean:.1f} s end to end over {len(own)} run(s); "
            f"{harnesses[0][0]}/{name} {sum(baseline) / len(baseline) / mean:.2f}"
        )


if __name__ == "__main__":
    main()

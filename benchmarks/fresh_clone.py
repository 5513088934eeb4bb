"""README's first command on a new machine, end to end, for harness revisions side by side:

    python benchmarks/fresh_clone.py --scratch DIR --harness base=698f84a --harness new=HEAD [--repeat 2] [--warm 1] \\
        [--warm-downloads] [-- <pytest args of the matrix session>]

Each run is a new user's first `nox -s matrix`: a `git clone` of the revision (its own empty `.nox/envs`), an
empty harness cache (AUTOTP_CACHE) but for the PyPI release data copied from this machine's (so every run expands
the same combination, offline or not), and an empty uv download cache of its own (`--warm-downloads`: this
machine's, to leave the index's speed out). Runs alternate between the harnesses, round by round, so they share
the machine's state as nearly as one after the other can. Printed per run: seconds end to end, the environment
phase (nox's start to its pytest command), pytest's own seconds, the cells passed/failed, the load at its end and
its verdicts compared cell by cell (outcome, failure class, signature) with the first harness's first run;
then the means and their ratios against the first harness. `--warm K` runs the same command K more times in each
clone right after its first (environments and harness cache filled: a user's next run). Everything is appended to
DIR/fresh.jsonl as each run ends and each run's nox output is kept (DIR/<harness>-<round>/nox-<fresh|warmK>.txt,
and -timed.txt with every line's second).
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
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from benchmarks.nightly import layout_environment, pytest_summary

RECORDS = "fresh.jsonl"
PYTEST_COMMAND = " -m pytest suites"
"""How nox prints the matrix session's pytest command: the environment phase ends at that line."""


@dataclass(frozen=True)
class MatrixRun:
    """One `nox -s matrix` of one harness revision: its first on a new machine, or one after it in the same clone."""

    harness: str
    revision: str
    round: int
    start: str
    """`fresh` (the clone's first run) or `warm` (again in the same clone: environments and harness cache filled)."""
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
    """cell id: [outcome, failure class, signature] from the run's cells.jsonl files (a later record of a cell wins)."""
    found = {}
    for cells in sorted(results.rglob("cells.jsonl")):
        for line in cells.read_text().splitlines():
            record = json.loads(line)
            found[record["cell"]["id"]] = [record["outcome"], record["failure_class"], record["signature"]]
    return found


def new_machine(
    name: str, revision: str, round_number: int, scratch: Path, warm_downloads: bool
) -> tuple[Path, dict[str, Any]]:
    """A fresh clone of `revision` and the environment variables of a new user's machine: (checkout, env)."""
    folder = scratch / f"{name}-{round_number}"
    shutil.rmtree(folder, ignore_errors=True)
    checkout = folder / "checkout"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(PROJECT_ROOT), str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "checkout", "--quiet", "--detach", revision], check=True)
    env = layout_environment(f"{name}-{round_number}", scratch)
    env["AUTOTP_ENV_ROOT"] = str(checkout / ".nox" / "envs")  # the clone's own, as a new user has it
    if not warm_downloads:
        env["UV_CACHE_DIR"] = str(folder / "uv-cache")
    return checkout, env


def timed_matrix(
    name: str, round_number: int, start: str, checkout: Path, env: dict[str, Any], nox: str, pytest_args: list[str]
) -> tuple[MatrixRun, dict[str, list[str]]]:
    """`nox -s matrix` in the checkout, timed, its output kept beside the checkout (nox-<start>.txt, and
    nox-<start>-timed.txt with every line's second)."""
    log, timed_log = checkout.parent / f"nox-{start}.txt", checkout.parent / f"nox-{start}-timed.txt"
    environment_seconds = None
    began = time.perf_counter()
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
            second = time.perf_counter() - began
            if environment_seconds is None and PYTEST_COMMAND in line:
                environment_seconds = second
            output.write(line)
            timed_output.write(f"{second:7.1f} {line}")
    seconds = time.perf_counter() - began
    summary = pytest_summary(log)
    run = MatrixRun(
        harness=name,
        revision=subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip(),
        round=round_number,
        start=start,
        seconds=seconds,
        environment_seconds=environment_seconds,
        pytest_seconds=summary.seconds if summary else None,
        passed=summary.counts.get("passed", 0) if summary else 0,
        failed=summary.counts.get("failed", 0) if summary else 0,
        exit_code=nox_process.returncode,
        differing_cells=[],
        load=os.getloadavg()[0],
    )
    return run, verdicts(checkout / "results")


def describe(run: MatrixRun) -> str:
    environment = f"{run.environment_seconds:5.1f}" if run.environment_seconds is not None else "  -  "
    pytest_seconds = f"{run.pytest_seconds:6.1f}" if run.pytest_seconds is not None else "   -  "
    return (
        f"{run.harness:>8} {run.revision:>9} round {run.round} {run.start:5}: {run.seconds:6.1f} s end to end "
        f"(environments {environment} s, pytest {pytest_seconds} s), {run.passed} passed {run.failed} failed, "
        f"exit {run.exit_code}, {len(run.differing_cells)} cells differ, load {run.load:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--harness", action="append", required=True, help="name=git revision of this repository")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each runs every harness once")
    parser.add_argument("--warm", type=int, default=0, help="runs again in the same clone after each fresh one")
    parser.add_argument("--warm-downloads", action="store_true", help="use this machine's uv download cache")
    parser.add_argument("--nox", default=shutil.which("nox") or "nox")
    parser.add_argument("pytest_args", nargs="*", help="after --: the matrix session's pytest arguments")
    args = parser.parse_args()
    harnesses = [tuple(entry.split("=", 1)) for entry in args.harness]
    if any(len(entry) != 2 for entry in harnesses):
        parser.error("--harness takes name=revision, e.g. --harness base=698f84a")
    args.scratch.mkdir(parents=True, exist_ok=True)
    first: dict[str, list[str]] | None = None
    runs: list[MatrixRun] = []
    for round_number in range(1, args.repeat + 1):
        for name, revision in harnesses:
            checkout, env = new_machine(name, revision, round_number, args.scratch, args.warm_downloads)
            for start in ["fresh"] + [f"warm{again}" for again in range(1, args.warm + 1)]:
                run, found = timed_matrix(name, round_number, start, checkout, env, args.nox, args.pytest_args)
                first = found if first is None else first
                differing = sorted(cell for cell in first.keys() | found.keys() if first.get(cell) != found.get(cell))
                run = MatrixRun(**{**asdict(run), "differing_cells": differing})
                runs.append(run)
                with (args.scratch / RECORDS).open("a") as records:
                    records.write(json.dumps(asdict(run)) + "\n")
                print(describe(run), flush=True)
    for start in ("fresh", "warm"):
        means = {}
        for name, _ in harnesses:
            own = [run for run in runs if run.harness == name and run.start.startswith(start)]
            if own:
                pytest_runs = [run.pytest_seconds for run in own if run.pytest_seconds is not None]
                means[name] = sum(run.seconds for run in own) / len(own)
                print(
                    f"{name} {start}: mean {means[name]:.1f} s end to end over {len(own)} run(s)"
                    + (f", pytest {sum(pytest_runs) / len(pytest_runs):.1f} s" if pytest_runs else "")
                    + (
                        f"; {harnesses[0][0]}/{name} {means[harnesses[0][0]] / means[name]:.2f}"
                        if harnesses[0][0] in means
                        else ""
                    )
                )


if __name__ == "__main__":
    main()

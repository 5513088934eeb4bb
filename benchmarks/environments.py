"""How long a version combination's environment costs: cold creation, warm reuse, and the time from
starting `nox -s matrix` to the first cell result.

    python benchmarks/environments.py [--pins deepspeed=0.19.7,transformers=5.24.0] [--models llama --tp 2]

Cold: a fresh --envdir (virtualenv + torch from its wheel + the pins; pip's own download cache
stays warm, as on a CI runner with a cached pip folder). Warm: the same session again, reusing the
environment (nox reuse_venv=yes; pip finds every pin installed). Target: warm reuse <= 15 s.
Runs one rank group at a time: nice it on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from matrix.versions import combinations  # noqa: E402  (needs the project root on sys.path)

WARM_TARGET_S = 15.0


def nox(envdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "nox", "--envdir", str(envdir), *args]


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=PROJECT_ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def time_to_first_cell(command: list[str], env: dict[str, str], cells: Path) -> tuple[float, float]:
    """(seconds until cells.jsonl has its first record, seconds until the session ended)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL)
    first = None
    while process.poll() is None:
        if first is None and cells.exists() and cells.read_text().strip():
            first = time.perf_counter() - start
        time.sleep(0.2)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit code {process.returncode}")
    total = time.perf_counter() - start
    return (first if first is not None else total), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pins", default="deepspeed=0.19.7,transformers=5.24.0",
                        help="AUTOTP_PINS of the combination to build (default: one not in the dev venv)")
    parser.add_argument("--models", default="llama")
    parser.add_argument("--tp", default="2")
    args = parser.parse_args()

    overrides = dict(pin.split("=", 1) for pin in args.pins.split(","))
    (combo,) = combinations("latest", overrides=overrides)
    session = f"autotp({combo.id})"
    env = {**os.environ, "AUTOTP_PINS": args.pins}
    # Removed only after the table is printed: deleting two environments takes minutes on a busy machine.
    scratch = tempfile.mkdtemp(prefix="autotp-bench-")
    envdir, results = Path(scratch) / "envs", Path(scratch) / "results"
    cold = timed(nox(envdir, "-s", session, "--install-only"), env)
    warm = timed(nox(envdir, "-s", session, "--install-only"), env)
    first, total = time_to_first_cell(
        nox(envdir, "-s", "matrix", "--", "--models", args.models, "--tp", args.tp,
            "--results", str(results)),
        env, results / "cells.jsonl")
    # `nox -s matrix` is a session of its own, so its first start above built its environment cold too;
    # the second start is what a developer re-running the matrix waits for.
    results_again = Path(scratch) / "results-again"
    first_warm, total_warm = time_to_first_cell(
        nox(envdir, "-s", "matrix", "--", "--models", args.models, "--tp", args.tp,
            "--results", str(results_again)),
        env, results_again / "cells.jsonl")

    print(f"combination {combo.id} ({args.pins}); cells: --models {args.models} --tp {args.tp}")
    rows = [
        ("environment, cold (new envdir)", cold, None),
        ("environment, warm (reused)", warm, WARM_TARGET_S),
        ("nox -s matrix -> first cell (cold env)", first, None),
        ("nox -s matrix, whole session (cold env)", total, None),
        ("nox -s matrix -> first cell (warm env)", first_warm, None),
        ("nox -s matrix, whole session (warm env)", total_warm, None),
    ]
    print(f"{'measurement':<44} {'seconds':>8}  target")
    for name, seconds, target in rows:
        verdict = "" if target is None else f"<= {target:.0f} s: {'ok' if seconds <= target else 'MISSED'}"
        print(f"{name:<44} {seconds:>8.1f}  {verdict}", flush=True)
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()

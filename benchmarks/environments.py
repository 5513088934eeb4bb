"""How long a version combination's environment costs: cold creation, warm reuse, the time from
starting `nox -s matrix` to the first cell result, and a second combination over the same DeepSpeed base.

    python benchmarks/environments.py [--pins deepspeed=0.19.7,transformers=5.24.0] [--sibling-transformers 5.23.0]

Cold: a fresh environment root (AUTOTP_ENV_ROOT: venvs + torch from its wheel + the pins; pip's own
download cache stays warm, as on a CI runner with a cached pip folder). Warm: the same session again
(the ready marker matches: nothing is installed). The first `nox -s matrix` in a new base pays DeepSpeed's
comm-op JIT build; the sibling combination (other transformers, same DeepSpeed and torch) shares the base,
its install and that build (sessions/environments.py). Target: warm reuse <= 15 s.
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

from sessions.environments import ENV_ROOT_ENV  # noqa: E402  (needs the project root on sys.path)
from matrix.versions import combinations, parse_pins  # noqa: E402

WARM_TARGET_S = 15.0


def nox(*args: str) -> list[str]:
    return [sys.executable, "-m", "nox", *args]


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
    parser.add_argument("--sibling-transformers", default="5.23.0",
                        help="transformers of a second combination over the same DeepSpeed and torch")
    parser.add_argument("--models", default="llama")
    parser.add_argument("--tp", default="2")
    args = parser.parse_args()

    overrides = parse_pins([args.pins], "--pins")
    sibling_overrides = {**overrides, "transformers": args.sibling_transformers}
    sibling_pins = ",".join(f"{axis}={value}" for axis, value in sibling_overrides.items())
    (combo,) = combinations("latest", overrides=overrides)
    (sibling,) = combinations("latest", overrides=sibling_overrides)
    # Removed only after the table is printed: deleting environments takes minutes on a busy machine.
    scratch = Path(tempfile.mkdtemp(prefix="autotp-bench-"))
    env = {**os.environ, "AUTOTP_PINS": args.pins, ENV_ROOT_ENV: str(scratch / "envs")}
    cells = ["--models", args.models, "--tp", args.tp]
    cold = timed(nox("-s", f"autotp({combo.id})", "--install-only"), env)
    warm = timed(nox("-s", f"autotp({combo.id})", "--install-only"), env)
    first, total = time_to_first_cell(nox("-s", "matrix", "--", *cells, "--results", str(scratch / "r1")),
                                      env, scratch / "r1" / "cells.jsonl")
    first_warm, total_warm = time_to_first_cell(nox("-s", "matrix", "--", *cells, "--results", str(scratch / "r2")),
                                                env, scratch / "r2" / "cells.jsonl")
    sibling_env = {**env, "AUTOTP_PINS": sibling_pins}
    sibling_cold = timed(nox("-s", f"autotp({sibling.id})", "--install-only"), sibling_env)
    sibling_first, sibling_total = time_to_first_cell(
        nox("-s", f"autotp({sibling.id})", "--", *cells, "--results", str(scratch / "r3")),
        sibling_env, scratch / "r3" / "cells.jsonl")

    print(f"combination {combo.id}, sibling {sibling.id}; cells: --models {args.models} --tp {args.tp}")
    rows = [
        ("environment, cold (new root)", cold, None),
        ("environment, warm (reused)", warm, WARM_TARGET_S),
        ("nox -s matrix -> first cell (new base: JIT build)", first, None),
        ("nox -s matrix, whole session (new base)", total, None),
        ("nox -s matrix -> first cell (warm)", first_warm, None),
        ("nox -s matrix, whole session (warm)", total_warm, None),
        ("sibling environment, cold (base reused)", sibling_cold, None),
        ("sibling -> first cell (JIT build reused)", sibling_first, None),
        ("sibling, whole session", sibling_total, None),
    ]
    print(f"{'measurement':<50} {'seconds':>8}  target")
    for name, seconds, target in rows:
        verdict = "" if target is None else f"<= {target:.0f} s: {'ok' if seconds <= target else 'MISSED'}"
        print(f"{name:<50} {seconds:>8.1f}  {verdict}", flush=True)
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()

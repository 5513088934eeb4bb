"""What a new version combination costs before its first cell, in the layered uv environments of this
checkout against the previous pip layout (a git worktree of --old-ref), measured side by side in one run:

    python benchmarks/environments.py [--old-ref e684cfc] [--models llama --tp 2]

For each layout, in a fresh environment root and harness cache of its own (AUTOTP_ENV_ROOT, AUTOTP_CACHE; uv's
and pip's download caches stay warm, as on a CI runner with cached folders):

1. from nothing: `nox -s autotp(<deepspeed, transformers, torch>)` (old: torch + DeepSpeed in one base and
   the comm op JIT-built at the first cell; new: a torch layer, a DeepSpeed layer with its op, a combination);
2. a new transformers release over that DeepSpeed (target: <= 8 s to the first cell);
3. a new DeepSpeed release over the same torch (target: <= 25 s for its environment, op included, when its
   op's sources hash like the first one's).

Each step is timed as its environment (`--install-only`), then with the session to its first cell record. Runs
one rank group at a time: nice it on a shared machine.
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
from matrix.versions import combinations  # noqa: E402

OLD_LAYOUT_REF = "e684cfc"
"""The last commit before layered uv environments (#29): one pip-built base per DeepSpeed with torch in it."""
TARGETS = {"new transformers over an existing DeepSpeed: environment + session to first cell": 8.0,
           "new DeepSpeed over an existing torch: environment": 25.0}


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"{' '.join(command)} in {cwd} failed:\n{completed.stderr[-3000:]}")
    return time.perf_counter() - start


def time_to_first_cell(command: list[str], cwd: Path, env: dict[str, str], cells: Path) -> float:
    """Seconds until cells.jsonl has its first record (the session is left to finish, untimed)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while process.poll() is None:
        if first is None and cells.exists() and cells.read_text().strip():
            first = time.perf_counter() - start
        time.sleep(0.2)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} in {cwd} failed with exit code {process.returncode}")
    return first if first is not None else time.perf_counter() - start


def measure(checkout: Path, scratch: Path, steps: list[tuple[str, str]], cells: list[str]) -> dict[str, tuple[float, float]]:
    """{step: (environment seconds, session seconds to its first cell)} for `steps` (name, AUTOTP_PINS) in order,
    all in one fresh environment root."""
    found = {}
    for n, (name, pins) in enumerate(steps):
        (combo,) = combinations("latest", overrides=dict(pin.split("=") for pin in pins.split(",")))
        # A harness cache per layout: each pays the same tiny checkpoints and references (shared, the layout
        # measured second would find the first one's and look faster).
        env = {**os.environ, "AUTOTP_PINS": pins, ENV_ROOT_ENV: str(scratch / "envs"), "AUTOTP_CACHE": str(scratch / "cache")}
        nox = [sys.executable, "-m", "nox", "-s", f"autotp({combo.id})"]
        install = timed([*nox, "--install-only"], checkout, env)
        results = scratch / f"results-{n}"
        first = time_to_first_cell([*nox, "--", *cells, "--results", str(results)], checkout, env, results / "cells.jsonl")
        found[name] = (install, first)
        print(f"  {checkout.name}: {name}: environment {install:.1f} s, session to first cell {first:.1f} s", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-ref", default=OLD_LAYOUT_REF, help="commit of the previous layout to compare with")
    parser.add_argument("--deepspeed", default="0.19.8", help="DeepSpeed of the first combination")
    parser.add_argument("--new-deepspeed", default="0.19.7", help="a DeepSpeed release for step 3")
    parser.add_argument("--transformers", default="5.24.0", help="transformers of the first combination")
    parser.add_argument("--new-transformers", default="5.23.0", help="a transformers release for step 2")
    parser.add_argument("--models", default="llama")
    parser.add_argument("--tp", default="2")
    args = parser.parse_args()

    steps = [("from nothing", f"deepspeed={args.deepspeed},transformers={args.transformers}"),
             ("new transformers over an existing DeepSpeed", f"deepspeed={args.deepspeed},transformers={args.new_transformers}"),
             ("new DeepSpeed over an existing torch", f"deepspeed={args.new_deepspeed},transformers={args.transformers}")]
    cells = ["--models", args.models, "--tp", args.tp]
    # Removed only after the table is printed: deleting environments takes minutes on a busy machine.
    scratch = Path(tempfile.mkdtemp(prefix="autotp-bench-"))
    old_checkout = scratch / "old-layout"
    subprocess.run(["git", "-C", str(PROJECT_ROOT), "worktree", "add", "--quiet", "--detach", str(old_checkout),
                    args.old_ref], check=True)
    try:
        print(f"layouts: this checkout (new) and {args.old_ref} (old); cells: {' '.join(cells)}", flush=True)
        new = measure(PROJECT_ROOT, scratch / "new", steps, cells)
        old = measure(old_checkout, scratch / "old", steps, cells)
    finally:
        subprocess.run(["git", "-C", str(PROJECT_ROOT), "worktree", "remove", "--force", str(old_checkout)], check=False)
    print(f"\n{'measurement':<72} {'old s':>7} {'new s':>7} {'old/new':>7}  target")
    for name, _ in steps:
        for part, total in (("environment", lambda pair: pair[0]),
                            ("environment + session to first cell", lambda pair: pair[0] + pair[1])):
            label = f"{name}: {part}"
            before, after = total(old[name]), total(new[name])
            target = TARGETS.get(label)
            verdict = "" if target is None else f"<= {target:.0f} s: {'ok' if after <= target else 'MISSED'}"
            print(f"{label:<72} {before:>7.1f} {after:>7.1f} {before / after:>6.1f}x  {verdict}", flush=True)
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()

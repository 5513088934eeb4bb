"""Cells per minute with one rank group vs N groups in parallel (pytest-xdist), on the same cells.

    python benchmarks/parallel_groups.py [--models derived] [--tp 2] [--workers 1,2]

Each way runs the real suite (`pytest suites -n W`) into its own results folder; checkpoints and
references are prepared first, so every way measures running cells alone. Prints seconds,
cells/minute and the speed-up over one group, and checks that every way reached the same verdicts.
Keep workers × tp ≤ cores for real runs: the table marks ways that oversubscribe the machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from matrix.cells import expand
from suites.records.run_records import read_records
from suites.run.command import suites_command
from suites.run.driver import RunOptions, prepare_job


def run_suite(models: str, tp: str, workers: int, results: Path) -> float:
    command = suites_command(
        sys.executable,
        models=models,
        tp=tp,
        results=results,
        extra=["--no-resume", "-q", *(["-n", str(workers)] if workers > 1 else [])],
    )
    started = time.perf_counter()
    subprocess.run(command, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def verdicts(results: Path) -> dict[str, str]:
    return {r["cell"]["id"]: f"{r['outcome']} {r['failure_class']}".strip() for r in read_records(results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="derived", help="model selection, as for pytest --models")
    parser.add_argument("--tp", default="2")
    parser.add_argument("--workers", default="1,2", help="comma-separated xdist worker counts; 1 = one group, no xdist")
    args = parser.parse_args()
    cells = expand(args.models, tp=args.tp)
    print(f"{len(cells)} cells ({args.models}, tp {args.tp}); preparing checkpoints and references ...", flush=True)
    for cell in cells:
        prepare_job(cell, RunOptions())
    cores, rows, outcomes = os.cpu_count() or 1, [], {}
    with tempfile.TemporaryDirectory(prefix="autotp-parallel-") as scratch:
        for workers in (int(w) for w in args.workers.split(",")):
            results = Path(scratch) / f"workers-{workers}"
            print(f"  {workers} group(s) ...", flush=True)
            seconds = run_suite(args.models, args.tp, workers, results)
            outcomes[workers] = verdicts(results)
            rows.append((workers, seconds))
    first = next(iter(outcomes.values()))
    differing = {w: sorted(c for c in first if o.get(c) != first[c]) for w, o in outcomes.items()}
    print(f"\n{'groups':>6}{'ranks':>7}{'seconds':>10}{'cells/min':>11}{'speed-up':>10}")
    for workers, seconds in rows:
        ranks = workers * max(int(t) for t in args.tp.split(","))
        note = f"  (oversubscribed: {ranks} ranks on {cores} cores)" if ranks > cores else ""
        print(
            f"{workers:>6}{ranks:>7}{seconds:>10.1f}{len(cells) / seconds * 60:>11.1f}"
            f"{rows[0][1] / seconds:>9.2f}x{note}"
        )
    for workers, cells_differing in differing.items():
        if cells_differing:
            print(
                f"verdicts differ with {workers} group(s) on {len(cells_differing)} cells: "
                f"{', '.join(cells_differing[:10])}"
            )
    print(f"{len(first)} cells recorded per way; {sum(v == 'pass' for v in first.values())} pass")


if __name__ == "__main__":
    main()

"""Cost of a launch per cell vs one reused rank group, measured side by side on the same cells.

    python benchmarks/launch_reuse.py [--cells 20] [--tp 2]

Three ways over the same cells: a fresh `deepspeed --num_gpus N` launch per cell (what a harness
without reuse pays); one reused group, relaunched by DeepSpeed's launcher when a cell kills it; one
reused group, relaunched from the fork server (the harness's default on CPU). Prints seconds and the
ratios. References and tiny checkpoints are prepared first (all ways share them), so the difference
is launches alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from matrix.cells import Cell, expand
from suites.engine.rank_group import RankGroupPool
from suites.run.driver import RunOptions, prepare_job, run_cell
from suites.verdicts.vocabulary import Outcome


def timed_run(cells: list[Cell], launcher: str, pool_per_cell: bool) -> tuple[float, list[Outcome]]:
    started, outcomes = time.perf_counter(), []
    pool = RankGroupPool(launcher=launcher)
    for cell in cells:
        if pool_per_cell:
            pool.close()
        outcomes.append(run_cell(cell, pool, RunOptions()).outcome)
        print(
            f"  {launcher}{' per cell' if pool_per_cell else ' reused'}: {cell.id} {outcomes[-1]} "
            f"({time.perf_counter() - started:.0f} s so far)",
            flush=True,
        )
    pool.close()
    return time.perf_counter() - started, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20, help="how many cells (registry order) to run each way")
    parser.add_argument("--tp", default="2")
    args = parser.parse_args()
    cells = expand("registry", tp=args.tp)[: args.cells]
    print(f"{len(cells)} cells at tp {args.tp}; preparing checkpoints and references ...", flush=True)
    for cell in cells:
        prepare_job(cell, RunOptions())
    warmup = RankGroupPool(
        launcher="deepspeed"
    )  # the first launch after a while reads everything from disk: keep it out of both timings
    run_cell(cells[0], warmup, RunOptions())
    warmup.close()
    ways = {
        "one launch per cell": ("deepspeed", True),
        "reused group, launcher": ("deepspeed", False),
        "reused group, forked": ("fork", False),
    }
    seconds, verdicts = {}, {}
    for way, (launcher, per_cell) in ways.items():
        seconds[way], verdicts[way] = timed_run(cells, launcher, per_cell)
    assert len({tuple(v) for v in verdicts.values()}) == 1, f"all ways must reach the same verdicts: {verdicts}"
    baseline = seconds["one launch per cell"]
    print(f"\n{'way':<26}{'seconds':>10}{'s/cell':>10}{'speed-up':>10}")
    for way, spent in seconds.items():
        print(f"{way:<26}{spent:>10.1f}{spent / len(cells):>10.2f}{baseline / spent:>9.1f}x")
    print(
        f"{len(cells)} cells at tp {args.tp}, {sum(v != 'pass' for v in verdicts['reused group, forked'])} of them "
        f"failing"
    )


if __name__ == "__main__":
    main()

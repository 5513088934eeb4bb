"""Cost of a launch per cell vs one reused rank group, measured side by side on the same cells.

    python benchmarks/launch_reuse.py [--cells 16] [--tp 2]

Prints seconds for each way and the ratio. References and tiny checkpoints are prepared first
(both ways share them), so the difference is launches alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from matrix.cells import expand  # noqa: E402
from suites.driver import RunOptions, prepare_job, run_cell  # noqa: E402
from suites.rank_group import RankGroupPool  # noqa: E402


def timed_run(cells, pool_per_cell: bool) -> tuple[float, list[str]]:
    started, outcomes = time.perf_counter(), []
    pool = RankGroupPool()
    for cell in cells:
        if pool_per_cell:
            pool.close()
        outcomes.append(run_cell(cell, pool, RunOptions()).outcome)
        print(f"  {'fresh launch' if pool_per_cell else 'reused group'}: {cell.id} {outcomes[-1]} "
              f"({time.perf_counter() - started:.0f} s so far)", flush=True)
    pool.close()
    return time.perf_counter() - started, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=16, help="how many cells (registry order) to run each way")
    parser.add_argument("--tp", default="2")
    args = parser.parse_args()
    cells = expand("all", tp=args.tp)[: args.cells]
    print(f"{len(cells)} cells at tp {args.tp}; preparing checkpoints and references ...", flush=True)
    for cell in cells:
        prepare_job(cell, RunOptions())
    warmup = RankGroupPool()  # the first launch after a while reads everything from disk: keep it out of both timings
    run_cell(cells[0], warmup, RunOptions())
    warmup.close()
    reused, reused_outcomes = timed_run(cells, pool_per_cell=False)
    fresh, fresh_outcomes = timed_run(cells, pool_per_cell=True)
    assert reused_outcomes == fresh_outcomes, "both ways must reach the same verdicts"
    print(f"\n{'way':<24}{'seconds':>10}{'s/cell':>10}")
    print(f"{'one launch per cell':<24}{fresh:>10.1f}{fresh / len(cells):>10.2f}")
    print(f"{'one reused rank group':<24}{reused:>10.1f}{reused / len(cells):>10.2f}")
    print(f"speed-up: {fresh / reused:.1f}x on {len(cells)} cells")


if __name__ == "__main__":
    main()

"""What each rank of a warm cell does, counted (the facts a shared machine cannot blur, unlike its seconds): model
forwards of the sharded model (each top-level call: `generate` makes one a token), DeepSpeed's inference all-reduces
and the cell's CPU seconds per stage (the record's `cpu_<stage>_s`, every rank's summed), one line per cell.

    python benchmarks/rank_counts.py --models llama,qwen2,bloom --tp 2,3,4

Run with the combination's python (the matrix's environment), `AUTOTP_CACHE` set to a harness cache (a cold one is
filled first). Each cell runs in this process's own rank pool with `count` as its stage hook, which counts on every
rank and appends one JSON line per rank and cell to `$AUTOTP_RANK_COUNTS` (a file of this run's own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

COUNTS_FILE_ENV = "AUTOTP_RANK_COUNTS"
HOOK = "benchmarks.rank_counts:count"
COUNTED: dict[str, int] = {}
"""This rank's counts of the cell running now (a rank serves one cell at a time)."""
UNDO: list[Callable[[], None]] = []


def count(stage: str, model: Any, rank: int) -> None:
    """A stage hook (suites/engine/cell_runner.py `_run_fault_hooks`), changing nothing a cell computes: from the
    sharded model on, every forward and all-reduce of this rank is counted; at the cell's end the counts are
    appended to the counts file."""
    if stage == "sharded":
        # lazily: runs on a rank, where DeepSpeed is imported by the time a model is sharded
        import deepspeed.comm

        COUNTED.update(forwards=0, all_reduces=0)
        original = deepspeed.comm.inference_all_reduce

        def counted_all_reduce(*args: Any, **kwargs: Any) -> Any:
            COUNTED["all_reduces"] += 1
            return original(*args, **kwargs)

        def counted_forward(*_args: Any) -> None:
            COUNTED["forwards"] += 1

        deepspeed.comm.inference_all_reduce = counted_all_reduce
        handle = model.register_forward_pre_hook(counted_forward)
        UNDO.extend((handle.remove, lambda: setattr(deepspeed.comm, "inference_all_reduce", original)))
    elif stage == "finished":
        while UNDO:
            UNDO.pop()()
        with open(os.environ[COUNTS_FILE_ENV], "a") as counts:
            counts.write(json.dumps({"rank": rank, **COUNTED}) + "\n")
        COUNTED.clear()


def _row(cell_id: str, verdict: str, metrics: dict[str, float], ranks: list[dict[str, int]]) -> str:
    """One cell: its verdict, each rank's counts (`-` where a rank counted nothing: its cell ended before sharding)
    and the record's CPU seconds of its stages."""
    ranks = sorted(ranks, key=lambda counted: counted["rank"])
    forwards, all_reduces = ("/".join(str(r.get(key, "-")) for r in ranks) for key in ("forwards", "all_reduces"))
    cpu = "/".join(f"{metrics.get(f'cpu_{stage}_s', 0.0):.3f}" for stage in ("load", "shard", "forward", "cell"))
    return f"{cell_id:46} {verdict:16} {forwards:>12} {all_reduces:>14} {cpu}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama,qwen2,bloom,mixtral,gemma2,persimmon")
    parser.add_argument("--tp", default="2,3,4")
    parser.add_argument("--shapes", default="faithful", help="as the matrix's --shapes (its default: faithful)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="rank-counts-"))
    counts_file = folder / "counts.jsonl"
    os.environ[COUNTS_FILE_ENV] = str(counts_file)  # before the pool forks its server: every rank inherits it

    # lazily: the path above first (this file runs as a script from anywhere)
    from matrix.cells import expand
    from suites.engine.rank_group import RankGroupPool
    from suites.run.driver import RunOptions, run_cell

    cells = expand(args.models, "eager", "fp32", args.tp, shapes=args.shapes)  # grouped by tp: one group a size
    pool = RankGroupPool(results=folder)
    pool.prepare()
    print(f"{'cell':46} {'outcome':16} {'forwards':>12} {'all-reduces':>14} cpu s (load/shard/forward/cell)")
    try:
        for cell in cells:
            counts_file.write_text("")
            outcome = run_cell(cell, pool, RunOptions(faults=(HOOK,)))
            ranks = [json.loads(line) for line in counts_file.read_text().splitlines()]
            print(_row(cell.id, f"{outcome.outcome} {outcome.failure_class}".strip(), outcome.metrics, ranks))
    finally:
        pool.close()


if __name__ == "__main__":
    main()

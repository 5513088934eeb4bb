"""What a new version or commit costs before its first cell, in the layered uv environments of this checkout
against the previous pip layout (a git worktree of --old-ref), side by side in one run:

    python benchmarks/environments.py --deepspeed-repo CLONE --transformers-repo CLONE \
        [--scratch DIR] [--seed-torch-layer ROOT]

Each layout gets an environment root and a harness cache (AUTOTP_CACHE) of its own under --scratch; uv's and
pip's download caches are the machine's (warm: every wheel was downloaded before, as on a CI runner with
cached folders). First, untimed, each layout builds the combination the steps start from (--deepspeed with
--transformers) and runs its cells once: the old layout JIT-builds the comm op at that first cell, the new
one builds it with the DeepSpeed layer; both harness caches then hold that transformers version's tiny
checkpoints and references. Then each step runs on the old layout and at once on the new one (the same
load, as near as a shared machine allows), timed as its environment, then to the first cell record of
`pytest suites --models llama --tp 2 --dtypes fp32` (stopped there):

1. a new transformers release over the existing DeepSpeed (target: <= 8 s to the first cell);
2. a new DeepSpeed release over the existing torch whose comm op hashes like the existing one's
   (target: <= 25 s for its environment, op included);
3. a DeepSpeed commit step (a commit of --deepspeed-repo whose op sources equal the release's; target:
   <= 30 s to the first cell);
4. a transformers commit step (a commit of --transformers-repo; target: <= 15 s to the first cell).

The load average (1 min) is printed with every figure: on a shared machine it says what a figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
OLD_LAYOUT_REF = "e684cfc"
"""The last commit before layered uv environments (#29): one pip-built base per DeepSpeed with torch in it, a
commit built as a wheel."""
TORCH_LAYER = "torch-pt{torch}"

STEP = textwrap.dedent("""\
    # Run in a layout's checkout: build one environment, then its cells to the first record.
    import json, os, signal, subprocess, sys, time
    from pathlib import Path
    from sessions.environments import (commit_environment, ensure_environment, env_root, environment_variables,
                                       release_environment)
    from suites.run.command import suites_command

    step = json.loads(sys.argv[1])
    start = time.perf_counter()
    if step["commit"]:
        spec = commit_environment(env_root(), Path(step["clone"]), step["commit"], step["pins"], step["axis"])
    else:
        spec = release_environment(step["pins"])
    python = ensure_environment(env_root(), spec, log=lambda line: print(line, file=sys.stderr, flush=True))
    environment = time.perf_counter() - start
    load_after_environment = os.getloadavg()[0]
    cells = Path(step["results"]) / "cells.jsonl"
    start = time.perf_counter()
    process = subprocess.Popen(suites_command(python, models="llama", tp="2", dtypes="fp32", results=step["results"]),
                               env=environment_variables(python), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    first = None
    while process.poll() is None:
        if cells.exists() and cells.read_text().strip():
            first = time.perf_counter() - start
            process.send_signal(signal.SIGINT)  # pytest's own clean stop: the other cells are not measured
            process.wait()
            break
        time.sleep(0.1)
    if first is None:
        sys.exit(f"no cell record in {cells}: {process.stderr.read()[-3000:]}")
    print(json.dumps({"environment": environment, "first_cell": first, "load_environment": load_after_environment,
                      "load_cells": os.getloadavg()[0], "key": spec.key}))
""")


@dataclass(frozen=True)
class Layout:
    name: str
    checkout: Path
    scratch: Path

    def run(self, step: dict[str, Any]) -> dict[str, Any]:
        """One step in this layout's own environment root and harness cache: its figures."""
        env = {
            **os.environ,
            "AUTOTP_ENV_ROOT": str(self.scratch / "envs"),
            "AUTOTP_CACHE": str(self.scratch / "cache"),
            "PYTHONPATH": str(self.checkout),
        }
        results = self.scratch / f"results-{step['name']}"
        shutil.rmtree(results, ignore_errors=True)  # a rerun's first record must be its own
        done = subprocess.run(
            [sys.executable, "-c", STEP, json.dumps({**step, "results": str(results)})],
            cwd=self.checkout,
            env=env,
            capture_output=True,
            text=True,
        )
        (self.scratch / f"log-{step['name']}.txt").write_text(done.stderr)
        if done.returncode != 0:
            raise SystemExit(f"{self.name}: step {step['name']} failed:\n{done.stderr[-3000:]}")
        answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return answer


def old_layout_checkout(scratch: Path, ref: str) -> Path:
    """A detached git worktree of `ref` at `scratch`/old-layout (made once; `git worktree remove` it when done)."""
    checkout = scratch / "old-layout"
    if not checkout.exists():
        subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "worktree", "add", "--quiet", "--detach", str(checkout), ref], check=True
        )
    return checkout


def seed_torch_layer(source_root: Path, layout: Layout, torch: str) -> None:
    """Hard links of an existing root's torch layer (nothing writes into a finished layer): the new layout's
    untimed start then skips unpacking torch again."""
    target = layout.scratch / "envs" / TORCH_LAYER.format(torch=torch)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(source_root / target.name), str(target)], check=True)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-ref", default=OLD_LAYOUT_REF, help="commit of the previous layout to compare with")
    parser.add_argument("--deepspeed-repo", type=Path, required=True, help="a DeepSpeed clone (for the commit step)")
    parser.add_argument("--transformers-repo", type=Path, required=True, help="a transformers clone (commit step)")
    parser.add_argument("--deepspeed", default="0.19.5", help="the DeepSpeed release the steps start from")
    parser.add_argument(
        "--new-deepspeed", default="0.19.4", help="step 2: a release whose comm op hashes like --deepspeed's"
    )
    parser.add_argument(
        "--deepspeed-commit", default="edaa72212", help="step 3: a commit whose op sources equal --deepspeed's"
    )
    parser.add_argument("--transformers", default="5.24.0", help="the transformers release the steps start from")
    parser.add_argument("--new-transformers", default="5.23.0", help="step 1: another transformers release")
    parser.add_argument("--transformers-commit", default="HEAD", help="step 4: a commit of --transformers-repo")
    parser.add_argument("--torch", default="2.13.0")
    parser.add_argument(
        "--scratch", type=Path, help="where the layouts' roots go (kept; default: a new temporary folder)"
    )
    parser.add_argument(
        "--seed-torch-layer",
        type=Path,
        help="an environment root whose torch layer the new layout "
        "starts with (hard links), to skip unpacking torch in the untimed start",
    )
    return parser.parse_args()


def rev_parse(repo: Path, ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


Step = tuple[str, float, str, dict[str, Any]]
"""(label, target seconds, what the target bounds: "environment" or "first" cell, the step's request)."""


def timed_steps(args: argparse.Namespace) -> list[Step]:
    """The four steps, each from the start's pins: a transformers release, a DeepSpeed release, a DeepSpeed commit,
    a transformers commit."""
    start = {"deepspeed": args.deepspeed, "transformers": args.transformers, "torch": args.torch}
    none = {"commit": "", "clone": "", "axis": ""}
    return [
        (
            "new transformers release over the existing DeepSpeed",
            8.0,
            "first",
            {**none, "name": "transformers-release", "pins": {**start, "transformers": args.new_transformers}},
        ),
        (
            "new DeepSpeed release over the existing torch, op hashed alike",
            25.0,
            "environment",
            {**none, "name": "deepspeed-release", "pins": {**start, "deepspeed": args.new_deepspeed}},
        ),
        (
            "DeepSpeed commit step, op sources unchanged",
            30.0,
            "first",
            {
                "name": "deepspeed-commit",
                "pins": start,
                "axis": "deepspeed",
                "clone": str(args.deepspeed_repo),
                "commit": rev_parse(args.deepspeed_repo, args.deepspeed_commit),
            },
        ),
        (
            "transformers commit step",
            15.0,
            "first",
            {
                "name": "transformers-commit",
                "pins": start,
                "axis": "transformers",
                "clone": str(args.transformers_repo),
                "commit": rev_parse(args.transformers_repo, args.transformers_commit),
            },
        ),
    ]


def print_table(rows: list[tuple[str, float, str, dict[str, dict[str, Any]]]]) -> None:
    """Old and new layout side by side, each step against its target."""
    print(f"\n{'step':<62} {'old env':>8} {'new env':>8} {'old 1st':>8} {'new 1st':>8} {'old/new':>8}  target (new)")
    for label, target, measure, measured in rows:
        before, after = measured["old"], measured["new"]
        old_first, new_first = (
            before["environment"] + before["first_cell"],
            after["environment"] + after["first_cell"],
        )
        judged = after["environment"] if measure == "environment" else new_first
        compared = before["environment"] / after["environment"] if measure == "environment" else old_first / new_first
        what = "environment" if measure == "environment" else "to first cell"
        print(
            f"{label:<62} {before['environment']:>8.1f} {after['environment']:>8.1f} {old_first:>8.1f} "
            f"{new_first:>8.1f} "
            f"{compared:>7.1f}x  {what} <= {target:.0f} s: {'ok' if judged <= target else 'MISSED'} ({judged:.1f} s)"
        )
    print("(env: the environment alone; 1st: environment + the session to its first cell record; load averages above)")


def main() -> None:
    args = arguments()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="autotp-bench-"))
    old_checkout = old_layout_checkout(scratch, args.old_ref)
    old, new = Layout("old", old_checkout, scratch / "old"), Layout("new", PROJECT_ROOT, scratch / "new")
    if args.seed_torch_layer:
        seed_torch_layer(args.seed_torch_layer, new, args.torch)

    start = {"deepspeed": args.deepspeed, "transformers": args.transformers, "torch": args.torch}
    none = {"commit": "", "clone": "", "axis": ""}
    steps = timed_steps(args)
    print(
        f"layouts: {new.checkout} (new: uv layers) and {args.old_ref} (old: pip bases); scratch {scratch}; "
        "uv's and pip's download caches warm (shared machine caches)",
        flush=True,
    )
    for layout in (new, old):
        figures = layout.run({**none, "name": "start", "pins": start})
        print(
            f"untimed start, {layout.name}: DeepSpeed {args.deepspeed} + transformers {args.transformers}: environment "
            f"{figures['environment']:.1f} s, first cell {figures['first_cell']:.1f} s (load "
            f"{figures['load_cells']:.1f})",
            flush=True,
        )
    rows = []
    for label, target, measure, step in steps:
        measured = {layout.name: layout.run(step) for layout in (old, new)}
        rows.append((label, target, measure, measured))
        for name, figures in measured.items():
            print(
                f"  {name}: {label}: environment {figures['environment']:.1f} s (load "
                f"{figures['load_environment']:.1f}), "
                f"first cell after {figures['first_cell']:.1f} s more (load {figures['load_cells']:.1f})",
                flush=True,
            )

    print_table(rows)


if __name__ == "__main__":
    main()

"""Bisect one cell along one version axis: which release, and with a DeepSpeed clone which commit
(and PR), broke it (--mode broken), fixed it (--mode fixed) or first ran it (--mode supported).

    python -m reports bisect --cell llama-eager-fp32-tp3 --axis deepspeed --good 0.16.4 --bad 0.17.0
    python -m reports bisect --cell llama-eager-fp32-tp3 --good 0.16.4 --bad 0.17.0 \
        --deepspeed-repo ~/DeepSpeed --refine
    python -m reports bisect --cell llama-eager-fp32-tp3 --good v0.16.4 --bad 3f1c2a9 --deepspeed-repo ~/DeepSpeed
    python -m reports bisect --cell llama-eager-fp16-tp2 --mode supported --bad 0.14.4 --good 0.19.8

"good" always means the cell passes and "bad" that it fails, so --mode broken takes --good older than
--bad and --mode fixed takes --bad older than --good. --mode supported asks since when DeepSpeed runs the cell at
all: "bad" is a release that refuses it (the cell's outcome `unsupported`: a dtype its accelerator does not list
here), "good" one where it runs, pass or fail; --bad is the older end. Each step runs only that cell, in an environment
of its own under .nox/envs/<key> that later bisections and matrix sessions reuse. "Bad" means the failure seen at the
failing end (same failure class and signature) unless --any-failure; a step that cannot be tested
(install failure, a different failure, a skipped cell) is skipped like `git bisect skip` and the
search continues on its neighbours. The answer goes into the history store, so the report can say
"broken by #NNNN" next to the transition.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from matrix.version_axes import AXES
from reports.commands.interface import Command
from reports.commands.options import add_cell_runs
from reports.search import (
    BisectRequest,
    bisect_cell,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cell", required=True, help="cell id, e.g. llama-eager-fp32-tp3")
    parser.add_argument("--axis", choices=AXES, default="deepspeed", help="the axis to bisect (default deepspeed)")
    parser.add_argument("--good", required=True, help="a version (or, with --deepspeed-repo, a tag or sha) that passes")
    parser.add_argument("--bad", required=True, help="a version (or tag or sha) that fails")
    parser.add_argument(
        "--mode",
        choices=("broken", "fixed", "gone", "supported"),
        default="broken",
        help="broken: first bad after --good (default); fixed: first good after --bad; gone: the "
        "first version after --bad without --bad's failure (its class and cause), where the "
        "cell passes or fails another way (--good names such a version); supported: the first version after "
        "--bad (where DeepSpeed refuses the cell: unsupported) that runs it, passing or failing",
    )
    parser.add_argument(
        "--any-failure",
        action="store_true",
        help="count every failure as bad, not only the failing end's class and signature",
    )
    parser.add_argument("--deepspeed-repo", type=Path, help="local DeepSpeed clone: bisect its commits")
    parser.add_argument(
        "--refine",
        action="store_true",
        help="with --deepspeed-repo: bisect releases first, then the commits between the answer",
    )
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="AXIS=VERSION",
        help="hold another axis at this release (default: as in the stored failing run, else latest)",
    )
    add_cell_runs(parser)


def run(args: argparse.Namespace) -> int:
    bisect_cell(
        BisectRequest(
            cell=args.cell,
            axis=args.axis,
            good=args.good,
            bad=args.bad,
            mode=args.mode,
            any_failure=args.any_failure,
            deepspeed_repo=args.deepspeed_repo,
            refine=args.refine,
            pin=tuple(args.pin),
            store=args.store,
            env_root=args.env_root,
            cell_timeout=args.cell_timeout,
            end_repeats=args.end_repeats,
        )
    )
    return 0


COMMAND = Command(
    "bisect",
    "which release (and with a DeepSpeed clone, which commit and PR) broke or fixed one cell",
    add_arguments,
    run,
    description=__doc__,
)

"""Answer every open transition of the history store by itself: which release, commit and PR broke (or
fixed) each red (or newly green) cell, on the DeepSpeed and the transformers side.

    python -m reports triage --store results/history.sqlite [--deepspeed-repo PATH] [--transformers-repo PATH]
                             [--max-cells 200] [--max-minutes 60]

Transitions that changed along the same axis, over the same release range, at the same other versions,
with the same failure class and cause (the signature with tp-dependent detail masked) are one question:
one representative cell (the smallest tp) is bisected — releases first, then commits when a clone is
given — and every other cell of the question is run once at each end of the answer, which confirms it
for that cell. A cell that does not confirm becomes a question of its own. On the transformers side a
clone also lists the commits of the range that touched the failure's files and the model's folder. The
budget stops the work between cell runs; what is left stays "not yet triaged" in the report, and a
question that cannot be answered is recorded with its reason. Answers go into the store like those of
`python -m reports bisect`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from matrix.registry import RegistryError, load_models
from reports.analysis import analyse
from reports.clones import GitRepo
from reports.commands.interface import Command
from reports.commands.options import add_cell_runs, positive
from reports.search import DEEPSPEED_REPO_ENV, TRANSFORMERS_REPO_ENV, Budget, Triage, real_installer
from reports.store import HistoryStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deepspeed-repo",
        type=Path,
        default=os.environ.get(DEEPSPEED_REPO_ENV) or None,
        help=f"local DeepSpeed clone: bisect commits after releases (default ${DEEPSPEED_REPO_ENV})",
    )
    parser.add_argument(
        "--transformers-repo",
        type=Path,
        default=os.environ.get(TRANSFORMERS_REPO_ENV) or None,
        help="local transformers clone: list the commits that touched the failure's files, and "
        f"bisect commits (default ${TRANSFORMERS_REPO_ENV})",
    )
    parser.add_argument(
        "--refine",
        action="store_true",
        help="also bisect the commits behind answers found at release level (needs a clone)",
    )
    parser.add_argument(
        "--max-cells", type=positive(int), default=200, help="most cell runs to spend, 1 or more (default 200)"
    )
    parser.add_argument(
        "--max-minutes", type=positive(float), default=60.0, help="most minutes to spend, more than 0 (default 60)"
    )
    add_cell_runs(parser)


def run(args: argparse.Namespace) -> int:
    repos = {
        axis: GitRepo(path, f"--{axis}-repo")
        for axis, path in (("deepspeed", args.deepspeed_repo), ("transformers", args.transformers_repo))
        if path is not None
    }
    with HistoryStore(args.store, create=False, read_only=True) as store:
        history = analyse(store.observations(), None, store.bisections(), store.triage_attempts())
    try:
        model_types = {name: entry.model_type for name, entry in load_models().items()}
    except RegistryError:
        model_types = {}
    triage = Triage(
        args.store,
        args.env_root,
        real_installer(args.env_root),
        Budget(args.max_cells, args.max_minutes),
        repos,
        cell_timeout=args.cell_timeout,
        end_repeats=args.end_repeats,
        model_types=model_types,
    )
    left = triage.run(history.transitions, refine=args.refine)
    cells_left = sum(len(q.transitions) for q in left)
    print(
        f"triage: {triage.answered} question(s) answered by bisection, {triage.confirmed} cell(s) confirmed, "
        f"{triage.steps} bisection step(s), {triage.budget.spent_cells} cell run(s); {cells_left} cell(s) in "
        f"{len(left)} question(s) not yet triaged"
    )
    print(f"`python -m reports render --store {args.store}` shows the answers")
    return 0


COMMAND = Command(
    "triage",
    "which release, commit and PR broke or fixed every open transition of the store, by itself",
    add_arguments,
    run,
    description=__doc__,
)

"""`python -m reports since-when`: on a first night (one version set in the history), run each new cause's example
cell at a few earlier points of each axis and merge the results into the history, so the report says since when
each cause fails and which axis moved (reports/search/since_when.py). On a history that already has earlier versions
it says so and runs nothing. The cost is printed before anything runs; `--plan` prints it and stops."""

from __future__ import annotations

import argparse
from pathlib import Path

from matrix.earlier_points import DEFAULT_DEEPSPEED_MINORS, DEFAULT_MAX_CELLS, DEFAULT_MAX_POINTS, earlier_points
from matrix.releases import ReleaseDataUnavailable
from matrix.version_axes import AxisValueError
from reports import ReportsError
from reports.analysis import analyse_aggregates
from reports.commands import merge
from reports.commands.interface import Command
from reports.commands.options import add_cell_runs, add_known_failures, known_failures
from reports.outputs import build_report
from reports.search import SinceWhenPlan, plan_since_when, run_since_when
from reports.store import AXES, KEEP_RECENT_RUNS, CellKey, HistoryStore, Versions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cell_runs(parser)
    add_known_failures(parser)
    parser.add_argument(
        "--results",
        type=Path,
        default=Path("results/since-when"),
        help="a results folder per point under it (default results/since-when)",
    )
    parser.add_argument(
        "--max-cells",
        type=int,
        default=DEFAULT_MAX_CELLS,
        help=f"most example cells (one per new cause, the most severe first; default {DEFAULT_MAX_CELLS})",
    )
    parser.add_argument(
        "--max-points",
        type=int,
        default=DEFAULT_MAX_POINTS,
        help=f"most earlier points, alternating DeepSpeed and transformers (default {DEFAULT_MAX_POINTS})",
    )
    parser.add_argument(
        "--deepspeed-minors",
        type=int,
        default=DEFAULT_DEEPSPEED_MINORS,
        help=f"DeepSpeed minor releases before the latest one's to try (default {DEFAULT_DEEPSPEED_MINORS})",
    )
    parser.add_argument("--plan", action="store_true", help="print what it would run and its cost, run nothing")


def first_night_examples(store: Path, known: Path) -> tuple[Versions, list[CellKey]] | None:
    """The latest versions and the new causes' example cells (the report's order), or None where the history is
    not a first night (it already says since when)."""
    with HistoryStore(store, create=False, read_only=True) as opened:
        aggregates = opened.aggregates()
        history = analyse_aggregates(aggregates, None, opened.bisections(), opened.triage_attempts())
    report = build_report(history, aggregates, None, known_failures(known))
    if not report.failing_now.backfill:
        return None
    cells = {cell.id: cell for cell in history.cells}
    return history.latest, [cells[c.repro.cell] for c in report.failing_now.causes if c.status == "new"]


def plan(args: argparse.Namespace) -> SinceWhenPlan | None:
    """The plan, or None (said why) where there is nothing to run."""
    found = first_night_examples(args.store, args.known_failures)
    if found is None:
        print(f"since-when: {args.store} has runs at more than one version set; its report says since when")
        return None
    latest, examples = found
    if not examples:
        print("since-when: no new cause fails at the latest versions; nothing to run")
        return None
    releases = {axis: Versions.label(latest, axis).split("+")[0] for axis in AXES}
    try:
        points = earlier_points(releases, deepspeed_minors=args.deepspeed_minors, max_points=args.max_points)
    except (AxisValueError, ReleaseDataUnavailable) as error:
        raise ReportsError(f"since-when: no release data to pick earlier points from: {error}") from None
    if not points:
        print(f"since-when: no earlier release to try at {latest.describe()}")
        return None
    return plan_since_when(examples, points, releases, max_cells=args.max_cells)


def run(args: argparse.Namespace) -> int:
    if args.max_cells < 1 or args.max_points < 1:
        raise ReportsError("since-when: --max-cells and --max-points take 1 or more")
    chosen = plan(args)
    if chosen is None:
        return 0
    print(f"since-when: {chosen.cost_text(args.env_root)}")
    if args.plan:
        return 0
    runs = run_since_when(chosen, args.env_root, args.results, args.cell_timeout)
    folders = [folder for point_run in runs for folder in point_run.junit if folder.is_dir()]
    seconds = sum(point_run.seconds for point_run in runs)
    print(
        f"since-when: {chosen.cell_runs} cell runs at {len(runs)} points in {seconds / 60:.1f} min"
        + "".join(f"; {r.point.axis} {r.point.version} not run: {r.failure}" for r in runs if r.failure)
    )
    if not folders:
        raise ReportsError("since-when: no point wrote results; nothing to merge")
    return merge.run(
        argparse.Namespace(
            inputs=folders, store=args.store, archive=None, keep_recent_runs=KEEP_RECENT_RUNS, untrusted=False
        )
    )


COMMAND = Command(
    "since-when",
    "on a first night, each new cause's example cell at a few earlier releases of each axis, merged into the history",
    add_arguments,
    run,
    description=__doc__,
)

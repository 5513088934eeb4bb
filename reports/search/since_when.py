"""Since when, on the first night: each new cause's example cell run at a few earlier points of each axis
(matrix/earlier_points.py: the newest patch of older DeepSpeed minors, the last transformers of the previous major;
the other axes at the latest versions), into a results folder per point whose JUnit is merged into the history like
any run's. The report then reads since when from the data (reports/analysis/since_when.py).

The cost is bounded before anything runs — at most `max_cells` example cells (the report's order: the most severe
cause first) at most `max_points` points — and printed: the cell runs and the environments, which of them are
already built. A combination's environment is built on first use (sessions/environments.py) and kept for the
nightly, bisection and triage steps that need it later."""

from __future__ import annotations

import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from matrix import PROJECT_ROOT
from matrix.cells import replay_name
from matrix.earlier_points import EarlierPoint
from reports.analysis import SINCE_WHEN_SESSION
from reports.store import CellKey
from sessions.environments import (
    READY_MARKER,
    EnvironmentBuildError,
    EnvironmentSpec,
    ensure_environment,
    environment_variables,
    release_environment,
)
from suites.run.command import suites_command

SESSION = SINCE_WHEN_SESSION
"""The session name its runs are recorded under: never compared with another run (reports.analysis.trust)."""


@dataclass(frozen=True)
class SinceWhenPlan:
    """What a first night's since-when run costs, decided before it runs."""

    cells: tuple[CellKey, ...]
    """The example cells it runs, one per new cause (at most max_cells)."""
    left_out: tuple[CellKey, ...]
    """New causes' example cells over the cap: their causes stay "not known yet"."""
    points: tuple[EarlierPoint, ...]
    latest: tuple[tuple[str, str], ...]
    """Every axis's release at the latest versions, the others' value at each point."""

    @property
    def cell_runs(self) -> int:
        return len(self.cells) * len(self.points)

    def environment(self, point: EarlierPoint) -> EnvironmentSpec:
        return release_environment(point.pins(dict(self.latest)))

    def cost_text(self, env_root: Path) -> str:
        """ "15 example cells × 4 points (DeepSpeed 0.18.9, …) = 60 cell runs; 4 environments, 2 to build (…)"."""
        specs = [self.environment(point) for point in self.points]
        missing = [spec.key for spec in specs if not (env_root / spec.key / READY_MARKER).is_file()]
        points = ", ".join(f"{point.axis} {point.version}" for point in self.points)
        over = f" ({len(self.left_out)} more new causes over the cap, not tried)" if self.left_out else ""
        return (
            f"{len(self.cells)} example cells{over} × {len(self.points)} points ({points}) = {self.cell_runs} cell "
            f"runs; {len(specs)} environments, "
            + (f"{len(missing)} to build ({', '.join(missing)})" if missing else "all built")
        )


def plan_since_when(
    examples: list[CellKey],
    points: list[EarlierPoint],
    latest: dict[str, str],
    *,
    max_cells: int,
) -> SinceWhenPlan:
    """The cells (the first `max_cells` of the examples, in the report's order) and the points (already capped,
    matrix.earlier_points) a since-when run takes."""
    unique = list(dict.fromkeys(examples))
    return SinceWhenPlan(
        cells=tuple(unique[:max_cells]),
        left_out=tuple(unique[max_cells:]),
        points=tuple(points),
        latest=tuple(latest.items()),
    )


@dataclass(frozen=True)
class PointRun:
    """One point's run: where its results are, and what it took."""

    point: EarlierPoint
    junit: tuple[Path, ...]
    """The JUnit folders its cells wrote (one per variant, dtype and tp of the cells)."""
    seconds: float
    failure: str = ""
    """Why it did not run ("" when it ran): an environment that cannot be built."""


def prefixed(key: str, log: Callable[[str], None]) -> Callable[[str], None]:
    """log, each line naming the environment it is about."""
    return lambda line: log(f"{key}: {line}")


def run_since_when(
    plan: SinceWhenPlan,
    env_root: Path,
    results: Path,
    cell_timeout: float,
    log: Callable[[str], None] = print,
) -> list[PointRun]:
    """Each point's environment (built on first use), then its cells, grouped so each pytest run selects exactly
    them (one run per variant, dtype and tp: `--models` of that group); each group writes its own results folder
    under results/<combination>/."""
    groups: dict[tuple[str, str, int], list[CellKey]] = defaultdict(list)
    for cell in plan.cells:
        groups[cell.variant, cell.dtype, cell.tp].append(cell)
    runs = []
    for point in plan.points:
        started = time.monotonic()
        spec = plan.environment(point)
        try:
            python = ensure_environment(env_root, spec, log=prefixed(spec.key, log))
        except EnvironmentBuildError as error:
            log(f"{point.axis} {point.version}: not run, its environment cannot be built: {str(error).splitlines()[0]}")
            runs.append(PointRun(point, (), time.monotonic() - started, str(error).splitlines()[0]))
            continue
        folders = []
        for (variant, dtype, tp), cells in groups.items():
            folder = results / spec.key / f"{variant}-{dtype}-tp{tp}"
            argv = suites_command(
                python,
                models=",".join(sorted({replay_name(cell.model) for cell in cells})),
                variants=variant,
                dtypes=dtype,
                tp=str(tp),
                results=folder,
                session_name=SESSION,
                cell_timeout=cell_timeout,
                extra=["-q", "--tb=no"],
            )
            subprocess.run(argv, cwd=PROJECT_ROOT, env=environment_variables(python), check=False)
            folders.append(folder / "junit")
        seconds = time.monotonic() - started
        log(f"{point.axis} {point.version}: {len(plan.cells)} cells in {seconds:.0f} s (environment included)")
        runs.append(PointRun(point, tuple(folders), seconds))
    return runs

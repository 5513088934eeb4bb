"""Options several verbs share, registered the same way by each."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from matrix.known_failures import KNOWN_FAILURES_FILE, KnownFailure, load_known_failures
from matrix.registry import RegistryError
from reports import ReportsError
from reports.search import END_REPEATS
from reports.store import DEFAULT_STORE, KEEP_RECENT_RUNS
from sessions.environments import env_root
from suites.run.command import CELL_TIMEOUT_S
from suites.verdicts.vocabulary import FAILURE_CLASSES


def add_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"history store (default {DEFAULT_STORE})")


def add_archive(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--archive",
        type=Path,
        help="results archive, every merged run's raw results (default: archive/ next to --store)",
    )


def _run_count(text: str) -> int:
    """--keep-recent-runs: a whole number of runs, at least 1 (publish and draft-issue read the newest run's detail)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs; give a whole number of 1 or more")
    return int(text)


def add_keep_recent_runs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep-recent-runs",
        type=_run_count,
        default=KEEP_RECENT_RUNS,
        metavar="N",
        help=f"keep messages and metrics of each session's newest N runs (default {KEEP_RECENT_RUNS}); "
        "older results keep their verdict and signature, and their detail where a report reads it",
    )


def add_known_failures(parser: argparse.ArgumentParser, when: str = "") -> None:
    parser.add_argument(
        "--known-failures",
        type=Path,
        default=KNOWN_FAILURES_FILE,
        help=f"{when}failures known upstream (default matrix/known_failures.toml)",
    )


def known_failures(path: Path) -> dict[str, KnownFailure]:
    try:
        return load_known_failures(FAILURE_CLASSES, path)
    except RegistryError as error:
        raise ReportsError(str(error)) from None


def add_deepspeed_repo(parser: argparse.ArgumentParser, what: str = "commit order and PRs") -> None:
    parser.add_argument("--deepspeed-repo", type=Path, help=f"local DeepSpeed clone: {what}")


def add_cell_runs(parser: argparse.ArgumentParser) -> None:
    """What bisect and triage share: the store they read and answer into, and where and how long cells run."""
    add_store(parser)
    parser.add_argument(
        "--env-root",
        type=Path,
        default=env_root(),
        help="where environments live (default .nox/envs, shared with the nox sessions; reused)",
    )
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, help="seconds a cell may take per run")
    parser.add_argument(
        "--end-repeats",
        type=int,
        default=END_REPEATS,
        help=f"runs of each end of a range before bisecting it; ends whose verdicts differ are "
        f"flaky and not bisected (default {END_REPEATS})",
    )


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type for a budget: a budget of 0 or less could not run one cell, so it is refused."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} leaves no budget for a single cell run; give a number above 0")
        return value

    return parse

"""pytest wiring for the AutoTP suites: command-line selection of cells, one rank-group pool per
session, a record per cell in results/, and a summary table at the end."""

from __future__ import annotations

import os
import signal
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from matrix.cells import Cell, expand
from matrix.disk_space import DiskSpaceError, require_free_space, run_needs
from matrix.harness_cache import RunPruning, live_run, prune
from matrix.registry import RegistryError
from matrix.remedies import RemedyError, load_remedies
from suites.engine.rank_group import RankGroupPool
from suites.records.run_records import (
    CellRecorder,
    RunInfo,
    RunState,
    cells_without_record,
    harness_commit,
    installed_versions,
    read_records,
)
from suites.records.summary import print_summary
from suites.reference.memory_plan import default_variants
from suites.run.command import SUITE_OPTIONS

if TYPE_CHECKING:  # these import torch: imported where they are used, after the fork server started (pytest_configure)
    from _pytest.terminal import TerminalReporter

    from suites.checks.task_probe import AccuracyTask
    from suites.run.ahead import RunAhead
    from suites.run.driver import CacheContents, RunOptions

SUITE_DIR = Path(__file__).resolve().parent / "suites"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """A skip's location, which pytest writes before its reason into JUnit, relative to the project
    (`suites/test_autotp.py:56`): a record keeps no folder of the machine that ran it."""
    report: pytest.TestReport = yield
    if report.skipped and isinstance(report.longrepr, tuple):
        path, line, reason = report.longrepr
        if Path(path).is_absolute() and Path(path).resolve().is_relative_to(SUITE_DIR.parent):
            report.longrepr = (Path(path).resolve().relative_to(SUITE_DIR.parent).as_posix(), line, reason)
    return report


RUN_PRUNING: pytest.StashKey[RunPruning] = pytest.StashKey()
"""This process's pruning of the harness cache while its cells go on (matrix/harness_cache.py RunPruning)."""


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After each cell, the cache is kept within its limit: a run's working set may outgrow the disk before its end."""
    if RUN_PRUNING in item.config.stash:
        item.config.stash[RUN_PRUNING].after_cell()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("autotp", "AutoTP matrix cells")
    for names, settings in SUITE_OPTIONS:
        group.addoption(*names, **settings)


CELLS = pytest.StashKey[list[Cell]]()
ACCURACY_TASK: pytest.StashKey[AccuracyTask | None] = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    if _starts_a_run(config):
        _require_disk_space(config)
    if _runs_cells_here(config):
        _interrupt_on_sigterm()
        # First, before anything here imports torch/transformers (expand's config classes, the run's versions): the
        # fork server's own imports, the longest wait before the first cell, then run beside the driver's.
        _rank_pool(config)
    option = config.getoption
    # lazily: torch (the task's scoring), imported after the fork server started above
    from suites.checks.task_probe import resolve_task
    from suites.checks.task_scoring import TaskError

    try:  # a bad selection is a usage error (exit 4, one clear line), not a collection crash
        variants = option("--variants") or default_variants(option("--checkpoints"))
        config.stash[CELLS] = expand(
            option("--models"),
            variants,
            option("--dtypes"),
            option("--tp"),
            models_file=Path(option("--models-file")),
            shapes=option("--shapes"),
        )
        config.stash[ACCURACY_TASK] = resolve_task(option("--accuracy-task")) if option("--accuracy-task") else None
        if option("--remedy"):
            config.stash[CELLS] = _with_remedy(config.stash[CELLS], option("--remedy"))
    except (RegistryError, TaskError, RemedyError) as error:
        raise pytest.UsageError(str(error)) from None
    if _runs_suites(config) and not config.option.collectonly:  # collecting only: no run, nothing to record
        workers = getattr(config.option, "numprocesses", None)
        if workers and config.option.dist == "load":
            config.option.dist = "loadgroup"  # keep each worker on its chunk of cells (see _xdist_group)
        _warn_if_oversubscribed(config, workers)
        _failures_as_causes(config)
        if getattr(config.option, "xmlpath", None) is None:
            config.option.xmlpath = str(Path(option("--results")) / "junit" / f"{option('--session-name')}.xml")
        config.stash[RUN] = _start_run(config)
        if not hasattr(config, "workerinput"):  # the controller holds the cache's live-run lock for its workers
            config.stash[LIVE_RUN] = ExitStack()
            config.stash[LIVE_RUN].enter_context(live_run())
    if _runs_cells_here(config):  # the fork server imports the run's models once, not each rank at each model's cell
        config.stash[RUN_PRUNING] = RunPruning()
        cells = config.stash[CELLS]
        _rank_pool(config).preload(sorted({c.model.model_type for c in cells if not c.model.trust_remote_code}))


def _starts_a_run(config: pytest.Config) -> bool:
    """This process starts a run of the suites: not a pytest-xdist worker (its controller checked), nor a listing."""
    listing = getattr(config.option, "help", False) or config.option.collectonly
    return _runs_suites(config) and not listing and not hasattr(config, "workerinput")


def _require_disk_space(config: pytest.Config) -> None:
    """Stop before the first cell where the harness cache's or the results' disk has less free than a run needs."""
    try:
        require_free_space(run_needs(Path(config.getoption("--results"))))
    except DiskSpaceError as error:
        raise pytest.UsageError(str(error)) from None


LIVE_RUN: pytest.StashKey[ExitStack] = pytest.StashKey()
"""The cache's lock held while this run goes on (matrix/harness_cache.py live_run): no other run evicts what it uses."""


def pytest_unconfigure(config: pytest.Config) -> None:
    if LIVE_RUN in config.stash:
        config.stash[LIVE_RUN].close()


def _interrupt_on_sigterm() -> None:
    """A SIGTERM (a CI job cancelled, `kill`) ends the run as Ctrl-C does: the rank groups are ended, and the end of the
    run says which cells have no result and how to run them, instead of the process vanishing mid-cell."""

    def interrupt(_signal: int, _frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, interrupt)


Run = tuple["RunInfo", "RunState", dict[str, str]]
"""The run this session records into, its state file and the installed versions (_start_run)."""
RUN = pytest.StashKey[Run]()


def _with_remedy(cells: list[Cell], name: str) -> list[Cell]:
    """The cells with the arguments of remedy `name` (matrix/remedies.toml; a patch passes none)."""
    remedies = load_remedies()
    remedy = next((remedy for remedy in remedies if remedy.name == name), None)
    if remedy is None:
        known = ", ".join(remedy.name for remedy in remedies)
        raise RemedyError(f"--remedy {name!r}: no remedy of that name in matrix/remedies.toml; known: {known}")
    return [replace(cell, arguments=remedy.arguments) for cell in cells]


def _failures_as_causes(config: pytest.Config) -> None:
    """A run's failures are read as causes where it ends (`python -m reports render`: one line per cause), each
    cell's tracebacks and rank logs under results/logs/<cell>/: pytest's own failure blocks and its short summary
    line per failed cell would repeat every failure (213 cells: ~3,700 lines). A user who asks for them (`--tb=...`,
    `-r...`) still gets them."""
    asked = [str(arg) for arg in config.invocation_params.args]
    if not any(arg.startswith("--tb") for arg in asked):
        config.option.tbstyle = "no"
    if not any(arg.startswith("-r") or arg == "--report-chars" for arg in asked):
        config.option.reportchars = ""


def _warn_if_oversubscribed(config: pytest.Config, workers: object) -> None:
    """Each xdist worker runs its own rank group: more ranks than cores make every cell slower
    (measured on 2 cores: 2 groups at tp 2 ran 0.72x the cells/minute of one group)."""
    if not isinstance(workers, int) or hasattr(config, "workerinput"):
        return
    tp, cores = max((cell.tp for cell in config.stash[CELLS]), default=1), os.cpu_count() or 1
    if workers * tp > cores:
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(
                f"-n {workers} runs up to {workers * tp} ranks on {cores} cores; -n {max(1, cores // tp)} gives the "
                f"most "
                "cells per minute here (workers x tp <= cores)"
            ),
            stacklevel=2,
        )


def _start_run(config: pytest.Config) -> Run:
    """The run this session records into: decided once by the controller (or the only process) and
    handed to pytest-xdist workers, so all of them share one run id; an interrupted run with the same
    session, selection and versions is continued unless --no-resume."""
    option = config.getoption
    versions = installed_versions()
    # Injected faults and the harness commit are part of what a run is: records made under a fault, or by
    # other harness code, are never replayed into this run.
    selection = {
        name: option(f"--{name.replace('_', '-')}")
        for name in ("models", "variants", "dtypes", "tp", "checkpoints", "accuracy_task", "inject_fault", "remedy")
    }
    state = RunState(
        Path(option("--results")), option("--session-name"), selection, {**versions, "harness_git": harness_commit()}
    )
    if hasattr(config, "workerinput"):
        return (
            RunInfo(option("--session-name"), started=getattr(config, "workerinput", {})["autotp_run_started"]),
            state,
            versions,
        )
    run = RunInfo(option("--session-name"))
    resumed = None if option("--no-resume") else state.resumable_start()
    run.started = resumed or run.started
    state.write(run.started, complete=False)
    return run, state, versions


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist's WorkerController: untyped
    """pytest-xdist: every worker records under the controller's run id (runs of the suites only)."""
    if RUN in node.config.stash:
        node.workerinput["autotp_run_started"] = node.config.stash[RUN][0].started


CACHE_AT_START: pytest.StashKey[CacheContents] = pytest.StashKey()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The memory plan of every model, before the first cell (suites/reference/memory_plan.py); the controller only.
    Tiny checkpoints and references are written when the first cell needs a reference (suites/run/ahead.py; under
    pytest-xdist by the cells that first need them), never here, and the end of the run says what was written."""
    config = session.config
    if RUN not in config.stash or hasattr(config, "workerinput"):
        return
    from suites.run.driver import CacheContents, RunOptions, longest_steps, memory_plan_lines  # lazily: torch

    config.stash[CACHE_AT_START] = CacheContents.now()
    reporter = cast("TerminalReporter", config.pluginmanager.get_plugin("terminalreporter"))
    for line in memory_plan_lines(
        config.stash[CELLS],
        RunOptions(
            checkpoints=config.getoption("--checkpoints"),
            allow_remote_code=config.getoption("--allow-remote-code"),
            unsharded_steps=longest_steps(config.stash[CELLS]),
        ),
        ahead=_runs_cells_here(config),  # a pytest-xdist worker runs its cells without (the `run_ahead` fixture)
    ):
        reporter.write_line(line)


def _runs_suites(config: pytest.Config) -> bool:
    return any(Path(arg.split("::")[0]).resolve().is_relative_to(SUITE_DIR) for arg in config.args)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" not in metafunc.fixturenames:
        return
    cells = metafunc.config.stash[CELLS]
    workers = getattr(metafunc.config, "workerinput", {}).get("workercount", 1)
    params = [
        pytest.param(cell, id=cell.id, marks=pytest.mark.xdist_group(_xdist_group(cell, cells, workers)))
        for cell in cells
    ]
    metafunc.parametrize("cell", params)


def _xdist_group(cell: Cell, cells: list[Cell], workers: int) -> str:
    """Under pytest-xdist each worker runs its own rank group: give each worker a contiguous chunk of
    one tp size, so groups are rarely relaunched for another tp."""
    same_tp = [c.id for c in cells if c.tp == cell.tp]
    return f"tp{cell.tp}-{same_tp.index(cell.id) * workers // len(same_tp)}"


@pytest.fixture(scope="session")
def run_options(pytestconfig: pytest.Config) -> RunOptions:
    from suites.run.driver import RunOptions, longest_steps  # lazily: torch, after the fork server started

    option = pytestconfig.getoption
    return RunOptions(
        checkpoints=option("--checkpoints"),
        allow_remote_code=option("--allow-remote-code"),
        cell_timeout=option("--cell-timeout"),
        faults=tuple(option("--inject-fault")),
        accuracy_task=pytestconfig.stash[ACCURACY_TASK],
        unsharded_steps=longest_steps(pytestconfig.stash.get(CELLS, [])),
    )


@pytest.fixture(scope="session")
def run_ahead(pytestconfig: pytest.Config, run_options: RunOptions) -> RunAhead | None:
    """The cold work of this process's cells (their tiny checkpoints and references), done together when the first
    asks for a reference (suites/run/ahead.py); None in a pytest-xdist worker, which does not know which cells it
    gets."""
    from suites.run.driver import run_ahead  # lazily: torch, after the fork server started

    return None if hasattr(pytestconfig, "workerinput") else run_ahead(pytestconfig.stash[CELLS], run_options)


POOL: pytest.StashKey[RankGroupPool] = pytest.StashKey()


def _runs_cells_here(config: pytest.Config) -> bool:
    """This process will run cells of the suites: not --help or --collect-only, nor a pytest-xdist controller
    (its workers run the cells, each with a rank pool of its own)."""
    distributes = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
    listing = getattr(config.option, "help", False) or config.option.collectonly
    return _runs_suites(config) and not distributes and not listing


def _rank_pool(config: pytest.Config) -> RankGroupPool:
    """The session's rank-group pool, its fork server started at once (suites: from pytest_configure)."""
    if POOL not in config.stash:
        config.stash[POOL] = RankGroupPool(results=Path(config.getoption("--results")).resolve())
        config.stash[POOL].prepare()
    return config.stash[POOL]


@pytest.fixture(scope="session")
def rank_pool(pytestconfig: pytest.Config) -> Iterator[RankGroupPool]:
    pool = _rank_pool(pytestconfig)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def recorder(pytestconfig: pytest.Config) -> CellRecorder:
    run, state, versions = pytestconfig.stash[RUN]
    return CellRecorder(
        Path(pytestconfig.getoption("--results")),
        run,
        versions,
        state=state,
        expected_cells={cell.id for cell in pytestconfig.stash[CELLS]},
        faults=tuple(pytestconfig.getoption("--inject-fault")),
    )


def pytest_terminal_summary(terminalreporter: TerminalReporter, config: pytest.Config) -> None:
    if RUN not in config.stash or hasattr(config, "workerinput"):
        return
    from suites.run.driver import CacheContents  # lazily: torch, after the fork server started

    if CACHE_AT_START in config.stash and (written := CacheContents.now().written_since(config.stash[CACHE_AT_START])):
        terminalreporter.write_line(written)
    if LIVE_RUN in config.stash:  # the run's cells are done: its cache is pruned to its limit, other live runs kept
        config.stash[LIVE_RUN].close()
        if RUN_PRUNING in config.stash and (during := config.stash[RUN_PRUNING].line()):
            terminalreporter.write_line(during)
        if pruned := prune().line():
            terminalreporter.write_line(pruned)
    run_id = config.stash[RUN][0].id
    records = [r for r in read_records(Path(config.getoption("--results"))) if r["run"]["id"] == run_id]
    if records:
        print_summary(records, terminalreporter)
    for line in cells_without_record(config.stash[CELLS], records):
        terminalreporter.write_line(line, yellow=True)

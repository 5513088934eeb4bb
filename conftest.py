"""pytest wiring for the AutoTP suites: command-line selection of cells, one rank-group pool per
session, a record per cell in results/, and a summary table at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from matrix.cells import expand
from matrix.registry import MODELS_FILE, RegistryError

SUITE_DIR = Path(__file__).resolve().parent / "suites"


def pytest_addoption(parser):
    group = parser.getgroup("autotp", "AutoTP matrix cells")
    group.addoption("--models", default="all", help="comma-separated model names from matrix/models.toml, or 'all'")
    group.addoption("--models-file", default=str(MODELS_FILE), help="model registry to read (default: matrix/models.toml)")
    group.addoption("--variants", default="eager", help="comma-separated variants from matrix/variants.toml, or 'all'")
    group.addoption("--dtypes", default="fp32", help="comma-separated dtypes: fp32, bf16, fp16")
    group.addoption("--tp", default="2,3,4", help="comma-separated tensor-parallel sizes")
    group.addoption("--checkpoints", default="tiny", choices=("tiny", "hub"),
                    help="tiny random checkpoints (any CPU) or the registry's real hub ids (GPU runners)")
    group.addoption("--allow-remote-code", action="store_true", help="allow models that need trust_remote_code")
    group.addoption("--cell-timeout", type=float, default=180.0, help="seconds a cell may take before its rank group is killed")
    group.addoption("--results", default="results", help="folder for cells.jsonl, junit/ and repro scripts")
    group.addoption("--session-name", default=os.environ.get("NOX_SESSION_NAME", "local"), help="name recorded with every cell")
    group.addoption("--no-resume", action="store_true",
                    help="start afresh even when the results folder holds an interrupted run of this session")
    group.addoption("--repro", action="store_true", help="also write a standalone repro_<cell>.py per cell into the results folder")
    group.addoption("--inject-fault", action="append", default=[], metavar="MODULE:FUNCTION",
                    help="harness self-test only: call this fault hook on every rank at each stage")


CELLS = pytest.StashKey[list]()


def pytest_configure(config):
    option = config.getoption
    try:  # a bad selection is a usage error (exit 4, one clear line), not a collection crash
        config.stash[CELLS] = expand(option("--models"), option("--variants"), option("--dtypes"), option("--tp"),
                                     Path(option("--models-file")))
    except RegistryError as error:
        raise pytest.UsageError(str(error)) from None
    if getattr(config.option, "xmlpath", None) is None and _runs_suites(config):
        config.option.xmlpath = str(Path(option("--results")) / "junit" / f"{option('--session-name')}.xml")


def _runs_suites(config) -> bool:
    return any(Path(arg.split("::")[0]).resolve().is_relative_to(SUITE_DIR) for arg in config.args)


def pytest_generate_tests(metafunc):
    if "cell" not in metafunc.fixturenames:
        return
    cells = metafunc.config.stash[CELLS]
    metafunc.parametrize("cell", cells, ids=[cell.id for cell in cells])


@pytest.fixture(scope="session")
def run_options(pytestconfig):
    from suites.driver import RunOptions

    option = pytestconfig.getoption
    return RunOptions(checkpoints=option("--checkpoints"), allow_remote_code=option("--allow-remote-code"),
                      cell_timeout=option("--cell-timeout"), faults=tuple(option("--inject-fault")))


@pytest.fixture(scope="session")
def rank_pool():
    from suites.rank_group import RankGroupPool

    pool = RankGroupPool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def recorder(pytestconfig):
    from suites.records import CellRecorder, RunInfo, installed_versions

    option = pytestconfig.getoption
    selection = {name: option(f"--{name}") for name in ("models", "variants", "dtypes", "tp", "checkpoints")}
    recorder = CellRecorder(Path(option("--results")), RunInfo(option("--session-name")), installed_versions(),
                            selection, expected_cells={cell.id for cell in pytestconfig.stash[CELLS]},
                            resume=not option("--no-resume"))
    pytestconfig.stash[RECORDS] = recorder.records
    return recorder


RECORDS = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, config):
    records = config.stash.get(RECORDS, None)
    if records:
        from suites.summary import print_summary

        print_summary(records, terminalreporter)

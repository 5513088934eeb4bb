"""The AutoTP cells: each one runs a model sharded over `tp` ranks against its unsharded reference.

Select cells with --models/--variants/--dtypes/--tp (see `pytest --help`, section "autotp").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from suites.records.repro import write_repro
from suites.records.run_records import RecordNotWritten
from suites.run.driver import run_cell

if TYPE_CHECKING:
    from matrix.cells import Cell
    from suites.engine.rank_group import RankGroupPool
    from suites.records.run_records import CellRecorder, RecordProperty
    from suites.run.ahead import RunAhead
    from suites.run.driver import RunOptions


def test_cell(
    cell: Cell,
    rank_pool: RankGroupPool,
    run_options: RunOptions,
    run_ahead: RunAhead | None,
    recorder: CellRecorder,
    record_property: RecordProperty,
    pytestconfig: pytest.Config,
) -> None:
    record = recorder.replay(cell.id, record_property)  # finished before this run was interrupted
    if record is None:
        outcome = run_cell(cell, rank_pool, run_options, run_ahead)
        try:
            record = recorder.record(cell, outcome, record_property)
        except RecordNotWritten as error:  # the end of the run lists the cells without a record
            pytest.fail(str(error), pytrace=False)
    if pytestconfig.getoption("--repro"):
        verdict = f"{record['outcome']} {record['failure_class']} {record['signature']}".strip()
        record["repro"] = str(
            write_repro(
                cell,
                run_options.checkpoints,
                Path(pytestconfig.getoption("--results")) / "repro",
                run=recorder.run,
                versions=recorder.versions,
                outcome_line=verdict,
                loaded_revision=record.get("checkpoint", {}).get("revision"),
                ran_here=True,
            )
        )
    if record["outcome"] in ("skip", "unsupported"):  # JUnit's skipped; its `outcome` property keeps which
        pytest.skip(record["message"])
    if record["outcome"] == "fail":
        pytest.fail(f"{record['failure_class']}: {record['signature']}\n{record['message']}", pytrace=False)

"""The AutoTP cells: each one runs a model sharded over `tp` ranks against its unsharded reference.

Select cells with --models/--variants/--dtypes/--tp (see `pytest --help`, section "autotp").
"""

from pathlib import Path

import pytest

from suites.driver import run_cell
from suites.records.repro import write_repro


def test_cell(cell, rank_pool, run_options, recorder, record_property, pytestconfig):
    record = recorder.replay(cell.id, record_property)  # finished before this run was interrupted
    if record is None:
        outcome = run_cell(cell, rank_pool, run_options)
        record = recorder.record(cell, outcome, record_property)
    if pytestconfig.getoption("--repro"):
        verdict = f"{record['outcome']} {record['failure_class']} {record['signature']}".strip()
        record["repro"] = str(
            write_repro(
                cell,
                run_options.checkpoints,
                Path(pytestconfig.getoption("--results")) / "repro",
                recorder.run,
                recorder.versions,
                verdict,
                record.get("checkpoint", {}).get("revision"),
            )
        )
    if record["outcome"] == "skip":
        pytest.skip(record["message"])
    if record["outcome"] == "fail":
        pytest.fail(f"{record['failure_class']}: {record['signature']}\n{record['message']}", pytrace=False)

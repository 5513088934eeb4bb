"""The AutoTP cells: each one runs a model sharded over `tp` ranks against its unsharded reference.

Select cells with --models/--variants/--dtypes/--tp (see `pytest --help`, section "autotp").
"""

import pytest

from suites.driver import run_cell


def test_cell(cell, rank_pool, run_options, recorder, record_property):
    outcome = run_cell(cell, rank_pool, run_options)
    if rank_pool.group is not None:
        recorder.run.accelerator = rank_pool.group.info.get("accelerator", "")
        recorder.run.backend = rank_pool.group.info.get("backend", "")
    record = recorder.record(cell, outcome, record_property)
    if outcome.outcome == "skip":
        pytest.skip(record["message"])
    if outcome.outcome == "fail":
        pytest.fail(f"{record['failure_class']}: {record['signature']}\n{record['message']}", pytrace=False)

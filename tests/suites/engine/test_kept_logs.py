"""Every failing cell keeps the end of its ranks' logs under results/logs/<cell>/, whether or not its rank group ended
(issue #44): the part of the logs the cell wrote, not what the cells before it in the same group wrote."""

import pytest

from matrix.cells import expand
from suites.engine.rank_group import KEPT_LOG_LINES, RankGroupPool
from suites.run.driver import RunOptions, run_cell
from suites.verdicts.outcome import failed

pytestmark = pytest.mark.autotp


def run_with(cell, pool, fault):
    return run_cell(cell, pool, RunOptions(cell_timeout=120.0, faults=(f"tests.faults:{fault}",)))


def test_a_failing_cell_in_a_group_that_lives_on_keeps_its_part_of_the_rank_logs(rank_pool, tmp_path):
    rank_pool.close()  # one live group at a time: this test starts a pool (and fork server) of its own
    pool = RankGroupPool(results=tmp_path)
    (cell,) = expand("llama", tp="2")
    try:
        passed = run_with(cell, pool, "announce_a_passing_cell")
        failing = run_with(cell, pool, "announce_and_raise_in_forward")
        launches, alive = pool.launches, pool.group is not None and pool.group.alive
    finally:
        pool.close()
    assert passed.outcome == "pass" and passed.logs == "", passed.message  # a passing cell keeps nothing
    assert (failing.outcome, failing.failure_class) == ("fail", "forward"), failing.message
    assert launches == 1 and alive  # the group lived on: before #44 its logs were not kept at all
    kept = tmp_path / "logs" / cell.id
    assert failing.logs == f"logs/{cell.id}/" and f"logs: logs/{cell.id}/" in failing.message  # the results' name
    for rank in (0, 1):
        log = (kept / f"rank{rank}.log").read_text()
        assert "the failing cell ran here" in log
        assert "a passing cell ran here" not in log  # the earlier cell's part of the same log is not its
        assert len(log.splitlines()) <= KEPT_LOG_LINES


def test_a_cell_whose_setup_failed_keeps_the_drivers_account_of_it(tmp_path):
    pool = RankGroupPool(results=tmp_path, launcher="deepspeed")  # starts no process until a cell runs
    try:
        outcome = pool.keep_text(
            "llama-eager-fp32-tp2",
            failed("setup", "ReferenceFailed: x", "the reference process died; log /tmp/r.log:\nTraceback ..."),
            "setup.log",
            "the reference process died; log /tmp/r.log:\nTraceback ...",
        )
    finally:
        pool.close()
    kept = tmp_path / "logs" / "llama-eager-fp32-tp2"
    assert outcome.logs == "logs/llama-eager-fp32-tp2/"  # relative to the results folder: no host path
    assert (kept / "setup.log").read_text() == "the reference process died; log /tmp/r.log:\nTraceback ...\n"

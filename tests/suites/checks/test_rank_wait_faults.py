"""Every way an oversubscribing rank may wait (suites/engine/rank_waits.py, picked by AUTOTP_RANK_WAIT) changes when a
rank runs, never what a cell computes or how it is judged: under each, a tp 3 group on this 2-core machine computes
the same numbers as under the default, and injected faults still turn its cells red with their classes (a no-op
all-reduce, a hung rank, a group-killing raise).

The control `spin` here (the default's naps are exercised by every tp 3 and 4 cell of the suite): its group costs a
start, a timeout and a restart (~40 s under load)."""

import os
from pathlib import Path

import pytest

from matrix.cells import expand
from suites.engine.rank_group import RankGroupPool
from suites.engine.rank_waits import DEFAULT_WAIT, RANK_WAIT_ENV, WAIT_STRATEGIES
from suites.run.driver import RunOptions, run_cell

pytestmark = pytest.mark.autotp

DEFAULT = WAIT_STRATEGIES[DEFAULT_WAIT]
OTHER_MECHANISMS = [
    name
    for name, strategy in WAIT_STRATEGIES.items()
    if (strategy.period_seconds is None) != (DEFAULT.period_seconds is None)
]
COMPARED = ("logits_max_abs", "gen_logits_max_abs", "ppl_tp", "rank_param_bytes_max", "rank_logits_spread")


@pytest.fixture(scope="module")
def llama_tp3():
    return expand("llama.faithful", "eager", "fp32", "3")[0]  # passes at tp 3 (the tiny llama fails memory there)


def run_with(cell, pool, fault=None, timeout=120.0):
    options = RunOptions(cell_timeout=timeout, faults=(f"tests.faults:{fault}",) if fault else ())
    return run_cell(cell, pool, options)


@pytest.fixture(scope="module")
def default_outcome(rank_pool, llama_tp3):
    outcome = run_with(llama_tp3, rank_pool)
    assert outcome.outcome == "pass", outcome.message
    return outcome


@pytest.mark.parametrize("strategy", OTHER_MECHANISMS)
def test_each_rank_wait_strategy_computes_the_same_and_its_faults_turn_cells_red(
    strategy, llama_tp3, default_outcome, monkeypatch
):
    assert len(os.sched_getaffinity(0)) < 3, "a tp 3 group must oversubscribe this machine for its ranks to nap"
    monkeypatch.setenv(RANK_WAIT_ENV, strategy)
    pool = RankGroupPool()  # its fork server, and every rank it forks, reads the strategy from this environment
    try:
        healthy = run_with(llama_tp3, pool)
        assert pool.group is not None
        said = (Path(pool.group.workdir) / "rank0.log").read_text()
        naps = "never" if WAIT_STRATEGIES[strategy].period_seconds is None else "in each cell"
        assert f"rank wait strategy {strategy}: naps {naps}" in said, said[-2000:]
        assert healthy.outcome == "pass", healthy.message
        assert {m: healthy.metrics[m] for m in COMPARED} == {m: default_outcome.metrics[m] for m in COMPARED}
        noop = run_with(llama_tp3, pool, "noop_allreduce")
        assert (noop.outcome, noop.failure_class) == ("fail", "numerics"), noop.message
        group_killing = (("rank1_hangs", "timeout", 10.0), ("rank1_raises_in_forward", "forward", 30.0))
        for fault, failure_class, timeout in group_killing:
            launches = pool.launches
            outcome = run_with(llama_tp3, pool, fault, timeout=timeout)
            assert (outcome.outcome, outcome.failure_class) == ("fail", failure_class), (fault, outcome.message)
            after = run_with(llama_tp3, pool)
            assert after.outcome == "pass" and pool.launches == launches + 1, (fault, after.message)
    finally:
        pool.close()

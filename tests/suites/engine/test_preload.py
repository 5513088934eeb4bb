"""The fork server imports the run's modeling modules once, when the driver names the run's model types, before it
forks a group: every rank starts with them, instead of each rank importing its model's module at that model's first
cell (docs/findings.md "#58 where a warm cell's time goes")."""

import re

import pytest

from suites.engine.rank_group import RankGroupPool
from tests.suites.suites_testkit import never_loaded_job

pytestmark = pytest.mark.autotp


def test_ranks_start_with_the_preloaded_models_and_a_type_without_a_module_is_left_to_its_cell(
    rank_pool, monkeypatch, tmp_path
):
    rank_pool.close()  # one live group at a time: this test starts a pool (and fork server) of its own
    monkeypatch.setenv("AUTOTP_STARTUP_FAULT", "tests.faults:rank1_names_its_modeling_modules_at_start")
    pool = RankGroupPool(results=tmp_path)
    pool.preload(["gpt_neox", "no_such_model_type"])
    cell, job = never_loaded_job()
    try:  # rank 1 raises at its start, naming what it started with: no cell runs
        outcome = pool.run(2, job, timeout=60.0)
    finally:
        pool.close()
    named = re.search(r"RuntimeError: injected: started with (.*)", outcome.message)
    assert named, outcome.message  # the server forked the group after both preloads
    started_with = named.group(1).split()
    assert "transformers.models.gpt_neox.modeling_gpt_neox" in started_with
    assert "transformers.models.opt.modeling_opt" not in started_with  # only what the run names

"""Rank logs copied into results/logs/<cell>/ (uploaded as CI artifacts) carry no secret: a rank that prints
credentials — token shapes and the value of a credential-like environment variable — then dies has its logs kept,
redacted."""

import pytest

from suites.engine.rank_group import RankGroupPool
from tests import planted_secrets
from tests.suites.suites_testkit import never_loaded_job

pytestmark = pytest.mark.autotp


def test_kept_rank_logs_are_redacted(rank_pool, monkeypatch, tmp_path):
    rank_pool.close()  # one live group at a time: this test starts a pool (and fork server) of its own
    monkeypatch.setenv("AUTOTP_STARTUP_FAULT", "tests.faults:rank1_logs_secrets_at_start")
    monkeypatch.setenv(planted_secrets.SECRET_ENV, planted_secrets.SECRET_VALUE)  # the ranks inherit it
    pool = RankGroupPool(results=tmp_path)
    cell, job = never_loaded_job()
    try:  # the group fails to start, so no cell runs: no checkpoint or reference is needed
        outcome = pool.run(2, job, timeout=60.0)
    finally:
        pool.close()
    assert outcome.outcome == "fail", outcome.message  # its class is test_faults.py's business
    kept = tmp_path / "logs" / "llama-eager-fp32-tp2"
    rank_log = (kept / "rank1.log").read_bytes()
    assert b"injected harness failure after logging secrets" in rank_log  # the log that held them was kept
    assert b"Bearer ***" in rank_log
    for log in kept.iterdir():
        assert planted_secrets.leaks(log.read_bytes()) == [], log.name

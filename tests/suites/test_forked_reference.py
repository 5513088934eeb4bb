"""A reference computed in a child of the fork server (CPU runs): a process of its own that holds no process group
and none of the ranks' variables, whose reference file is byte for byte the one the reference process writes, and
whose death is the reference process's `setup` failure."""

from __future__ import annotations

import io
import json

import pytest
import torch
from suites_testkit import live_processes_named

from matrix.cells import expand
from matrix.checkpoints import Checkpoint, resolve_checkpoint
from suites.checks.inputs import ProbeSpec
from suites.engine.fork_server import DISTRIBUTED_VARIABLES, REFERENCE_PROCESS_NAME, ForkServer
from suites.engine.rank_group import launch_environment
from suites.reference.cache import cached_reference
from suites.reference.checkpoint_sizes import checkpoint_size
from suites.reference.memory_plan import ReferencePlan, Runner, plan_reference
from suites.reference.unsharded import ReferenceFailed, compute_reference
from suites.variants.loading import ContaminatedProcessError

pytestmark = pytest.mark.autotp  # starts a fork server (its imports: ~10-20 s here)

RANK_VARIABLES = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_SIZE": "2",
    "CROSS_RANK": "0",
    "CROSS_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29512",
}


@pytest.fixture
def fork_server_with(monkeypatch, tmp_path):
    """A fork server started in an environment that has the ranks' variables (as a driver inside a launcher would
    give it) and a start-up fault hook; closed after the test."""
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    servers = []

    def start(hook: str, **variables: str) -> ForkServer:
        server = ForkServer({**launch_environment(), **RANK_VARIABLES, "AUTOTP_STARTUP_FAULT": hook, **variables})
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def _plan(checkpoint: Checkpoint, dtype: str) -> ReferencePlan:
    return plan_reference(checkpoint_size(checkpoint.folder), dtype, Runner.detect())


def test_a_forked_reference_is_isolated_and_the_reference_process_s_byte_for_byte(fork_server_with, tmp_path):
    assert set(RANK_VARIABLES) == set(DISTRIBUTED_VARIABLES)
    isolation = tmp_path / "isolation.json"
    server = fork_server_with("tests.faults:reference_reports_isolation", AUTOTP_TEST_ISOLATION_FILE=str(isolation))
    for model in ("llama", "gpt2"):
        checkpoint = resolve_checkpoint(expand(model, tp="2")[0].model, "tiny")
        for dtype in ("fp32", "bf16"):
            plan = _plan(checkpoint, dtype)
            forked = cached_reference(checkpoint, dtype, ProbeSpec(), plan=plan, fork_server=server)
            forked_bytes = _untimed_bytes(forked)
            assert json.loads(isolation.read_text()) == {"process_group": False, "variables": []}
            isolation.unlink()
            forked.unlink()
            fresh = cached_reference(checkpoint, dtype, ProbeSpec(), plan=plan)  # the reference process, a fresh python
            assert fresh == forked and _untimed_bytes(fresh) == forked_bytes, (model, dtype)


def _untimed_bytes(path) -> bytes:
    """The reference file's bytes but for the one figure no two processes share, the forward's wall time."""
    observations = torch.load(path, weights_only=False)
    assert observations["forward_seconds"] > 0
    observations["forward_seconds"] = 0.0
    saved = io.BytesIO()
    torch.save(observations, saved)
    return saved.getvalue()


def test_a_forked_reference_s_process_has_ended_when_its_answer_returns(fork_server_with):
    """The driver goes on to the cell's ranks only once the reference's process is gone: the memory plan counts its
    memory free by then, and its exit beside the ranks' busy-waiting all-reduce slowed their cell."""
    server = fork_server_with("")
    checkpoint = resolve_checkpoint(expand("llama", tp="2")[0].model, "tiny")
    for dtype in ("fp32", "bf16"):
        cached_reference(checkpoint, dtype, ProbeSpec(), plan=_plan(checkpoint, dtype), fork_server=server)
        assert live_processes_named(REFERENCE_PROCESS_NAME) == [], dtype


def test_a_forked_reference_that_is_killed_is_the_reference_process_s_death(fork_server_with):
    server = fork_server_with("tests.faults:reference_killed")
    checkpoint = resolve_checkpoint(expand("llama", tp="2")[0].model, "tiny")
    with pytest.raises(ReferenceFailed) as failed:
        cached_reference(checkpoint, "fp32", ProbeSpec(), plan=_plan(checkpoint, "fp32"), fork_server=server)
    assert failed.value.signature == "ReferenceProcessDied: the reference process exited without an answer"
    assert "exit code -9" in str(failed.value)


def test_a_reference_is_refused_in_a_process_with_a_process_group(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(ContaminatedProcessError, match="process group"):
            compute_reference("unused", None, "fp32", ProbeSpec())
    finally:
        torch.distributed.destroy_process_group()

"""Every check can fail: real faults injected into real rank processes must be reported with the
right failure class, and a killed or hung group must not lose the next cell.

One rank group serves the faults that leave it healthy; the ones that kill or hang it come last
and each costs a relaunch (~1 s forked from the server here, ~8 s through DeepSpeed's launcher).
"""

import os
import signal
from pathlib import Path

import pytest

from matrix.cells import expand
from matrix.registry import DEFAULT_TOLERANCES, EPSILON
from suites.engine.rank_group import RankGroupPool
from suites.run.driver import RunOptions, run_cell

pytestmark = pytest.mark.autotp


@pytest.fixture
def pool(rank_pool):
    return rank_pool  # the session's shared pool (conftest.py): tests reuse its live rank group


@pytest.fixture(scope="module")
def llama_tp2():
    return expand("llama", tp="2")[0]


def run_with(cell, pool, fault=None, timeout=120.0):
    options = RunOptions(cell_timeout=timeout, faults=(f"tests.faults:{fault}",) if fault else ())
    return run_cell(cell, pool, options)


def test_healthy_cell_passes_and_is_reproducible_after_faults(pool, llama_tp2):
    first = run_with(llama_tp2, pool)
    launches = pool.launches
    assert first.outcome == "pass", first.message
    assert first.metrics["logits_max_abs"] < 1e-5
    # each stage's CPU seconds, summed over the ranks: what a stage costs where wall seconds do not tell
    stages = sum(first.metrics[f"cpu_{stage}_s"] for stage in ("load", "shard", "forward"))
    assert 0 < first.metrics["cpu_forward_s"] and stages <= first.metrics["cpu_cell_s"]
    # Run the faults that keep the group alive, then the same cell again: a harness whose state
    # leaked between cells (or whose reference came from a sharded process) would not repeat itself.
    for fault in (
        "noop_allreduce",
        "wrong_shard",
        "break_before_shard",
        "raise_in_forward",
        "harness_bug_in_generation_probe",
        "harness_bug_in_logits_check",
    ):
        run_with(llama_tp2, pool, fault)
    again = run_with(llama_tp2, pool)
    assert pool.launches == launches
    assert again.outcome == "pass"
    for metric in ("logits_max_abs", "gen_logits_max_abs", "ppl_tp", "rank_param_bytes_max"):
        assert again.metrics[metric] == first.metrics[metric], metric


@pytest.mark.parametrize(
    "fault, failure_class, signature_start",
    [
        ("noop_allreduce", "numerics", "logits:"),
        ("wrong_shard", "numerics", "logits:"),
        ("perturb_rank_logits", "numerics", "ranks_agree:"),
        ("rank1_nan_logits", "numerics", "ranks_agree:"),
        ("corrupt_decode_steps", "generation", "generation:"),
        ("corrupt_batched_decode_steps", "generation", "generation: batched decoding row"),
        ("half_vocabulary_logits", "numerics", "shapes: sharded outputs have the wrong shape"),
        ("corrupt_loss", "numerics", "perplexity:"),
        # library outputs the harness cannot read are the library's fault, named where they enter the harness
        ("decode_lm_head_not_gathered", "numerics", "shapes: generate returned decode-step logits of differing shapes"),
        ("overflowing_loss", "numerics", "perplexity: perplexity inf vs reference"),
        ("skip_sharding", "memory", "memory:"),
        ("break_before_shard", "shard", ""),
        ("raise_in_forward", "forward", "RuntimeError: injected forward failure at layer N"),
        # the same stage, but the harness's own code raises: its bug, never DeepSpeed's
        (
            "harness_bug_in_generation_probe",
            "setup",
            "TypeError: 'NoneType' object is not callable @ suites/checks/probes.py:observe",
        ),
    ],
)
def test_fault_is_reported_with_its_class(pool, llama_tp2, fault, failure_class, signature_start):
    outcome = run_with(llama_tp2, pool, fault)
    assert (outcome.outcome, outcome.failure_class) == ("fail", failure_class), outcome.message
    assert outcome.signature.startswith(signature_start), outcome.signature


def test_a_harness_bug_while_judging_is_setup_named_by_its_frame(pool, llama_tp2):
    """Rank 0 judges the cell after every stage passed: a check that raises is the harness's bug (cell_runner's
    judging `except`), never a rank's `crash` nor the model's `forward`, and is named by the harness's frame."""
    outcome = run_with(llama_tp2, pool, "harness_bug_in_logits_check")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "setup"), outcome.message
    assert outcome.signature == "TypeError: 'NoneType' object is not callable @ suites/checks/logits.py:check"
    assert "judging the cell failed (harness bug)" in outcome.message, outcome.message


@pytest.mark.parametrize(
    "model, fault, failure_class, signature_start",
    [
        ("gpt_neox", "row_parallel_bias_on_every_rank", "numerics", "logits:"),
        ("qwen2", "column_parallel_bias_of_rank0_everywhere", "numerics", "logits:"),
        ("llama", "rank1_permuted_norm_weights", "numerics", "logits:"),
        ("llama", "nan_decode_logits", "generation", "generation:"),
    ],
)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bug_classes_hidden_by_constant_weights_are_reported(pool, model, fault, failure_class, signature_start, dtype):
    """Biases at 0 and norm weights at 1 (transformers' init) made these bugs compute the right numbers;
    tiny checkpoints now randomise every constant parameter (matrix/checkpoints.py). In bf16 too: its
    tolerance (matrix/registry.py) must stay below the size of a real bug."""
    cell = expand(model, dtypes=dtype, tp="2")[0]
    assert run_with(cell, pool).outcome == "pass"
    outcome = run_with(cell, pool, fault)
    assert (outcome.outcome, outcome.failure_class) == ("fail", failure_class), outcome.message
    assert outcome.signature.startswith(signature_start), outcome.signature


@pytest.mark.parametrize(
    "tp, whole", [("2", "{q_proj,k_proj,v_proj,o_proj}"), ("3", "{q_proj,o_proj}")]
)  # 2 kv heads < tp 3: k/v whole by design
def test_attention_left_whole_fails_memory_with_the_layers_named(pool, tp, whole):
    """Attention is ~10 % of the tiny llama's linear bytes: the old bound on all linears together passed it."""
    outcome = run_with(expand("llama", tp=tp)[0], pool, "attention_left_whole")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "memory"), outcome.message
    assert outcome.signature == f"memory: linears left whole: model.layers.*.self_attn.{whole}"
    assert outcome.metrics["logits_max_abs"] < 1e-4  # the numbers stay right: only memory can see it


def test_a_deepspeed_that_leaves_lm_head_whole_fails_memory_on_a_faithful_llama(pool):
    """DeepSpeed >= 0.16.3 splits the output head (LmHeadLinearAllreduce; 0.12.0 with a checkpoint json): one that
    leaves it a plain nn.Linear, all [vocab, hidden] of it on every rank, computes the same numbers and only memory
    sees it."""
    cell = expand("llama.faithful", tp="2")[0]
    healthy = run_with(cell, pool)
    assert healthy.outcome == "pass", healthy.message
    outcome = run_with(cell, pool, "deepspeed_leaves_lm_head_whole")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "memory"), outcome.message
    assert outcome.signature == "memory: output head left whole: lm_head", outcome.signature
    assert "splits an nn.Linear lm_head as LmHeadLinearAllreduce" in outcome.message
    assert outcome.metrics["logits_max_abs"] < 1e-4  # the numbers stay right
    assert run_with(cell, pool).outcome == "pass"  # the planted DeepSpeed is gone for the next cell


def test_a_tied_output_head_is_a_note_when_copied_and_fails_memory_when_left_whole(pool):
    """Qwen3-0.6B ties its head to the embedding: DeepSpeed's LmHeadLinearAllreduce splits a clone and leaves the
    embedding whole, so each rank holds 1 + 1/tp of the tied weight (a pass, the note saying so in words, DeepSpeed's
    design its owner); one that leaves the head whole (and tied) fails memory like an untied one."""
    cell = expand("qwen3.faithful-qwen3-0-6b", tp="2")[0]
    assert cell.model.tiny["tie_word_embeddings"] is True
    healthy = run_with(cell, pool)
    assert healthy.outcome == "pass", healthy.message
    assert "output head tied to model.embed_tokens.weight split by a copy: rank 0 holds 1.50x" in healthy.message
    assert "runs correctly but saves less memory; DeepSpeed's design" in healthy.message
    outcome = run_with(cell, pool, "deepspeed_leaves_lm_head_whole")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "memory"), outcome.message
    assert outcome.signature == "memory: output head left whole: lm_head", outcome.signature


def test_a_renamed_layer_fails_memory_with_its_name(pool, llama_tp2):
    outcome = run_with(llama_tp2, pool, "rewrapped_mlp")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "memory"), outcome.message
    assert outcome.signature.startswith(
        "memory: tensors the unsharded model does not have: model.layers.*.mlp.inner."
    ), outcome.signature


def test_moe_experts_left_whole_fail_memory_with_the_kind_named(pool):
    """transformers >= 5 stores experts as fused 3-D parameters, which AutoTP (0.19.8) leaves whole on every
    rank: counting nn.Linear bytes only, mixtral passed at ~98 % of the model per rank."""
    outcome = run_with(expand("mixtral", tp="2")[0], pool)
    assert (outcome.outcome, outcome.failure_class) == ("fail", "memory"), outcome.message
    assert outcome.signature.startswith("memory: experts left whole: model.layers.*.mlp.experts."), outcome.signature
    assert outcome.metrics["expert_shard_ratio"] == 1.0


def test_a_drift_on_a_token_routed_alike_fails_while_the_flipped_token_is_left_out(pool):
    """qwen3_moe bf16 (stress shape): one prefill token's top-2 routing flips on a near-tie at tp 2, 3 and 4 and is left
    out of the logits comparison (the 9-ulp override it replaced widened every token); a drift just over the default
    bound on another token still fails `logits`."""
    cell = expand("qwen3_moe.stress", dtypes="bf16", tp="2")[0]
    bound = DEFAULT_TOLERANCES["bf16"].logits_rel
    assert cell.model.tolerance_for("bf16") == DEFAULT_TOLERANCES["bf16"]  # no override left
    healthy = run_with(cell, pool)
    # experts are left whole by DeepSpeed 0.19.8 (a memory finding judged after the numbers)
    assert (healthy.outcome, healthy.failure_class) == ("fail", "memory"), healthy.message
    assert healthy.metrics["routing_flipped_tokens"] == 1 and healthy.metrics["routing_flipped_logits_max_rel"] > bound
    assert healthy.metrics["logits_max_rel"] <= bound / 4
    assert "1 of 68 tokens whose expert routing flipped not compared" in healthy.message
    drifted = run_with(cell, pool, "drift_one_prefill_token")
    assert (drifted.outcome, drifted.failure_class) == ("fail", "numerics"), drifted.message
    assert drifted.signature.startswith("logits: prefill logits differ by"), drifted.signature
    assert bound < drifted.metrics["logits_max_rel"] < 9 * EPSILON["bf16"] + healthy.metrics["logits_max_rel"]


@pytest.mark.parametrize(
    "fault, failure_class, signature_part",
    [
        ("rank1_raises_in_forward", "forward", "injected forward failure"),
        ("rank1_hangs", "timeout", "no answer within"),
        ("rank1_sigkill", "crash", "SIGKILL"),
        ("rank1_dies_after_the_verdict", "crash", "SIGKILL"),
        ("rank1_segfault", "crash", "SIGSEGV"),
        ("rank1_exceeds_memory_limit", "forward", "can't allocate memory"),
    ],
)
def test_group_killing_fault_is_reported_and_the_next_cell_runs(pool, llama_tp2, fault, failure_class, signature_part):
    launches = pool.launches
    outcome = run_with(llama_tp2, pool, fault, timeout=30.0)
    assert (outcome.outcome, outcome.failure_class) == ("fail", failure_class), outcome.message
    assert signature_part in outcome.signature
    assert not list(Path("/dev/shm").glob(f"deepspeed_*_{pool.group.port}_*")), "killed group leaked /dev/shm buffers"
    after = run_with(llama_tp2, pool)
    assert after.outcome == "pass", after.message
    assert pool.launches == launches + 1


def test_a_rank_the_kernels_out_of_memory_killer_kills_says_so_and_what_to_do(pool, llama_tp2, monkeypatch):
    """A rank dies by a real SIGKILL mid-forward; the kernel's count of out-of-memory kills is the test's. While the
    count rises the crash names the OOM killer and says to rerun the cell alone (seen: a training cell killed while the
    tests ran beside the matrix read as a bare SIGKILL); while it stays, the same death is a bare SIGKILL."""
    from suites.engine import oom_kills

    counts = iter(range(1000))  # one more kill at every read
    monkeypatch.setattr(oom_kills, "kernel_oom_kills", lambda: next(counts))
    killed = run_with(llama_tp2, pool, "rank1_sigkill", timeout=30.0)
    assert (killed.failure_class, killed.signature) == (
        "crash",
        "rank died: SIGKILL by the kernel's out-of-memory killer",
    ), killed.message
    assert "memory ran out, the host's or its container's limit" in killed.message
    assert "rerun the cell alone" in killed.message
    monkeypatch.setattr(oom_kills, "kernel_oom_kills", lambda: 7)
    bare = run_with(llama_tp2, pool, "rank1_sigkill", timeout=30.0)
    assert (bare.failure_class, bare.signature) == ("crash", "rank died: SIGKILL"), bare.message
    assert run_with(llama_tp2, pool).outcome == "pass"


def test_a_dead_fork_server_is_started_again(pool, llama_tp2):
    assert run_with(llama_tp2, pool).outcome == "pass"
    assert pool.fork_server is not None, "CPU groups are forked from the server (suites/engine/fork_server.py)"
    os.killpg(pool.fork_server.process.pid, signal.SIGKILL)
    pool.group.kill()
    after = run_with(llama_tp2, pool)
    assert after.outcome == "pass", after.message


@pytest.mark.parametrize(
    "fault, failure_class, signature_part, log_name, logged",
    [
        (
            "server_import_fails",
            "setup",
            "ModuleNotFoundError: import of transformers.generation.utils halted",
            "fork-server.log",
            "transformers.generation.utils",
        ),
        (
            "rank1_harness_raises_at_start",
            "setup",
            "RegistryError: 'injected harness failure in rank setup' is not a cell id",
            "rank1.log",
            "injected harness failure",
        ),
        (
            "rank1_torch_raises_at_start",
            "crash",
            "ValueError: Default process group has not been initialized",
            "rank1.log",
            "Default process group has not been initialized",
        ),
        ("rank1_sigkill_at_start", "crash", "rank died: SIGKILL", "launcher.log", "exits with return code = -9"),
    ],
)
def test_a_group_that_cannot_start_is_reported_as_whose_fault_it_is_with_its_logs_kept(
    rank_pool, llama_tp2, monkeypatch, tmp_path, fault, failure_class, signature_part, log_name, logged
):
    rank_pool.close()  # one live group at a time: this test starts a pool (and fork server) of its own
    monkeypatch.setenv("AUTOTP_STARTUP_FAULT", f"tests.faults:{fault}")
    pool = RankGroupPool(results=tmp_path)
    try:
        outcome = run_with(llama_tp2, pool, timeout=60.0)
    finally:
        pool.close()  # deletes the fork server's and the group's temporary folders
    assert (outcome.outcome, outcome.failure_class) == ("fail", failure_class), outcome.message
    assert signature_part in outcome.signature
    kept = tmp_path / "logs" / llama_tp2.id
    assert outcome.logs == f"logs/{llama_tp2.id}/" and f"logs: logs/{llama_tp2.id}/" in outcome.message
    assert logged in (kept / log_name).read_text(), f"{log_name} was not kept"


def test_groups_started_by_deepspeeds_launcher_report_the_same_verdicts(llama_tp2):
    """The launcher path accelerators use (a CUDA process cannot be forked into CUDA ranks)."""
    launcher_pool = RankGroupPool(launcher="deepspeed")
    try:
        assert launcher_pool.fork_server is None
        assert run_with(llama_tp2, launcher_pool).outcome == "pass"
        crashed = run_with(llama_tp2, launcher_pool, "rank1_segfault", timeout=60.0)
        assert (crashed.failure_class, crashed.signature) == ("crash", "rank died: SIGSEGV"), crashed.message
        assert run_with(llama_tp2, launcher_pool).outcome == "pass"
        assert launcher_pool.launches == 2
    finally:
        launcher_pool.close()

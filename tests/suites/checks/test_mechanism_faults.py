"""What AutoTP did and where it broke, diagnosed by name in real ranks: tensors planted next to a split and left
whole by AutoTP, a kv-unit split with one kv head, and a library numerics fault located at the first module whose
output diverges from the unsharded model's (suites/checks/sharding.py, suites/checks/breakpoints.py,
suites/verdicts/mechanism.py)."""

import pytest

from matrix.cells import expand
from suites.run.driver import RunOptions, run_cell

pytestmark = pytest.mark.autotp


@pytest.fixture(scope="module")
def llama_tp2():
    return expand("llama", tp="2")[0]


def run_with(cell, pool, fault):
    return run_cell(cell, pool, RunOptions(cell_timeout=120.0, faults=(f"tests.faults:{fault}",)))


def test_a_healthy_cell_records_what_autotp_did(rank_pool, llama_tp2):
    outcome = run_cell(llama_tp2, rank_pool, RunOptions(cell_timeout=120.0))
    assert outcome.outcome == "pass", outcome.message
    record = outcome.autotp
    assert record is not None and record.complete
    assert [(p.layer_class, p.allreduce) for p in record.policies] == [
        ("LlamaDecoderLayer", ("mlp.down_proj", "self_attn.o_proj"))
    ]
    replaced = {r.path: r.layer_class for r in record.replaced}
    assert replaced["model.layers.*.self_attn.q_proj"] == "LinearLayer"
    assert replaced["model.layers.*.self_attn.o_proj"] == "LinearAllreduce"
    assert record.left_whole == () and record.unparsed == ()
    assert outcome.cause is None and outcome.broke_at is None


def test_a_norm_over_a_split_width_is_named_where_it_broke(rank_pool, llama_tp2):
    outcome = run_with(llama_tp2, rank_pool, "planted_norm_over_split_width")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "forward"), outcome.message
    assert [(w.tensor, w.kind, w.beside, w.over) for w in outcome.autotp.left_whole] == [
        ("model.layers.*.self_attn.planted_norm.weight", "norm", "model.layers.*.self_attn.q_proj", "width")
    ]
    assert (outcome.broke_at.path, outcome.broke_at.module_class) == (
        "model.layers.0.self_attn.planted_norm",
        "RMSNorm",
    )
    assert outcome.cause.mechanism_key == "left whole|norm"
    assert outcome.cause.words.startswith("`self_attn.planted_norm.weight` (width of the split `self_attn.q_proj`, 96)")
    assert "raised in `model.layers.0.self_attn.planted_norm` (RMSNorm)" in outcome.message


def test_a_per_head_buffer_left_whole_is_named(rank_pool, llama_tp2):
    outcome = run_with(llama_tp2, rank_pool, "planted_per_head_buffer")
    assert (outcome.outcome, outcome.failure_class) == ("fail", "forward"), outcome.message
    assert outcome.broke_at.path == "model.layers.0.self_attn.q_proj"
    assert (outcome.broke_at.module_class, outcome.broke_at.layer_class) == ("Linear", "LinearLayer")
    assert outcome.cause.mechanism_key == "left whole|per-head"
    assert "`self_attn.head_scale` (heads of the split `self_attn.q_proj`, 6) left whole" in outcome.cause.words


def test_a_kv_unit_split_with_one_kv_head_is_named(rank_pool, llama_tp2):
    """Rank 0 gets every query head and rank 1 none: whether that crashes rank 1's attention or only wastes it,
    the cause names the split."""
    outcome = run_with(llama_tp2, rank_pool, "planted_one_kv_head")
    assert outcome.outcome == "fail", outcome.message
    assert outcome.autotp.kv_heads == 1
    idle = outcome.failure_class == "memory"  # right numbers: the idle ranks DeepSpeed documents; else its bug
    assert outcome.cause.mechanism_key == f"kv-unit split|{'ranks idle' if idle else 'query heads starved'}", (
        outcome.cause
    )
    assert outcome.cause.whose == ("design-limit" if idle else "autotp"), outcome.cause
    assert "1 kv head < tp 2, so rank 1 holds no query head of `self_attn.q_proj`" in outcome.cause.words


@pytest.mark.parametrize(
    "fault, diverged, origin",
    [
        ("noop_allreduce", "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn"),
        ("noop_allreduce_in_second_mlp", "model.layers.1.mlp.down_proj", "model.layers.1.mlp"),
    ],
)
def test_a_library_numerics_fault_names_the_first_diverging_module(rank_pool, llama_tp2, fault, diverged, origin):
    outcome = run_with(llama_tp2, rank_pool, fault)
    assert (outcome.outcome, outcome.failure_class) == ("fail", "numerics"), outcome.message
    assert (outcome.broke_at.how, outcome.broke_at.path, outcome.broke_at.origin) == ("diverged", diverged, origin)
    assert outcome.broke_at.layer_class == "LinearAllreduce"
    assert outcome.message.startswith(f"first divergence at `{diverged}` (Linear, LinearAllreduce)")


def test_the_parser_is_asked_not_wrapped_so_a_refusal_traces_through_deepspeed_only(rank_pool):
    """jetmoe: DeepSpeed's parser refuses it from inside init_inference (its no-policy assert's message builds a
    kernel-injection policy that raises). The policy is read by asking the parser beforehand, never by wrapping it,
    so the trace from init_inference down is DeepSpeed's own frames, as a user running it alone sees them."""
    from deepspeed.module_inject.auto_tp import AutoTP

    from matrix.cells import parse_cell
    from reports.outputs.library_trace import library_trace

    parser = AutoTP.__dict__["tp_parser"]
    outcome = run_cell(parse_cell("jetmoe.faithful-eager-fp32-tp2"), rank_pool, RunOptions(cell_timeout=120.0))
    assert (outcome.outcome, outcome.failure_class) == ("fail", "shard"), outcome.message
    assert "Unsupported activation function: silu" in outcome.message
    assert (
        "suites/checks/sharding.py" not in outcome.message
        and "suites/" not in outcome.message.split("deepspeed/__init__.py", 1)[1]
    )
    trace = library_trace(outcome.message)
    assert trace[1].startswith('  File "deepspeed/__init__.py"') and not [line for line in trace if "suites/" in line]
    assert outcome.cause is not None and outcome.cause.mechanism_key.startswith("no policy|")
    assert outcome.autotp is not None and outcome.autotp.policies == () and not outcome.autotp.complete
    assert AutoTP.__dict__["tp_parser"] is parser  # this process's DeepSpeed untouched too

"""A parser miss planted in real ranks (a DeepSpeed whose parser leaves llama's `self_attn.o_proj` column-parallel,
tests/faults.py) is named by the policy inferred from the unsharded model (suites/checks/policy_inference.py), and
the `injection_policy` the inference yields remedies it (passed to init_inference through the cell's arguments)."""

from dataclasses import replace

import pytest

from matrix.cell_arguments import CellArguments
from matrix.cells import expand
from suites.run.driver import RunOptions, run_cell
from suites.verdicts.policy import injection_policy_candidate

pytestmark = pytest.mark.autotp

PLANTED = ("tests.faults:parser_misses_the_attention_output",)


@pytest.fixture(scope="module")
def llama_tp2():
    return expand("llama", tp="2")[0]


def test_a_healthy_cell_records_the_inferred_policy_and_no_disagreement(rank_pool, llama_tp2):
    outcome = run_cell(llama_tp2, rank_pool, RunOptions(cell_timeout=120.0))
    assert outcome.outcome == "pass", outcome.message
    record = outcome.autotp
    assert [(b.layer_class, b.writers) for b in record.inferred] == [
        ("LlamaDecoderLayer", ("self_attn.o_proj", "mlp.down_proj"))
    ]
    assert record.disagreements == () and record.inference_note == ""
    assert injection_policy_candidate(record.inferred, record.disagreements) is None


def test_a_planted_parser_miss_is_named_by_the_inferred_policy(rank_pool, llama_tp2):
    outcome = run_cell(llama_tp2, rank_pool, RunOptions(cell_timeout=120.0, faults=PLANTED))
    assert (outcome.outcome, outcome.failure_class) == ("fail", "forward"), outcome.message
    record = outcome.autotp
    assert [(p.layer_class, p.allreduce) for p in record.policies] == [("LlamaDecoderLayer", ("mlp.down_proj",))]
    assert [d.text for d in record.disagreements] == [
        "the parser made `self_attn.o_proj` column-parallel; it writes the residual"
    ]
    assert outcome.cause.mechanism_key == "policy|column-parallel:self_attn.o_proj"
    assert outcome.cause.words.startswith(
        "the parser made `self_attn.o_proj` column-parallel; it writes the residual; raised in "
        "`model.layers.0.self_attn.o_proj` (Linear, LinearLayer)"
    ), outcome.cause.words
    candidate = injection_policy_candidate(record.inferred, record.disagreements)
    assert candidate is not None
    assert candidate.blocks == (("LlamaDecoderLayer", ("self_attn.o_proj", "mlp.down_proj")),)

    remedied = replace(llama_tp2, arguments=candidate.arguments())
    outcome = run_cell(remedied, rank_pool, RunOptions(cell_timeout=120.0, faults=PLANTED))
    assert outcome.outcome == "pass", outcome.message  # the planted parser is still there: the policy bypasses it
    replaced = {r.path: r.layer_class for r in outcome.autotp.replaced}
    assert replaced["model.layers.*.self_attn.o_proj"] == "LinearAllreduce"
    assert outcome.autotp.disagreements == ()
    assert run_cell(llama_tp2, rank_pool, RunOptions(cell_timeout=120.0)).outcome == "pass"  # the planted parser gone


def test_a_wrong_injection_policy_is_named_as_the_one_passed(rank_pool, llama_tp2):
    """The same miss through a cell's own `injection_policy` (no planted parser): the split is the policy's."""
    wrong = CellArguments(injection_policy=(("LlamaDecoderLayer", ("mlp.down_proj",)),))
    outcome = run_cell(replace(llama_tp2, arguments=wrong), rank_pool, RunOptions(cell_timeout=120.0))
    assert outcome.outcome == "fail", outcome.message
    assert [d.text for d in outcome.autotp.disagreements] == [
        "the injection_policy made `self_attn.o_proj` column-parallel; it writes the residual"
    ]


def test_a_policy_inference_that_raises_is_a_note_on_the_cell_never_a_setup_failure(rank_pool, llama_tp2):
    """The inference's walk of the unsharded model and its comparison with what DeepSpeed made both raise (planted
    in the ranks): the healthy cell still passes, its record says why no policy was inferred or compared."""
    faults = ("tests.faults:policy_inference_raises",)
    outcome = run_cell(llama_tp2, rank_pool, RunOptions(cell_timeout=120.0, faults=faults))
    assert (outcome.outcome, outcome.failure_class) == ("pass", ""), outcome.message
    record = outcome.autotp
    assert (record.inferred, record.disagreements) == ((), ())
    raised = "RuntimeError: planted: the policy inference broke @ faults.py:broken"
    assert record.inference_note == f"policy not inferred: {raised}; policy not compared: {raised}"
    assert run_cell(llama_tp2, rank_pool, RunOptions(cell_timeout=120.0)).autotp.inferred  # restored for the next

"""A cell's own arguments (matrix/cell_arguments.py) reach the ranks' init_inference and the standalone script's:
an injection_policy naming the right row-parallel linears passes, one leaving out a row-parallel linear fails the
numbers (so it is what shards the model), an unknown block class is the harness's `setup` failure naming it."""

from dataclasses import replace

import pytest

from matrix.cell_arguments import CellArguments, UnknownBlockClassError, resolve_injection_policy
from matrix.cells import expand
from suites.run.driver import RunOptions, run_cell

LLAMA_ROWS = ("self_attn.o_proj", "mlp.down_proj")


def with_policy(cell, *blocks):
    return replace(cell, arguments=CellArguments(injection_policy=tuple(blocks)))


def test_an_unknown_block_class_is_refused_naming_the_model_classes():
    with pytest.raises(UnknownBlockClassError, match=r"\['CTRLBlock'\].*LlamaDecoderLayer"):
        resolve_injection_policy((("CTRLBlock", ("ffn.2",)),), {"LlamaDecoderLayer": object, "Linear": object})
    policy = CellArguments(injection_policy=(("EncoderLayer", ("multi_head_attention.dense", "ffn.2")),))
    assert policy.policy_text() == "{EncoderLayer: ('multi_head_attention.dense', 'ffn.2')}"
    assert not CellArguments() and policy


@pytest.mark.autotp
def test_the_policy_reaches_init_inference_in_the_ranks(rank_pool):
    llama = expand("llama", tp="2")[0]
    options = RunOptions(cell_timeout=180.0)
    right = run_cell(with_policy(llama, ("LlamaDecoderLayer", LLAMA_ROWS)), rank_pool, options)
    assert right.outcome == "pass", right.message
    assert [(p.layer_class, p.allreduce) for p in right.autotp.policies] == [
        ("LlamaDecoderLayer", tuple(sorted(LLAMA_ROWS)))
    ]
    # o_proj left column-parallel: each rank's attention output is a slice the next layer reads as the whole.
    short = run_cell(with_policy(llama, ("LlamaDecoderLayer", ("mlp.down_proj",))), rank_pool, options)
    assert (short.outcome, short.failure_class) in {("fail", "numerics"), ("fail", "forward")}, short.message
    unknown = run_cell(with_policy(llama, ("CTRLEncoderLayer", ("ffn.2",))), rank_pool, options)
    assert (unknown.outcome, unknown.failure_class) == ("fail", "setup"), unknown.message
    assert "CTRLEncoderLayer" in unknown.message and "LlamaDecoderLayer" in unknown.message


@pytest.mark.autotp
def test_the_mask_less_forward_gets_the_mask_asked_for(rank_pool):
    """`forward_mask = all-ones` gives bloom's mask-less forward a mask: without one, BloomModel builds ALiBi from
    every head (past DeepSpeed's head-sliced build_alibi_tensor) and the plain forward raises; with one that forward
    passes and the cell gets as far as generate, whose unpadded prefill drops the all-ones mask and raises the same
    (so the mask alone is no workaround at this transformers)."""
    bloom = expand("bloom.faithful", tp="2")[0]
    options = RunOptions(cell_timeout=180.0)
    bare = run_cell(bloom, rank_pool, options)
    assert bare.outcome == "fail" and "generation/utils.py" not in bare.message, bare.message
    masked = run_cell(replace(bloom, arguments=CellArguments(forward_mask="all-ones")), rank_pool, options)
    assert masked.outcome == "fail" and "generation/utils.py" in masked.message, masked.message


def test_the_script_passes_the_policy_to_its_init_inference(tmp_path, monkeypatch):
    from suites.records.repro import write_repro
    from suites.records.run_records import RunInfo

    cell = with_policy(expand("llama", tp="2")[0], ("LlamaDecoderLayer", LLAMA_ROWS))
    cell = replace(cell, arguments=replace(cell.arguments, model_kwargs=(("attn_implementation", "eager"),)))
    script = write_repro(
        cell, "tiny", tmp_path, run=RunInfo("unit"), versions={}, outcome_line="from the test"
    ).read_text()
    assert "'injection_policy': {'LlamaDecoderLayer': ['self_attn.o_proj', 'mlp.down_proj']}" in script
    assert "'model_kwargs': {'attn_implementation': 'eager'}" in script
    assert "injection_policy=injection_policy(model)," in script
    namespace: dict[str, object] = {}
    exec(compile(script, "repro.py", "exec"), namespace)  # noqa: S102 (the harness's own generated script)
    import torch

    class LlamaDecoderLayer(torch.nn.Module):
        pass

    model = torch.nn.Sequential(LlamaDecoderLayer())
    assert namespace["injection_policy"](model) == {LlamaDecoderLayer: LLAMA_ROWS}

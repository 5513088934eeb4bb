"""A cause is a bug (suites/verdicts/mechanism.py `cause_of`): keyed by what AutoTP did and where the cell broke, never
by
the error's text alone; and numbers in shapes are masked as numbers (suites/verdicts/outcome.py `mask_numbers`)."""

from matrix.json_records import read_record, write_record
from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import (
    AutoTPRecord,
    BreakPoint,
    Failure,
    LeftWhole,
    Replaced,
    cause_of,
    failure_text,
    mask_indices,
    role,
)
from suites.verdicts.outcome import mask_numbers
from suites.verdicts.policy import Policy


def test_a_shape_is_masked_as_numbers_never_as_a_hex_literal():
    """phimoe's and dbrx's router failures read alike: `0x4` is a 0 x 4 matrix (the hex reading split them)."""
    phimoe = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (48x1024 and 512x4)"
    dbrx = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (6x64 and 0x4)"
    assert (
        mask_numbers(phimoe)
        == mask_numbers(dbrx)
        == ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (NxN and NxN)")
    )
    assert mask_numbers("tensor at 0x7f3a2b10 and 0xdead") == "tensor at N and N"
    assert mask_numbers("q_proj.3 of layer 12, 2.5e-3") == "q_proj.N of layer N, N"


def test_the_failure_text_reads_the_same_whatever_the_function_it_surfaced_in_is_called():
    old = "RuntimeError: shape '[N, N, N, N]' is invalid for input of size N @ transformers/models/x.py:fix_order"
    new = "RuntimeError: shape '[N, N, N]' is invalid for input of size N @ transformers/models/x.py:reorder"
    assert failure_text(old) == failure_text(new) == "RuntimeError: shape '[N…]' is invalid for input of size N"


def test_paths_are_masked_to_roles_shared_by_architectures():
    assert mask_indices("model.layers.3.mlp.experts.7.w1") == "model.layers.*.mlp.experts.*.w1"
    assert role("model.layers.0.self_attn.q_norm") == role("transformer.h.11.self_attn.q_norm") == "self_attn.q_norm"
    assert role("lm_head") == "lm_head"


def _linear(path, layer_class, shape, dim, held, layout=""):
    return Replaced(path, "Linear", layer_class, shape, dim, held, layout)


def _record(tp=2, heads=8, kv=8, head_dim=32, experts=0, replaced=(), left_whole=()):
    attention = (
        _linear("model.layers.*.self_attn.q_proj", "LinearLayer", (heads * head_dim, 256), 0, heads * head_dim // tp),
        _linear(
            "model.layers.*.self_attn.o_proj", "LinearAllreduce", (256, heads * head_dim), 1, heads * head_dim // tp
        ),
    )
    return AutoTPRecord(
        tp,
        heads,
        kv,
        head_dim,
        experts,
        (Policy("DecoderLayer", ("self_attn.o_proj",)),),
        (),
        (*attention, *replaced),
        tuple(left_whole),
    )


def _raised(path, module_class, layer_class=""):
    origin = path.rpartition(".")[0] if "Allreduce" in layer_class else path
    return BreakPoint(
        path, module_class, layer_class, "raised", origin, "Attention" if origin != path else module_class
    )


Q_NORM = LeftWhole("model.layers.*.self_attn.q_norm.weight", "norm", 256, "model.layers.*.self_attn.q_proj", "width")
SUB_NORM = LeftWhole(
    "model.layers.*.self_attn.attn_sub_norm.weight", "norm", 256, "model.layers.*.self_attn.o_proj", "width"
)
SINKS = LeftWhole("model.layers.*.self_attn.sinks", "per-head", 8, "model.layers.*.self_attn.q_proj", "heads")


def test_one_mechanism_in_two_architectures_is_one_cause_and_says_so():
    """A norm over the width of a split projection, left whole: olmo2's q_norm and bitnet's sub-norm, raised in
    different files and functions, are one cause whose words name the tensor."""
    olmo2 = Failure(
        "forward",
        "RuntimeError: The size of tensor a (256) must match the size of tensor b (128) @ "
        "transformers/olmo2.py:forward",
        _record(left_whole=[Q_NORM]),
        _raised("model.layers.0.self_attn.q_norm", "Olmo2RMSNorm"),
    )
    bitnet = Failure(
        "forward",
        "RuntimeError: The size of tensor a (2560) must match the size of tensor b (1280) @ transformers/bitnet.py:f",
        _record(left_whole=[SUB_NORM]),
        _raised("model.layers.1.self_attn.attn_sub_norm", "BitNetRMSNorm"),
    )
    assert cause_of(olmo2).mechanism_key == cause_of(bitnet).mechanism_key == "left whole|norm"
    assert cause_of(olmo2).words.startswith("`self_attn.q_norm.weight` (width of the split `self_attn.q_proj`, 256)")
    assert cause_of(olmo2).whose == "autotp"
    per_head = Failure(
        "forward", olmo2.signature, _record(left_whole=[SINKS]), _raised("model.layers.0.self_attn", "A")
    )
    assert cause_of(per_head).mechanism_key == "left whole|per-head"


def test_two_mechanisms_under_one_error_text_are_two_causes():
    """`mat1 and mat2 shapes cannot be multiplied … @ deepspeed/module_inject/layers.py:forward` held three bugs."""
    text = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (48x768 and 384x768) @ deepspeed/layers.py:forward"
    router = _linear("model.layers.*.mlp.router", "LinearAllreduce", (4, 256), 1, 128)
    fused = _linear("model.layers.*.self_attn.qkv_proj", "fused_LinearLayer", (768, 256), 0, 384, "phi3type")
    missed = _linear("model.layers.*.attn.dense", "LinearLayer", (256, 256), 0, 128)
    causes = {
        cause_of(Failure("forward", text, _record(experts=4, replaced=[router]),
                         _raised("model.layers.0.mlp.router", "Router", "LinearAllreduce"))).mechanism_key,
        cause_of(Failure("forward", text, _record(replaced=[fused]),
                         _raised("model.layers.0.self_attn.o_proj", "Linear", "LinearAllreduce"))).mechanism_key,
        cause_of(Failure("forward", text, _record(replaced=[missed]),
                         _raised("model.layers.0.attn.dense", "Linear", "LinearLayer"))).mechanism_key,
    }  # fmt: skip
    assert causes == {
        "router|LinearAllreduce",
        "layout|self_attn.qkv_proj|fused_LinearLayer(phi3type)",
        "column-parallel|attn.dense",
    }


def test_a_mechanism_that_crashes_at_one_tp_and_miscomputes_at_another_is_one_cause():
    """diffllama: tp 3 raises in its attention, tp 2 diverges first at o_proj, which only joins the attention's
    partial results; the attention computed what went wrong either way."""
    crash = Failure(
        "forward", "RuntimeError: size @ x.py:sdpa", _record(tp=3), _raised("model.layers.0.self_attn", "Attention")
    )
    diverged = BreakPoint(
        "model.layers.0.self_attn.o_proj", "Linear", "LinearAllreduce", "diverged", "model.layers.0.self_attn",
        "Attention", "(max |Δ| 22.9 at output scale 21; bound 0.00257)",
    )  # fmt: skip
    numerics = Failure("numerics", "logits: prefill logits differ by N", _record(), diverged)
    assert cause_of(crash).mechanism_key == cause_of(numerics).mechanism_key == "at|self_attn|Attention|"
    assert "first divergence at `model.layers.0.self_attn.o_proj`" in cause_of(numerics).words


def test_a_kv_unit_split_that_crashes_is_autotps_bug_and_one_that_only_idles_ranks_a_documented_limit():
    """gpt_bigcode and falcon crash on the starved ranks, which DeepSpeed documents as giving a correct result: its
    bug; gemma passes its numbers while rank 0 holds every query head: the limit DeepSpeed documents and warns of."""
    starved = _record(tp=2, heads=8, kv=1)
    crash = Failure(
        "forward", "RuntimeError: split_with_sizes @ f.py:forward", starved, _raised("model.layers.0.self_attn", "A")
    )
    memory = Failure("memory", "memory: linears split unevenly: model.layers.*.self_attn.{q_proj,o_proj}", starved)
    assert (cause_of(crash).mechanism_key, cause_of(crash).whose) == ("kv-unit split|query heads starved", "autotp")
    assert (cause_of(memory).mechanism_key, cause_of(memory).whose) == ("kv-unit split|ranks idle", "design-limit")
    assert "Limitations 1" in cause_of(memory).evidence and "contradict" in cause_of(crash).evidence
    assert "1 kv head < tp 2, so rank 1 holds no query head of `self_attn.q_proj`" in cause_of(memory).words


def test_memory_findings_group_by_what_was_left_whole_not_where_the_block_sits():
    mixtral = Failure(
        "memory", "memory: experts left whole: model.layers.*.mlp.experts.{gate_up_proj,down_proj}", _record()
    )
    granite = Failure(
        "memory",
        "memory: experts left whole: model.layers.*.block_sparse_moe.experts.{gate_up_proj,down_proj}",
        _record(),
    )
    assert (
        cause_of(mixtral).mechanism_key
        == cause_of(granite).mechanism_key
        == "memory|experts left whole: experts.{gate_up_proj,down_proj}"
    )


def test_what_nothing_located_is_grouped_by_its_text_and_the_harness_owns_setup():
    parser = Failure(
        "shard", "AssertionError: Not able to determine model policy automatically. @ deepspeed/auto_tp.py:tp_parser"
    )
    assert cause_of(parser).mechanism_key == "shard|AssertionError: Not able to determine model policy automatically."
    harness = Failure("setup", "TypeError: 'NoneType' object is not callable @ suites/checks/probes.py:observe")
    assert cause_of(harness).whose == "harness"


def test_repro_prints_the_cause_and_what_autotp_did():
    from suites.records.summary import repro_details

    record = _record(left_whole=[Q_NORM])
    cause = cause_of(
        Failure("forward", "RuntimeError: x @ y.py:f", record, _raised("model.layers.0.self_attn.q_norm", "N"))
    )
    lines = repro_details({"cause": write_record(cause), "autotp": write_record(record)})
    assert lines[0].startswith("cause (AutoTP bug (DeepSpeed's)): `self_attn.q_norm.weight` (width of the split")
    assert lines[1:4] == [
        "what AutoTP did:",
        "  policy DecoderLayer: all-reduce self_attn.o_proj",
        "  LinearLayer: model.layers.*.self_attn.q_proj",
    ]
    assert lines[-1] == f"  {Q_NORM.text}"


def test_a_stored_cause_names_its_mechanism_key_key_as_every_history_does():
    """cells.jsonl, JUnit properties and the store (whose text ids hash the JSON) hold `key`: a cause written before
    the field was called `mechanism_key` reads back, and one written now is stored as before."""
    stored = {"key": "left whole|norm", "words": "a norm left whole", "whose": "autotp", "evidence": ""}
    cause = read_record(Cause, stored)
    assert cause == Cause(mechanism_key="left whole|norm", words="a norm left whole", whose="autotp")
    assert write_record(cause) == stored and list(write_record(cause)) == list(stored)

"""The memory rules of issue #56 (one rule; faithful cells judged by their real checkpoint's counts) and #57 (the
output head judged where DeepSpeed's design splits it), on footprints written out here, and the standalone repro
script judging by the same code."""

import inspect
import sys
import types
from dataclasses import asdict

import torch

from suites.checks import memory
from suites.checks.probes import Footprint, SplitCounts

HEAD_DIM, HIDDEN, VOCAB = 16, 128, 512


def _footprint(heads, kv_heads, head=False, tied=False):
    """One decoder layer's attention (q/k/v/o), an input embedding, and an output head (tied or not)."""
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.layers.0.self_attn.q_proj.weight": (heads * HEAD_DIM, HIDDEN),
        "model.layers.0.self_attn.k_proj.weight": (kv_heads * HEAD_DIM, HIDDEN),
        "model.layers.0.self_attn.v_proj.weight": (kv_heads * HEAD_DIM, HIDDEN),
        "model.layers.0.self_attn.o_proj.weight": (HIDDEN, heads * HEAD_DIM),
    }
    if head:
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    kinds = {name: "embeddings" if "embed" in name or "lm_head" in name else "linears" for name in shapes}
    full = {name: 4 * torch.Size(shape).numel() for name, shape in shapes.items()}
    if tied:
        del full["lm_head.weight"]  # a tied weight is listed under its first name only
    return Footprint(full, kinds, shapes, SplitCounts(heads, kv_heads, HEAD_DIM, 0))


def _held(reference, heads_by_rank, kv_by_rank, head_share=None, tied=False):
    """Each rank's bytes: attention by the heads each holds, the embedding whole, the output head by `head_share`
    (None: whole, still tied where it was)."""
    ranks = []
    heads, kv = reference.counts.heads, reference.counts.kv_heads
    for rank, (query, kv_held) in enumerate(zip(heads_by_rank, kv_by_rank)):
        held = {}
        for name, size in reference.bytes_by_name.items():
            if "q_proj" in name or "o_proj" in name:
                held[name] = size * query // heads
            elif "k_proj" in name or "v_proj" in name:
                held[name] = size * kv_held // kv
            else:
                held[name] = size
        if head_share is not None:
            held["lm_head.weight"] = int(4 * VOCAB * HIDDEN * head_share[rank])
        ranks.append(held)
    return ranks


def test_a_faithful_kv_unit_split_is_judged_by_the_real_checkpoints_query_heads():
    """ernie4_5 at tp 3: 16 query heads and 2 kv heads split [8, 8, 0] (DeepSpeed's kv-unit split); its tiny shape
    (4 / 2) splits [2, 2, 0], which the tiny counts allow (ceil(4/3)/4 = 50 %) and the real ones do not (6/16)."""
    tiny = _footprint(heads=4, kv_heads=2)
    starved = _held(tiny, [2, 2, 0], [1, 1, 0])
    assert memory.check(tiny, starved).passed  # the false pass, judged by the tiny counts
    result = memory.check(tiny, starved, real=SplitCounts(16, 2, 128, 0))
    assert not result.passed and result.failure_class == "memory"
    assert result.reason.startswith("linears split unevenly: model.layers.*.self_attn.q_proj"), result.reason
    assert "at most 38% on tp 3: 16 query heads of the real checkpoint — 2 kv heads < tp 3" in result.reason
    # the even split of the tiny heads stands for the real checkpoint's even split [6, 5, 5]
    even = _held(tiny, [2, 1, 1], [1, 1, 1])
    assert memory.check(tiny, even, real=SplitCounts(16, 2, 128, 0)).passed


def test_a_faithful_even_split_passes_though_the_tiny_share_is_above_the_real_one():
    """llama at tp 3: 32 kv heads split 11/11/10 (34 %); its tiny 8 split 3/3/2 (38 %) is the same even split."""
    tiny, real = _footprint(heads=8, kv_heads=8), SplitCounts(32, 32, 128, 0)
    assert memory.check(tiny, _held(tiny, [3, 3, 2], [3, 3, 2]), real=real).passed
    lopsided = memory.check(tiny, _held(tiny, [4, 2, 2], [4, 2, 2]), real=real)
    assert not lopsided.passed and "at most 34% on tp 3: 32 kv head groups of the real checkpoint" in lopsided.reason


def test_differential_attention_is_judged_in_kv_head_pairs():
    """diffllama at tp 3: head i works with head i + heads/2, so 32 heads split in 16 pairs [6, 5, 5] (38 %, above the
    34 % of single heads); its tiny 8 heads split in 4 pairs [2, 1, 1] are that even split. The same split of a model
    without pairs fails (above), and a pair split more uneven than the pairs force fails here too."""
    tiny = _footprint(heads=8, kv_heads=8)
    tiny = Footprint(tiny.bytes_by_name, tiny.kinds, tiny.shapes_by_name, SplitCounts(8, 8, HEAD_DIM, 0, True))
    real = SplitCounts(32, 32, 128, 0, True)
    assert SplitCounts.read(asdict(real)) == real  # as a training cell's ranks and the repro script get it
    assert memory.check(tiny, _held(tiny, [4, 2, 2], [4, 2, 2]), real=real).passed
    lopsided = memory.check(tiny, _held(tiny, [6, 2, 0], [6, 2, 0]), real=real)
    assert not lopsided.passed and "at most 38% on tp 3: 16 kv-head pairs of the real checkpoint" in lopsided.reason


def test_the_output_head_left_whole_fails_where_deepspeed_splits_it():
    reference = _footprint(heads=8, kv_heads=8, head=True)
    whole = _held(reference, [4, 4], [4, 4])
    result = memory.check(reference, whole, deepspeed_release=(0, 19, 8))
    assert not result.passed and result.failure_class == "memory"
    assert result.signature.startswith("output head left whole: lm_head"), result.signature
    assert "DeepSpeed >= 0.16.3 splits an nn.Linear lm_head as LmHeadLinearAllreduce without a checkpoint json" in (
        result.reason
    )
    # set_lm_head ran only when init_inference loaded a checkpoint json (0.12.0) until #6812 (0.16.3): DeepSpeed
    # 0.14.4 leaves a plain load's head whole by design, and splits a checkpoint json's
    assert memory.check(reference, whole, deepspeed_release=(0, 14, 4)).passed
    with_json = memory.check(reference, whole, deepspeed_release=(0, 14, 4), checkpoint_json=True)
    assert (
        not with_json.passed
        and "DeepSpeed >= 0.12.0" in with_json.reason
        and "loading a checkpoint json" in (with_json.reason)
    )
    # before 0.12.0 and in training (no release given) the head stays whole by design
    assert memory.check(reference, whole, deepspeed_release=(0, 11, 2), checkpoint_json=True).passed
    assert memory.check(reference, whole).passed
    split = _held(reference, [4, 4], [4, 4], head_share=(0.5, 0.5))
    assert memory.check(reference, split, deepspeed_release=(0, 19, 8)).passed
    lopsided = memory.check(reference, _held(reference, [4, 4], [4, 4], (0.75, 0.25)), deepspeed_release=(0, 19, 8))
    assert lopsided.signature.startswith("output head split unevenly: lm_head"), lopsided.signature


def test_a_tied_head_split_by_a_copy_is_a_note_and_left_tied_it_fails():
    reference = _footprint(heads=8, kv_heads=8, head=True, tied=True)
    copied = memory.check(reference, _held(reference, [4, 4], [4, 4], (0.5, 0.5)), deepspeed_release=(0, 19, 8))
    assert copied.passed
    assert (
        "output head tied to model.embed_tokens.weight split by a copy: rank 0 holds 1.50x the tied weight's"
        in copied.reason
    )
    assert "runs correctly but saves less memory; DeepSpeed's design" in copied.reason
    still_tied = memory.check(reference, _held(reference, [4, 4], [4, 4]), deepspeed_release=(0, 19, 8))
    assert not still_tied.passed and still_tied.signature.startswith("output head left whole: lm_head")


def test_the_repro_script_judges_memory_by_the_harness_rules_copied_in():
    """One implementation: the script's rules are the source of memory.RULES, and the script's template defines
    none of them itself; run from the copied text, they judge as the harness does."""
    import ast

    from suites.records import repro

    copied = repro.harness_functions(False)
    for rule in memory.RULES:
        assert inspect.getsource(getattr(memory, rule)) in copied, rule
    template = ast.parse(repro.TEMPLATE.read_text())
    defined = {node.name for node in ast.walk(template) if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    assert not defined & set(memory.RULES), "the template keeps a memory rule of its own"
    script_module = types.ModuleType("repro_rules")  # the rules as the script defines them, from the copied text
    sys.modules[script_module.__name__] = script_module
    header = (
        "from __future__ import annotations\nimport math\nimport re\nfrom dataclasses import dataclass\nimport torch\n"
    )
    exec(compile(header + copied, "repro_rules", "exec"), script_module.__dict__)
    namespace = script_module.__dict__
    tiny = _footprint(heads=4, kv_heads=2)
    starved = _held(tiny, [2, 2, 0], [1, 1, 0])
    name = "model.layers.0.self_attn.q_proj.weight"
    held = [by_name[name] for by_name in starved]
    script_rules = namespace["weight_share"]
    real = namespace["SplitCounts"](16, 2, 128, 0)  # type: ignore[operator]
    counts = namespace["SplitCounts"](4, 2, HEAD_DIM, 0)  # type: ignore[operator]
    script = script_rules(
        name, "linears", tiny.shapes_by_name[name], tiny.bytes_by_name[name], held, [None] * 3, counts, real
    )  # type: ignore[operator]
    harness = memory.weight_share(
        name,
        "linears",
        tiny.shapes_by_name[name],
        tiny.bytes_by_name[name],
        held,
        [None] * 3,
        tiny.counts,
        SplitCounts(16, 2, 128, 0),
    )
    assert script.uneven and harness.uneven and script.finding(3) == harness.finding(3)

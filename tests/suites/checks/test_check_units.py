"""The checks on hand-made observations: generation near-ties, the padded row, NaN decode logits, memory by kind."""

import pytest
import torch

from matrix.registry import DEFAULT_TOLERANCES, EPSILON
from tests.suites.rank_summaries import inference_rank


def _observations(**changes):
    from suites.checks.probes import Footprint, Observations, SplitCounts

    torch.manual_seed(0)
    base = dict(
        logits_masked=torch.randn(44, 16),
        logits_plain=torch.randn(1, 24, 16),
        gen_tokens=torch.tensor([1, 2, 3, 4]),
        gen_logits=torch.randn(4, 16),
        nll_sum=100.0,
        nll_tokens=50,
        forward_seconds=0.1,
        footprint=Footprint(
            {"w": 800, "n": 200}, {"w": "linears", "n": "rest"}, {"w": (20, 10), "n": (50,)}, SplitCounts(2, 2, 5, 0)
        ),
    )
    base["gen_tokens"] = base["gen_logits"].argmax(-1)
    base["gen_padded_logits"] = torch.randn(2, 4, 16)
    base["gen_padded_tokens"] = base["gen_padded_logits"].argmax(-1)
    base.update(changes)
    return Observations(**base)


def test_generation_divergence_passes_only_on_a_genuine_near_tie():
    from suites.checks import generation

    reference = _observations()
    tolerance = DEFAULT_TOLERANCES["fp32"]
    step_logits = reference.gen_logits.clone()
    runner_up = step_logits[2].topk(2).indices[1]
    tied = step_logits.clone()
    tied[2, runner_up] = tied[2].max()  # an exact tie: the sharded side may pick either token
    near_tie = generation.check(
        _observations(gen_logits=tied),
        _observations(
            gen_tokens=torch.cat([reference.gen_tokens[:2], runner_up.view(1), reference.gen_tokens[3:]]),
            gen_logits=tied,
        ),
        tolerance,
    )
    assert near_tie.passed and "near-tie at token 2" in near_tie.reason
    wrong = generation.check(
        reference,
        _observations(gen_tokens=torch.cat([reference.gen_tokens[:2], runner_up.view(1), reference.gen_tokens[3:]])),
        tolerance,
    )
    assert not wrong.passed and wrong.metrics["gen_first_divergence"] == 2


def test_generation_of_the_left_padded_row_is_judged_too():
    from suites.checks import generation

    reference = _observations()
    drifted = reference.gen_padded_logits.clone()
    drifted[1, 2] += 1.0  # only the left-padded row's third decode step is off
    result = generation.check(reference, _observations(gen_padded_logits=drifted), DEFAULT_TOLERANCES["fp32"])
    assert not result.passed and result.reason.startswith("batched decoding row 1, left-padded: decode-step logits")
    assert result.metrics["gen_padded0_logits_max_abs"] == 0.0


def test_generation_fails_on_nan_decode_logits_even_when_the_tokens_match():
    from suites.checks import generation

    reference = _observations()
    nan_step = reference.gen_logits.clone()
    nan_step[1, 0] = float("nan")
    result = generation.check(
        reference, _observations(gen_logits=nan_step, gen_tokens=reference.gen_tokens), DEFAULT_TOLERANCES["fp32"]
    )
    assert not result.passed and result.failure_class == "generation", result.reason


def test_tensor_kinds_come_from_the_modules_and_buffers_are_never_split_kinds():
    from suites.checks.probes import tensor_kinds

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.q, self.norm = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)
            self.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
            self.fused_experts = torch.nn.Parameter(torch.zeros(2, 4, 4))  # transformers >= 5 layout
            self.patch_embed = torch.nn.Conv2d(3, 4, 2)  # a vision tower's kernel is 4-D but no expert
            self.probe = torch.nn.Parameter(torch.zeros(1, 1, 4))  # a vision head's pooling query: 3-D, no expert
            self.register_buffer("causal_mask", torch.ones(1, 1, 4, 4))  # 4-D, but not a weight (gpt_neo)

    assert tensor_kinds(Toy(), 2) == {
        "causal_mask": "rest",
        "fused_experts": "experts",
        "embed.weight": "embeddings",
        "q.weight": "linears",
        "q.bias": "linears",
        "norm.weight": "rest",
        "norm.bias": "rest",
        "experts.0.weight": "experts",
        "experts.0.bias": "experts",
        "patch_embed.weight": "convs",
        "patch_embed.bias": "convs",
        "probe": "rest",
    }


def _layered(heads=8, kv_heads=8, experts=0):
    """A two-layer model's unsharded footprint: q/k/v/o, an MLP, optional fused experts and a router."""
    from suites.checks.probes import Footprint, SplitCounts

    head_dim, hidden = 16, 128
    shapes = {}
    for layer in range(2):
        prefix = f"model.layers.{layer}."
        shapes |= {
            prefix + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            prefix + "mlp.up_proj.weight": (384, hidden),
            prefix + "mlp.down_proj.weight": (hidden, 384),
            prefix + "input_layernorm.weight": (hidden,),
        }
        if experts:
            shapes |= {
                prefix + "mlp.experts.gate_up_proj": (experts, 2 * 384, hidden),
                prefix + "mlp.gate.weight": (experts, hidden),
            }
    kinds = {name: "rest" if "norm" in name else "experts" if "experts" in name else "linears" for name in shapes}
    full = {name: 4 * torch.Size(shape).numel() for name, shape in shapes.items()}
    return Footprint(full, kinds, shapes, SplitCounts(heads, kv_heads, head_dim, experts))


def _split(reference, tp, whole=(), rows=None):
    """Each rank's bytes when every linear/expert weight is split in `tp` (or as `rows` gives rank 0's share)."""
    ranks = []
    for rank in range(tp):
        held = {}
        for name, size in reference.bytes_by_name.items():
            split = reference.kinds[name] != "rest" and not any(part in name for part in whole)
            held[name] = size if not split else (rows(name, size, rank) if rows else size // tp)
        ranks.append(held)
    return ranks


def test_memory_judges_every_weight_and_names_the_layers_left_whole():
    """AutoTP leaving attention whole while the MLP splits stays inside a bound on all linears together (a
    fraction f left whole gives f + (1 - f)/tp): judged per weight, it fails at tp 2 and 3 with the layers named."""
    from suites.checks import memory

    reference = _layered()
    for tp in (2, 3, 4):

        def rows(name, size, rank, tp=tp):
            return size // 128 * (128 // tp + (rank < 128 % tp))

        assert memory.check(reference, _split(reference, tp, rows=rows)).passed
        half_whole = memory.check(reference, _split(reference, tp, whole=("self_attn",), rows=rows))
        assert not half_whole.passed and half_whole.failure_class == "memory"
        assert half_whole.reason.startswith(
            f"linears left whole: model.layers.*.self_attn.{{q_proj,k_proj,v_proj,o_proj}} (4 of 12 linears split on "
            f"tp {tp})"
        )
        assert (
            half_whole.metrics["linear_shard_ratio"] < memory.SHARE_EPSILON + (1 + 1 / tp) / 2
        )  # the old bound passed it


def test_memory_allows_a_split_exactly_as_uneven_as_the_heads_force_and_no_more():
    from suites.checks import memory

    reference = _layered(heads=6, kv_heads=6)  # 6 heads on 4 ranks: 2/2/1/1, rank 0 holds 2 of 6

    def by_heads(name, size, rank):
        return size // 6 * (2 if rank < 2 else 1)

    assert memory.check(
        reference, _split(reference, 4, rows=lambda n, s, r: by_heads(n, s, r) if "self_attn" in n else s // 4)
    ).passed

    def lopsided(name, size, rank):
        return size // 6 * (3 if rank == 0 else 1)  # 3/1/1/1: more than the heads force

    result = memory.check(
        reference, _split(reference, 4, rows=lambda n, s, r: lopsided(n, s, r) if "q_proj" in n else s // 4)
    )
    assert not result.passed and result.reason.startswith("linears split unevenly: model.layers.*.self_attn.q_proj")
    assert "rank 0 holds 50% of model.layers.0.self_attn.q_proj.weight; at most 33%" in result.reason


def test_memory_names_the_rules_that_keep_weights_whole_by_design():
    from suites.checks import memory

    reference = _layered(heads=8, kv_heads=1, experts=4)  # one kv head, routers of 4 experts
    kept = memory.check(reference, _split(reference, 2, whole=("k_proj", "v_proj", "mlp.gate.")))
    assert kept.passed, kept.reason
    assert "linears kept whole by design: model.layers.*.self_attn.{k_proj,v_proj} (1 kv heads < tp 2" in kept.reason
    assert "model.layers.*.mlp.gate (MoE router (4 experts)" in kept.reason
    projector = _layered(heads=8, kv_heads=1, experts=4)  # a projector as wide as the kv heads is no kv projection
    projector.shapes_by_name["model.projector.weight"], projector.kinds["model.projector.weight"] = (16, 128), "linears"
    projector.bytes_by_name["model.projector.weight"] = 4 * 16 * 128
    whole_projector = memory.check(
        projector, _split(projector, 2, whole=("k_proj", "v_proj", "mlp.gate.", "projector"))
    )
    assert whole_projector.reason.startswith("linears left whole: model.projector (")
    experts_whole = memory.check(reference, _split(reference, 2, whole=("experts", "mlp.gate.", "k_proj", "v_proj")))
    assert not experts_whole.passed
    # counted in experts, not in expert tensors: 4 fused experts in each of the 2 layers
    assert experts_whole.reason.startswith(
        "experts left whole: model.layers.*.mlp.experts.gate_up_proj (0 of 8 experts"
    )
    counts = reference.counts
    assert memory._units("model.layers.0.mlp.experts.3.w1.weight", (16, 8), "experts", counts) == {
        "model.layers.0.mlp.experts.3"
    }
    assert memory._units("model.layers.0.mlp.experts.down_proj", (4, 8, 16), "experts", counts) == {
        f"model.layers.0.mlp.experts#{index}" for index in range(4)
    }


def test_memory_fails_a_rank_tensor_the_unsharded_model_does_not_have():
    """A renamed or re-wrapped layer would otherwise never be judged."""
    from suites.checks import memory

    reference = _layered()
    ranks = _split(reference, 2)
    for held in ranks:
        held["model.layers.0.mlp.inner.up_proj.weight"] = held.pop("model.layers.0.mlp.up_proj.weight")
    result = memory.check(reference, ranks)
    assert not result.passed
    assert result.reason.startswith(
        "tensors the unsharded model does not have: model.layers.*.mlp.inner.up_proj (rank 0"
    )


def test_a_non_finite_reference_is_setup_and_stops_the_comparison():
    from suites.checks import judge
    from suites.checks.interface import CheckInputs

    reference = _observations()
    broken = reference.logits_plain.clone()
    broken[0, 3, 1] = float("nan")
    ranks = [inference_rank(rank, reference) for rank in range(2)]
    results = judge.judge(
        CheckInputs(DEFAULT_TOLERANCES["fp32"], tuple(ranks), _observations(logits_plain=broken), reference)
    )
    assert [(r.name, r.passed, r.failure_class) for r in results] == [("reference", False, "setup")]
    assert results[0].reason.startswith("the unsharded reference is not finite: logits_plain hold NaN/inf")


def test_nan_in_the_second_compared_logits_is_never_dropped():
    """Python's max over [finite, nan] keeps the finite value: the plain forward's NaN passed."""
    from suites.checks import logits

    reference = _observations()
    plain = reference.logits_plain.clone()
    plain[0, 0, 0] = float("nan")
    result = logits.check(reference, _observations(logits_plain=plain), DEFAULT_TOLERANCES["fp32"])
    assert not result.passed and result.reason == "sharded logits contain NaN/inf"


def test_a_huge_finite_loss_is_a_perplexity_verdict_not_an_overflow():
    from suites.checks import perplexity

    result = perplexity.check(_observations(), _observations(nll_sum=1e6), DEFAULT_TOLERANCES["fp32"])
    assert not result.passed and result.failure_class == "numerics"
    assert result.reason.startswith("perplexity inf vs reference")


def test_a_library_output_error_keeps_its_class_whoever_noticed_it():
    from suites.engine.cell_runner import _stage_error
    from suites.verdicts.outcome import LibraryOutputError

    try:
        raise LibraryOutputError(
            "numerics", "shapes: generate returned decode-step logits of differing shapes", "[(1, 8)]"
        )
    except LibraryOutputError as raised:  # raised in the harness's own file, still the library's class
        error = _stage_error("forward", raised, 0)
    assert (error.failure_class, error.signature) == (
        "numerics",
        "shapes: generate returned decode-step logits of differing shapes",
    )
    assert "failed validation where it entered the harness" in error.message


def test_a_failure_only_a_fresh_process_hits_is_the_verdict_with_the_ranks_findings_kept():
    from suites.engine.cell_runner import as_a_fresh_process_would
    from suites.verdicts.outcome import CellOutcome

    fresh = {
        "signature": "TypeError: Signature mismatch between <function OnDevice...new_tensor at 0xN> @ torch/x.py:f",
        "message": "in a fresh process ... raised",
    }
    passed = as_a_fresh_process_would(CellOutcome("pass", metrics={"logits_max_abs": 0.0}), fresh)
    assert (passed.outcome, passed.failure_class, passed.signature) == ("fail", "shard", fresh["signature"])
    assert passed.message.endswith("deepspeed.OnDevice, the same model passed every check.")
    assert passed.metrics["logits_max_abs"] == 0.0
    failed = as_a_fresh_process_would(CellOutcome("fail", "memory", "meta_memory: a rank's peak"), fresh)
    assert (
        failed.signature == fresh["signature"]
        and "the same model failed memory: meta_memory: a rank's peak" in failed.message
    )
    assert "harness" not in passed.message  # a draft issue quotes it
    assert as_a_fresh_process_would(CellOutcome("skip", message="no"), fresh).outcome == "skip"
    harness_bug = as_a_fresh_process_would(
        CellOutcome("fail", "setup", "TypeError @ suites/checks/probes.py:observe"), fresh
    )
    assert (harness_bug.failure_class, harness_bug.signature) == (
        "setup",
        "TypeError @ suites/checks/probes.py:observe",
    )
    assert as_a_fresh_process_would(CellOutcome("pass"), None).outcome == "pass"


def _comparison(max_rel_error=0.0, problems=(), worst_vanished=False):
    """One rank's ComparisonRecord (suites/variants/trainee.py) as its report carries it."""
    from suites.checks.contracts import ComparisonRecord

    return ComparisonRecord(
        largest=1.0,
        floor_share=0.0,
        max_rel_error=max_rel_error,
        worst_parameter="model.layers.0.mlp.up_proj.weight",
        compared=4,
        problems=tuple(problems),
        errors_at_floor={},
        worst_vanished=worst_vanished,
        loss_scale=1.0,
    )


def _training_reports(tp=2, losses=(2.0, 1.5), grads=(), layout=(), update=(), trip=None):
    """The unsharded steps and `tp` ranks' reports of one trained model: every figure as the unsharded run's,
    unless a keyword gives rank 0 another (`grads`/`update`: Comparison keywords, `layout`: problems)."""
    reference = _layered()
    unsharded = {
        "losses": [2.0, 1.5],
        "bytes_by_name": reference.bytes_by_name,
        "kinds": reference.kinds,
        "shapes_by_name": reference.shapes_by_name,
        "counts": {"heads": 8, "kv_heads": 8, "head_dim": 16, "experts": 0},
        "lm_head_weight": None,
    }
    reports = [
        {
            "label": "llama",
            "losses": list(losses) if rank == 0 else [2.0, 1.5],
            "steps": [_comparison(**(dict(grads) if rank == 0 else {})) for _ in losses],
            "problems": list(layout) if rank == 0 else [],
            "update": _comparison(**(dict(update) if rank == 0 else {})),
            "bytes_by_name": held,
            "sharded": 6,
            "lm_head_mode": "LinearLayer",
        }
        for rank, held in enumerate(_split(reference, tp))
    ]
    if trip is not None:
        for report in reports:
            report["round_trip"] = {
                "saved": _comparison(),
                "gathered": _comparison(),
                "loaded": _comparison(),
                "resumed_step": 2,
                "resumed_tp": tp,
                "resumed_loss": 1.5,
                "resumed_grads": _comparison(),
                "resumed_update": _comparison(),
                **trip,
            }
    return unsharded, reports


def _failing_signatures():
    """Every kind of failing check on hand-made observations: check name → the cell signature it gives."""
    from suites.checks import accuracy, generation, judge, logits, memory, meta_load, perplexity, quantization, training
    from suites.checks.interface import CheckInputs
    from suites.checks.probes import Footprint, SplitCounts
    from suites.checks.result import Finding

    tolerance = DEFAULT_TOLERANCES["fp32"]
    reference = _observations()
    nan_reference = reference.logits_plain.clone()
    nan_reference[0, 3, 1] = float("nan")
    runner_up = reference.gen_logits[2].topk(2).indices[1]
    drifted = reference.gen_padded_logits.clone()
    drifted[1, 2] += 1.0
    layered = _layered()
    renamed = _split(layered, 2)
    for held in renamed:
        held["model.layers.0.mlp.inner.up_proj.weight"] = held.pop("model.layers.0.mlp.up_proj.weight")
    ranks = [inference_rank(rank, reference) for rank in range(2)]
    results = {
        "reference": judge.judge(
            CheckInputs(tolerance, tuple(ranks), _observations(logits_plain=nan_reference), reference)
        )[0],
        "shapes": logits.check_shapes(
            reference, _observations(logits_masked=torch.randn(44, 8)), [torch.randn(16), torch.randn(8)]
        ),
        "logits": logits.check(reference, _observations(logits_masked=reference.logits_masked + 1.0), tolerance),
        "logits NaN": logits.check(reference, _observations(logits_plain=nan_reference), tolerance),
        "ranks_agree": logits.check_ranks_agree([torch.ones(16), torch.ones(16) * 2]),
        "generation tokens": generation.check(
            reference,
            _observations(
                gen_tokens=torch.cat([reference.gen_tokens[:2], runner_up.view(1), reference.gen_tokens[3:]])
            ),
            tolerance,
        ),
        "generation padded": generation.check(reference, _observations(gen_padded_logits=drifted), tolerance),
        "perplexity": perplexity.check(reference, _observations(nll_sum=200.0), tolerance),
        "memory": memory.check(layered, _split(layered, 2, whole=("self_attn",))),
        "memory unknown": memory.check(layered, renamed),
        "meta_memory": meta_load.check_meta_load(
            Footprint({"w": 200 << 20}, {"w": "linears"}, {"w": (50 << 20, 1)}, SplitCounts(2, 2, 5, 0)),
            float(300 << 20),
        ),
        "accuracy": accuracy.check([True] * 30, [False] * 30),
    }
    results["quant_tokens"], results["quant_perplexity"] = quantization.check(
        reference, _observations(gen_tokens=reference.gen_tokens + 1, nll_sum=300.0), tolerance
    )
    by_name = {}
    for label, kwargs in {
        "train_loss": {"losses": (2.0, 3.0)},
        "train_grads": {"grads": {"max_rel_error": 0.5}},
        "train_grads layout": {
            "layout": [
                Finding("a.weight: not a parameter of the unsharded model"),
                Finding("b.weight: shard", "(4, 2) is not a slice of the unsharded (8, 2)"),
                Finding("c.weight: not a parameter of the unsharded model"),
            ]
        },
        "train_update": {"update": {"problems": [Finding("w: shape", "(2, 3), unsharded (4, 3)")]}},
        "gather": {
            "trip": {
                "gathered": _comparison(
                    problems=[
                        Finding("w: 10 bytes on this rank before the gather, 20 after"),
                        Finding("v: 10 bytes on this rank before the gather, 20 after"),
                    ]
                )
            }
        },
        "resume": {"trip": {"resumed_loss": 9.0}},
    }.items():
        found = training.check_model(*_training_reports(**kwargs), tolerance, prefix="second_")
        by_name[label] = next(result for result in found if not result.passed)
    results.update(by_name)
    trained_memory = _training_reports()
    for report in trained_memory[1]:
        report["bytes_by_name"] = layered.bytes_by_name
    results["memory trained"] = next(r for r in training.check_model(*trained_memory, tolerance) if not r.passed)
    return results


def test_each_check_writes_its_own_short_signature_as_the_cell_signature_was():
    """A check's signature is made where it finds the failure (nothing parses its text back); these are the cell
    signatures the judge cut from the texts before (`<name>: ` + the text before its first ` (`)."""
    results = _failing_signatures()
    assert all(not result.passed for result in results.values())
    assert {label: result.cell_signature for label, result in results.items()} == {
        "reference": "reference: the unsharded reference is not finite: logits_plain hold NaN/inf",
        "shapes": "shapes: sharded outputs have the wrong shape: logits_masked",
        "logits": "logits: prefill logits differ by 1",
        "logits NaN": "logits: sharded logits contain NaN/inf",
        "ranks_agree": "ranks_agree: ranks disagree: logits differ across ranks by 1",
        "generation tokens": f"generation: greedy tokens diverge at step 2: reference "
        f"{int(_observations().gen_tokens[2])}, "
        f"sharded {int(_observations().gen_logits[2].topk(2).indices[1])}",
        "generation padded": "generation: batched decoding row 1, left-padded: decode-step logits differ by 1 over "
        "all steps",
        "perplexity": "perplexity: perplexity 54.5982 vs reference 7.38906",
        "memory": "memory: linears left whole: model.layers.*.self_attn.{q_proj,k_proj,v_proj,o_proj}",
        "memory unknown": "memory: tensors the unsharded model does not have: model.layers.*.mlp.inner.up_proj",
        "meta_memory": "meta_memory: a rank's peak RSS grew by 300 MiB while loading on the meta device",
        "accuracy": "accuracy: accuracy 0.000 [0.000, 0.114] vs reference 1.000 [0.886, 1.000] on 30 items: 30 lost, "
        "0 gained, exact McNemar p=1.9e-09 < 0.01",
        "quant_tokens": "quant_tokens: only 0% of greedy tokens match the fp32 baseline",
        "quant_perplexity": "quant_perplexity: perplexity 403.429 vs fp32 baseline 7.38906",
        "train_loss": "train_loss: second model llama: step 2: training loss differs from the unsharded step by units "
        "of its value",
        "train_grads": "train_grads: second model llama: step 1: gradient of model.layers.0.mlp.up_proj.weight on "
        "rank 0 differs from the unsharded gradient by tenths of its scale",
        # Problems without figures before the first with figures stay in the signature, as the cut text had them.
        "train_grads layout": "train_grads: second model llama: sharded: rank 0: a.weight: not a parameter of the "
        "unsharded model; rank 0: b.weight: shard",
        "train_update": "train_update: second model llama: after step 2: rank 0: w: shape",
        "gather": "gather: GatherReplacedLayerParams: rank 0: w: 10 bytes on this rank before the gather, 20 after; "
        "rank 0: v: 10 bytes on this rank before the gather, 20 after; rank 1: w: 10 bytes on this rank "
        "before the gather, 20 after",
        "resume": "resume: step 2 after load_checkpoint at tp 2: loss differs from the uninterrupted run by units of "
        "its "
        "value",
        "memory trained": "memory: linears left whole: model.layers.*.self_attn.{q_proj,k_proj,v_proj,o_proj}, "
        "model.layers.*.mlp.{up_proj,down_proj}",
    }
    for label, result in results.items():  # the rule the judge applied to the text before
        assert result.signature == result.reason.split(" (")[0], label


def test_a_failing_check_without_a_signature_is_refused():
    import pytest

    from suites.checks.result import CheckResult

    with pytest.raises(ValueError, match="check logits failed without a signature"):
        CheckResult("logits", False, "numerics", {}, "prefill logits differ")


def _routed(reference_logits: torch.Tensor, flips: list[int], drift_at: int | None, drift: float):
    """The unsharded observations with routing (2 routers x top-2 over 4 experts per token) and sharded ones whose
    routing flips at the `flips` tokens of the masked batch (their logits far off, as another expert computes them)
    and whose logits drift by `drift` at token `drift_at`."""
    tokens = reference_logits.shape[0]
    routing = torch.tensor([[0, 1, 2, 3]]).repeat(tokens, 1)
    plain_routing = routing[:24].clone()
    reference = _observations(logits_masked=reference_logits, routing_masked=routing, routing_plain=plain_routing)
    sharded_logits, sharded_routing = reference_logits.clone(), routing.clone()
    for token in flips:
        sharded_routing[token, 1] = 2  # the first router picks experts {0, 2} instead of {0, 1}
        sharded_logits[token] += 1.0
    if drift_at is not None:
        sharded_logits[drift_at] += drift
    return reference, _observations(
        logits_masked=sharded_logits, routing_masked=sharded_routing, routing_plain=plain_routing
    )


def test_tokens_whose_expert_routing_flips_are_left_out_and_counted():
    """A near-tie between two experts' router scores may go the other way on the sharded model (qwen3_moe bf16):
    that token computes another function, so only it is left out; the message counts it."""
    from suites.checks import logits

    tolerance = DEFAULT_TOLERANCES["bf16"]
    reference, sharded = _routed(_observations().logits_masked, flips=[5], drift_at=None, drift=0.0)
    result = logits.check(reference, sharded, tolerance)
    assert result.passed, result.reason
    assert result.reason == "1 of 68 tokens whose expert routing flipped not compared"
    assert result.metrics["routing_flipped_tokens"] == 1.0 and result.metrics["logits_max_abs"] == 0.0
    assert result.metrics["routing_flipped_logits_max_rel"] > tolerance.logits_rel
    # without routing recorded (a dense model, or routers not found) every token is compared
    unrouted = logits.check(
        _observations(logits_masked=reference.logits_masked),
        _observations(logits_masked=sharded.logits_masked),
        tolerance,
    )
    assert not unrouted.passed and "routing_flipped_tokens" not in unrouted.metrics


def test_a_small_drift_on_a_token_whose_routing_holds_fails_at_the_default_bound():
    """The rule is as tight as the default on every other token: a drift just over the bound (8 bf16 ulps; the
    override it replaced allowed 9) at a token routed alike fails, flips elsewhere or not."""
    from suites.checks import logits

    tolerance = DEFAULT_TOLERANCES["bf16"]
    reference_logits = _observations().logits_masked
    scale = max(reference_logits.abs().max().item(), _observations().logits_plain.abs().max().item())
    drift = 8.5 * EPSILON["bf16"] * scale
    reference, sharded = _routed(reference_logits, flips=[5], drift_at=6, drift=drift)
    result = logits.check(reference, sharded, tolerance)
    assert not result.passed, result.reason
    assert result.reason.startswith("prefill logits differ by") and result.reason.endswith(
        "; 1 of 68 tokens whose expert routing flipped not compared)"
    )
    assert result.metrics["logits_max_abs"] == pytest.approx(drift)


def test_routing_that_flips_on_many_tokens_fails_itself():
    """Near-ties are rare; a router fed a wrong shard moves many tokens: more than MAX_ROUTING_FLIP_SHARE of them
    fails the logits check, whatever the remaining tokens' logits."""
    from suites.checks import logits

    allowed = int(logits.MAX_ROUTING_FLIP_SHARE * 68)
    reference, sharded = _routed(_observations().logits_masked, flips=list(range(allowed)), drift_at=None, drift=0.0)
    assert logits.check(reference, sharded, DEFAULT_TOLERANCES["bf16"]).passed
    reference, sharded = _routed(
        _observations().logits_masked, flips=list(range(allowed + 1)), drift_at=None, drift=0.0
    )
    result = logits.check(reference, sharded, DEFAULT_TOLERANCES["bf16"])
    assert not result.passed and result.failure_class == "numerics"
    assert result.reason.startswith(
        f"expert routing differs from the unsharded model's on {allowed + 1} of 68 prefill tokens"
    )


def test_expert_choices_are_recorded_per_token_from_the_routers():
    """The routers' own choices (transformers' TopKRouter returns its indices) for every token of one forward."""
    import transformers

    from suites.checks.probes import _per_token, expert_choices

    config = transformers.AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        vocab_size=64,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 64, (2, 5))
    returned = []
    watch = model.model.layers[1].mlp.gate.register_forward_hook(lambda _m, _i, output: returned.append(output[2]))
    with torch.no_grad(), expert_choices(model) as recorded:
        model(ids)
    watch.remove()
    routing = _per_token(recorded, (2, 5))
    assert routing.shape == (2, 5, 4)  # 2 layers' routers x top 2
    assert torch.equal(routing.reshape(10, 4)[:, 2:], returned[0].sort(dim=-1).values)
    with torch.no_grad():
        model(ids)  # outside the block: nothing recorded any more
    assert [len(calls) for calls in recorded] == [1, 1]
    dense = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(
            "llama", hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1, vocab_size=64
        )
    )
    with torch.no_grad(), expert_choices(dense) as none:
        dense(ids)
    assert _per_token(none, (2, 5)).shape == (2, 5, 0)


def test_every_check_goes_through_the_one_list_and_every_name_is_one_of_its_checks():
    """suites/checks/judge.py CHECKS: inference, variant and training checks alike; a listed name no entry gives (or
    an entry naming a name not listed) is refused."""
    from suites.checks.judge import CHECKS
    from suites.verdicts.check_names import CHECK_NAMES

    declared = [name for check in CHECKS for name in check.names]
    assert set(declared) == set(CHECK_NAMES)
    assert [name for name in set(declared) if declared.count(name) > 1] == ["memory"]  # a trained model's, too


def test_an_inference_cell_is_judged_by_the_inference_checks_in_order():
    from suites.checks.interface import CheckInputs
    from suites.checks.judge import CHECKS, judge

    reference = _observations()
    ranks = tuple(inference_rank(rank, reference) for rank in range(2))
    results = judge(CheckInputs(DEFAULT_TOLERANCES["fp32"], ranks, reference, _observations()))
    names = ["reference", "shapes", "logits", "ranks_agree", "generation", "perplexity", "memory"]
    assert [r.name for r in results if r.name in names] == names  # a check added later may run among them
    assert [r.name for r in results if not r.passed] == ["memory"]  # both ranks hold the whole model
    training_only = CheckInputs(DEFAULT_TOLERANCES["fp32"], (), unsharded_steps=({},))
    assert [check.names[0] for check in CHECKS if check.applies(training_only)] == ["train_loss"]


def test_a_failing_gate_skips_the_comparisons_but_not_the_variants_own_checks(monkeypatch):
    """Outputs of the wrong shape leave nothing to compare; a quantized variant's relaxed checks and the accuracy
    task still judge the cell (they run on the baseline and the task's answers)."""
    from suites.checks import judge
    from suites.checks.interface import CheckInputs

    reference = _observations()
    narrow = _observations(logits_masked=torch.randn(44, 8))
    ranks = tuple(inference_rank(rank, reference) for rank in range(2))
    results = judge.judge(
        CheckInputs(
            DEFAULT_TOLERANCES["fp32"],
            ranks,
            reference,
            narrow,
            baseline=reference,
            accuracy_reference=(True,) * 30,
            task_correct=(True,) * 30,
        )
    )
    assert [(r.name, r.passed) for r in results] == [
        ("reference", True),
        ("shapes", False),
        ("quant_tokens", True),
        ("quant_perplexity", True),
        ("accuracy", True),
    ]

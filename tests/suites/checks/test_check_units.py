"""The checks on hand-made observations: generation near-ties, the padded row, NaN decode logits, memory by kind."""

import torch

from matrix.registry import DEFAULT_TOLERANCES


def _observations(**changes):
    from suites.checks.probes import Observations

    torch.manual_seed(0)
    base = dict(logits_masked=torch.randn(44, 16), logits_plain=torch.randn(1, 24, 16),
                gen_tokens=torch.tensor([1, 2, 3, 4]), gen_logits=torch.randn(4, 16), nll_sum=100.0, nll_tokens=50,
                forward_seconds=0.1, param_bytes=1000, bytes_by_name={"w": 800, "n": 200}, kinds={"w": "linears", "n": "rest"})
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
    near_tie = generation.check(_observations(gen_logits=tied), _observations(
        gen_tokens=torch.cat([reference.gen_tokens[:2], runner_up.view(1), reference.gen_tokens[3:]]),
        gen_logits=tied), tolerance)
    assert near_tie.passed and "near-tie at token 2" in near_tie.reason
    wrong = generation.check(reference, _observations(
        gen_tokens=torch.cat([reference.gen_tokens[:2], runner_up.view(1), reference.gen_tokens[3:]])), tolerance)
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
    result = generation.check(reference, _observations(gen_logits=nan_step, gen_tokens=reference.gen_tokens),
                              DEFAULT_TOLERANCES["fp32"])
    assert not result.passed and result.failure_class == "generation", result.reason


def test_tensor_kinds_come_from_the_modules_and_buffers_are_never_split_kinds():
    from suites.checks.probes import tensor_kinds

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.q, self.norm = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)
            self.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
            self.fused_experts = torch.nn.Parameter(torch.zeros(2, 4, 4))  # transformers >= 5 layout
            self.register_buffer("causal_mask", torch.ones(1, 1, 4, 4))  # 4-D, but not a weight (gpt_neo)

    assert tensor_kinds(Toy()) == {
        "causal_mask": "rest", "fused_experts": "experts", "embed.weight": "embeddings", "q.weight": "linears",
        "q.bias": "linears", "norm.weight": "rest", "norm.bias": "rest", "experts.0.weight": "experts",
        "experts.0.bias": "experts"}


def test_memory_is_judged_by_kind_and_names_the_kind_left_whole():
    from suites.checks import memory

    kinds = {"embed.weight": "embeddings", "q.weight": "linears", "moe.experts.up": "experts", "norm.weight": "rest"}
    full = {"embed.weight": 200 << 10, "q.weight": 400 << 10, "moe.experts.up": 32 << 20, "norm.weight": 8 << 10}
    reference = _observations(param_bytes=sum(full.values()), bytes_by_name=full, kinds=kinds)
    split = {**full, "q.weight": 200 << 10, "moe.experts.up": 16 << 20}
    assert memory.check(reference, [split, split]).passed
    linears_whole = memory.check(reference, [{**split, "q.weight": 400 << 10}, split])
    assert not linears_whole.passed and linears_whole.metrics["linear_shard_ratio"] == 1.0
    assert linears_whole.reason.startswith("linears not sharded: rank 0 holds")
    experts_whole = memory.check(reference, [split, {**split, "moe.experts.up": (32 << 20) - (512 << 10)}])
    assert not experts_whole.passed
    assert experts_whole.reason.startswith("experts not sharded: rank 1 holds 31.5 of 32 MiB (98%")

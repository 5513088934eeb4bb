"""The policy a model needs, inferred from one forward of each block class on the unsharded model
(suites/checks/policy_inference.py), compared with DeepSpeed's parser and named in the cause (suites/verdicts/policy.py,
suites/verdicts/mechanism.py `cause_of`): tiny registry models and a hand-built MoE block, no rank runs."""

import pytest
import torch

from matrix.checkpoints import tiny_config
from matrix.registry import load_models
from suites.checks.policy_inference import disagreements, infer_policies, parser_made
from suites.checks.sharding import parsed_policy, snapshot
from suites.verdicts.cause_titles import cause_title
from suites.verdicts.mechanism import AutoTPRecord, BreakPoint, Failure, cause_of, cause_sentence
from suites.verdicts.policy import InferredBlock, PolicyDisagreement, deepspeed_name, injection_policy_candidate


def _tiny(name: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(load_models()[name])).eval()


def _inferred(model: torch.nn.Module) -> tuple[InferredBlock, ...]:
    return infer_policies(model, torch.arange(2, 10)[None], snapshot(model).layers)


def _parser_disagrees(model: torch.nn.Module, inferred: tuple[InferredBlock, ...]) -> tuple[PolicyDisagreement, ...]:
    made = parser_made(inferred, {p.layer_class: p.allreduce for p in parsed_policy(model)})
    return disagreements(inferred, made, "the parser")


@pytest.mark.parametrize(
    "name, layer_class, writers",
    [
        ("llama", "LlamaDecoderLayer", ("self_attn.o_proj", "mlp.down_proj")),
        ("falcon", "FalconDecoderLayer", ("self_attention.dense", "mlp.dense_4h_to_h")),  # parallel attention
        ("gpt_bigcode", "GPTBigCodeBlock", ("attn.c_proj", "mlp.c_proj")),
        ("opt", "OPTDecoderLayer", ("self_attn.out_proj", "fc2")),  # linears directly in the block
    ],
)
def test_the_writers_are_the_output_projections_and_agree_with_the_parser(name, layer_class, writers):
    model = _tiny(name)
    (block,) = _inferred(model)
    assert (block.layer_class, block.writers) == (layer_class, writers)
    assert block.readers and not set(block.readers) & set(writers) and block.unrun == ()
    assert _parser_disagrees(model, (block,)) == ()


def test_ctrl_the_parser_misses_the_attention_output_and_the_inference_names_it():
    """CTRL registers its layernorms after `ffn`, so the parser takes only `ffn.2` (the linear before the first norm
    in registration order) as row-parallel; `multi_head_attention.dense` writes the residual too."""
    model = _tiny("ctrl")
    inferred = _inferred(model)
    assert [(b.layer_class, b.writers) for b in inferred] == [("EncoderLayer", ("multi_head_attention.dense", "ffn.2"))]
    assert inferred[0].readers == (
        "multi_head_attention.Wq",
        "multi_head_attention.Wk",
        "multi_head_attention.Wv",
        "ffn.0",
    )
    found = _parser_disagrees(model, inferred)
    assert [d.text for d in found] == [
        "the parser made `multi_head_attention.dense` column-parallel; it writes the residual"
    ]
    candidate = injection_policy_candidate(inferred, found)
    assert candidate is not None
    assert candidate.blocks == (("EncoderLayer", ("multi_head_attention.dense", "ffn.2")),)
    assert candidate.arguments().policy_text() == "{EncoderLayer: ('multi_head_attention.dense', 'ffn.2')}"


class Expert(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = torch.nn.Linear(width, 16), torch.nn.Linear(width, 16), torch.nn.Linear(16, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class SparseMoe(torch.nn.Module):
    """Mixtral's block_sparse_moe as transformers 4 wrote it: a Linear router, top-2 of 4 Linear experts, the chosen
    experts' outputs scaled by their routing weights and added back with index_add_."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(width, 4, bias=False)
        self.experts = torch.nn.ModuleList(Expert(width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(torch.softmax(self.gate(flat), dim=-1), 2, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == index)
            if len(token):
                out.index_add_(0, token, expert(flat[token]) * weights[token, slot, None])
        return out.reshape(x.shape)


class MoeLayer(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
        self.o_proj, self.block_sparse_moe = torch.nn.Linear(width, width), SparseMoe(width)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.o_proj(self.input_layernorm(hidden_states))
        return hidden_states + self.block_sparse_moe(self.post_attention_layernorm(hidden_states))


class MoeModel(torch.nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, width)
        self.layers = torch.nn.ModuleList(MoeLayer(width) for _ in range(2))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden


def test_a_moe_block_s_expert_down_projections_write_and_its_router_reads():
    torch.manual_seed(0)
    model = MoeModel().eval()
    (block,) = infer_policies(model, torch.arange(0, 24)[None], snapshot(model).layers)
    ran = [f"block_sparse_moe.experts.{i}.w2" for i in range(4) if f"block_sparse_moe.experts.{i}.w1" in block.readers]
    assert ran, "no expert ran"
    assert block.writers == ("o_proj", *ran)
    assert "block_sparse_moe.gate" in block.readers  # its scores reach the output only through softmax and top-k
    assert block.row_parallel() == (".o_proj", *(deepspeed_name(path) for path in ran))


def test_the_forward_stops_after_the_first_block():
    """One block's forward: the second layer never runs (the forward is raised out of)."""
    torch.manual_seed(0)
    model = MoeModel().eval()
    calls = []
    model.layers[1].register_forward_pre_hook(lambda *_: calls.append(1))
    infer_policies(model, torch.arange(0, 24)[None], snapshot(model).layers)
    assert calls == []


def test_deepspeed_names_are_the_parent_s_name_and_the_linear_s():
    assert deepspeed_name("self_attn.o_proj") == "self_attn.o_proj"
    assert deepspeed_name("block_sparse_moe.experts.3.w2") == "3.w2"
    assert deepspeed_name("fc2") == ".fc2"


def test_a_disagreement_is_the_cause_in_the_parser_s_words():
    """ctrl's record at DeepSpeed 0.19.8: `multi_head_attention.dense` LinearLayer, `ffn.2` LinearAllreduce."""
    block = InferredBlock(
        "EncoderLayer",
        "transformer.h.0",
        ("multi_head_attention.dense", "ffn.2"),
        ("multi_head_attention.Wq", "ffn.0"),
    )
    made = {
        "transformer.h.0.multi_head_attention.dense": "LinearLayer",
        "transformer.h.0.ffn.2": "LinearAllreduce",
        "transformer.h.0.multi_head_attention.Wq": "LinearLayer",
        "transformer.h.0.ffn.0": "LinearLayer",
    }
    found = disagreements((block,), made, "the parser")
    record = AutoTPRecord(2, 4, 4, 128, 0, (), (), (), (), inferred=(block,), disagreements=found)
    broke = BreakPoint("transformer.h.0.multi_head_attention.dense", "Linear", "LinearLayer", "raised", "", "Linear")
    cause = cause_of(Failure("forward", "RuntimeError: mat1 and mat2 shapes cannot be multiplied", record, broke))
    assert cause.mechanism_key == "policy|column-parallel:multi_head_attention.dense"
    assert cause.words.startswith(
        "the parser made `multi_head_attention.dense` column-parallel; it writes the residual; raised in "
    )
    assert cause.whose == "autotp"
    assert cause_sentence(cause.mechanism_key, [cause.words, "other"]) == (
        "the parser made `multi_head_attention.dense` column-parallel; it writes the residual"
    )
    assert (
        cause_title(cause.mechanism_key, cause.words)
        == "`multi_head_attention.dense` made column-parallel by the parser"
    )
    assert disagreements((block,), {**made, "transformer.h.0.ffn.0": "LinearAllreduce"}, "the parser")[1].text == (
        "the parser made `ffn.0` row-parallel; it reads the residual"
    )
    agreeing = {**made, "transformer.h.0.multi_head_attention.dense": "LinearAllreduce"}
    assert disagreements((block,), agreeing, "the parser") == ()

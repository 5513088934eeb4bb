"""What a cell observes of a model: the same probes run on the unsharded reference and on the
sharded model, so the checks compare like with like.

Each probe exercises one code path a user hits (see AUTOTP-NOTES: a bug can live in one path only):
prefill with and without an attention mask, greedy decoding with the KV cache, and the `labels=`
loss path used for perplexity.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from suites.checks.inputs import ProbeInputs, ProbeSpec


@dataclass
class Observations:
    logits_masked: torch.Tensor
    """[real tokens, V] float32 prefill logits of the padded batch at its unpadded positions
    (padded positions hold arbitrary values in any model)."""
    logits_plain: torch.Tensor
    """[1, T, V] float32 prefill logits of the first prompt with no attention mask passed."""
    gen_tokens: torch.Tensor
    """[K] greedy tokens generated after the first prompt."""
    gen_logits: torch.Tensor
    """[K, V] float32 logits of each decoding step."""
    gen_padded_tokens: torch.Tensor
    """[2, K] greedy tokens generated for the padded batch at once (row 1 is left-padded): batched decoding."""
    gen_padded_logits: torch.Tensor
    """[2, K, V] float32 logits of each of its decoding steps."""
    nll_sum: float
    """Summed negative log-likelihood over the scored corpus tokens."""
    nll_tokens: int
    forward_seconds: float
    param_bytes: int
    """Bytes of parameters and buffers this process holds for the model."""
    bytes_by_name: dict[str, int]
    """The same bytes per parameter/buffer name (AutoTP keeps the names of the layers it replaces)."""
    kinds: dict[str, str]
    """Kind of each name (see `tensor_kinds`); meaningful on the unsharded model, whose module types
    AutoTP has not replaced yet."""

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_sum / self.nll_tokens)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> "Observations":
        return cls(**data)


def _sliding_window_nll(model, corpus_ids: torch.Tensor, spec: ProbeSpec, device) -> tuple[float, int]:
    """Perplexity the HF-guide way: overlapping windows, only the new tokens of each window scored."""
    nll_sum, scored, previous_end = 0.0, 0, 0
    length = corpus_ids.shape[1]
    for begin in range(0, length, spec.ppl_stride):
        end = min(begin + spec.ppl_window, length)
        new_tokens = end - previous_end
        window = corpus_ids[:, begin:end].to(device)
        labels = window.clone()
        labels[:, :-new_tokens] = -100
        loss = model(window, labels=labels).loss
        # The loss is a mean over the shifted labels: the first token of a window is never predicted.
        predicted = (labels[:, 1:] != -100).sum().item()
        nll_sum += loss.float().item() * predicted
        scored += predicted
        previous_end = end
        if end == length:
            break
    return nll_sum, scored


@torch.no_grad()
def observe(model, inputs: ProbeInputs, spec: ProbeSpec, device) -> Observations:
    started = time.perf_counter()
    batch_ids, batch_mask = inputs.batch_ids.to(device), inputs.batch_mask.to(device)
    logits_masked = model(batch_ids, attention_mask=batch_mask).logits[batch_mask.bool()].float().cpu()
    logits_plain = model(batch_ids[:1]).logits.float().cpu()
    gen_tokens, gen_logits = _greedy(model, batch_ids[:1], batch_mask[:1], spec)
    gen_padded_tokens, gen_padded_logits = _greedy(model, batch_ids, batch_mask, spec)
    nll_sum, nll_tokens = _sliding_window_nll(model, inputs.corpus_ids, spec, device)
    by_name = bytes_by_name(model)
    return Observations(logits_masked, logits_plain, gen_tokens[0], gen_logits[0], gen_padded_tokens, gen_padded_logits,
                        nll_sum, nll_tokens,
                        time.perf_counter() - started, sum(by_name.values()), by_name, tensor_kinds(model))


def _greedy(model, ids: torch.Tensor, mask: torch.Tensor, spec: ProbeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, K] greedy tokens, [B, K, V] logits of each decode step) with the KV cache."""
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=spec.new_tokens, min_new_tokens=spec.new_tokens,
                               do_sample=False, use_cache=True, output_logits=True, return_dict_in_generate=True,
                               pad_token_id=0)
    return generated.sequences[:, ids.shape[1]:].cpu(), torch.stack(generated.logits, dim=1).float().cpu()


KINDS = ("linears", "experts", "embeddings", "rest")
"""What a rank holds, by kind: attention/MLP linear layers and MoE experts are what AutoTP must split;
embeddings + lm_head and the rest (norms, routers' buffers, rotary tables) may stay whole."""


def bytes_by_name(model) -> dict[str, int]:
    named = [*model.named_parameters(), *model.named_buffers()]  # a tied parameter comes once
    return {name: tensor.numel() * tensor.element_size() for name, tensor in named}


def tensor_kinds(model) -> dict[str, str]:
    """Kind of every parameter and buffer, from the module that holds it. transformers >= 5 stores MoE
    experts as fused 3-D parameters, not nn.Linear modules: counting only nn.Linear would miss them."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kinds = {}
    for module_name, module in model.named_modules():
        for local, _ in module.named_buffers(recurse=False):
            # Buffers (causal masks, rotary tables) are never what AutoTP splits, whatever their rank.
            kinds.setdefault(f"{module_name}.{local}" if module_name else local, "rest")
        for local, tensor in module.named_parameters(recurse=False):
            name = f"{module_name}.{local}" if module_name else local
            if tensor.dim() >= 3 or "experts" in module_name.split("."):
                kind = "experts"
            elif isinstance(module, torch.nn.Embedding) or (output is not None and module is output):
                kind = "embeddings"
            elif isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
                kind = "linears"
            else:
                kind = "rest"
            kinds.setdefault(name, kind)
    return kinds

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

from suites.inputs import ProbeInputs, ProbeSpec


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
    nll_sum: float
    """Summed negative log-likelihood over the scored corpus tokens."""
    nll_tokens: int
    forward_seconds: float
    param_bytes: int
    """Bytes of parameters and buffers this process holds for the model."""
    linear_bytes: int
    """Bytes of the `nn.Linear` weights and biases: what AutoTP is expected to split."""

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
    generated = model.generate(
        batch_ids[:1], attention_mask=batch_mask[:1], max_new_tokens=spec.new_tokens, min_new_tokens=spec.new_tokens,
        do_sample=False, use_cache=True, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
    )
    gen_tokens = generated.sequences[0, batch_ids.shape[1]:].cpu()
    gen_logits = torch.stack([step[0] for step in generated.logits]).float().cpu()
    nll_sum, nll_tokens = _sliding_window_nll(model, inputs.corpus_ids, spec, device)
    return Observations(logits_masked, logits_plain, gen_tokens, gen_logits, nll_sum, nll_tokens,
                        time.perf_counter() - started, _bytes(model), _linear_bytes(model))


def _bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def _linear_bytes(model) -> int:
    return sum(_bytes(m) for m in model.modules() if isinstance(m, torch.nn.Linear))

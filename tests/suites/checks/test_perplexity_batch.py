"""Perplexity's windows scored as one batch: the same tokens and the same NLL as one forward per window."""

import pytest
import torch

from matrix.checkpoints import tiny_checkpoint
from matrix.registry import load_models
from suites.checks.inputs import ProbeSpec, build_inputs, load_tokenizer
from suites.checks.probes import observe, perplexity_batch
from suites.variants.loading import load_model


def _window_by_window(model, corpus_ids: torch.Tensor, spec: ProbeSpec) -> tuple[float, int]:
    """The HF guide's loop: one forward per window, only the tokens new to a window scored."""
    nll_sum, scored, previous_end = 0.0, 0, 0
    for begin in range(0, corpus_ids.shape[1], spec.ppl_stride):
        end = min(begin + spec.ppl_window, corpus_ids.shape[1])
        window = corpus_ids[:, begin:end]
        labels = window.clone()
        labels[:, : -(end - previous_end)] = -100
        predicted = int((labels[:, 1:] != -100).sum())
        nll_sum += model(window, labels=labels).loss.item() * predicted
        scored, previous_end = scored + predicted, end
        if end == corpus_ids.shape[1]:
            break
    return nll_sum, scored


def test_the_batch_scores_each_corpus_token_once_as_the_window_loop_does():
    spec = ProbeSpec()
    corpus = torch.arange(spec.ppl_tokens).view(1, -1)
    ids, labels = perplexity_batch(corpus, spec)
    assert ids.shape == (7, spec.ppl_window)
    assert ids[:, 0].tolist() == list(range(0, spec.ppl_tokens - spec.ppl_window + 1, spec.ppl_stride))
    scored = labels[:, 1:][labels[:, 1:] != -100]  # a window's first token is never predicted
    assert scored.tolist() == list(range(1, spec.ppl_tokens))


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
@torch.no_grad()
def test_one_batched_forward_gives_the_perplexity_of_one_forward_per_window(model_name):
    spec = ProbeSpec()
    model = load_model(str(tiny_checkpoint(load_models()[model_name])), "fp32", False)
    inputs = build_inputs(load_tokenizer(None), spec)
    observed = observe(model, inputs, spec, "cpu")
    nll_sum, scored = _window_by_window(model, inputs.corpus_ids, spec)
    assert observed.nll_tokens == scored == spec.ppl_tokens - 1
    assert observed.nll_sum == pytest.approx(nll_sum, rel=1e-5)


def test_a_spec_whose_windows_cannot_all_be_full_is_refused():
    with pytest.raises(ValueError, match="ppl_tokens 250, ppl_window 64, ppl_stride 32: need"):
        ProbeSpec(ppl_tokens=250)

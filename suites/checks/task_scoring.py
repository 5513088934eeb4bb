"""Scoring a continuation after a context, as lm-evaluation-harness scores multiple-choice answers: shared
by the shipped tasks (suites/checks/task_probe.py) and lm-eval's own (suites/checks/lm_eval_tasks.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from suites.base.model_types import CausalLM, Device, Tokenizer


class TaskError(ValueError):
    """A task file that cannot be used; the message names the file, the line and the field."""


def _split(tokenizer: Tokenizer, context: str, choice: str) -> tuple[list[int], list[int]]:
    """Context and continuation ids, lm-eval's way: trailing context spaces move to the continuation."""
    stripped = context.rstrip(" ")
    choice = context[len(stripped) :] + choice
    context_ids = list(tokenizer.encode(stripped))
    whole = list(tokenizer.encode(stripped + choice))
    return whole[: len(context_ids)], whole[len(context_ids) :]


@torch.no_grad()
def continuation_loglikelihoods(
    model: CausalLM, tokenizer: Tokenizer, pairs: list[tuple[str, str]], device: Device
) -> list[tuple[float, bool]]:
    """(summed log-likelihood, whether greedy decoding would produce it) of each continuation after its
    context, all pairs in one forward: right-padded, the padding sits after every scored position, so a
    causal model's scores do not depend on it and no attention mask is needed."""
    split = [_split(tokenizer, context, continuation) for context, continuation in pairs]
    for (context, continuation), (context_ids, continuation_ids) in zip(pairs, split):
        if not context_ids or not continuation_ids:
            raise TaskError(
                f"{context!r} + {continuation!r}: the tokenizer leaves no context or no continuation tokens"
            )
    width = max(len(c) + len(k) for c, k in split)
    ids = torch.tensor([c + k + [0] * (width - len(c) - len(k)) for c, k in split], device=device)
    log_probs = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    scores = []
    for row, (context_ids, continuation_ids) in enumerate(split):
        positions = torch.arange(
            len(context_ids) - 1, len(context_ids) + len(continuation_ids) - 1, device=log_probs.device
        )
        targets = torch.tensor(continuation_ids, device=log_probs.device)
        rows = log_probs[row, positions]
        scores.append(
            (rows[torch.arange(len(targets)), targets].sum().item(), bool((rows.argmax(-1) == targets).all()))
        )
    return scores

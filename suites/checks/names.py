"""The checks' names, the one place they are spelled: a judged failure's signature is `<check>: <finding>`, and the
reports tell it from a raised exception's `<Type>: <message> @ <where>` by its first word (reports/analysis/reasons.py).
A check's `CheckResult.name` is a `CheckName`, so strict mypy refuses a check whose name is not listed here.

Imports only typing: the reports import it without torch or the checks."""

from __future__ import annotations

from typing import Literal, get_args

CheckName = Literal[
    # inference (suites/checks/judge.py run_all, in order)
    "reference",
    "shapes",
    "logits",
    "ranks_agree",
    "generation",
    "perplexity",
    "memory",
    # inference variants: meta load, quantized, accuracy task
    "meta_memory",
    "quant_tokens",
    "quant_perplexity",
    "accuracy",
    # training (suites/checks/training.py), then its checkpoint round trip
    "train_loss",
    "train_grads",
    "train_update",
    "lm_head",
    "save",
    "gather",
    "load",
    "resume",
]

CHECK_NAMES: tuple[CheckName, ...] = get_args(CheckName)


def judged_signature(check: CheckName, finding: str) -> str:
    """A judged failure's signature: the check's name, then what it found (`Finding.short`)."""
    return f"{check}: {finding}"

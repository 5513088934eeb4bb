"""The checks' names, the one place they are spelled: a judged failure's signature is `<check>: <finding>`, and the
reports tell it from a raised exception's `<Type>: <message> @ <where>` by its first word (reports/analysis/reasons.py).
A check's `CheckResult.name` is a `CheckName`, so strict mypy refuses a check whose name is not listed here.

Imports only typing: the reports import it without torch or the checks."""

from __future__ import annotations

import re
from typing import Literal, get_args

CheckName = Literal[
    # inference (suites/checks/judge.py CHECKS, in order)
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


def at_floor(metric: str, k: int) -> str:
    """The name of `metric` had the scale floor been 2^-k of the largest magnitude (suites/variants/training.py
    FLOOR_CANDIDATES): `<metric>_floor_2_to_minus_<k>`. A metric name is an identifier, as the door holds it
    (reports/store/validation.py): the floor's exponent is a documented suffix, never a formula such as `2^-10`."""
    return f"{metric}_floor_2_to_minus_{k}"


_FORMULA_FLOOR = re.compile(r"_floor2\^-(\d+)$")
"""How harnesses before `at_floor` named the same metrics (`grad_first_step_max_rel_error_floor2^-10`)."""


def current_metric_name(name: str) -> str:
    """A metric's name as this harness writes it: an older JUnit file's or cells.jsonl's `<metric>_floor2^-<k>` read
    as `at_floor(metric, k)`, every other name unchanged."""
    formula = _FORMULA_FLOOR.search(name)
    return at_floor(name[: formula.start()], int(formula[1])) if formula else name

"""A cause in a few words for a bug report's title, from the key and words `suites/verdicts/mechanism.py` `cause_of`
writes."""

from __future__ import annotations

import re

from suites.verdicts import policy
from suites.verdicts.mechanism import FRAME, IDLE_RANKS, LEFT_WHOLE_TEXT
from suites.verdicts.statements import LAYOUT_MECHANISMS, MECHANISMS_BY_NAME, POLICY_PROBE

PROOF = re.compile(r" \((?:mechanism not proven|verified): .*\)$", re.DOTALL)
"""What suites/verdicts/statements.py `stated` appends to a cause's sentence: what proved it, or what was tried."""


def cause_title(mechanism_key: str, words: str) -> str:
    """A cause in a few words for a bug report's title, from its mechanism key (`cause_of` writes both); whole, never
    cut."""
    kind, _, rest = mechanism_key.partition("|")
    parts = rest.split("|")
    known = (
        MECHANISMS_BY_NAME.get(parts[0])
        if kind == "model"
        else POLICY_PROBE
        if kind == "no policy"
        else LAYOUT_MECHANISMS.get(parts[-1])
        if kind == "layout"
        else None
    )
    if known:
        return known.title
    if kind == "column-parallel":
        return f"the parser leaves `{parts[0]}` column-parallel where it must be row-parallel"
    if kind == "router":
        return f"MoE router made {parts[0]} by the parser"
    if kind == "policy":
        return policy.policy_title(parts, sentence=False)
    if kind == "kv-unit split" and parts[0] == IDLE_RANKS:
        return "fewer kv heads than ranks leaves ranks idle, without query heads"
    if kind == "kv-unit split":
        return "fewer kv heads than ranks crashes attention that hard-codes its kv split"
    if kind == "left whole":
        found = LEFT_WHOLE_TEXT.match(words)
        if found:
            return f"`{found[1].removesuffix('.weight')}` left whole beside the split `{found[2]}`"
        return f"a {' or '.join(parts[0].split(','))} tensor left whole beside a split projection"
    if kind == "layout":
        return f"`{parts[0]}` split as {parts[1]}"
    if kind == "at":
        return f"`{parts[0]}` ({parts[2] or parts[1]}) fails after the split"
    if kind == "memory":
        return f"{parts[0].partition(': ')[0]} on every rank"
    return FRAME.sub("", PROOF.sub("", words)).partition(". ")[0]

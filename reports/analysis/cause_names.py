"""One name per cause, in every output: a cause's title (a few whole words: what AutoTP did, from the mechanism the
harness recorded, else the failure's reason), said with its class ("forward: fewer kv heads than ranks crashes
attention that hard-codes its kv split"). The report's failing-now entry, the step summary, the per-checkpoint lines,
the supported-models page, the draft issue's title, the PR comment, the regression issue and the gate all name a cause
by `cause_title`; its error text is a cell's detail, never its name. Where a line is short, `shortened` cuts a text at
a word boundary, never inside a word or a code span."""

from __future__ import annotations

from collections.abc import Sequence

from reports.analysis.reasons import reason
from suites.verdicts.cause_titles import cause_title as mechanism_title
from suites.verdicts.mechanism import cause_sentence, class_and_finding


def cause_title(failure_class: str, masked_signature: str, mechanism_key: str, mechanism: str) -> str:
    """A cause's name in a few whole words: from its mechanism key and sentence where the harness located one
    (suites/verdicts/cause_titles.py), else the reason its class and masked signature give (reports.analysis.reasons);
    `mechanism` is "" where nothing was located."""
    if mechanism and mechanism_key:
        return " ".join(mechanism_title(mechanism_key, mechanism).split())
    return reason(failure_class, masked_signature).short


def located_sentence(mechanism_key: str, words: Sequence[str], masked_signature: str) -> str:
    """The sentence a cause's cells share (`cause_sentence`), "" where none was located or it only repeats the
    signature: what `cause_title` names a cause by where the report's failing-now entry is not at hand."""
    if not words or not mechanism_key:
        return ""
    sentence = cause_sentence(mechanism_key, words)
    return "" if sentence == masked_signature else sentence


def named(failure_class: str, title: str) -> str:
    """ "forward: <title>": a cause's name with its class, as every output says it."""
    return class_and_finding(failure_class, title)


ELLIPSIS = "…"


def shortened(text: str, limit: int) -> str:
    """`text` in at most `limit` characters, cut at a word boundary (never inside a word or a `code span`) with an
    ellipsis; whole where it fits."""
    if len(text) <= limit:
        return text
    room = limit - len(ELLIPSIS)
    cut = text[: room + 1]
    end = cut.rfind(" ")
    while end > 0 and cut[:end].count("`") % 2:  # the cut would open a code span it never closes
        end = cut.rfind(" ", 0, end)
    return (cut[:end].rstrip(" ,;:—(") if end > 0 else "") + ELLIPSIS

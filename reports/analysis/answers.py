"""The one line that answers a transition — which release, commit and PR broke (or fixed) a cell — as
every output says it: report.md, report.html, the GitHub step summary, publish's PR comment and issues.

    bloom tp2 eager fp32: broke at transformers 5.20.2 → 5.21.0, first bad commit abc1234567 (#41234
    "Refactor attention"), forward: RuntimeError: … @ transformers/models/bloom/modeling_bloom.py:forward

Works on a TransitionEntry: a transition as the report has it (reports.outputs.model builds it; report.json keeps it
under "regressions"/"fixes"/"class_changes"). answer_words is the answer alone, which a root cause's cells share
(reports.analysis.causes).
`link(text, url)` decides the markup: a Markdown one (reports.outputs.markdown_safety.markdown_link, which marks it as
the harness's), an HTML one (reports.outputs.links.linked_html), or plain_link for a terminal."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields

from markupsafe import Markup, escape

from matrix.json_records import read_record, split_keys
from reports.store import (
    GITHUB_REPOSITORY,
    Bisection,
    CellKey,
    Commit,
    JSONObject,
    Pins,
    TransitionKind,
    TriageAttempt,
    parse_pins,
    pins_text,
)

Link = Callable[[str, str], str]
CELL_FIELDS = tuple(field.name for field in fields(CellKey))
"""A cell's key as report.json flattens it into the entries that name the cell."""
MAX_SUSPECTS = 3  # in the line; report.json keeps them all


@dataclass(frozen=True)
class EntryStatus:
    """A cell's verdict at one end of a transition, as the report states it."""

    status: str  # pass | fail | flaky | skip | unsupported
    passes: int
    fails: int
    skips: int
    failure_class: str
    signature: str
    key_metric: float | None


@dataclass(frozen=True)
class TransitionEntry:
    """A transition as the report states it (report.json's "regressions", "fixes" and "class_changes"): the
    range by its labels, the held-fixed pins, both ends' verdicts, the candidate commits, and the bisection that
    answers it or the triage attempt that could not."""

    cell: CellKey
    kind: TransitionKind
    axis: str
    before: str  # the axis's label (a DeepSpeed git build as 0.19.8@abc1234567)
    after: str
    held_fixed: Pins
    before_status: EntryStatus
    after_status: EntryStatus
    commits: tuple[Commit, ...]
    bisection: Bisection | None
    attempt: TriageAttempt | None

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        """report.json's form of it (reports.outputs.model.entry_json): the cell flattened, the pins as text."""
        cell_fields, transition = split_keys(entry, CELL_FIELDS)
        cell = read_record(CellKey, cell_fields)
        bisection, attempt = transition["bisection"], transition["attempt"]
        return {
            **transition,
            "cell": cell,
            "held_fixed": parse_pins(transition["held_fixed"]),
            # An answer is the transition's own cell's (reports.analysis.history.answer_for).
            "bisection": answer_shape(bisection, cell) if bisection else None,
            "attempt": answer_shape(attempt, cell) if attempt else None,
        }

    def json_shape(self, written: JSONObject) -> JSONObject:
        """report.json's form of it (own_shape's inverse): the cell by its id and its parts, the pins as text."""
        transition = {name: item for name, item in written.items() if name != "cell"}
        return {
            "cell": self.cell.id,
            **written["cell"],
            **transition,
            "held_fixed": pins_text(self.held_fixed),
            "bisection": answer_json(written["bisection"], self.bisection) if self.bisection else None,
            "attempt": answer_json(written["attempt"], self.attempt) if self.attempt else None,
        }


def answer_shape(entry: JSONObject, cell: CellKey) -> JSONObject:
    """A bisection or triage attempt in its fields' shape, from report.json's (reports.outputs.model.answer_json:
    the cell by its id, the pins as text)."""
    return {**entry, "cell": cell, "held_fixed": parse_pins(entry["held_fixed"])}


def answer_json(written: JSONObject, answer: Bisection | TriageAttempt) -> JSONObject:
    """A written bisection or triage attempt as report.json has it (answer_shape's inverse): the cell by its id, the
    pins as text."""
    return {**written, "cell": answer.cell.id, "held_fixed": pins_text(answer.held_fixed)}


def bisection_from_json(entry: JSONObject, cell: CellKey) -> Bisection:
    """A bisection from report.json's form of it, whose cell by its id the caller looked up."""
    return read_record(Bisection, answer_shape(entry, cell))


def plain_link(text: str, url: str) -> str:
    return text


def one_line(text: str) -> str:
    return " ".join(text.split())


def code(text: str) -> str:
    """Inline code that survives any signature (Markdown has no escape inside backticks)."""
    return "`" + one_line(text).replace("`", "'") + "`"


_CODE_SPAN = re.compile(r"`+([^`]+?)`+")


def code_html(line: str) -> Markup:
    """A Markdown line for report.html: the text escaped, its code spans (`code`) as <code>."""
    return Markup(_CODE_SPAN.sub(r"<code>\1</code>", str(escape(line))))


def cell_label(cell: CellKey) -> str:
    return f"{cell.model} tp{cell.tp} {cell.variant} {cell.dtype}"


def commit_url(axis: str, sha: str) -> str:
    return f"https://github.com/{GITHUB_REPOSITORY[axis]}/commit/{sha}"


def pr_url(axis: str, pr: int) -> str:
    return f"https://github.com/{GITHUB_REPOSITORY[axis]}/pull/{pr}"


def commit_words(axis: str, commit: Commit, link: Link) -> str:
    """`abc1234567 (#1234 "subject")`, each part linked to GitHub."""
    sha = link(commit.sha[:10], commit_url(axis, commit.sha)) if axis in GITHUB_REPOSITORY else commit.sha[:10]
    subject = one_line(commit.subject)
    if commit.pr:
        subject = subject.replace(f" (#{commit.pr})", "")
        number = link(f"#{commit.pr}", pr_url(axis, commit.pr)) if axis in GITHUB_REPOSITORY else f"#{commit.pr}"
        return f'{sha} ({number} "{subject}")'
    return f'{sha} ("{subject}")'


def failure_text(status: EntryStatus) -> str:
    return f"{status.failure_class}: {one_line(status.signature)}"


def answer_words(t: TransitionEntry, link: Link) -> str:
    """The answer alone, without the cell and its failure — what every cell of a root cause shares: the
    narrowest range and the commit (or suspects) found, or why there is none yet."""
    b = t.bisection
    if b is None:
        return f"triage could not answer: {one_line(t.attempt.reason)}" if t.attempt else "not yet triaged"
    # A class change is bisected like a regression, its old failure standing for "good".
    verb, which = {
        "broke": ("broke", "first bad"),
        "fixed": ("fixed", "first good"),
        "class-change": ("changed", "first changed"),
    }[t.kind]
    parts = [f"{verb} at {b.axis} {b.before} → {b.after}"]
    if b.commit:
        parts.append(f"{which} commit {commit_words(b.axis, Commit(b.commit, b.subject, b.pr), link)}")
    elif b.suspects:
        shown = [commit_words(b.axis, s, link) for s in b.suspects[:MAX_SUSPECTS]]
        more = f" and {len(b.suspects) - MAX_SUSPECTS} more" if len(b.suspects) > MAX_SUSPECTS else ""
        parts.append(f"suspect commits {'; '.join(shown)}{more}")
    if b.untestable:
        parts.append(f"untestable in between: {', '.join(c[:10] for c in b.untestable)}")
    return ", ".join(parts)


def answer_text(t: TransitionEntry, link: Link) -> str:
    """One line per transition: where it changed, the narrowest answer known, and the failure."""
    answer = answer_words(t, link)
    if t.kind == "class-change":
        return (
            f"{cell_label(t.cell)}: failure class changed at {t.axis} {t.before} → {t.after}: "
            f"{t.before_status.failure_class} → {failure_text(t.after_status)} ({answer})"
        )
    broke = t.kind == "broke"
    failure = failure_text(t.after_status) if broke else f"was {failure_text(t.before_status)}"
    b = t.bisection
    if b is None:
        verb = "broke" if broke else "fixed"
        return f"{cell_label(t.cell)}: {verb} at {t.axis} {t.before} → {t.after} ({answer}), {failure}"
    line = f"{cell_label(t.cell)}: {answer}, {failure}"
    return f"{line} (confirmed here; bisected on {b.confirmed_from})" if b.confirmed_from else line

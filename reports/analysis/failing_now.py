"""Failing now, by cause: the first section of every report when cells fail at the latest versions.

The failing cells at the latest versions are grouped by cause (reports.analysis.signatures.failure_key: the cause the
harness recorded, what AutoTP did where it broke, suites/mechanism.py; for a failure recorded before causes were kept,
its class and signature with every number masked). Each cause says its mechanism in words, whose bug it is (AutoTP's
wherever the exception surfaced, the unsharded model passing the same probes; the frame is "surfaced in"), since when
it fails (the oldest version set in the history where the same cause appears, or "since the first run"), the answer
triage found for the transitions that brought it into the latest versions, whether it is known (matrix/
known_failures.toml: "known" with the upstream link, "known by design" with DeepSpeed's refusing line, else "new"), and
the one command that reproduces a representative cell. An open known failure whose cells pass at the latest versions
is listed as "fixed at <version>: close <link>"; a fixed one that fails again at or after its fix as "reopen".

Built into the report model (reports.outputs.model.build_report) as report.json's form of the section, and rendered from
the Report, so report.md, report.html and the step summary say the same; `cause_id` is the one publish's issues
carry for the same class and cause."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from matrix.cells import replay_name
from matrix.registry import KnownFailure
from reports.store import AXES, Aggregates, CellKey, ResultGroup, Versions, started_order
from reports.analysis.answers import Link, TransitionEntry, code
from reports.analysis.causes import RootCause, by_kind, cause_id, cells_text, count_text, shared_answers, typed_members
from reports.analysis.history import History, Transition
from reports.analysis.known import (
    FixedKnown,
    KnownMatch,
    fixed_known,
    known_for,
    known_from_json,
    versions_of,
)
from reports.analysis.signatures import cause, failure_key, surfaced_in
from reports.analysis.statuses import CellStatus
from suites.mechanism import WHOSE, whose

LOGS_ROOT = "results/logs"  # where a cell that ends its rank group keeps the launcher, fork-server and rank logs
INTRO = (
    "Each cause with what AutoTP did where it broke, whose bug it is (AutoTP's wherever its exception surfaced: the "
    "unsharded model passes the same probes), since when it fails, the triage answer and the command that reproduces "
    "one of its cells "
    "(it also writes results/repro/repro_<cell>.py; the logs folder holds the rank logs when the cell ends its "
    "rank group)."
)
STATUS_ORDER = ("new", "known", "by design")
"""A cause's status, in the order causes are listed: new ones first, those DeepSpeed refuses on purpose last."""


def repro_command(cell: CellKey) -> str:
    """The one command that runs this cell alone, with its verdict and a standalone repro script."""
    return (
        f"nox -s repro -- --models {replay_name(cell.model)} --variants {cell.variant} --dtypes {cell.dtype} "
        f"--tp {cell.tp}"
    )


# ---- The section (report.json "failing_now": asdict of FailingNow) ------------------------------------------------


@dataclass(frozen=True)
class FirstSeen:
    """Since when a cause fails: the text a report prints, and the run and versions where it was first seen."""

    text: str
    run: str
    started: str
    versions: str


@dataclass(frozen=True)
class Repro:
    """The representative cell of a cause, the command that runs it alone and where its logs go."""

    cell: str
    command: str
    logs: str


@dataclass(frozen=True)
class FailingCause:
    """The cells failing at the latest versions with one cause."""

    id: str
    failure_class: str  # the classes its cells fail with, the most cells first ("forward, numerics")
    cause: str  # the representative cell's signature, numbers masked
    count: int
    cells: tuple[str, ...]
    cells_text: str
    since: FirstSeen
    root_causes: tuple[str, ...]  # the ids of the root causes that brought these cells into the latest versions
    status: str  # "new", "known" when a known failure covers some of its cells, "by design" when one by design does
    known: KnownMatch | None
    repro: Repro
    key: str = ""  # what groups its cells (reports.analysis.signatures.failure_key)
    mechanism: str = ""  # the mechanism in words (suites/mechanism.py Cause.words); "" before causes were kept
    whose: str = ""  # a key of suites.mechanism.WHOSE
    surfaced_in: str = ""  # the frame its representative's exception surfaced in


@dataclass(frozen=True)
class FailingNow:
    cells: int
    causes: tuple[FailingCause, ...]  # new ones first, then the most cells first
    fixed_known: tuple[FixedKnown, ...]

    @classmethod
    def from_json(cls, section: dict) -> FailingNow:
        return cls(
            cells=section["cells"],
            causes=tuple(
                FailingCause(
                    **{
                        **c,
                        "cells": tuple(c["cells"]),
                        "since": FirstSeen(**c["since"]),
                        "root_causes": tuple(c["root_causes"]),
                        "known": known_from_json(c["known"]) if c["known"] else None,
                        "repro": Repro(**c["repro"]),
                    }
                )
                for c in section["causes"]
            ),
            fixed_known=tuple(FixedKnown(**{**f, "cells": tuple(f["cells"])}) for f in section["fixed_known"]),
        )


def build_failing_now(
    root_causes: tuple[RootCause, ...], history: History, aggregates: Aggregates, known: dict[str, KnownFailure]
) -> FailingNow:
    """report.json "failing_now": the causes of the cells failing at the latest versions (new ones first, then
    the most cells first) and the open known failures whose cells pass there now."""
    latest = history.latest
    failing: dict[str, list[tuple[CellKey, CellStatus]]] = defaultdict(list)
    for (cell, versions), status in history.statuses.items():
        if versions == latest and status.status == "fail":
            failing[failure_key(status.failure_class, status.signature, status.cause)].append((cell, status))
    first_seen = _first_seen(aggregates, history)
    transitions = by_kind(history.transitions)
    first_run = aggregates.first_run.run_id
    at_latest = versions_of(latest)
    causes: list[FailingCause] = []
    for key, members in failing.items():
        members.sort(key=lambda member: member[0])
        cells = [cell for cell, _ in members]
        representative, shown = min(members, key=lambda m: (m[0].tp, m[0].model, m[0].variant, m[0].dtype))
        classes = Counter(status.failure_class for _, status in members)
        text = cause(shown.signature)
        match = known_for(known, members, at_latest)
        causes.append(
            FailingCause(
                # a cause recorded before causes were kept keeps the id it had (publish's issues carry it)
                id=cause_id(key) if shown.cause else cause_id(shown.failure_class, text),
                failure_class=", ".join(name for name, _ in classes.most_common()),
                cause=text,
                count=len(cells),
                cells=tuple(cell.id for cell in cells),
                cells_text=cells_text(cells),
                since=_since(first_seen[key], first_run, latest),
                root_causes=tuple(_root_causes(root_causes, transitions, latest, key, set(cells))),
                status=("by design" if match.state == "by design" else "known") if match else "new",
                known=match,
                repro=Repro(
                    cell=representative.id,
                    command=repro_command(representative),
                    logs=f"{LOGS_ROOT}/{representative.id}/",
                ),
                key=key,
                mechanism=shown.cause.words if shown.cause else "",
                whose=shown.cause.whose if shown.cause else whose(shown.failure_class),
                surfaced_in=surfaced_in(shown.signature),
            )
        )
    causes.sort(key=lambda c: (STATUS_ORDER.index(c.status), -c.count, c.failure_class, c.cause))
    return FailingNow(
        cells=sum(c.count for c in causes),
        causes=tuple(causes),
        fixed_known=tuple(fixed_known(history, aggregates, known)),
    )


def _first_seen(aggregates: Aggregates, history: History) -> dict[str, ResultGroup]:
    """Per cause, its failures at the oldest version set of the history (in the history's version order) that hold
    the earliest run there (of two as early, the smaller run id, then the first cell)."""
    order = {versions: index for index, versions in enumerate(history.version_sets)}
    first: dict[str, tuple[tuple, ResultGroup]] = {}
    for group in aggregates.groups:
        if group.outcome != "fail":
            continue
        key = failure_key(group.failure_class, group.signature, group.cause)
        rank = order[group.versions], *started_order(group.earliest), group.cell
        known = first.get(key)
        if known is None or rank < known[0]:
            first[key] = rank, group
    return {key: group for key, (_, group) in first.items()}


def _since(first: ResultGroup, first_run: str, latest: Versions) -> FirstSeen:
    """Since when a cause fails: "the first run", the versions where it first appears where they differ from the
    latest ones, or the day it first appeared at the latest versions."""
    run = first.earliest
    if run.run_id == first_run:
        text = "since the first run"
    elif first.versions != latest:
        changed = [
            f"{axis} {first.versions.label(axis)}" for axis in AXES if first.versions.label(axis) != latest.label(axis)
        ]
        text = f"since {', '.join(changed)} (first seen {run.started[:10]})"
    else:
        text = f"since {run.started[:10]} (session {run.session})"
    return FirstSeen(text=text, run=run.run_id, started=run.started, versions=first.versions.describe())


def _root_causes(
    root_causes: tuple[RootCause, ...],
    transitions: dict[str, list[Transition]],
    latest: Versions,
    key: str,
    cells: set[CellKey],
) -> list[str]:
    """The root causes (reports.analysis.causes) whose transitions (`transitions`: the history's, by kind) brought these cells
    into the latest versions failing this way: broke, or changed failure class, on one axis with the others at the
    latest versions."""
    ids = []
    for root in root_causes:
        if root.kind == "fixed":
            continue
        for t in typed_members(transitions, root):
            failing = t.failing_end
            if (
                t.cell in cells
                and failure_key(failing.failure_class, failing.signature, failing.cause) == key
                and t.after.label(t.axis) == latest.label(t.axis)
                and t.held_fixed == latest.pins(tuple(a for a in AXES if a != t.axis))
            ):
                ids.append(root.id)
                break
    return ids


class ReportView(Protocol):
    """What the section's text reads of the report model (reports.outputs.model.Report, which builds this module's section
    and so cannot be imported here)."""

    @property
    def failing_now(self) -> FailingNow: ...

    def members(self, root_cause: RootCause) -> list[TransitionEntry]: ...

    def root_cause(self, cause_id: str) -> RootCause: ...


# ---- Text (Markdown, and HTML through a Link) --------------------------------------------------------------------


def summary_text(section: FailingNow) -> str:
    """ "94 cells fail in 27 causes at the latest versions: 24 new, 1 known, 2 known by design; 1 known failure fixed:
    close upstream"."""
    causes = section.causes
    counts = Counter(c.status for c in causes)
    by_status = f"{counts['new']} new, {counts['known']} known" + (
        f", {counts['by design']} known by design" if counts["by design"] else ""
    )
    parts = (
        [
            f"{count_text(section.cells, 'cell')} {'fails' if section.cells == 1 else 'fail'} in "
            f"{count_text(len(causes), 'cause')} at the latest versions: {by_status}"
        ]
        if causes
        else ["No cell fails at the latest versions"]
    )
    if section.fixed_known:
        parts.append(f"{count_text(len(section.fixed_known), 'known failure')} fixed: close upstream")
    return "; ".join(parts)


def status_text(entry: FailingCause, link: Link) -> str:
    """ "new", or "known deepspeedai/DeepSpeed#8185 (open)" with the link; "reopen" for a fix that did not hold."""
    known = entry.known
    if known is None:
        return "new"
    share = f", {len(known.cells)} of {entry.count} cells" if len(known.cells) < entry.count else ""
    upstream = link(known.label, known.upstream)
    if known.state == "by design":
        return f"known by design ({upstream}{share})"
    if known.fails_after_fix:
        return f"known {upstream} (fixed in {known.fixed_in} upstream, yet fails here: reopen{share})"
    state = f"fixed in {known.fixed_in}" if known.state == "fixed" else "open"
    return f"known {upstream} ({state}{share})"


def cause_answer_text(entry: FailingCause, report: ReportView, link: Link) -> str:
    """Where the transitions into the latest versions place the cause and the answer most of its cells share
    (reports.analysis.answers.answer_words), or "" when it failed everywhere the history ran it."""
    transitions = [
        t
        for root_id in entry.root_causes
        for t in report.members(report.root_cause(root_id))
        if t.cell.id in entry.cells
    ]
    if not transitions:
        return ""
    answer, answered = shared_answers(transitions, link)[0]
    first = next(t for t in transitions if t.cell.id in answered)
    cells = {t.cell.id for t in transitions}
    share = f" ({len(answered)} of {len(cells)} cells)" if len(answered) < len(cells) else ""
    if first.bisection:
        return answer + share  # "broke at deepspeed 0.19.7 → 0.19.8, first bad commit …"
    verb = "broke" if first.kind == "broke" else "changed class"
    return f"{verb} at {first.axis} {first.before} → {first.after} ({answer}){share}"


def whose_text(entry: FailingCause, spanned: Callable[[str], str] = code) -> str:
    """ "AutoTP's (DeepSpeed's) bug, surfaced in `transformers/…:forward`" (`spanned`: how the frame is set off); the
    frame only where the line shows the mechanism instead of the signature, which ends with it."""
    surfaced = f", surfaced in {spanned(entry.surfaced_in)}" if entry.surfaced_in and entry.mechanism else ""
    return f"{WHOSE.get(entry.whose, entry.whose)} bug{surfaced}"


def cause_line(entry: FailingCause, report: ReportView, link: Link) -> str:
    """One line per cause: status, class and mechanism (else the masked signature), whose bug and where it surfaced,
    cells, since, answer, and the command with its log folder."""
    shown = f"{entry.mechanism} ({code(entry.cause)})" if entry.mechanism else code(entry.cause)
    parts = [
        f"**{status_text(entry, link)}** {entry.failure_class} {shown}",
        whose_text(entry),
        f"{count_text(entry.count, 'cell')}: {entry.cells_text}",
        entry.since.text,
        cause_answer_text(entry, report, link),
        f"{code(entry.repro.command)} (logs: `{entry.repro.logs}`, cause `{entry.id}`)",
    ]
    return " — ".join(part for part in parts if part)


def fixed_known_text(fixed: FixedKnown, link: Link) -> str:
    """ "fixed at deepspeed 0.19.6: close deepspeedai/DeepSpeed#8185 — shard, 44 cells pass now: …"."""
    how = (
        f" (last failing at {fixed.last_failing}{'' if fixed.bisected else '; not bisected'})"
        if fixed.last_failing
        else ""
    )
    return (
        f"fixed at {fixed.fixed_at}: close {link(fixed.label, fixed.upstream)}{how} — "
        f"`{fixed.name}`, {fixed.failure_class}, {count_text(len(fixed.cells), 'cell')} pass now: "
        f"{fixed.cells_text}"
    )


def failing_now_markdown(report: ReportView, link: Link) -> list[str]:
    """The section, or nothing when no cell fails at the latest versions and no known failure was fixed."""
    section = report.failing_now
    if not section.causes and not section.fixed_known:
        return []
    lines = ["## Failing now, by cause", "", f"{summary_text(section)}. {INTRO}", ""]
    lines += [f"{number}. {cause_line(entry, report, link)}" for number, entry in enumerate(section.causes, start=1)]
    if section.fixed_known:
        lines += ["", "Known failures whose cells pass now:", ""]
        lines += [f"- {fixed_known_text(fixed, link)}" for fixed in section.fixed_known]
    return [*lines, ""]


def failing_now_html(report: ReportView, linked: Callable[[Callable[[Link], list[str]]], list]) -> dict:
    """What the HTML template draws, each text with its links made by `linked` (reports.outputs.render.linked_html)."""
    section = report.failing_now
    causes = section.causes
    return {
        "summary": summary_text(section),
        "intro": INTRO,
        "causes": list(
            zip(
                causes,
                linked(lambda link: [status_text(c, link) for c in causes]),
                linked(lambda link: [cause_answer_text(c, report, link) for c in causes]),
                [whose_text(c, lambda text: text) for c in causes],
            )
        ),
        "fixed_known": linked(lambda link: [fixed_known_text(f, link) for f in section.fixed_known]),
    }

"""Failing now, by cause, as text: the Markdown lines of report.md, the step summary and the terminal, and what the HTML
template draws, with links made by a Link (reports.analysis.answers). The section itself is built in
reports.analysis.failing_now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from markupsafe import Markup

from matrix.earlier_points import DEFAULT_DEEPSPEED_MINORS, DEFAULT_MAX_CELLS, DEFAULT_MAX_POINTS
from reports.analysis.answers import Link, TransitionEntry, code, plain_link
from reports.analysis.cause_names import named
from reports.analysis.causes import RootCause, count_text, shared_answers
from reports.analysis.checkpoints import NamedCause
from reports.analysis.failing_now import STATUS_ORDER, FailingCause, FailingNow
from reports.analysis.known import FixedKnown
from suites.verdicts.mechanism import WHOSE, class_and_finding

INTRO = (
    "Each cause with what AutoTP did where it broke, whose it is (AutoTP's wherever its exception surfaced, as the "
    "unsharded model passes the same probes, unless a source line makes it a design limit, unsupported or a "
    "transformers change), since when it fails, the triage answer, and one of its cells (the one "
    "standing for the checkpoint users run most): the command that runs it alone, its rank logs and its standalone "
    "repro script."
)
FIRST_NIGHT_INTRO = (
    "Each cause with what AutoTP did where it broke, whose it is, and one of its cells (the one standing for the "
    "checkpoint users run most): the command that runs it alone, its rank logs and its standalone repro script."
)


SINCE_WHEN_COMMAND = "nox -s since-when"


class ReportView(Protocol):
    """What the section's text reads of the report model (reports.outputs.model.Report, which builds this module's
    section and so cannot be imported here)."""

    @property
    def failing_now(self) -> FailingNow: ...

    def members(self, root_cause: RootCause) -> list[TransitionEntry]: ...

    def root_cause(self, cause_id: str) -> RootCause: ...


# ---- Text (Markdown, and HTML through a Link) --------------------------------------------------------------------


def named_causes(section: FailingNow) -> dict[str, NamedCause]:
    """Each failing cell's cause (by cell id) with its place in the list and its name: what a verdict line says of it
    (reports.analysis.checkpoints)."""
    return {
        cell: NamedCause(number, entry.id, entry.title)
        for number, entry in enumerate(section.causes, start=1)
        for cell in entry.group.cells
    }


def counts_line(section: FailingNow) -> str:
    """ "91 cells fail in 24 causes (23 new)": what `nox -s matrix` ends with."""
    new = sum(1 for c in section.causes if c.status == "new")
    fails = "fails" if section.cells == 1 else "fail"
    return f"{count_text(section.cells, 'cell')} {fails} in {count_text(len(section.causes), 'cause')} ({new} new)"


def summary_text(section: FailingNow) -> str:
    """ "94 cells fail in 27 causes at the latest versions: 25 new, 1 known, 1 unsupported upstream; 1 known failure
    fixed: close upstream"."""
    causes = section.causes
    tally = {status: sum(1 for c in causes if c.status == status) for status in STATUS_ORDER}
    parts = (
        [
            f"{count_text(section.cells, 'cell')} {'fails' if section.cells == 1 else 'fail'} in "
            f"{count_text(len(causes), 'cause')} at the latest versions: {tally['new']} new, {tally['known']} known"
            + (f", {tally['unsupported']} unsupported upstream" if tally["unsupported"] else "")
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
    share = f", {len(known.cells)} of {entry.group.count} cells" if len(known.cells) < entry.group.count else ""
    upstream = link(known.label, known.upstream)
    if known.state == "unsupported":
        return (
            f"new ({share.lstrip(', ')} unsupported upstream: {upstream})"
            if share
            else f"unsupported upstream ({upstream})"
        )
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
        if t.cell.id in entry.group.cells
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


def files_text(entry: FailingCause, link: Link) -> str:
    """ "phi3.faithful tp2 (microsoft/Phi-3-mini-4k-instruct): logs, repro script, draft issue" with the links to
    what the results folder holds, and the cause's id."""
    repro = entry.repro
    cell = repro.cell
    stands = f" ({', '.join(repro.checkpoints)})" if repro.checkpoints else ""
    files = [
        f"{name} {link(path, path)}"
        for name, path in (("logs", repro.logs), ("script", repro.script), ("draft issue", entry.draft))
        if path
    ]
    symptom = (
        f" {code(entry.group.masked_signature)}" if entry.mechanism else ""
    )  # else the sentence is its signature already
    return (
        f"e.g. `{cell}`{stands}:{symptom} {code(repro.command)}"
        + (f"; {', '.join(files)}" if files else "")
        + (f" (cause `{entry.id}`)")
        + "".join(
            f"; proof taken by the harness at {proof.taken_at.harness_git[:12]} on {proof.taken_at.recorded_at[:10]}"
            for proof in entry.proven_by
            if proof.taken_at.named
        )
    )


def whose_text(entry: FailingCause, spanned: Callable[[str], str] = code) -> str:
    """ "AutoTP bug (DeepSpeed's), surfaced in `transformers/…:forward`", or an owner with the line that makes it so
    ("a documented AutoTP design limit (evidence: `…`)"); `spanned`: how a frame or line is set off. The frame only
    where the line shows the mechanism instead of the signature, which ends with it."""
    surfaced = f", surfaced in {spanned(entry.surfaced_in)}" if entry.surfaced_in and entry.mechanism else ""
    evidence = f" (evidence: {spanned(entry.evidence)})" if entry.evidence else ""
    return f"{WHOSE.get(entry.whose, entry.whose)}{surfaced}{evidence}"


def cause_line(entry: FailingCause, report: ReportView, link: Link) -> str:
    """One line per cause: status, class and the sentence that holds for all its cells (else the masked signature),
    whose bug and where it surfaced, cells, since (not on a first night: said once above), answer, and its example
    cell with its signature, the command and the files kept for it."""
    first_night = bool(report.failing_now.backfill)
    parts = [
        f"**{status_text(entry, link)}** {cause_sentence_text(entry)}",
        whose_text(entry),
        f"{count_text(entry.group.count, 'cell')}: {entry.group.cells_text}",
        "" if first_night else entry.since.text,
        cause_answer_text(entry, report, link),
        files_text(entry, link),
    ]
    return " — ".join(part for part in parts if part)


def cause_sentence_text(entry: FailingCause) -> str:
    """ "forward: <its name> — <the sentence that holds for every cell>", the class said once: the cause's name
    (`cause_name_text`), then the mechanism where one was located, else the example's signature (numbers masked)."""
    failure_class = entry.group.failure_class
    said = entry.mechanism or code(entry.group.masked_signature.removeprefix(f"{failure_class}: "))
    return f"{cause_name_text(entry)} — {said}" if entry.title else class_and_finding(failure_class, said)


def cause_name_text(entry: FailingCause) -> str:
    """ "forward: fewer kv heads than ranks crashes attention that hard-codes its kv split": the cause's name with
    its class (reports.analysis.cause_names), what every output calls it."""
    return named(entry.group.failure_class, entry.title or entry.mechanism or entry.group.masked_signature)


def console_lines(section: FailingNow) -> list[str]:
    """Where `nox -s matrix` ends: one plain-text line per cause (status, class and sentence, its cells, the command
    that runs its example alone), the most severe first; the full section is in report.md."""
    return [
        f"{number}. [{status_text(entry, plain_link)}] {cause_sentence_text(entry).replace('`', '')} — "
        f"{count_text(entry.group.count, 'cell')}: {entry.group.cells_text} — alone: {entry.repro.command}"
        for number, entry in enumerate(section.causes, start=1)
    ]


def first_night_text(section: FailingNow) -> str:
    """Said once on a first night, instead of "since the first run" on every cause: the command that tells since when
    and which axis moved (both axes, with its cost bound), and the one for the whole history."""
    return (
        "This is the first run in this history: it cannot say yet since when a cause fails or which change broke it. "
        f"`{SINCE_WHEN_COMMAND}` runs each new cause's example cell at a few earlier releases of each axis, the other "
        f"at these versions (the newest patch of the {DEFAULT_DEEPSPEED_MINORS} DeepSpeed minors before this one, the "
        f"last transformers of the previous major: at most {DEFAULT_MAX_POINTS} more environments and "
        f"{DEFAULT_MAX_POINTS * DEFAULT_MAX_CELLS} cell runs, its cost printed before it starts) and says which axis "
        f"moved; the whole history along one axis: `{section.backfill}` (or `--axis transformers`), then triage finds "
        "the release and PR; or compare with a nightly's published history: `nox -s matrix -- --history "
        "<archive URL or folder>`."
    )


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
    lines = ["## Failing now, by cause", "", f"{summary_text(section)}.", ""]
    lines += [first_night_text(section), ""] if section.backfill else []
    lines += [f"{section.moved}.", ""] if section.moved else []
    lines += [FIRST_NIGHT_INTRO if section.backfill else INTRO, ""]
    lines += [f"{number}. {cause_line(entry, report, link)}" for number, entry in enumerate(section.causes, start=1)]
    if section.fixed_known:
        lines += ["", "Known failures whose cells pass now:", ""]
        lines += [f"- {fixed_known_text(fixed, link)}" for fixed in section.fixed_known]
    return [*lines, ""]


def failing_now_html(
    report: ReportView, linked: Callable[[Callable[[Link], list[str]]], list[Markup]]
) -> dict[str, object]:
    """What the HTML template draws, each text with its links made by `linked` (reports.outputs.render.linked_html)."""
    section = report.failing_now
    causes = section.causes
    return {
        "summary": summary_text(section),
        "first_night": first_night_text(section) if section.backfill else "",
        "moved": section.moved,
        "intro": FIRST_NIGHT_INTRO if section.backfill else INTRO,
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

"""The PR comment, in the shape of PyTorch's Dr.CI: the first line is the count of new failures with the head (what
was tested: the newest run's DeepSpeed and run) and the base it was compared with; then the new failures expanded,
each with its cells and the real checkpoints they stand for (model cards), the failure in words, where the history
places it with the answer's commit and PR links, the known upstream issue, and the command that reproduces it; then
everything else collapsed (already failing on the base, flaky, known, fixed). A first run says "no baseline: nothing
compared" and folds what fails away. No per-checkpoint verdict list: the report has it.

Without `--base` the base is each session's previous run (the last nightly); with it, a PR run's failures are
classified against that base (reports.outputs.pr_failures)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from reports.analysis import (
    DeltaCause,
    SessionDeltas,
    TransitionEntry,
    cause,
    cells_text,
    code,
    count_text,
    delta_causes,
    reason,
    repro_command,
    upstream_label,
)
from reports.outputs.github import COMMENT_MARKER
from reports.outputs.links import hub_url
from reports.outputs.markdown import answer_lines
from reports.outputs.markdown_safety import bare_link, markdown_link, our_html
from reports.outputs.model import transition_entry
from reports.outputs.pr_failures import PrFailure, summary_line
from reports.store import KNOWN_FAILURE_CLASSES, CellKey, Observation, Versions, pins_text, release

TITLE = "AutoTP matrix"


@dataclass(frozen=True)
class BaseComparison:
    """A PR run's failures classified against its base (`--base`)."""

    selector: str
    """The base as given: a run id or a version set (`deepspeed=0.19.8`)."""
    failures: list[PrFailure]
    same_run: bool
    """The base selects the candidate's own run(s): nothing is compared."""


CHECKPOINTS_SHOWN = 3  # checkpoints named per cause line; the report names them all


def failure_class_text(failure_class: str) -> str:
    """A failure class as it is known (merge validates them); one from an older store as inert code."""
    return failure_class if failure_class in KNOWN_FAILURE_CLASSES else code(failure_class)


def head_text(sessions: list[SessionDeltas]) -> str:
    """ "deepspeed 0.19.8@abc1234567 (run `nightly@…`": what the newest runs tested (the parenthesis left open for
    what the line says of the base)."""
    return "; ".join(f"deepspeed {s.newest.versions.label('deepspeed')} (run {code(s.newest.run_id)}" for s in sessions)


def compare_links(session: SessionDeltas) -> list[str]:
    """Each version axis that changed between the session's two runs, with a link comparing the two refs."""
    from matrix.versions import load_config  # the axis repositories live with the version axes

    repos = {axis: rule.repo for axis, rule in load_config().axes.items()}
    if session.previous is None:  # a session's first run: nothing to compare with
        return []
    previous, newest = session.previous.versions, session.newest.versions
    return [
        session.change_text(axis)
        + (
            f" ({bare_link(f'{repos[axis]}/compare/{_git_ref(previous, axis)}...{_git_ref(newest, axis)}')})"
            if repos.get(axis)
            else ""
        )
        for axis in session.changed
    ]


def _git_ref(versions: Versions, axis: str) -> str:
    if axis == "deepspeed" and versions.deepspeed_git:
        return versions.deepspeed_git
    value = getattr(versions, axis)
    return f"v{value}" if release(value) is not None else value  # a label (master, a sha) is a ref already


def placements(delta_cause: DeltaCause) -> list[list[TransitionEntry]]:
    """The history's transitions that place the cause's change (last good → first bad on one axis, others held
    fixed), one list per root cause they belong to; [] when nothing places it."""
    by_root: dict[tuple[str, ...], list[TransitionEntry]] = {}
    for _, delta in delta_cause.deltas:
        for transition in delta.transitions:
            by_root.setdefault(transition.cause_key, []).append(transition_entry(transition))
    return list(by_root.values())


def placement_lines(delta_cause: DeltaCause) -> list[str]:
    """Where each placement lies and the answer its cells share (bisection, triage or candidate commits)."""
    lines = []
    for transitions in placements(delta_cause):
        t, cells = transitions[0], len({t.cell for t in transitions})
        lines.append(f"- {t.axis} {t.before} → {t.after} at {pins_text(t.held_fixed)} ({count_text(cells, 'cell')})")
        lines += [f"  - {line}" for line in answer_lines(transitions, markdown_link)]
    return lines


def cells_with_checkpoints(cells: list[CellKey], checkpoints: dict[CellKey, tuple[str, ...]]) -> str:
    """The cells, and the real checkpoints they stand for as links to their model cards."""
    hub_ids = list(dict.fromkeys(hub_id for cell in cells for hub_id in checkpoints.get(cell, ())))
    shown = ", ".join(markdown_link(hub_id, hub_url(hub_id)) for hub_id in hub_ids[:CHECKPOINTS_SHOWN])
    more = f" and {len(hub_ids) - CHECKPOINTS_SHOWN} more" if len(hub_ids) > CHECKPOINTS_SHOWN else ""
    return cells_text(cells) + (f" (standing for {shown}{more})" if shown else "")


def new_failure_block(
    failure_class: str,
    text: str,
    cells: list[CellKey],
    checkpoints: dict[CellKey, tuple[str, ...]],
    notes: list[str],
) -> list[str]:
    """One new failure, expanded: what fails, which cells and checkpoints, in words, where placed, how to rerun."""
    return [
        f"- **{failure_class_text(failure_class)}** {code(text)} — {count_text(len(cells), 'cell')}: "
        f"{cells_with_checkpoints(cells, checkpoints)}",
        f"  - {reason(failure_class, text).sentence}",
        *(f"  - {note}" for note in notes),
        f"  - reproduce: {code(repro_command(cells[0]))}",
    ]


def collapsed(summary: str, lines: list[str]) -> list[str]:
    """Lines GitHub folds away under a summary (our frame; the lines are made inert with the rest)."""
    return (
        ["", our_html(f"<details><summary>{summary}</summary>"), "", *lines, "", our_html("</details>")]
        if lines
        else []
    )


def _short_line(failure_class: str, text: str, cells: list[CellKey], note: str = "") -> str:
    return (
        f"- {note}{failure_class_text(failure_class)} {code(text)} — {count_text(len(cells), 'cell')}: "
        f"{cells_text(cells)}"
    )


def nightly_comment(
    sessions: list[SessionDeltas], checkpoints: dict[CellKey, tuple[str, ...]], newest: list[Observation]
) -> list[str]:
    """Against each session's previous run (the last nightly): new failures, then fixed, flaky and still failing
    folded; a first run compares nothing and folds what fails."""
    causes = delta_causes(sessions)
    compared = [s for s in sessions if s.previous is not None]
    new = [c for c in causes if c.kind == "new failure"]
    if not compared:
        failing = _failing_causes(newest)
        first = f"**{TITLE}: no baseline, nothing compared** at {head_text(sessions)}): the first run of " + ", ".join(
            code(s.session) for s in sessions
        )
        summary = (
            f"{count_text(sum(len(c) for c in failing.values()), 'cell')} fail in "
            f"{count_text(len(failing), 'cause')} (no earlier run to say which are new)"
        )
        lines = [_short_line(fc, text, cells) for (fc, text), cells in failing.items()]
        return [first, *collapsed(summary, lines)]
    bases = "; ".join(
        f"{code(s.session)} last nightly {code(s.previous.run_id)}" for s in compared if s.previous is not None
    )
    lines = [
        f"**{TITLE}: {count_text(sum(len(c.cells) for c in new), 'new failure')}** at {head_text(compared)}; "
        f"base: {bases})"
    ]
    lines.append("")
    for session in compared:
        changed = compare_links(session)
        if changed:
            lines += [f"- {code(session.session)} changed: {'; '.join(changed)}"]
        elif any(delta.regression for delta in session.deltas):
            lines.append(
                f"- {code(session.session)}: no version changed since the last nightly: suspect the runner or a "
                "nondeterministic failure"
            )
    if new:
        lines += ["", f"### {count_text(len(new), 'new failure cause', 'new failure causes')}", ""]
        for delta_cause in new:
            unseen = [d.cell.id for _, d in delta_cause.deltas if d.kind == "new failure" and not d.regression]
            notes = [
                f"{t[0].axis} {t[0].before} → {t[0].after}: {line}"
                for t in placements(delta_cause)
                for line in answer_lines(t, markdown_link)
            ]
            notes += [f"{len(unseen)} without a verdict in the last nightly"] if unseen else []
            lines += new_failure_block(
                delta_cause.failure_class, delta_cause.cause, delta_cause.cells, checkpoints, notes
            )
    others = [c for c in causes if c.kind != "new failure"]
    flaky = [(s, d.cell) for s in sessions for d in s.deltas if d.kind == "flaky"]
    tally: dict[str, int] = defaultdict(int)
    for c in others:
        tally[c.kind] += len(c.cells)
    summary = f"{tally['still failing']} still failing, {tally['fixed']} fixed, {len(flaky)} flaky"
    folded = [_short_line(c.failure_class, c.cause, c.cells, f"**{c.kind}** ") for c in others]
    folded += [f"- **flaky** {code(cell.id)}" for _, cell in flaky]
    return [*lines, *collapsed(summary, folded)]


def _failing_causes(observations: list[Observation]) -> dict[tuple[str, str], list[CellKey]]:
    failing: dict[tuple[str, str], list[CellKey]] = defaultdict(list)
    for obs in observations:
        if obs.result.outcome == "fail":
            failing[obs.result.failure_class, cause(obs.result.signature)].append(obs.cell)
    return dict(sorted(failing.items(), key=lambda item: (-len(item[1]), item[0])))


def base_comment(
    base: BaseComparison, sessions: list[SessionDeltas], checkpoints: dict[CellKey, tuple[str, ...]]
) -> list[str]:
    """A PR run against its base: "N new failures" first, the new ones expanded, the others folded (Dr.CI's broken
    trunk, flaky and known)."""
    failures = base.failures
    if base.same_run:
        return [
            f"**{TITLE}: no baseline, nothing compared** at {head_text(sessions)}): the base {code(base.selector)} "
            "selects this run itself; pass the PR's base (its merge base's run or release)"
        ]
    new = [f for f in failures if f.kind == "new"]
    lines = [
        f"**{TITLE}: {count_text(len(new), 'new failure')}** at {head_text(sessions)}; base: {code(base.selector)}): "
        f"{summary_line(failures).split(', ', 1)[1]}"
    ]
    grouped: dict[tuple[str, str, str], list[PrFailure]] = defaultdict(list)
    for failure in new:
        grouped[failure.failure_class, failure.cause, failure.base_failure].append(failure)
    if grouped:
        lines += ["", f"### {count_text(len(grouped), 'new failure cause', 'new failure causes')}", ""]
    for (failure_class, text, base_failure), members in grouped.items():
        notes = (
            [f"the base fails another way: {base_failure}"]
            if base_failure
            else [f"{'/'.join(sorted({f.base for f in members}))} on the base"]
        )
        known = members[0].known
        if known:
            notes.append(
                f"known upstream, brought back here: {markdown_link(upstream_label(known.upstream), known.upstream)}"
            )
        lines += new_failure_block(failure_class, text, [f.cell for f in members], checkpoints, notes)
    others = [f for f in failures if f.kind != "new"]
    by_kind: dict[tuple[str, str, str, str], list[CellKey]] = defaultdict(list)
    for failure in others:
        upstream = failure.known.upstream if failure.known else ""
        by_kind[failure.kind, failure.failure_class, failure.cause, upstream].append(failure.cell)
    folded = [
        _short_line(fc, text, cells, f"**{kind}** ")
        + (f" ({markdown_link(upstream_label(upstream), upstream)})" if upstream else "")
        for (kind, fc, text, upstream), cells in by_kind.items()
    ]
    counts = {kind: sum(f.kind == kind for f in others) for kind in ("broken trunk", "flaky", "known")}
    summary = f"{counts['broken trunk']} already failing on the base, {counts['flaky']} flaky, {counts['known']} known"
    return [*lines, *collapsed(summary, folded)]


def comment_markdown(
    sessions: list[SessionDeltas],
    checkpoints: dict[CellKey, tuple[str, ...]],
    newest: list[Observation],
    inert: Callable[[str], str],
    base: BaseComparison | None = None,
) -> str:
    """The comment: COMMENT_MARKER (found by reruns, which edit it), then base_comment (with `base`: its
    classified failures) or nightly_comment. `inert` neutralises every line built from the
    results, keeping our links and <details> frames."""
    body = base_comment(base, sessions, checkpoints) if base else nightly_comment(sessions, checkpoints, newest)
    text = "\n".join(inert(line) for line in body)
    return f"{COMMENT_MARKER}\n{text.rstrip()}\n"

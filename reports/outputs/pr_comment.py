"""The PR comment, in the shape of PyTorch's Dr.CI: the first line is the count of new failures with the head (what
was tested: the newest run's DeepSpeed and run) and the base it was compared with; then the new failures expanded,
each with its cells and the real checkpoints they stand for (model cards), the failure in words, where the history
places it with the answer's commit and PR links, the known upstream issue, and the command that reproduces it; then
everything else collapsed (already failing on the base, flaky, known, fixed). A first run says "no baseline: nothing
compared" and folds what fails away. No per-checkpoint verdict list: the report has it.

Without a base the comment compares each session's newest run with its previous one (the last nightly); a pull
request's check (`--head` and `--merge-base`, or `--base`) renders reports.outputs.pr_check's comparison, the one the
gate prints: the report's cause ids and words, each failing cell's numbers and logs, what the PR fixed and what it
never ran."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from reports.analysis import (
    DeltaCause,
    SessionDeltas,
    TransitionEntry,
    cause_title,
    cells_text,
    code,
    count_text,
    delta_causes,
    failure_cause_id,
    failure_key,
    located_sentence,
    log_folder,
    mask_signature,
    named,
    reason,
    repro_command,
    upstream_label,
)
from reports.outputs.github import COMMENT_MARKER
from reports.outputs.links import hub_url
from reports.outputs.markdown import answer_lines
from reports.outputs.markdown_safety import bare_link, markdown_link, our_html
from reports.outputs.model import transition_entry
from reports.outputs.pr_check import Fixed, PrCheck, RunLinks
from reports.outputs.pr_failures import PrFailure, summary_line
from reports.store import KNOWN_FAILURE_CLASSES, CellKey, Observation, Versions, pins_text, release

TITLE = "AutoTP matrix"


CHECKPOINTS_SHOWN = 3  # checkpoints named per cause line; the report names them all


def failure_class_text(failure_class: str) -> str:
    """A failure class as it is known (merge validates them); one from an older store as inert code."""
    return failure_class if failure_class in KNOWN_FAILURE_CLASSES else code(failure_class)


def head_text(sessions: list[SessionDeltas]) -> str:
    """ "deepspeed 0.19.8@abc1234567 (run `nightly@…`": what the newest runs tested, each session's parenthesis
    closed but the last one's (left open for what the line says of the base)."""
    return "); ".join(
        f"deepspeed {s.newest.versions.label('deepspeed')} (run {code(s.newest.run_id)}" for s in sessions
    )


def compare_links(session: SessionDeltas) -> list[str]:
    """Each version axis that changed between the session's two runs, with a link comparing the two refs."""
    from matrix.version_axes import load_config  # the axis repositories live with the version axes

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
    delta_cause: DeltaCause,
    name: str,
    checkpoints: dict[CellKey, tuple[str, ...]],
    notes: list[str],
) -> list[str]:
    """One new failure, expanded: the cause by its id and `name` (cause_name), which cells and checkpoints, its error
    text, where placed, how to rerun."""
    cells = delta_cause.cells
    failure_class, text = delta_cause.failure_class, delta_cause.masked_signature
    return [
        f"- {_cause_name(delta_cause.id, name)} — {count_text(len(cells), 'cell')}: "
        f"{cells_with_checkpoints(cells, checkpoints)}",
        f"  - {reason(failure_class, text).sentence} {code(text)}",
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


def cause_name(names: Mapping[str, str], cause_id: str, failure_class: str, title: str) -> str:
    """ "forward: <its name>": the report's name for a cause failing at the latest versions (`names`, by id: its
    classes and title, reports.analysis.cause_name_text), else its class and `title` (its own cells')."""
    return names.get(cause_id) or named(failure_class_text(failure_class), title)


def _cause_name(cause_id: str, name: str, bold: bool = True) -> str:
    """ "**cause 7d61ebe6fdfe** forward: <its name>": a cause as the report and the gate name it (its id in bold
    where nothing before it is)."""
    said = f"cause {cause_id}"
    return f"{f'**{said}**' if bold else said} {name}"


def _short_line(cause_id: str, name: str, cells: list[CellKey], kind: str = "") -> str:
    """A folded cause: "- **fixed** cause <id> <class>: <name> — <cells>" (the check comment's form)."""
    return (
        f"- {f'**{kind}** ' if kind else ''}{_cause_name(cause_id, name, bold=not kind)} — "
        f"{count_text(len(cells), 'cell')}: {cells_text(cells)}"
    )


def nightly_comment(
    sessions: list[SessionDeltas],
    checkpoints: dict[CellKey, tuple[str, ...]],
    newest: list[Observation],
    names: Mapping[str, str],
) -> list[str]:
    """Against each session's previous run (the last nightly): new failures, then fixed, flaky and still failing
    folded; a first run compares nothing and folds what fails. Each cause is named by `names` (the report's
    failing-now names, by cause id), else by its own cells (DeltaCause.title)."""
    causes = delta_causes(sessions)
    compared = [s for s in sessions if s.previous is not None]
    new = [c for c in causes if c.kind == "new failure"]
    if not compared:
        failing = _failing_causes(newest)
        first = f"**{TITLE}: no baseline, nothing compared** at {head_text(sessions)}): the first run of " + ", ".join(
            code(s.session) for s in sessions
        )
        summary = (
            f"{count_text(sum(len(c.cells) for c in failing), 'cell')} fail in "
            f"{count_text(len(failing), 'cause')} (no earlier run to say which are new)"
        )
        lines = [
            _short_line(cause.id, cause_name(names, cause.id, cause.failure_class, cause.title), cause.cells)
            for cause in failing
        ]
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
            name = cause_name(names, delta_cause.id, delta_cause.failure_class, delta_cause.title)
            lines += new_failure_block(delta_cause, name, checkpoints, notes)
    others = [c for c in causes if c.kind != "new failure"]
    flaky = [(s, d.cell) for s in sessions for d in s.deltas if d.kind == "flaky"]
    tally: dict[str, int] = defaultdict(int)
    for c in others:
        tally[c.kind] += len(c.cells)
    summary = f"{tally['still failing']} still failing, {tally['fixed']} fixed, {len(flaky)} flaky"
    folded = [_short_line(c.id, cause_name(names, c.id, c.failure_class, c.title), c.cells, c.kind) for c in others]
    folded += [f"- **flaky** {code(cell.id)}" for _, cell in flaky]
    return [*lines, *collapsed(summary, folded)]


@dataclass(frozen=True)
class FirstRunCause:
    """The cells failing in a first run with one cause (reports.analysis.signatures.failure_key, as the report groups
    them)."""

    id: str
    """The id the report's failing-now section gives it (failure_cause_id)."""
    failure_class: str
    """Its first cell's class."""
    title: str
    """Its name from its own cells (reports.analysis.cause_names)."""
    cells: list[CellKey]


def _failing_causes(observations: list[Observation]) -> list[FirstRunCause]:
    """What fails in a first run, by cause, the most cells first."""
    failing: dict[str, list[Observation]] = defaultdict(list)
    for obs in observations:
        if obs.result.outcome == "fail":
            failing[failure_key(obs.result.failure_class, obs.result.signature, obs.result.cause)].append(obs)
    causes = []
    for key, members in failing.items():
        first = members[0].result
        text = mask_signature(first.signature)
        sentence = located_sentence(key, [obs.result.cause.words for obs in members if obs.result.cause], text)
        causes.append(
            FirstRunCause(
                failure_cause_id(first.failure_class, first.signature, first.cause),
                first.failure_class,
                cause_title(first.failure_class, text, key, sentence),
                sorted({obs.cell for obs in members}),
            )
        )
    return sorted(causes, key=lambda c: (-len(c.cells), c.failure_class, c.title))


def check_comment(
    pr: PrCheck,
    sessions: list[SessionDeltas],
    checkpoints: dict[CellKey, tuple[str, ...]],
    links: RunLinks | None,
) -> list[str]:
    """A pull request's check against its base (reports.outputs.pr_check, which the gate prints too): the count
    first, "as of <head> with merge base <sha>", links to the run and its report; the new failures expanded by the
    report's cause, each cell with its numbers and logs; what this PR fixed; the base's cells it never ran; the rest
    folded (Dr.CI's broken trunk, flaky and known)."""
    tested = (
        f"as of {code(pr.commits.head)} with merge base {code(pr.commits.merge_base)} ({pr.base})"
        if pr.commits
        else f"at {head_text(sessions)}; base: {code(pr.base)})"
    )
    if {run.run_id for run in pr.base_runs} <= {run.run_id for run in pr.candidate_runs}:
        return [
            f"**{TITLE}: no baseline, nothing compared** {tested}: the base selects this run itself; pass the PR's "
            "base (its merge base's run or release)"
        ]
    failures, missing = list(pr.failures), pr.missing
    new = [f for f in failures if f.kind == "new"]
    lines = [
        f"**{TITLE}: {count_text(len(new), 'new failure')}** {tested}: "
        f"{summary_line(failures, len(pr.fixed), len(missing)).split(', ', 1)[1]}"
    ]
    if links:
        report = f" · {markdown_link('report.html and every failing cell’s logs (artifact)', links.report)}"
        lines += ["", markdown_link("The run and its jobs' logs", links.run) + (report if links.report else "")]
    grouped: dict[str, list[PrFailure]] = defaultdict(list)
    for failure in new:
        grouped[failure.cause_id].append(failure)
    if grouped:
        lines += ["", f"### {count_text(len(grouped), 'new failure cause', 'new failure causes')}", ""]
    for cause_id, members in grouped.items():
        lines += _new_cause(cause_id, members, checkpoints, links)
    lines += _fixed_section(pr)
    if missing:
        lines += [
            "",
            f"### {count_text(len(missing), 'cell')} not run here",
            "",
            f"The base has a verdict for {count_text(len(missing), 'cell')} this run has none for (skipped, not run "
            f"or renamed), so nothing says they still work: {cells_text(missing)}",
        ]
    others: dict[tuple[str, str], list[PrFailure]] = defaultdict(list)
    for failure in failures:
        if failure.kind != "new":
            others[failure.kind, failure.cause_id].append(failure)
    folded = [_folded_line(kind, cause_id, members, links) for (kind, cause_id), members in others.items()]
    counts = {kind: sum(f.kind == kind for f in failures) for kind in ("broken trunk", "flaky", "known")}
    summary = f"{counts['broken trunk']} already failing on the base, {counts['flaky']} flaky, {counts['known']} known"
    return [*lines, *collapsed(summary, folded)]


def _cell_logs(cell: CellKey, links: RunLinks | None) -> str:
    """The cell, and where its logs are read: the report artifact's `logs/<cell>/`."""
    if links is None or not links.report:
        return code(cell.id)
    return f"{code(cell.id)} ({markdown_link('logs', links.report)}: {code(log_folder(cell.id))})"


def _new_cause(
    cause_id: str, members: list[PrFailure], checkpoints: dict[CellKey, tuple[str, ...]], links: RunLinks | None
) -> list[str]:
    """One new failure cause, expanded: the report's id and words, its cells with their numbers and logs, the base."""
    first = members[0]
    notes = sorted({f"the base fails another way: {f.base_failure}" for f in members if f.base_failure})
    bases = sorted({f.base for f in members if not f.base_failure})
    notes += [f"{'/'.join(bases)} on the base"] if bases else []
    if first.known:
        notes.append(
            f"known upstream, brought back here: "
            f"{markdown_link(upstream_label(first.known.upstream), first.known.upstream)}"
        )
    return [
        f"- **cause {cause_id}** {failure_class_text(first.failure_class)}: {first.words} — "
        f"{count_text(len(members), 'cell')}: {cells_with_checkpoints([f.cell for f in members], checkpoints)}",
        *(f"  - {_cell_logs(f.cell, links)}: {code(f.detail)}" for f in members),
        *(f"  - {note}" for note in notes),
        f"  - reproduce: {code(repro_command(first.cell))}",
    ]


def _fixed_section(pr: PrCheck) -> list[str]:
    """The base's failures this PR's run passes, by the base's cause."""
    if not pr.fixed:
        return []
    by_cause: dict[str, list[Fixed]] = defaultdict(list)
    for fixed in pr.fixed:
        by_cause[fixed.cause_id].append(fixed)
    return [
        "",
        f"### Fixed by this PR ({count_text(len(pr.fixed), 'cell')})",
        "",
        *(
            f"- **cause {cause_id}** {failure_class_text(members[0].failure_class)}: {members[0].words} — "
            f"{count_text(len(members), 'cell')}: {cells_text([f.cell for f in members])}"
            for cause_id, members in by_cause.items()
        ),
    ]


def _folded_line(kind: str, cause_id: str, members: list[PrFailure], links: RunLinks | None) -> str:
    first = members[0]
    upstream = first.known.upstream if first.known else ""
    known = f" ({markdown_link(upstream_label(upstream), upstream)})" if upstream else ""
    return (
        f"- **{kind}** cause {cause_id} {failure_class_text(first.failure_class)}: {first.words} — "
        f"{count_text(len(members), 'cell')}: {', '.join(_cell_logs(f.cell, links) for f in members)}{known}"
    )


def comment_markdown(
    sessions: list[SessionDeltas],
    checkpoints: dict[CellKey, tuple[str, ...]],
    newest: list[Observation],
    inert: Callable[[str], str],
    pr: PrCheck | None = None,
    links: RunLinks | None = None,
    names: Mapping[str, str] | None = None,
) -> str:
    """The comment: COMMENT_MARKER (found by reruns, which edit it), then check_comment (with `pr`: a pull request's
    check against its base) or nightly_comment (`names`: the report's failing-now names of causes, by id). `inert`
    neutralises every line built from the results, keeping our links and <details> frames."""
    body = (
        check_comment(pr, sessions, checkpoints, links)
        if pr
        else nightly_comment(sessions, checkpoints, newest, names or {})
    )
    text = "\n".join(inert(line) for line in body)
    return f"{COMMENT_MARKER}\n{text.rstrip()}\n"

"""The report model as Markdown: report.md, the step summary, and the pieces publish and the HTML page share (matrix
cells, root-cause titles, answers, since-the-previous-run lines)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reports.analysis import (
    EntryStatus,
    FailingCause,
    Link,
    RootCause,
    TransitionEntry,
    answer_text,
    cause_sentence_text,
    cells_text,
    checkpoints_markdown,
    code,
    commit_words,
    count_text,
    failing_now_markdown,
    new_architecture_lines,
    new_architectures_markdown,
    new_architectures_summary,
    one_line,
    shared_answers,
    status_text,
    summary_text,
)
from reports.outputs.docs import Drift
from reports.outputs.markdown_safety import markdown_link, our_html
from reports.outputs.model import Report
from reports.outputs.pr_check import run_links
from reports.outputs.report_parts import FlakyEntry, MatrixEntry, SupportMatrix
from reports.outputs.since_previous import SinceCause, SincePreviousRun
from reports.store import pins_text, short_commit

STATUS_ICONS = {"pass": "✅", "fail": "❌", "flaky": "⚠️", "skip": "⏭️", "unsupported": "🚫"}
MAX_CANDIDATES = 5  # candidate commits shown for a cause nothing answered yet; report.json keeps them all


def harness_text(commits: Sequence[str]) -> str:
    """ "harness abc1234567" (the harness commits that recorded these results), or "" for old results."""
    return f"harness {', '.join(short_commit(c) for c in commits)}" if commits else ""


def cell_text(verdict: EntryStatus) -> str:
    """What a matrix cell says besides its colour/icon: failure class and key metric, or the flaky tally."""
    metric = f"{verdict.key_metric:.2g}" if verdict.key_metric is not None else ""
    if verdict.status == "fail":
        return f"{verdict.failure_class} {metric}".strip()
    if verdict.status == "flaky":
        return f"flaky {verdict.fails}/{verdict.passes + verdict.fails} failed"
    return metric


def _matrix_cell(entry: MatrixEntry | None) -> str:
    if entry is None:
        return "—"  # not run at these versions
    return f"{STATUS_ICONS[entry.verdict.status]} {cell_text(entry.verdict)}".rstrip()


def counts_markdown(matrix: SupportMatrix) -> list[str]:
    columns, counts = matrix.columns, matrix.counts
    lines = ["| outcome | " + " | ".join(columns) + " | all |", "|---|" + "---:|" * (len(columns) + 1)]
    lines += [
        f"| {name} | " + " | ".join(str(per[c]) for c in [*columns, "all"]) + " |" for name, per in counts.items()
    ]
    cells = sum(per["all"] for per in counts.values())
    return [f"{len(matrix.rows)} architectures, {cells} cells at these versions:", "", *lines]


def counts_text(matrix: SupportMatrix) -> str:
    """ "120 pass, 80 shard, 4 skip": the outcome classes of one combination in a few words."""
    return ", ".join(f"{per['all']} {name}" for name, per in matrix.counts.items())


def matrix_markdown(matrix: SupportMatrix) -> list[str]:
    columns = matrix.columns
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in matrix.rows:
        lines.append(f"| {row.model} | " + " | ".join(_matrix_cell(row.cells.get(c)) for c in columns) + " |")
    return lines


def seen_at(root_cause: RootCause) -> str:
    """ " at transformers 5.23.0" where a cause was seen with other axes held elsewhere than the latest versions."""
    elsewhere = "; ".join(pins_text(pins) for pins in root_cause.elsewhere)
    return f" at {elsewhere}" if elsewhere else ""


def root_cause_title(root_cause: RootCause) -> str:
    """ "shard: <its name> `cause` — deepspeed 0.18.9 → 0.19.8 — 44 cells: eager fp32: llama tp2/3, …"."""
    group = root_cause.group
    return (
        f"{root_cause.name or group.failure_class} {code(group.masked_signature)} — {root_cause.axis} "
        f"{root_cause.before} → {root_cause.after}{seen_at(root_cause)} — {count_text(group.count, 'cell')}: "
        f"{group.cells_text}"
    )


def answer_lines(transitions: Sequence[TransitionEntry], link: Link = markdown_link) -> list[str]:
    """The answers shared by the transitions of a cause: the most common one with the number of cells it covers
    when not all, each other one with its cells; then the candidate commits while no answer names one."""
    cells = {t.cell.id: t.cell for t in transitions}
    lines = []
    for rank, (text, answered) in enumerate(shared_answers(transitions, link)):
        if len(answered) == len(cells):
            covers = ""
        elif rank == 0:
            covers = f" ({count_text(len(answered), 'cell')})"
        else:
            covers = f" ({count_text(len(answered), 'cell')}: {cells_text([cells[c] for c in answered])})"
        lines.append(f"answer{covers}: {text}")
    if not any(t.bisection for t in transitions) and transitions[0].commits:
        commits = transitions[0].commits  # one range, so every member lists the same commits
        shown = "; ".join(commit_words(transitions[0].axis, c, link) for c in commits[:MAX_CANDIDATES])
        more = f" and {len(commits) - MAX_CANDIDATES} more (report.json)" if len(commits) > MAX_CANDIDATES else ""
        relevant = sum(1 for c in commits if c.relevant)
        lines.append(
            f"candidate commits ({relevant} of {len(commits)} touch AutoTP paths, listed first): {shown}{more}"
        )
    return lines


ROOT_CAUSE_SECTIONS = (("broke", "Regressions"), ("fixed", "Fixes"), ("class-change", "Failure-class changes"))


def root_causes_markdown(report: Report) -> list[str]:
    found = report.root_causes
    transitions = sum(len(c.members) for c in found)
    lines = ["## Root causes", ""]
    if not found:
        return [*lines, "No transition in the history: every cell kept its outcome across the versions run.", ""]
    lines += [
        f"{count_text(len(found), 'root cause')} over {count_text(transitions, 'transition')}. A range is last "
        "good → first bad (regressions) or last bad → first good (fixes) along one axis; the other axes are held "
        f'at the latest versions ({report.latest_label}) unless a cause says "at …".',
        "",
    ]
    for kind, title in ROOT_CAUSE_SECTIONS:
        of_kind = [c for c in found if c.kind == kind]
        if of_kind:
            cells = sum(c.group.count for c in of_kind)
            lines += [f"### {title}: {count_text(len(of_kind), 'cause')}, {count_text(cells, 'cell')}", ""]
            for number, root_cause in enumerate(of_kind, start=1):
                lines.append(f"{number}. {root_cause_title(root_cause)}")
                lines += [f"   - {line}" for line in answer_lines(report.members(root_cause))]
            lines.append("")
    return lines


def delta_cause_line(delta_cause: SinceCause, report: Report) -> str:
    """One cause of what changed since the previous runs, with the answer of the root cause it belongs to."""
    placed = [report.root_cause(i) for i in delta_cause.root_causes]
    where = "; ".join(f"{c.axis} {c.before} → {c.after}" for c in placed)
    answers = [line for c in placed for line in answer_lines(report.members(c))]
    unseen = (
        f" ({len(delta_cause.no_previous_verdict)} without a verdict in the previous run)"
        if delta_cause.no_previous_verdict
        else ""
    )
    return (
        f"**{delta_cause.kind}** {delta_cause.name or delta_cause.group.failure_class} "
        f"{code(delta_cause.group.masked_signature)} — "
        f"{count_text(delta_cause.group.count, 'cell')}{unseen}: {delta_cause.group.cells_text}"
        + (f" — {where}: " + "; ".join(answers) if placed else "")
    )


def since_previous_run_summary(since: SincePreviousRun) -> str:
    """ "3 new failures in 1 cause, 45 fixes in 1 cause, 1 flaky cell" (what is zero is left out)."""
    counts = since.counts
    parts = [
        f"{count_text(counts[kind]['cells'], noun, plural)} in {count_text(counts[kind]['causes'], 'cause')}"
        for kind, noun, plural in (
            ("new failure", "new failure", ""),
            ("fixed", "fix", "fixes"),
            ("still failing", "cell still failing", "cells still failing"),
        )
        if counts[kind]["cells"]
    ]
    if counts["flaky"]["cells"]:
        parts.insert(2, count_text(counts["flaky"]["cells"], "flaky cell"))
    return ", ".join(parts) or "nothing changed"


def since_previous_run_markdown(report: Report) -> list[str]:
    since = report.since_previous_run
    compared = [s for s in since.sessions if s.previous_run]
    lines = ["## Since the previous run of each session", ""]
    if not compared:
        return [
            *lines,
            f"No session has run twice yet ({count_text(len(since.sessions), 'session')}): nothing to "
            "compare. The root causes below come from the whole history.",
            "",
        ]
    lines += [f"{since_previous_run_summary(since)}.", ""]
    for s in compared:
        changed = ", ".join(s.changed) or "no version changed"
        lines.append(f"- `{s.session}`: run `{s.previous_run}` → `{s.newest_run}`: {changed}")
    news = [f"- {delta_cause_line(c, report)}" for c in since.causes if c.kind != "still failing"]
    return [*lines, "", *news, ""] if news else [*lines, ""]


def flaky_text(entry: FlakyEntry) -> str:
    status = entry.status
    failed = f" ({status.failure_class}: {one_line(status.signature)})" if status.failure_class else ""
    return f"{entry.cell} at {entry.versions.describe()}: {status.passes} pass / {status.fails} fail{failed}"


def harness_changes_markdown(report: Report) -> list[str]:
    """Verdicts that changed at the same versions when the harness commit did: not flaky, no library change."""
    if not report.harness_changes:
        return []
    return [
        "## Harness changes",
        "",
        "Verdicts that changed with the harness commit at the same versions:",
        "",
        *[f"- {e.cell} at {e.versions_label}: {e.change}" for e in report.harness_changes],
        "",
    ]


def drift_lines(drift: Drift | None) -> list[str]:
    if drift is None:
        return []
    lines = [f"## Docs drift ({drift.docs_path})", ""]
    lines += [f"- listed as supported but failing here: {m}" for m in drift.listed_but_failing]
    lines += [f"- passing here but not listed: {m}" for m in drift.passing_but_unlisted]
    if len(lines) == 2:
        lines.append("None: the docs agree with the latest results.")
    return [*lines, ""]


def _recorded_by(harness: Sequence[str]) -> str:
    return f" ({harness_text(harness)})" if harness else ""


def other_matrices_markdown(report: Report) -> list[str]:
    """Every other version combination's matrix, collapsed (GitHub renders <details>)."""
    others = report.matrices[1:]
    if not others:
        return []
    lines = ["## Support matrix at the other version combinations", ""]
    for matrix in others:
        lines += [
            our_html(
                f"<details><summary>{matrix.label}{_recorded_by(matrix.harness)}: "
                f"{counts_text(matrix.matrix)}</summary>"
            ),
            "",
            *matrix_markdown(matrix.matrix),
            "",
            our_html("</details>"),
            "",
        ]
    return lines


def details_markdown(report: Report) -> list[str]:
    """One answer line per transition (answers.answer_text), collapsed, root cause by root cause."""
    lines = [answer_text(t, markdown_link) for c in report.root_causes for t in report.members(c)]
    if not lines:
        return []
    return [
        "## Details: every transition",
        "",
        our_html(f"<details><summary>{count_text(len(lines), 'transition')}, one line each</summary>"),
        "",
        *[f"- {line}" for line in lines],
        "",
        our_html("</details>"),
        "",
    ]


def report_markdown(report: Report) -> str:
    lines = [
        "# AutoTP support matrix",
        "",
        f"Latest versions: {report.latest_label}{_recorded_by(report.latest_harness)}.",
        "",
        *failing_now_markdown(report, markdown_link),
        *since_previous_run_markdown(report),
        *new_architectures_markdown(report.new_architectures),
        *root_causes_markdown(report),
        "## Support matrix at the latest versions",
        "",
        f"Cells show the outcome, the failure class and `{report.key_metric}`; — means not run at these versions.",
        "",
        *counts_markdown(report.matrix),
        "",
        *matrix_markdown(report.matrix),
        "",
        *checkpoints_markdown(report.checkpoints),
        *other_matrices_markdown(report),
        "## Flaky cells",
        "",
        *([f"- {flaky_text(entry)}" for entry in report.flaky] or ["None."]),
        "",
        *harness_changes_markdown(report),
        *details_markdown(report),
        *drift_lines(report.docs_drift),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


RUN_FILES = "report.html, report.md and every failing cell's logs"
MAX_SUMMARY_CAUSES = 20
"""Causes the step summary lists, one table row each (the most severe first); report.md lists them all."""
MAX_SUMMARY_ARCHITECTURES = 3
"""New architectures' first verdicts the step summary lists (the nightly's first screen); report.md lists them all.
With MAX_SUMMARY_CAUSES, the summary stays within 40 lines."""


def actions_run_url(environ: Mapping[str, str]) -> str:
    """The GitHub Actions run this process belongs to (its page lists the report and every cell's logs as
    artifacts), from its variables validated as the pull request's check validates them (pr_check.run_links), or ""
    outside Actions."""
    links = run_links(environ)
    return links.run if links else ""


def found_by(run_url: str) -> list[str]:
    """Where a draft written in GitHub Actions was found: the run's page, whose artifacts hold the cell's logs and
    the full script (an absolute link: a draft is read in DeepSpeed's tracker); nothing outside Actions."""
    if not run_url:
        return []
    return [f"Found by {markdown_link('this workflow run', run_url)} (its artifacts: the cells' logs and scripts).", ""]


def _table_text(text: str) -> str:
    """Text for one table cell: on one line, its pipes escaped (a link's mark, reports.outputs.markdown_safety, is
    whitespace to str.split, so lines are joined by hand)."""
    return " ".join(text.splitlines()).replace("|", "\\|")


def _since_cell(entry: FailingCause, first_night: bool) -> str:
    """The step summary's "since when": from the example cell's earlier points where it ran at any, "not known yet"
    on a first night (report.md says how to find out), else when it was first seen."""
    return "not known yet" if first_night and not entry.since.tried else entry.since.text


def step_summary_markdown(report: Report, run_url: str = "") -> str:
    """The job's summary, read in the Actions UI where a relative link goes nowhere: the counts, what is new and
    fixed since the previous trusted run, one row per cause, and absolute links only (`run_url`: the run's page,
    whose artifacts hold report.html and every cell's logs; none outside Actions)."""
    counts: dict[str, int] = {}
    for row in report.matrix.rows:
        for entry in row.cells.values():
            counts[entry.verdict.status] = counts.get(entry.verdict.status, 0) + 1
    tally = ", ".join(f"{STATUS_ICONS[s]} {counts[s]} {s}" for s in STATUS_ICONS if s in counts)
    section = report.failing_now
    since = report.since_previous_run
    compared = any(s.previous_run for s in since.sessions)
    lines = [
        f"## AutoTP matrix — {tally}",
        "",
        f"At {report.latest_label}{_recorded_by(report.latest_harness)}.",
        "",
        f"- {summary_text(section)}.",
        f"- Since the previous trusted run: {since_previous_run_summary(since)}."
        if compared
        else "- No session has a previous trusted run to compare with.",
    ]
    if run_url:
        lines.append(
            f"- {markdown_link(RUN_FILES, run_url + '#artifacts')} (artifacts of {markdown_link('this run', run_url)})"
        )
    if section.causes:
        shown = section.causes[:MAX_SUMMARY_CAUSES]
        lines += [f"- {section.moved}."] if section.moved else []
        lines += ["", "| # | status | cause | cells | since when | example cell |", "|---:|---|---|---:|---|---|"]
        lines += [
            f"| {number} | {_table_text(status_text(entry, markdown_link))} | "
            f"{_table_text(cause_sentence_text(entry))} "
            f"| {entry.group.count} | {_table_text(_since_cell(entry, bool(section.backfill)))} "
            f"| `{entry.repro.cell}` |"
            for number, entry in enumerate(shown, start=1)
        ]
        if len(section.causes) > len(shown):
            lines += ["", f"{len(section.causes) - len(shown)} more causes in report.md."]
    if report.new_architectures.release:
        architectures = new_architecture_lines(report.new_architectures)
        shown_architectures = architectures[:MAX_SUMMARY_ARCHITECTURES]
        lines += [
            "",
            "## New architectures since the previous transformers release",
            "",
            new_architectures_summary(report.new_architectures),
            *[f"- {line}" for line in shown_architectures],
            *(
                [f"- {len(architectures) - len(shown_architectures)} more in report.md"]
                if len(architectures) > len(shown_architectures)
                else []
            ),
        ]
    if report.docs_drift:
        drift = report.docs_drift
        lines += [
            "",
            f"Docs: {len(drift.listed_but_failing)} listed as supported but failing, "
            f"{len(drift.passing_but_unlisted)} passing but unlisted.",
        ]
    return "\n".join(lines).rstrip("\n") + "\n\n"


# report.html is paged like report.json: it draws the heatmaps of the newest HTML_MATRICES version combinations and the
# timeline (and trend) of the newest HTML_TIMELINE_SETS version sets, and names report-details.json for the rest (every
# combination's matrix, every timeline column). A year of nightlies has ~360 combinations and ~380 version sets:
# drawn whole, report.html was 42 MB and its rendering a quarter of render's CPU time.

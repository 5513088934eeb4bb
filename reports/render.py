"""Write the report model (reports.model.build_report) as report.md, report.json (+ report-details.json),
report.html, supported-models.md (and .diff) and a step summary; formatting only.

Every output is rendered from the one Report, so all say the same thing. A reader gets one screen first —
what fails now, what changed since the previous run of each session, and the root causes of every transition
(reports.causes) with their answers — then the support matrix, then the details.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from itertools import groupby
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from matrix.redaction import Redactor
from reports import ReportsError
from reports.answers import Link, TransitionEntry, answer_text, code, commit_words, markdown_link, one_line
from reports.checkpoints import checkpoints_html, checkpoints_markdown
from reports.causes import RootCause, cells_text, count_text, shared_answers
from reports.docs import Drift, docs_diff, docs_names, supported_models_markdown
from reports.failing_now import failing_now_html, failing_now_markdown
from reports.history import History
from reports.model import DETAILS_FILE, FlakyEntry, Report, SinceCause, SincePreviousRun, split_report
from reports.records import pins_text, short_commit

STATUS_ICONS = {"pass": "✅", "fail": "❌", "flaky": "⚠️", "skip": "⏭️"}
MAX_CANDIDATES = 5  # candidate commits shown for a cause nothing answered yet; report.json keeps them all


def write_outputs(report: Report, history: History, drift: Drift | None, out_dir: Path) -> list[Path]:
    step_summary = Path(os.environ.get("GITHUB_STEP_SUMMARY") or out_dir / "step-summary.md")
    first_screen, details = split_report(report)
    outputs = {
        out_dir / "report.md": report_markdown(report),
        out_dir / "report.json": json.dumps(first_screen, indent=2, ensure_ascii=False) + "\n",
        out_dir / DETAILS_FILE: json.dumps(details, ensure_ascii=False) + "\n",
        out_dir / "report.html": report_html(report),
    }
    if drift is None:
        outputs[out_dir / "supported-models.md"] = supported_models_markdown(report, history)
    else:  # the families in the copy's spelling, and the diff that makes the copy say what the matrix found
        docs = Path(drift.docs_path)
        outputs[out_dir / "supported-models.md"] = supported_models_markdown(report, history, docs_names(report, docs))
        outputs[out_dir / "supported-models.diff"] = docs_diff(report, docs)
    redact = Redactor()  # the store redacts what it imports; this also covers stores written before it did
    with writing_to(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        for path, text in outputs.items():
            path.write_text(redact(text), encoding="utf-8")
        with step_summary.open("a", encoding="utf-8") as summary:  # GitHub expects steps to append
            summary.write(redact(step_summary_markdown(report)))
    return [*outputs, step_summary]


@contextmanager
def writing_to(out_dir: Path):
    """An output that cannot be written (--out names a file, a folder without permission, a full disk) is one line."""
    try:
        yield
    except OSError as exc:
        raise ReportsError(
            f"--out {out_dir}: cannot write {exc.filename or out_dir} ({exc.strerror}); pass a "
            "folder that can be created or written"
        ) from None


# ---- Markdown ----------------------------------------------------------------------------------------------------


def harness_text(commits: list[str]) -> str:
    """ "harness abc1234567" (the harness commits that recorded these results), or "" for old results."""
    return f"harness {', '.join(short_commit(c) for c in commits)}" if commits else ""


def cell_text(entry: dict) -> str:
    """What a matrix cell says besides its colour/icon: failure class and key metric, or the flaky tally."""
    metric = f"{entry['key_metric']:.2g}" if entry["key_metric"] is not None else ""
    if entry["status"] == "fail":
        return f"{entry['failure_class']} {metric}".strip()
    if entry["status"] == "flaky":
        return f"flaky {entry['fails']}/{entry['passes'] + entry['fails']} failed"
    return metric


def _matrix_cell(entry: dict | None) -> str:
    if entry is None:
        return "—"  # not run at these versions
    return f"{STATUS_ICONS[entry['status']]} {cell_text(entry)}".rstrip()


def counts_markdown(matrix: dict) -> list[str]:
    columns, counts = matrix["columns"], matrix["counts"]
    lines = ["| outcome | " + " | ".join(columns) + " | all |", "|---|" + "---:|" * (len(columns) + 1)]
    lines += [
        f"| {name} | " + " | ".join(str(per[c]) for c in [*columns, "all"]) + " |" for name, per in counts.items()
    ]
    cells = sum(per["all"] for per in counts.values())
    return [f"{len(matrix['rows'])} architectures, {cells} cells at these versions:", "", *lines]


def counts_text(matrix: dict) -> str:
    """ "120 pass, 80 shard, 4 skip": the outcome classes of one combination in a few words."""
    return ", ".join(f"{per['all']} {name}" for name, per in matrix["counts"].items())


def matrix_markdown(matrix: dict) -> list[str]:
    columns = matrix["columns"]
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in matrix["rows"]:
        lines.append(f"| {row['model']} | " + " | ".join(_matrix_cell(row["cells"].get(c)) for c in columns) + " |")
    return lines


def seen_at(root_cause: RootCause) -> str:
    """ " at transformers 5.23.0" where a cause was seen with other axes held elsewhere than the latest versions."""
    elsewhere = "; ".join(pins_text(pins) for pins in root_cause.elsewhere)
    return f" at {elsewhere}" if elsewhere else ""


def root_cause_title(root_cause: RootCause) -> str:
    """ "shard `cause` — deepspeed 0.18.9 → 0.19.8 — 44 cells: eager fp32: llama tp2/3, …"."""
    return (
        f"{root_cause.failure_class} {code(root_cause.cause)} — {root_cause.axis} {root_cause.before} → "
        f"{root_cause.after}{seen_at(root_cause)} — {count_text(root_cause.count, 'cell')}: {root_cause.cells_text}"
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
            cells = sum(c.count for c in of_kind)
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
        f"**{delta_cause.kind}** {delta_cause.failure_class} {code(delta_cause.cause)} — "
        f"{count_text(delta_cause.count, 'cell')}{unseen}: {delta_cause.cells_text}"
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


def drift_lines(drift: dict | None) -> list[str]:
    if drift is None:
        return []
    lines = [f"## Docs drift ({drift['docs_path']})", ""]
    lines += [f"- listed as supported but failing here: {m}" for m in drift["listed_but_failing"]]
    lines += [f"- passing here but not listed: {m}" for m in drift["passing_but_unlisted"]]
    if len(lines) == 2:
        lines.append("None: the docs agree with the latest results.")
    return [*lines, ""]


def _recorded_by(harness: list[str]) -> str:
    return f" ({harness_text(harness)})" if harness else ""


def other_matrices_markdown(report: Report) -> list[str]:
    """Every other version combination's matrix, collapsed (GitHub renders <details>)."""
    others = report.matrices[1:]
    if not others:
        return []
    lines = ["## Support matrix at the other version combinations", ""]
    for matrix in others:
        lines += [
            f"<details><summary>{matrix['label']}{_recorded_by(matrix['harness'])}: {counts_text(matrix)}</summary>",
            "",
            *matrix_markdown(matrix),
            "",
            "</details>",
            "",
        ]
    return lines


def details_markdown(report: Report) -> list[str]:
    """One answer line per transition (answers.answer_text), collapsed, root cause by root cause."""
    lines = [answer_text(t) for c in report.root_causes for t in report.members(c)]
    if not lines:
        return []
    return [
        "## Details: every transition",
        "",
        f"<details><summary>{count_text(len(lines), 'transition')}, one line each</summary>",
        "",
        *[f"- {line}" for line in lines],
        "",
        "</details>",
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


def step_summary_markdown(report: Report) -> str:
    counts: dict[str, int] = {}
    for row in report.matrix["rows"]:
        for entry in row["cells"].values():
            counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    tally = ", ".join(f"{STATUS_ICONS[s]} {counts[s]} {s}" for s in STATUS_ICONS if s in counts)
    lines = [
        f"## AutoTP matrix — {tally}",
        "",
        f"At {report.latest_label}{_recorded_by(report.latest_harness)}.",
        "",
        *failing_now_markdown(report, markdown_link),
        *since_previous_run_markdown(report),
        *root_causes_markdown(report),
        *drift_lines(report.docs_drift),
    ]
    return "\n".join(lines).rstrip("\n") + "\n\n"


# ---- HTML --------------------------------------------------------------------------------------------------------

PLOT_WIDTH, PLOT_HEIGHT, PLOT_MARGIN = 900, 300, 60
# report.html is paged like report.json: it draws the heatmaps of the newest HTML_MATRICES version combinations and the
# timeline (and trend) of the newest HTML_TIMELINE_SETS version sets, and names report-details.json for the rest (every
# combination's matrix, every timeline column). A year of nightlies has ~360 combinations and ~380 version sets:
# drawn whole, report.html was 42 MB and its rendering a quarter of render's CPU time.
HTML_MATRICES = 12
HTML_TIMELINE_SETS = 40
SERIES_COLOURS = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#116329", "#953800")


def _trend_plot(timeline: dict) -> dict:
    """SVG coordinates for the key metric of each cell across the timeline's columns, on a log scale."""
    columns = timeline["columns"]
    values = [v for cell in timeline["cells"] for v in cell["key_metric"] if v is not None and v > 0]
    if not values:
        return {"series": [], "ticks": []}
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    high = max(high, low + 1)

    def x(position: int) -> float:
        return PLOT_MARGIN + (position + 0.5) * (PLOT_WIDTH - 2 * PLOT_MARGIN) / len(columns)

    def y(value: float) -> float:
        return PLOT_HEIGHT - PLOT_MARGIN / 2 - (math.log10(value) - low) / (high - low) * (PLOT_HEIGHT - PLOT_MARGIN)

    series: list[dict[str, Any]] = []
    for cell in timeline["cells"]:
        shown = [(position, cell["key_metric"][column["index"]]) for position, column in enumerate(columns)]
        points = [(x(position), y(v), v) for position, v in shown if v is not None and v > 0]
        if points:
            colour = SERIES_COLOURS[len(series) % len(SERIES_COLOURS)]
            series.append(
                {
                    "cell": cell["cell"],
                    "colour": colour,
                    "points": points,
                    "path": " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in points),
                }
            )
    ticks = [{"y": y(10.0**e), "label": f"1e{e}"} for e in range(low, high + 1)]
    return {
        "series": series,
        "ticks": ticks,
        "x": [(x(position), column["label"]) for position, column in enumerate(columns)],
    }


def _point_title(timeline: dict, cell: dict, index: int) -> str:
    """What hovering a timeline point shows: the cell, the versions, the outcome, the failure and the run."""
    status = cell["statuses"][index]
    where = f"{cell['cell']} at {timeline['version_sets'][index]}"
    if status is None:
        return f"{where}: not run"
    failure = (
        f" — {cell['failure_classes'][index]}: {one_line(cell['signatures'][index])}"
        if cell["signatures"][index]
        else ""
    )
    newest, count = cell["newest_runs"][index], cell["run_counts"][index]
    more = f" (+{count - 1} more)" if count > 1 else ""
    return f"{where}: {status}{failure} — run {newest}{more}" if newest else f"{where}: {status}{failure}"


def _timeline_view(timeline: dict) -> dict:
    """The timeline as the HTML table draws it: header groups, and rows grouped by model with a sub-row per
    tp × variant × dtype; rows whose outcome never changed are marked steady (hidden until asked for)."""
    columns = timeline["columns"]
    models = []
    for model, cells in groupby(timeline["cells"], key=lambda cell: cell["model"]):
        rows = [
            {
                "label": f"tp{cell['tp']} {cell['variant']} {cell['dtype']}",
                "changed": cell["changed"],
                "points": [
                    {
                        "status": cell["statuses"][c["index"]] or "none",
                        "text": _point_text(cell, c["index"]),
                        "title": _point_title(timeline, cell, c["index"]),
                    }
                    for c in columns
                ],
            }
            for cell in cells
        ]
        models.append({"model": model, "changed": any(row["changed"] for row in rows), "rows": rows})
    groups = [(group, len(list(members))) for group, members in groupby(c["group"] for c in columns)]
    changed = sum(cell["changed"] for cell in timeline["cells"])
    return {
        "groups": groups if any(group for group, _ in groups) else [],
        "models": models,
        "rows": len(timeline["cells"]),
        "changed": changed,
    }


def _point_text(cell: dict, index: int) -> str:
    status = cell["statuses"][index]
    return cell["failure_classes"][index] if status == "fail" else "" if status in (None, "pass") else status


_PLACEHOLDER = re.compile("\x00(\\d+)\x00")


def linked_html(make_lines: Callable[[Link], list[str]]) -> list[Markup]:
    """Lines built by a Link-taking function (answers, commits) as HTML: the text escaped, the links real anchors."""
    anchors: list[Markup] = []

    def link(text: str, url: str) -> str:
        anchors.append(Markup('<a href="{}">{}</a>').format(url, text))
        return f"\x00{len(anchors) - 1}\x00"  # survives escaping; replaced by its anchor afterwards

    return [Markup(_PLACEHOLDER.sub(lambda m: anchors[int(m[1])], str(escape(line)))) for line in make_lines(link)]


def newest_timeline(timeline: dict, sets: int) -> dict:
    """The timeline with only the columns of its `sets` newest version sets (version_sets run oldest to newest), in
    the order the columns are shown; each cell's lists stay indexed by version set, as the columns refer to them."""
    kept = set(range(len(timeline["version_sets"]))[-sets:])
    return {**timeline, "columns": [column for column in timeline["columns"] if column["index"] in kept]}


def html_paging(report: Report) -> dict:
    """What report.html leaves to report-details.json: how many combinations' heatmaps and version sets it omits."""
    return {
        "matrices": report.matrices[:HTML_MATRICES],
        "older_matrices": max(0, len(report.matrices) - HTML_MATRICES),
        "older_sets": max(0, len(report.timeline["version_sets"]) - HTML_TIMELINE_SETS),
        "details_file": DETAILS_FILE,
    }


def report_html(report: Report) -> str:
    environment = Environment(loader=PackageLoader("reports"), autoescape=True, undefined=StrictUndefined)
    template = environment.get_template("report.html.j2")
    timeline = newest_timeline(report.timeline, HTML_TIMELINE_SETS)
    return template.render(
        report=report,
        paging=html_paging(report),
        shown_timeline=timeline,
        sections=ROOT_CAUSE_SECTIONS,
        cell_text=cell_text,
        counts_text=counts_text,
        count_text=count_text,
        trend=_trend_plot(timeline),
        timeline=_timeline_view(timeline),
        plot={"width": PLOT_WIDTH, "height": PLOT_HEIGHT, "margin": PLOT_MARGIN},
        summary=since_previous_run_summary(report.since_previous_run),
        seen_at=seen_at,
        answers=lambda c: linked_html(lambda link: answer_lines(report.members(c), link)),
        root_cause_by_id={c.id: c for c in report.root_causes},
        details=linked_html(lambda link: [answer_text(t, link) for c in report.root_causes for t in report.members(c)]),
        flaky_text=flaky_text,
        harness_text=harness_text,
        failing_now=failing_now_html(report, linked_html),
        checkpoints=checkpoints_html(report.checkpoints),
    )

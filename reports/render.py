"""Turn a History into report.md, report.json, report.html, supported-models.md and a step summary.

Everything is rendered from one JSON-ready dict (build_report), so all outputs say the same thing.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from reports.docs import Drift, model_support, supported_models_markdown
from reports.history import CellStatus, History, Transition
from reports.model import AXES, KEY_METRIC, Bisection, CellKey, Versions, short_commit

STATUS_ICONS = {"pass": "✅", "fail": "❌", "flaky": "⚠️", "skip": "⏭️"}
MAX_COMMITS_IN_MARKDOWN = 20  # report.json always has the full list


def build_report(history: History, drift: Drift | None) -> dict:
    support = model_support(history)
    return {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "latest_versions": _versions(history.latest),
        "latest_label": history.latest.describe(),
        "latest_harness": list(history.harness.get(history.latest, ())),  # harness commits that recorded it
        "key_metric": KEY_METRIC,
        "matrix": _matrix(history),
        "regressions": [_transition(t) for t in history.transitions if t.kind == "broke"],
        "fixes": [_transition(t) for t in history.transitions if t.kind == "fixed"],
        "class_changes": [_transition(t) for t in history.transitions if t.kind == "class-change"],
        "flaky": [
            {"cell": cell.id, "versions": _versions(versions), "versions_label": versions.describe(), **_status(status)}
            for cell, versions, status in history.flaky
        ],
        "timeline": _timeline(history),
        "bisections": [_bisection(b) for b in history.bisections],
        "supported_models": {
            "supported": [m for m, ok in support.items() if ok],
            "unsupported": [m for m, ok in support.items() if not ok],
        },
        "docs_drift": asdict(drift) if drift else None,
    }


def write_outputs(history: History, drift: Drift | None, out_dir: Path) -> list[Path]:
    report = build_report(history, drift)
    out_dir.mkdir(parents=True, exist_ok=True)
    step_summary = Path(os.environ.get("GITHUB_STEP_SUMMARY") or out_dir / "step-summary.md")
    outputs = {
        out_dir / "report.md": report_markdown(report),
        out_dir / "report.json": json.dumps(report, indent=2, ensure_ascii=False) + "\n",
        out_dir / "report.html": report_html(report),
        out_dir / "supported-models.md": supported_models_markdown(model_support(history), history),
    }
    for path, text in outputs.items():
        path.write_text(text, encoding="utf-8")
    with step_summary.open("a", encoding="utf-8") as summary:  # GitHub expects steps to append
        summary.write(step_summary_markdown(report))
    return [*outputs, step_summary]


# ---- JSON-ready pieces -------------------------------------------------------------------------------------------


def _versions(versions: Versions) -> dict[str, str]:
    return {**{axis: getattr(versions, axis) for axis in AXES}, "deepspeed_git": versions.deepspeed_git}


def _status(status: CellStatus) -> dict:
    return {
        "status": status.status,
        "passes": status.passes,
        "fails": status.fails,
        "skips": status.skips,
        "failure_class": status.failure_class,
        "signature": status.signature,
        "key_metric": status.metrics.get(KEY_METRIC),
    }


def _column(cell: CellKey) -> str:
    return f"tp{cell.tp} {cell.variant}/{cell.dtype}"


def _matrix(history: History) -> dict:
    columns = sorted({(c.tp, c.variant, c.dtype) for c in history.cells})
    rows = []
    for model in sorted({c.model for c in history.cells}):
        cells = {}
        for tp, variant, dtype in columns:
            cell = CellKey(model, variant, dtype, tp)
            status = history.statuses.get((cell, history.latest))
            if status is not None:
                cells[_column(cell)] = {"cell": cell.id, **_status(status)}
        rows.append({"model": model, "cells": cells})
    names = [f"tp{tp} {variant}/{dtype}" for tp, variant, dtype in columns]
    return {"columns": names, "rows": rows, "counts": _class_counts(rows, names)}


def outcome_class(entry: dict) -> str:
    """pass, skip, flaky, or the failure class of a failing cell."""
    return (entry["failure_class"] or "fail") if entry["status"] == "fail" else entry["status"]


def _class_counts(rows: list[dict], columns: list[str]) -> dict[str, dict[str, int]]:
    """{outcome class: {column: cells, ..., "all": cells}}, pass first, then the most common classes."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        for column, entry in row["cells"].items():
            per_column = counts.setdefault(outcome_class(entry), dict.fromkeys([*columns, "all"], 0))
            per_column[column] += 1
            per_column["all"] += 1
    return dict(sorted(counts.items(), key=lambda item: (item[0] != "pass", item[0] == "skip", -item[1]["all"], item[0])))


def _transition(transition: Transition) -> dict:
    return {
        "cell": transition.cell.id,
        **asdict(transition.cell),
        "kind": transition.kind,
        "axis": transition.axis,
        "before": transition.before.label(transition.axis),
        "after": transition.after.label(transition.axis),
        "held_fixed": transition.held_fixed,
        "before_status": _status(transition.before_status),
        "after_status": _status(transition.after_status),
        "commits": [asdict(commit) for commit in transition.commits],
        "bisection": _bisection(transition.bisection) if transition.bisection else None,
        "attempt": {**asdict(transition.attempt), "cell": transition.attempt.cell.id} if transition.attempt else None,
    }


def _bisection(bisection: Bisection) -> dict:
    return {**asdict(bisection), "cell": bisection.cell.id}


def _timeline(history: History) -> dict:
    cells = []
    for cell in history.cells:
        points = [history.statuses.get((cell, versions)) for versions in history.version_sets]
        cells.append({
            "cell": cell.id,
            "statuses": [p.status if p else None for p in points],
            "key_metric": [p.metrics.get(KEY_METRIC) if p else None for p in points],
        })
    return {"version_sets": [v.describe() for v in history.version_sets], "cells": cells,
            "harness": [list(history.harness.get(v, ())) for v in history.version_sets]}


# ---- Markdown ----------------------------------------------------------------------------------------------------


def harness_text(commits: list[str]) -> str:
    """"harness abc1234567" (the harness commits that recorded these results), or "" for old results."""
    return f"harness {', '.join(short_commit(c) for c in commits)}" if commits else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
        return "—"  # not run at the latest versions
    return f"{STATUS_ICONS[entry['status']]} {cell_text(entry)}".rstrip()


def counts_markdown(report: dict) -> list[str]:
    columns, counts = report["matrix"]["columns"], report["matrix"]["counts"]
    lines = ["| outcome | " + " | ".join(columns) + " | all |", "|---|" + "---:|" * (len(columns) + 1)]
    lines += [f"| {name} | " + " | ".join(str(per[c]) for c in [*columns, "all"]) + " |" for name, per in counts.items()]
    models = len(report["matrix"]["rows"])
    cells = sum(per["all"] for per in counts.values())
    return [f"{models} architectures, {cells} cells at these versions:", "", *lines]


def matrix_markdown(report: dict) -> list[str]:
    columns = report["matrix"]["columns"]
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in report["matrix"]["rows"]:
        lines.append(f"| {row['model']} | " + " | ".join(_matrix_cell(row["cells"].get(c)) for c in columns) + " |")
    return lines


def _failure(status: dict) -> str:
    return f"{status['failure_class']}: {_one_line(status['signature'])}"


def transition_text(t: dict) -> str:
    before, after = t["before_status"], t["after_status"]
    where = f"{t['axis']} {t['before']} → {t['after']}"
    held_fixed = t["held_fixed"]
    if t["kind"] == "broke":
        detail = f"(last good → first bad) at {held_fixed} — {_failure(after)}"
    elif t["kind"] == "fixed":
        detail = f"(last bad → first good) at {held_fixed} — was {_failure(before)}"
    else:
        detail = (f"at {held_fixed} — failure class {before['failure_class']} → {after['failure_class']}: "
                  f"{_one_line(after['signature'])}")
    bisected = f" — {bisection_verdict(t['bisection'])}" if t["bisection"] else ""
    return f"{t['cell']}: {where} {detail}{bisected}"


def bisection_verdict(b: dict) -> str:
    """"broken by #1234 (subject, `sha`)", or the release answer when no commit was bisected."""
    verb = "broken by" if b["mode"] == "broken" else "fixed by"
    if b["commit"]:
        subject = _one_line(b["subject"]).replace(f" (#{b['pr']})", "")
        who = f"#{b['pr']} {subject}" if b["pr"] else subject
        return f"{verb} {who} (`{b['commit'][:10]}`)"
    words = ("last good", "first bad") if b["mode"] == "broken" else ("last bad", "first good")
    return f"{verb} {b['axis']} {b['after']} ({words[0]} {b['before']})"


def bisection_text(b: dict) -> str:
    untestable = f"; untestable in between: {', '.join(b['untestable'])}" if b["untestable"] else ""
    failure = f" — {b['failure_class']}: {_one_line(b['signature'])}" if b["failure_class"] else ""
    return f"{b['cell']}: {bisection_verdict(b)} at {b['held_fixed']}{failure}{untestable}"


def commit_text(commit: dict) -> str:
    subject, pr = _one_line(commit["subject"]), commit["pr"]
    if pr:  # lead with the PR number instead of repeating it at the end of the subject
        subject = f"#{pr} {subject.replace(f' (#{pr})', '')}"
    where = " — touches AutoTP paths" if commit["relevant"] else ""
    return f"{subject} (`{commit['sha'][:10]}`){where}"


def commit_lines(t: dict) -> list[str]:
    lines = [f"  - {commit_text(commit)}" for commit in t["commits"][:MAX_COMMITS_IN_MARKDOWN]]
    if len(t["commits"]) > MAX_COMMITS_IN_MARKDOWN:
        lines.append(f"  - … and {len(t['commits']) - MAX_COMMITS_IN_MARKDOWN} more commits (see report.json)")
    return lines


def _transition_section(title: str, transitions: list[dict]) -> list[str]:
    lines = [f"## {title}", ""]
    if not transitions:
        return [*lines, "None.", ""]
    for t in transitions:
        lines.append(f"- {transition_text(t)}")
        lines.extend(commit_lines(t))
    return [*lines, ""]


def _bisection_section(bisections: list[dict]) -> list[str]:
    if not bisections:
        return []  # the section only appears once `python -m reports.bisect` has recorded something
    return ["## Bisections", "", *[f"- {bisection_text(b)}" for b in bisections], ""]


def flaky_text(entry: dict) -> str:
    failed = f" ({entry['failure_class']}: {_one_line(entry['signature'])})" if entry["failure_class"] else ""
    return f"{entry['cell']} at {entry['versions_label']}: {entry['passes']} pass / {entry['fails']} fail{failed}"


def drift_lines(drift: dict | None) -> list[str]:
    if drift is None:
        return []
    lines = [f"## Docs drift ({drift['docs_path']})", ""]
    lines += [f"- listed as supported but failing here: {m}" for m in drift["listed_but_failing"]]
    lines += [f"- passing here but not listed: {m}" for m in drift["passing_but_unlisted"]]
    if len(lines) == 2:
        lines.append("None: the docs agree with the latest results.")
    return [*lines, ""]


def _recorded_by(report: dict) -> str:
    return f" ({harness_text(report['latest_harness'])})" if report["latest_harness"] else ""


def report_markdown(report: dict) -> str:
    lines = [
        "# AutoTP support matrix",
        "",
        f"Latest versions: {report['latest_label']}{_recorded_by(report)}. Cells show the outcome, the failure "
        f"class and `{report['key_metric']}`; — means not run at these versions.",
        "",
        *counts_markdown(report),
        "",
        *matrix_markdown(report),
        "",
        *_transition_section("Regressions", report["regressions"]),
        *_transition_section("Fixes", report["fixes"]),
        *_transition_section("Failure-class changes", report["class_changes"]),
        "## Flaky cells",
        "",
        *([f"- {flaky_text(entry)}" for entry in report["flaky"]] or ["None."]),
        "",
        *_bisection_section(report["bisections"]),
        *drift_lines(report["docs_drift"]),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def step_summary_markdown(report: dict) -> str:
    counts: dict[str, int] = {}
    for row in report["matrix"]["rows"]:
        for entry in row["cells"].values():
            counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    tally = ", ".join(f"{STATUS_ICONS[s]} {counts[s]} {s}" for s in STATUS_ICONS if s in counts)
    lines = [
        f"## AutoTP matrix — {tally}",
        "",
        f"At {report['latest_label']}{_recorded_by(report)}.",
        "",
        *_transition_section("Regressions", report["regressions"]),
        *_transition_section("Fixes", report["fixes"]),
        *drift_lines(report["docs_drift"]),
    ]
    return "\n".join(lines).rstrip("\n") + "\n\n"


# ---- HTML --------------------------------------------------------------------------------------------------------

PLOT_WIDTH, PLOT_HEIGHT, PLOT_MARGIN = 900, 300, 60
SERIES_COLOURS = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#116329", "#953800")


def _trend_plot(timeline: dict) -> dict:
    """SVG coordinates for the key metric of each cell across version sets, on a log scale."""
    columns = len(timeline["version_sets"])
    values = [v for cell in timeline["cells"] for v in cell["key_metric"] if v is not None and v > 0]
    if not values:
        return {"series": [], "ticks": []}
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    high = max(high, low + 1)

    def x(index: int) -> float:
        return PLOT_MARGIN + (index + 0.5) * (PLOT_WIDTH - 2 * PLOT_MARGIN) / columns

    def y(value: float) -> float:
        return PLOT_HEIGHT - PLOT_MARGIN / 2 - (math.log10(value) - low) / (high - low) * (PLOT_HEIGHT - PLOT_MARGIN)

    series = []
    for cell in timeline["cells"]:
        points = [(x(i), y(v), v) for i, v in enumerate(cell["key_metric"]) if v is not None and v > 0]
        if points:
            colour = SERIES_COLOURS[len(series) % len(SERIES_COLOURS)]
            series.append({"cell": cell["cell"], "colour": colour, "points": points,
                           "path": " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in points)})
    ticks = [{"y": y(10.0**e), "label": f"1e{e}"} for e in range(low, high + 1)]
    return {"series": series, "ticks": ticks, "x": [x(i) for i in range(columns)]}


def report_html(report: dict) -> str:
    environment = Environment(loader=PackageLoader("reports"), autoescape=True, undefined=StrictUndefined)
    template = environment.get_template("report.html.j2")
    return template.render(
        report=report,
        icons=STATUS_ICONS,
        cell_text=cell_text,
        trend=_trend_plot(report["timeline"]),
        plot={"width": PLOT_WIDTH, "height": PLOT_HEIGHT, "margin": PLOT_MARGIN},
        transition_text=transition_text,
        commit_text=commit_text,
        flaky_text=flaky_text,
        bisection_text=bisection_text,
        harness_text=harness_text,
    )

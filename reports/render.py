"""Turn a History into report.md, report.json, report.html, supported-models.md (and .diff) and a step summary.

Everything is rendered from one JSON-ready dict (build_report), so all outputs say the same thing. A reader
gets one screen first — what changed since the previous run of each session, and the root causes of every
transition (reports.causes) with their answers — then the support matrix, then the details.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from itertools import groupby
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from matrix.redaction import Redactor
from matrix.registry import KnownFailure
from reports import ReportsError
from reports.aggregates import Aggregates, started_order
from reports.answers import Link, answer_text, code, commit_words, markdown_link, one_line
from reports.checkpoints import cell_checkpoints, checkpoint_verdicts, checkpoints_html, checkpoints_markdown
from reports.causes import (DELTA_KINDS, SessionDeltas, all_session_deltas, cause_id, cell_of, cells_text, count_text,
                            delta_causes, members, other_pins, root_causes, shared_answers)
from reports.docs import Drift, docs_diff, docs_names, model_families, supported_models, supported_models_markdown
from reports.failing_now import failing_now, failing_now_html, failing_now_markdown
from reports.history import CellStatus, History, Transition, harness_change_text
from reports.records import (AXES, KEY_METRIC, Bisection, CellKey, Run, Versions, pins_text, release,
                             short_commit)

STATUS_ICONS = {"pass": "✅", "fail": "❌", "flaky": "⚠️", "skip": "⏭️"}
MAX_CANDIDATES = 5  # candidate commits shown for a cause nothing answered yet; report.json keeps them all
# What report.json leaves to report-details.json (split_report): what grows with the history (every combination's
# matrix, the timeline, each transition, flaky point and answer); report.json's root causes count and name them.
DETAILS_FILE = "report-details.json"
DETAIL_KEYS = ("matrices", "timeline", "regressions", "fixes", "class_changes", "flaky", "harness_changes",
               "bisections")


def build_report(history: History, aggregates: Aggregates, drift: Drift | None,
                 known_failures: dict[str, KnownFailure]) -> dict:
    runs = _runs_by_point(aggregates)
    report = {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "latest_versions": _versions(history.latest),
        "latest_label": history.latest.describe(),
        "latest_harness": list(history.harness.get(history.latest, ())),  # harness commits that recorded it
        "key_metric": KEY_METRIC,
        "since_previous_run": _since_previous_run(all_session_deltas(aggregates.recent, history)),
        "matrix": _matrix(history, history.latest),
        "matrices": [
            {"versions": _versions(versions), "label": versions.describe(),
             "harness": list(history.harness.get(versions, ())), **_matrix(history, versions)}
            for versions in reversed(history.version_sets)  # the newest first, as a reader looks for it
        ],
        "regressions": [transition_json(t) for t in history.transitions if t.kind == "broke"],
        "fixes": [transition_json(t) for t in history.transitions if t.kind == "fixed"],
        "class_changes": [transition_json(t) for t in history.transitions if t.kind == "class-change"],
        "flaky": [
            {"cell": cell.id, "versions": _versions(versions), "versions_label": versions.describe(), **_status(status)}
            for cell, versions, status in history.flaky
        ],
        "harness_changes": [
            {"cell": cell.id, "versions_label": versions.describe(), "change": harness_change_text(status),
             "before_status": _status(status.harness_change), "after_status": _status(status)}
            for cell, versions, status in history.harness_changes
        ],
        "timeline": _timeline(history, runs),
        "bisections": [_bisection(b) for b in history.bisections],
        "docs_drift": asdict(drift) if drift else None,
        "checkpoints": checkpoint_verdicts(history, cell_checkpoints(aggregates, history)),
    }
    report["root_causes"] = root_causes(report, history.transitions)
    report["failing_now"] = failing_now(report, history, aggregates, known_failures)
    report["supported_models"] = supported_models(history, report["failing_now"], model_families())
    return report


def write_outputs(history: History, aggregates: Aggregates, drift: Drift | None,
                  known_failures: dict[str, KnownFailure], out_dir: Path) -> list[Path]:
    report = build_report(history, aggregates, drift, known_failures)
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


def split_report(report: dict) -> tuple[dict, dict]:
    """(report.json, report-details.json): what grows with the history (DETAIL_KEYS) goes to the second, which the
    first names under "details", so report.json stays the size of its first screen however long the history."""
    details = {key: report[key] for key in DETAIL_KEYS}
    first_screen = {key: value for key, value in report.items() if key not in DETAIL_KEYS}
    return {**first_screen, "details": {"file": DETAILS_FILE, "keys": list(DETAIL_KEYS)}}, details


def read_report(out_dir: Path) -> dict:
    """The whole report a render wrote to out_dir: report.json with its details file put back."""
    first_screen = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    details = first_screen.pop("details")
    return {**first_screen, **json.loads((out_dir / details["file"]).read_text(encoding="utf-8"))}


@contextmanager
def writing_to(out_dir: Path):
    """An output that cannot be written (--out names a file, a folder without permission, a full disk) is one line."""
    try:
        yield
    except OSError as exc:
        raise ReportsError(f"--out {out_dir}: cannot write {exc.filename or out_dir} ({exc.strerror}); pass a "
                           "folder that can be created or written") from None


# ---- JSON-ready pieces -------------------------------------------------------------------------------------------


def _versions(versions: Versions) -> dict[str, str]:
    return {**{axis: getattr(versions, axis) for axis in AXES}, "deepspeed_git": versions.deepspeed_git}


def _labels(versions: Versions) -> dict[str, str]:
    """Each axis as reports print it (a DeepSpeed git build as 0.19.8@abc1234567)."""
    return {axis: versions.label(axis) for axis in AXES}


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


def _matrix(history: History, versions: Versions) -> dict:
    """The support matrix at one version combination: a row per model run there, a column per tp × variant × dtype."""
    here = [cell for cell in history.cells if (cell, versions) in history.statuses]
    columns = sorted({(c.tp, c.variant, c.dtype) for c in here})
    rows = []
    for model in sorted({c.model for c in here}):
        cells = {}
        for tp, variant, dtype in columns:
            cell = CellKey(model, variant, dtype, tp)
            status = history.statuses.get((cell, versions))
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


def transition_json(transition: Transition) -> dict:
    return {
        "cell": transition.cell.id,
        **asdict(transition.cell),
        "kind": transition.kind,
        "axis": transition.axis,
        "before": transition.before.label(transition.axis),
        "after": transition.after.label(transition.axis),
        "held_fixed": pins_text(transition.held_fixed),
        "before_status": _status(transition.before_status),
        "after_status": _status(transition.after_status),
        "commits": [asdict(commit) for commit in transition.commits],
        "bisection": _bisection(transition.bisection) if transition.bisection else None,
        "attempt": {**asdict(transition.attempt), "cell": transition.attempt.cell.id} if transition.attempt else None,
    }


def _bisection(bisection: Bisection) -> dict:
    return {**asdict(bisection), "cell": bisection.cell.id}


def _since_previous_run(sessions: list[SessionDeltas]) -> dict:
    """What changed between the previous and the newest run of each session, grouped into causes."""
    causes = delta_causes(sessions)
    flaky = sorted({d.cell.id for s in sessions for d in s.deltas if d.kind == "flaky"})
    return {
        "sessions": [{
            "session": s.session, "newest_run": s.newest.run_id, "newest_versions": s.newest.versions.describe(),
            "previous_run": s.previous.run_id if s.previous else None,
            "previous_versions": s.previous.versions.describe() if s.previous else None,
            "changed": [s.change_text(axis) for axis in s.changed],
        } for s in sessions],
        "counts": {kind: {"cells": sum(len(c.cells) for c in causes if c.kind == kind),
                          "causes": sum(1 for c in causes if c.kind == kind)}
                   for kind in DELTA_KINDS if kind != "flaky"} | {"flaky": {"cells": len(flaky)}},
        "causes": [{
            "id": c.id, "kind": c.kind, "failure_class": c.failure_class, "cause": c.cause, "count": len(c.cells),
            "cells": [cell.id for cell in c.cells], "cells_text": cells_text(c.cells),
            "sessions": [s.session for s in c.sessions],
            "no_previous_verdict": sorted({d.cell.id for _, d in c.deltas if c.kind == "new failure" and not d.regression}),
            "root_causes": sorted({cause_id(*t.cause_key) for _, d in c.deltas
                                   for t in d.transitions}),
        } for c in causes],
        "flaky": flaky,
    }


def _runs_by_point(aggregates: Aggregates) -> dict[tuple[CellKey, Versions], PointRuns]:
    """How many runs recorded each cell at each version set, and the newest of them."""
    runs: dict[tuple[CellKey, Versions], PointRuns] = {}
    for group in aggregates.groups:
        known = runs.get((group.cell, group.versions))
        newest = group.newest if known is None or started_order(group.newest) > started_order(known.newest) \
            else known.newest
        runs[group.cell, group.versions] = PointRuns(group.count + (known.count if known else 0), newest)
    return runs


@dataclass(frozen=True)
class PointRuns:
    count: int
    newest: Run


def _axis_order(axis: str, version_sets: list[Versions]) -> dict[str, tuple]:
    """A sort key per label of an axis: releases by PEP 440, then the history's order (which places DeepSpeed
    git builds topologically when a clone was given, and labels such as pr/1234 after the releases)."""
    first_seen: dict[str, int] = {}
    for index, versions in enumerate(version_sets):
        first_seen.setdefault(versions.label(axis), index)
    keys = {}
    for versions in version_sets:
        version = release(getattr(versions, axis))
        label = versions.label(axis)
        keys[label] = (0, version, first_seen[label]) if version is not None else (1, first_seen[label])
    return keys


def _newest_run(runs: PointRuns | None) -> str | None:
    return runs.newest.run_id if runs else None


def _timeline(history: History, runs: dict[tuple[CellKey, Versions], PointRuns]) -> dict:
    """Every cell at every version set. Columns are shown grouped by the axes that change besides the one that
    changes most (the primary axis), then ordered by version along the primary axis; axes that never change
    are stated once."""
    sets = history.version_sets
    labels = [_labels(v) for v in sets]
    varying = [axis for axis in AXES if len({label[axis] for label in labels}) > 1]
    primary = max(varying, key=lambda axis: len({label[axis] for label in labels}), default=AXES[0])
    grouping = [axis for axis in varying if axis != primary]
    order = {axis: _axis_order(axis, sets) for axis in varying}
    shown = sorted(range(len(sets)), key=lambda i: (tuple(order[a][labels[i][a]] for a in grouping),
                                                    order[primary][labels[i][primary]] if varying else 0))
    cells = []
    for cell in history.cells:
        points = [history.statuses.get((cell, versions)) for versions in sets]
        verdicts = {outcome_class(_status(p)) for p in points if p is not None and p.status != "skip"}
        cells.append({
            "cell": cell.id, **asdict(cell),
            "statuses": [p.status if p else None for p in points],
            "failure_classes": [p.failure_class if p else "" for p in points],
            "signatures": [p.signature if p else "" for p in points],
            "key_metric": [p.metrics.get(KEY_METRIC) if p else None for p in points],
            # The newest run there and how many ran (every run id of a year would be ~1.5 M of them).
            "newest_runs": [_newest_run(runs.get((cell, versions))) for versions in sets],
            "run_counts": [runs[cell, versions].count if (cell, versions) in runs else 0 for versions in sets],
            "changed": len(verdicts) > 1,  # a skip says nothing about the cell, so it changes nothing
        })
    return {
        "version_sets": [v.describe() for v in sets], "labels": labels,
        "harness": [list(history.harness.get(v, ())) for v in sets],
        "varying_axes": varying, "primary_axis": primary,
        "fixed_axes": {axis: labels[0][axis] for axis in AXES if axis not in varying},
        "columns": [{"index": i, "group": ", ".join(f"{a} {labels[i][a]}" for a in grouping),
                     "label": labels[i][primary]} for i in shown],
        "cells": cells,
    }


# ---- Markdown ----------------------------------------------------------------------------------------------------


def harness_text(commits: list[str]) -> str:
    """"harness abc1234567" (the harness commits that recorded these results), or "" for old results."""
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
    lines += [f"| {name} | " + " | ".join(str(per[c]) for c in [*columns, "all"]) + " |" for name, per in counts.items()]
    cells = sum(per["all"] for per in counts.values())
    return [f"{len(matrix['rows'])} architectures, {cells} cells at these versions:", "", *lines]


def counts_text(matrix: dict) -> str:
    """"120 pass, 80 shard, 4 skip": the outcome classes of one combination in a few words."""
    return ", ".join(f"{per['all']} {name}" for name, per in matrix["counts"].items())


def matrix_markdown(matrix: dict) -> list[str]:
    columns = matrix["columns"]
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in matrix["rows"]:
        lines.append(f"| {row['model']} | " + " | ".join(_matrix_cell(row["cells"].get(c)) for c in columns) + " |")
    return lines


def seen_at(root_cause: dict, report: dict) -> str:
    """" at transformers 5.23.0" where a cause was seen with other axes held elsewhere than the latest versions."""
    latest = Versions(**report["latest_versions"])
    elsewhere = [pins for pins in (other_pins(h, latest) for h in root_cause["held_fixed"]) if pins]
    return f" at {'; '.join(elsewhere)}" if elsewhere else ""


def root_cause_title(root_cause: dict, report: dict) -> str:
    """"shard `cause` — deepspeed 0.18.9 → 0.19.8 — 44 cells: eager fp32: llama tp2/3, …"."""
    return (f"{root_cause['failure_class']} {code(root_cause['cause'])} — {root_cause['axis']} {root_cause['before']} → "
            f"{root_cause['after']}{seen_at(root_cause, report)} — {count_text(root_cause['count'], 'cell')}: "
            f"{root_cause['cells_text']}")


def answer_lines(transitions: list[dict], link: Link = markdown_link) -> list[str]:
    """The answers shared by the transitions of a cause: the most common one with the number of cells it covers
    when not all, each other one with its cells; then the candidate commits while no answer names one."""
    cells = {t["cell"]: cell_of(t) for t in transitions}
    lines = []
    for rank, (text, answered) in enumerate(shared_answers(transitions, link)):
        if len(answered) == len(cells):
            covers = ""
        elif rank == 0:
            covers = f" ({count_text(len(answered), 'cell')})"
        else:
            covers = f" ({count_text(len(answered), 'cell')}: {cells_text([cells[c] for c in answered])})"
        lines.append(f"answer{covers}: {text}")
    if not any(t["bisection"] for t in transitions) and transitions[0]["commits"]:
        commits = transitions[0]["commits"]  # one range, so every member lists the same commits
        shown = "; ".join(commit_words(transitions[0]["axis"], c, link) for c in commits[:MAX_CANDIDATES])
        more = f" and {len(commits) - MAX_CANDIDATES} more (report.json)" if len(commits) > MAX_CANDIDATES else ""
        relevant = sum(1 for c in commits if c["relevant"])
        lines.append(f"candidate commits ({relevant} of {len(commits)} touch AutoTP paths, listed first): {shown}{more}")
    return lines


ROOT_CAUSE_SECTIONS = (("broke", "Regressions"), ("fixed", "Fixes"), ("class-change", "Failure-class changes"))


def root_causes_markdown(report: dict) -> list[str]:
    found = report["root_causes"]
    transitions = sum(len(c["members"]) for c in found)
    lines = ["## Root causes", ""]
    if not found:
        return [*lines, "No transition in the history: every cell kept its outcome across the versions run.", ""]
    lines += [f"{count_text(len(found), 'root cause')} over {count_text(transitions, 'transition')}. A range is last "
              "good → first bad (regressions) or last bad → first good (fixes) along one axis; the other axes are held "
              f"at the latest versions ({report['latest_label']}) unless a cause says \"at …\".", ""]
    for kind, title in ROOT_CAUSE_SECTIONS:
        of_kind = [c for c in found if c["kind"] == kind]
        if of_kind:
            cells = sum(c["count"] for c in of_kind)
            lines += [f"### {title}: {count_text(len(of_kind), 'cause')}, {count_text(cells, 'cell')}", ""]
            for number, root_cause in enumerate(of_kind, start=1):
                lines.append(f"{number}. {root_cause_title(root_cause, report)}")
                lines += [f"   - {line}" for line in answer_lines(members(report, root_cause))]
            lines.append("")
    return lines


def delta_cause_line(delta_cause: dict, report: dict) -> str:
    """One cause of what changed since the previous runs, with the answer of the root cause it belongs to."""
    by_id = {c["id"]: c for c in report["root_causes"]}
    placed = [by_id[i] for i in delta_cause["root_causes"]]
    where = "; ".join(f"{c['axis']} {c['before']} → {c['after']}" for c in placed)
    answers = [line for c in placed for line in answer_lines(members(report, c))]
    unseen = (f" ({len(delta_cause['no_previous_verdict'])} without a verdict in the previous run)"
              if delta_cause["no_previous_verdict"] else "")
    return (f"**{delta_cause['kind']}** {delta_cause['failure_class']} {code(delta_cause['cause'])} — "
            f"{count_text(delta_cause['count'], 'cell')}{unseen}: {delta_cause['cells_text']}"
            + (f" — {where}: " + "; ".join(answers) if placed else ""))


def since_previous_run_summary(since: dict) -> str:
    """"3 new failures in 1 cause, 45 fixes in 1 cause, 1 flaky cell" (what is zero is left out)."""
    counts = since["counts"]
    parts = [f"{count_text(counts[kind]['cells'], noun, plural)} in {count_text(counts[kind]['causes'], 'cause')}"
             for kind, noun, plural in (("new failure", "new failure", ""), ("fixed", "fix", "fixes"),
                                        ("still failing", "cell still failing", "cells still failing"))
             if counts[kind]["cells"]]
    if counts["flaky"]["cells"]:
        parts.insert(2, count_text(counts["flaky"]["cells"], "flaky cell"))
    return ", ".join(parts) or "nothing changed"


def since_previous_run_markdown(report: dict) -> list[str]:
    since = report["since_previous_run"]
    compared = [s for s in since["sessions"] if s["previous_run"]]
    lines = ["## Since the previous run of each session", ""]
    if not compared:
        return [*lines, f"No session has run twice yet ({count_text(len(since['sessions']), 'session')}): nothing to "
                        "compare. The root causes below come from the whole history.", ""]
    lines += [f"{since_previous_run_summary(since)}.", ""]
    for s in compared:
        changed = ", ".join(s["changed"]) or "no version changed"
        lines.append(f"- `{s['session']}`: run `{s['previous_run']}` → `{s['newest_run']}`: {changed}")
    news = [f"- {delta_cause_line(c, report)}" for c in since["causes"] if c["kind"] != "still failing"]
    return [*lines, "", *news, ""] if news else [*lines, ""]


def flaky_text(entry: dict) -> str:
    failed = f" ({entry['failure_class']}: {one_line(entry['signature'])})" if entry["failure_class"] else ""
    return f"{entry['cell']} at {entry['versions_label']}: {entry['passes']} pass / {entry['fails']} fail{failed}"


def harness_changes_markdown(report: dict) -> list[str]:
    """Verdicts that changed at the same versions when the harness commit did: not flaky, no library change."""
    if not report["harness_changes"]:
        return []
    return ["## Harness changes", "", "Verdicts that changed with the harness commit at the same versions:", "",
            *[f"- {e['cell']} at {e['versions_label']}: {e['change']}" for e in report["harness_changes"]], ""]


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


def other_matrices_markdown(report: dict) -> list[str]:
    """Every other version combination's matrix, collapsed (GitHub renders <details>)."""
    others = report["matrices"][1:]
    if not others:
        return []
    lines = ["## Support matrix at the other version combinations", ""]
    for matrix in others:
        lines += [f"<details><summary>{matrix['label']}{_recorded_by(matrix['harness'])}: {counts_text(matrix)}</summary>",
                  "", *matrix_markdown(matrix), "", "</details>", ""]
    return lines


def details_markdown(report: dict) -> list[str]:
    """One answer line per transition (answers.answer_text), collapsed, root cause by root cause."""
    lines = [answer_text(t) for c in report["root_causes"] for t in members(report, c)]
    if not lines:
        return []
    return ["## Details: every transition", "",
            f"<details><summary>{count_text(len(lines), 'transition')}, one line each</summary>", "",
            *[f"- {line}" for line in lines], "", "</details>", ""]


def report_markdown(report: dict) -> str:
    lines = [
        "# AutoTP support matrix",
        "",
        f"Latest versions: {report['latest_label']}{_recorded_by(report['latest_harness'])}.",
        "",
        *failing_now_markdown(report, markdown_link),
        *since_previous_run_markdown(report),
        *root_causes_markdown(report),
        "## Support matrix at the latest versions",
        "",
        f"Cells show the outcome, the failure class and `{report['key_metric']}`; — means not run at these versions.",
        "",
        *counts_markdown(report["matrix"]),
        "",
        *matrix_markdown(report["matrix"]),
        "",
        *checkpoints_markdown(report["checkpoints"]),
        *other_matrices_markdown(report),
        "## Flaky cells",
        "",
        *([f"- {flaky_text(entry)}" for entry in report["flaky"]] or ["None."]),
        "",
        *harness_changes_markdown(report),
        *details_markdown(report),
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
        f"At {report['latest_label']}{_recorded_by(report['latest_harness'])}.",
        "",
        *failing_now_markdown(report, markdown_link),
        *since_previous_run_markdown(report),
        *root_causes_markdown(report),
        *drift_lines(report["docs_drift"]),
    ]
    return "\n".join(lines).rstrip("\n") + "\n\n"


# ---- HTML --------------------------------------------------------------------------------------------------------

PLOT_WIDTH, PLOT_HEIGHT, PLOT_MARGIN = 900, 300, 60
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

    series = []
    for cell in timeline["cells"]:
        shown = [(position, cell["key_metric"][column["index"]]) for position, column in enumerate(columns)]
        points = [(x(position), y(v), v) for position, v in shown if v is not None and v > 0]
        if points:
            colour = SERIES_COLOURS[len(series) % len(SERIES_COLOURS)]
            series.append({"cell": cell["cell"], "colour": colour, "points": points,
                           "path": " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in points)})
    ticks = [{"y": y(10.0**e), "label": f"1e{e}"} for e in range(low, high + 1)]
    return {"series": series, "ticks": ticks,
            "x": [(x(position), column["label"]) for position, column in enumerate(columns)]}


def _point_title(timeline: dict, cell: dict, index: int) -> str:
    """What hovering a timeline point shows: the cell, the versions, the outcome, the failure and the run."""
    status = cell["statuses"][index]
    where = f"{cell['cell']} at {timeline['version_sets'][index]}"
    if status is None:
        return f"{where}: not run"
    failure = f" — {cell['failure_classes'][index]}: {one_line(cell['signatures'][index])}" if cell["signatures"][index] else ""
    newest, count = cell["newest_runs"][index], cell["run_counts"][index]
    more = f" (+{count - 1} more)" if count > 1 else ""
    return f"{where}: {status}{failure} — run {newest}{more}" if newest else f"{where}: {status}{failure}"


def _timeline_view(timeline: dict) -> dict:
    """The timeline as the HTML table draws it: header groups, and rows grouped by model with a sub-row per
    tp × variant × dtype; rows whose outcome never changed are marked steady (hidden until asked for)."""
    columns = timeline["columns"]
    models = []
    for model, cells in groupby(timeline["cells"], key=lambda cell: cell["model"]):
        rows = [{
            "label": f"tp{cell['tp']} {cell['variant']} {cell['dtype']}", "changed": cell["changed"],
            "points": [{"status": cell["statuses"][c["index"]] or "none",
                        "text": _point_text(cell, c["index"]), "title": _point_title(timeline, cell, c["index"])}
                       for c in columns],
        } for cell in cells]
        models.append({"model": model, "changed": any(row["changed"] for row in rows), "rows": rows})
    groups = [(group, len(list(members))) for group, members in groupby(c["group"] for c in columns)]
    changed = sum(cell["changed"] for cell in timeline["cells"])
    return {"groups": groups if any(group for group, _ in groups) else [], "models": models,
            "rows": len(timeline["cells"]), "changed": changed}


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


def report_html(report: dict) -> str:
    environment = Environment(loader=PackageLoader("reports"), autoescape=True, undefined=StrictUndefined)
    template = environment.get_template("report.html.j2")
    return template.render(
        report=report,
        sections=ROOT_CAUSE_SECTIONS,
        cell_text=cell_text,
        counts_text=counts_text,
        count_text=count_text,
        trend=_trend_plot(report["timeline"]),
        timeline=_timeline_view(report["timeline"]),
        plot={"width": PLOT_WIDTH, "height": PLOT_HEIGHT, "margin": PLOT_MARGIN},
        summary=since_previous_run_summary(report["since_previous_run"]),
        seen_at=lambda c: seen_at(c, report),
        answers=lambda c: linked_html(lambda link: answer_lines(members(report, c), link)),
        root_cause_by_id={c["id"]: c for c in report["root_causes"]},
        details=linked_html(lambda link: [answer_text(t, link) for c in report["root_causes"] for t in members(report, c)]),
        flaky_text=flaky_text,
        harness_text=harness_text,
        failing_now=failing_now_html(report, linked_html),
        checkpoints=checkpoints_html(report["checkpoints"]),
    )

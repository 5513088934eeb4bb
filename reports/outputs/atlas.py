"""A page per real checkpoint (the start of a public AutoTP atlas): `checkpoints/<org>--<name>.html` beside report.html,
each with the checkpoint's hub model card, its verdicts at every version set of the history (the faithful cells that
stand for it), the causes it fails with now, since when and the first bad version or PR where triage found it, and
links to the logs, repro scripts and draft issues the results folder holds. Formatting only, from the Report."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from reports.analysis import (
    CellFiles,
    CheckpointEntry,
    CheckpointVerdict,
    cause_answer_text,
    cause_sentence_text,
    repro_command,
    status_text,
)
from reports.outputs.links import checkpoint_page, code_spans, hub_url, linked_html, verdict_html
from reports.outputs.markdown_safety import visible_html
from reports.outputs.model import Report
from suites.verdicts.mechanism import class_and_finding


def page_data(report: Report, entry: CheckpointEntry) -> dict[str, Any]:
    """What one checkpoint's page shows."""
    cells = [verdict.cell for verdict in entry.verdicts]
    timeline = report.timeline
    rows = {row.cell.id: row for row in timeline.cells if row.cell.id in cells}
    history = [
        {
            "label": timeline.version_sets[index],
            "verdicts": [
                verdict_html(rows[cell].statuses[index] or "none", rows[cell].failure_classes[index])
                if cell in rows and rows[cell].statuses[index]
                else Markup("—")
                for cell in cells
            ],
        }
        for index in reversed(range(len(timeline.version_sets)))
    ]
    shown = [cause for cause in report.failing_now.causes if set(cause.group.cells) & set(cells)]
    statuses = linked_html(lambda link: [status_text(cause, link) for cause in shown], depth=1)
    answers = linked_html(lambda link: [cause_answer_text(cause, report, link) for cause in shown], depth=1)
    verdicts = {verdict.cell: verdict for verdict in entry.verdicts}
    causes = [
        {
            "cause": cause,
            "sentence": code_spans(cause_sentence_text(cause)),
            "status": status,
            "answer": answer,
            "draft": f"../{cause.draft}" if cause.draft else "",
            "cells": [own_cell(verdicts[member.cell], member) for member in cause.members if member.cell in verdicts],
        }
        for cause, status, answer in zip(shown, statuses, answers)
    ]
    return {
        "hub_id": entry.checkpoint,
        "hub_url": hub_url(entry.checkpoint),
        "architecture": entry.architecture,
        "cells": cells,
        "latest": [verdict_html(v.status, v.failure_class) for v in entry.verdicts],
        "history": history,
        "causes": causes,
        "backfill": report.failing_now.backfill,
    }


def own_cell(verdict: CheckpointVerdict, files: CellFiles) -> dict[str, Any]:
    """One of the page's own cells failing with a cause: what it broke with in its own words (its class, what AutoTP
    did where it broke, else its own signature), the command that runs this cell alone, and its own files."""
    return {
        "cell": verdict.cell,
        "symptom": code_spans(class_and_finding(verdict.failure_class, verdict.mechanism or verdict.cause)),
        "command": repro_command(verdict.key),
        "files": [
            (name, f"../{path}") for name, path in (("logs", files.logs), ("repro script", files.script)) if path
        ],
    }


def checkpoint_pages(report: Report) -> dict[str, str]:
    """Every real checkpoint's page, by its path relative to report.html."""
    environment = Environment(
        loader=PackageLoader("reports.outputs"), autoescape=True, undefined=StrictUndefined, finalize=visible_html
    )
    template = environment.get_template("checkpoint.html.j2")
    return {
        checkpoint_page(entry.checkpoint): template.render(
            page=page_data(report, entry), report=report, report_link="../report.html"
        )
        for entry in report.checkpoints.faithful
    }

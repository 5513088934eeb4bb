"""A page per real checkpoint (the start of a public AutoTP atlas): `checkpoints/<org>--<name>.html` beside report.html,
each with the checkpoint's hub model card, its verdicts at every version set of the history (the faithful cells that
stand for it), the causes it fails with now, since when and the first bad version or PR where triage found it, and
links to the logs, repro scripts and draft issues the results folder holds. Formatting only, from the Report."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from reports.analysis import CheckpointEntry, cause_answer_text, status_text
from reports.outputs.links import checkpoint_page, hub_url, linked_html, verdict_html
from reports.outputs.model import Report


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
    shown = [cause for cause in report.failing_now.causes if set(cause.cells) & set(cells)]
    statuses = linked_html(lambda link: [status_text(cause, link) for cause in shown], depth=1)
    answers = linked_html(lambda link: [cause_answer_text(cause, report, link) for cause in shown], depth=1)
    causes = [
        {
            "cause": cause,
            "status": status,
            "answer": answer,
            "cells": [cell for cell in cause.cells if cell in cells],
            "files": [
                (name, f"../{path}")
                for name, path in (
                    ("draft issue", cause.draft),
                    ("logs", cause.repro.logs if cause.repro.cell in cells else ""),
                    ("repro script", cause.repro.script if cause.repro.cell in cells else ""),
                )
                if path
            ],
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


def checkpoint_pages(report: Report) -> dict[str, str]:
    """Every real checkpoint's page, by its path relative to report.html."""
    environment = Environment(loader=PackageLoader("reports.outputs"), autoescape=True, undefined=StrictUndefined)
    template = environment.get_template("checkpoint.html.j2")
    return {
        checkpoint_page(entry.checkpoint): template.render(
            page=page_data(report, entry), report=report, report_link="../report.html"
        )
        for entry in report.checkpoints.faithful
    }

"""Write the report model (reports.outputs.model.build_report) as report.md, report.json (+ report-details.json),
report.html, supported-models.md (and .diff) and a step summary; formatting only.

Every output is rendered from the one Report, so all say the same thing. A reader gets one screen first —
what fails now, what changed since the previous run of each session, and the root causes of every transition
(reports.analysis.causes) with their answers — then the support matrix, then the details.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from matrix.redaction import Redactor
from reports.analysis import (
    History,
)
from reports.outputs.atlas import checkpoint_pages
from reports.outputs.docs import Drift, docs_diff, docs_names, supported_models_markdown
from reports.outputs.html import report_html
from reports.outputs.markdown import actions_run_url, report_markdown, step_summary_markdown
from reports.outputs.markdown_safety import inert
from reports.outputs.model import DETAILS_FILE, Report, split_report
from reports.outputs.staging import writing_to


def write_outputs(
    report: Report, history: History, drift: tuple[Drift, Path] | None, out_dir: Path, stage: Path
) -> list[Path]:
    """The report's files, written into `stage` (the staging folder of out_dir, reports.outputs.staging.staged, that
    the command's repro scripts and drafts are in too, so all of them move into place together); the paths they
    will have under out_dir. `drift`: the docs page's drift and the page itself (the drift names only its file)."""
    first_screen, details = split_report(report)
    outputs = {
        out_dir / "report.md": inert(report_markdown(report)),
        out_dir / "report.json": json.dumps(first_screen, indent=2, ensure_ascii=False) + "\n",
        out_dir / DETAILS_FILE: json.dumps(details, ensure_ascii=False) + "\n",
        out_dir / "report.html": report_html(report),
        **{out_dir / page: text for page, text in checkpoint_pages(report).items()},
    }
    if drift is None:
        outputs[out_dir / "supported-models.md"] = inert(supported_models_markdown(report, history))
    else:  # the families in the copy's spelling, and the diff that makes the copy say what the matrix found
        docs = drift[1]
        outputs[out_dir / "supported-models.md"] = inert(
            supported_models_markdown(report, history, docs_names(report, docs))
        )
        outputs[out_dir / "supported-models.diff"] = docs_diff(report, docs)
    redact = Redactor()  # the store redacts what it imports; this also covers stores written before it did
    for path, text in outputs.items():
        target = stage / path.relative_to(out_dir)
        target.parent.mkdir(parents=True, exist_ok=True)  # checkpoint pages have a folder of their own
        target.write_text(redact(text), encoding="utf-8")
    return list(outputs)


def append_step_summary(report: Report, out_dir: Path) -> Path:
    """The report's step summary appended to $GITHUB_STEP_SUMMARY (GitHub expects steps to append), else to
    out_dir/step-summary.md: after the other outputs are in place."""
    step_summary = Path(os.environ.get("GITHUB_STEP_SUMMARY") or out_dir / "step-summary.md")
    with writing_to(out_dir), step_summary.open("a", encoding="utf-8") as summary:
        summary.write(Redactor()(inert(step_summary_markdown(report, actions_run_url(os.environ)))))
    return step_summary

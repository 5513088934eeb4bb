"""What people read: the report's content (model) and its formats (render: md, html, json, step summary), the
supported-models page and its diff, PR comments and issues (publish), draft upstream issues, the release gate's table.

Other rooms import these names from here; modules inside the room import each other directly."""

from reports.outputs.docs import (
    check_drift,
    model_families,
    model_support,
)
from reports.outputs.draft_issue import (
    write_draft,
)
from reports.outputs.gate import (
    format_table,
)
from reports.outputs.html import (
    linked_html,
)
from reports.outputs.model import (
    build_report,
    transition_entry,
)
from reports.outputs.pr_failures import (
    cause_lines,
    classify,
    summary_line,
)
from reports.outputs.publish import (
    inert,
    publish_deltas,
)
from reports.outputs.render import (
    write_outputs,
    writing_to,
)

__all__ = [
    "build_report",
    "cause_lines",
    "check_drift",
    "classify",
    "format_table",
    "inert",
    "linked_html",
    "model_families",
    "model_support",
    "publish_deltas",
    "summary_line",
    "transition_entry",
    "write_draft",
    "write_outputs",
    "writing_to",
]

"""What people read: the report's content (model) and its formats (render: md, html, json, step summary), the
supported-models page and its diff, PR comments and issues (publish), draft upstream issues, the release gate's table.

Other rooms import these names from here; modules inside the room import each other directly."""

from reports.outputs.cell_files import (
    draft_runs,
    result_files,
    write_drafts,
    write_repro_scripts,
)
from reports.outputs.docs import (
    check_drift,
)
from reports.outputs.draft_issue import (
    write_draft,
)
from reports.outputs.gate import (
    gate_text,
)
from reports.outputs.links import (
    ATLAS_FOLDER,
    linked_html,
)
from reports.outputs.markdown_safety import (
    inert,
    visible,
    visible_html,
)
from reports.outputs.model import (
    build_report,
    transition_entry,
)
from reports.outputs.pr_check import (
    check,
    check_history,
    commit_sha,
    commits_base_text,
    run_links,
    select_commits,
)
from reports.outputs.publish import (
    MAX_ISSUES,
    publish_deltas,
)
from reports.outputs.render import (
    append_step_summary,
    write_outputs,
)
from reports.outputs.staging import (
    staged,
    writing_to,
)
from reports.outputs.support import (
    model_families,
    model_support,
)

__all__ = [
    "ATLAS_FOLDER",
    "MAX_ISSUES",
    "draft_runs",
    "result_files",
    "write_drafts",
    "write_repro_scripts",
    "build_report",
    "check",
    "check_drift",
    "check_history",
    "commit_sha",
    "commits_base_text",
    "gate_text",
    "inert",
    "linked_html",
    "model_families",
    "model_support",
    "publish_deltas",
    "run_links",
    "select_commits",
    "transition_entry",
    "write_draft",
    "write_outputs",
    "append_step_summary",
    "staged",
    "writing_to",
    "visible",
    "visible_html",
]

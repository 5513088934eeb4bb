"""The verbs of `python -m reports`, one module each (merge, rebuild, render, bisect, …), in the order `--help` lists
them. Each module's COMMAND registers its own arguments (reports/commands/interface.py)."""

from reports.commands import (
    archive_needs,
    atlas,
    bisect,
    draft_issue,
    gate,
    merge,
    publish,
    rebuild,
    render,
    since_when,
    triage,
    verify,
)
from reports.commands.interface import Command

COMMANDS: tuple[Command, ...] = tuple(
    module.COMMAND
    for module in (
        merge,
        archive_needs,
        rebuild,
        verify,
        render,
        gate,
        publish,
        draft_issue,
        bisect,
        triage,
        since_when,
        atlas,
    )
)

__all__ = ["COMMANDS", "Command"]

"""What the suites' tests share."""

from __future__ import annotations

from pathlib import Path

from matrix.cells import Cell, expand
from suites.checks.contracts import Job
from suites.checks.inputs import ProbeSpec


def live_processes_named(name: str) -> list[int]:
    """Processes whose name (Linux keeps 15 characters) is `name`, zombies left out (ended, not yet reaped)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended while listed
            continue
        comm, state = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2]
        if comm == name[:15] and state != "Z":
            live.append(int(stat.parent.name))
    return live


def never_loaded_job() -> tuple[Cell, Job]:
    """A tp 2 cell and its job whose checkpoint is never loaded: for tests whose group stops before any cell runs."""
    (cell,) = expand("llama.stress", "eager", "fp32", "2")
    job = Job(
        cell.id,
        "/never-loaded",
        None,
        cell.dtype,
        cell.variant,
        False,
        cell.model.tolerance_for(cell.dtype),
        ProbeSpec(),
    )
    return cell, job

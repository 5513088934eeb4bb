"""Bisection and triage answers as rows of the store's `bisections` and `triage_attempts` tables, and back: columns
named, records built by keyword, secrets redacted on the way in."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from matrix.json_records import read_record
from matrix.redaction import redact
from reports.store.records import Bisection, CellKey, Commit, TriageAttempt, parse_pins, pins_text

BISECTION_COLUMNS = (
    *("model", "variant", "dtype", "tp", "mode", "axis", "before", "after", "held_fixed", "failure_class"),
    *("signature", "commit_sha", "subject", "pr", "files", "untestable", "recorded_at", "suspects"),
    *("confirmed_from", "kind", "searched_older", "searched_newer"),
)
TRIAGE_COLUMNS = (
    *("model", "variant", "dtype", "tp", "axis", "mode", "before", "after", "held_fixed", "reason", "recorded_at"),
)
_CELL_COLUMNS = ("model", "variant", "dtype", "tp")


def insert_statement(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + column for column in columns)})"


def select_statement(table: str, columns: tuple[str, ...]) -> str:
    """Every row, oldest first (the order the answers were recorded in)."""
    return f"SELECT {', '.join(columns)} FROM {table} ORDER BY recorded_at, rowid"


def _cell_values(cell: CellKey) -> dict[str, Any]:
    return {"model": cell.model, "variant": cell.variant, "dtype": cell.dtype, "tp": cell.tp}


def bisection_row(bisection: Bisection) -> dict[str, Any]:
    return {
        **_cell_values(bisection.cell),
        "mode": bisection.mode,
        "axis": bisection.axis,
        "before": bisection.before,
        "after": bisection.after,
        "held_fixed": pins_text(bisection.held_fixed),
        "failure_class": bisection.failure_class,
        "signature": redact(bisection.signature),
        "commit_sha": bisection.commit,
        "subject": redact(bisection.subject),
        "pr": bisection.pr,
        "files": json.dumps(list(bisection.files)),
        "untestable": json.dumps(list(bisection.untestable)),
        "recorded_at": bisection.recorded_at,
        "suspects": json.dumps([asdict(commit) for commit in bisection.suspects]),
        "confirmed_from": bisection.confirmed_from,
        "kind": bisection.kind,
        "searched_older": bisection.searched_older,
        "searched_newer": bisection.searched_newer,
    }


def bisection_from_row(row: tuple[Any, ...]) -> Bisection:
    """A row selected with BISECTION_COLUMNS."""
    values = dict(zip(BISECTION_COLUMNS, row))
    return Bisection(
        cell=CellKey(*(values[column] for column in _CELL_COLUMNS)),
        mode=values["mode"],
        axis=values["axis"],
        before=values["before"],
        after=values["after"],
        held_fixed=parse_pins(values["held_fixed"]),
        failure_class=values["failure_class"],
        signature=values["signature"],
        commit=values["commit_sha"],
        subject=values["subject"],
        pr=values["pr"],
        files=tuple(json.loads(values["files"])),
        untestable=tuple(json.loads(values["untestable"])),
        recorded_at=values["recorded_at"],
        suspects=tuple(read_record(Commit, fields) for fields in json.loads(values["suspects"])),
        confirmed_from=values["confirmed_from"],
        kind=values["kind"],
        searched_older=values["searched_older"],
        searched_newer=values["searched_newer"],
    )


def triage_row(attempt: TriageAttempt) -> dict[str, Any]:
    return {
        **_cell_values(attempt.cell),
        "axis": attempt.axis,
        "mode": attempt.mode,
        "before": attempt.before,
        "after": attempt.after,
        "held_fixed": pins_text(attempt.held_fixed),
        "reason": redact(attempt.reason),
        "recorded_at": attempt.recorded_at,
    }


def triage_from_row(row: tuple[Any, ...]) -> TriageAttempt:
    """A row selected with TRIAGE_COLUMNS."""
    values = dict(zip(TRIAGE_COLUMNS, row))
    return TriageAttempt(
        cell=CellKey(*(values[column] for column in _CELL_COLUMNS)),
        axis=values["axis"],
        mode=values["mode"],
        before=values["before"],
        after=values["after"],
        held_fixed=parse_pins(values["held_fixed"]),
        reason=values["reason"],
        recorded_at=values["recorded_at"],
    )

"""A run as a row of the history store and back, and what a SQLite error means for the store's file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from matrix.json_records import read_record, write_record
from reports.store.ids import Cells, Texts
from reports.store.records import CellKey, CellResult, Mechanism, Run, Versions
from reports.store.schema import LOCK_TIMEOUT_S, RUN_FIELDS, SCHEMA_VERSION, VERSION_FIELDS, Row
from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import AutoTPRecord, BreakPoint


def run_row(run: Run) -> Row:
    return (*(getattr(run, f) for f in RUN_FIELDS), *(getattr(run.versions, f) for f in VERSION_FIELDS))


def run_from_row(row: Row, shared: dict[Versions, Versions] | None = None) -> Run:
    """The run of a row; with `shared`, runs at the same version set share one Versions object: the analysis looks
    points up by (cell, versions) hundreds of thousands of times at a year, and a dict compares a key that is the
    same object without calling the dataclass's __eq__."""
    run_id, *values = row
    fields = dict(zip(RUN_FIELDS + VERSION_FIELDS, values))
    versions = Versions(**{f: fields[f] for f in VERSION_FIELDS})
    if shared is not None:
        versions = shared.setdefault(versions, versions)
    return Run(
        run_id=run_id, **{**{f: fields[f] for f in RUN_FIELDS}, "trusted": bool(fields["trusted"])}, versions=versions
    )


def stored_verdicts(conn: sqlite3.Connection, run_key: int) -> dict[CellKey, tuple[str, str]]:
    """Each cell's outcome and failure class as a stored run holds them."""
    return {
        CellKey(*key): (outcome, failure_class)
        for *key, outcome, failure_class in conn.execute(
            "SELECT c.model, c.variant, c.dtype, c.tp, r.outcome, r.failure_class FROM results r "
            "JOIN cells c ON c.id = r.cell WHERE r.run = ?",
            (run_key,),
        )
    }


def changed_verdicts(results: list[CellResult], verdicts: dict[CellKey, tuple[str, str]]) -> list[str]:
    """The results whose cell the store holds with another verdict, one line each."""
    return [
        f"{result.cell.id} stored {'/'.join(filter(None, verdicts[result.cell]))}, "
        f"now {'/'.join(filter(None, (result.outcome, result.failure_class)))}"
        for result in results
        if verdicts.get(result.cell, (result.outcome, result.failure_class)) != (result.outcome, result.failure_class)
    ]


def result_rows(
    run_key: int, results: list[CellResult], verdicts: dict[CellKey, tuple[str, str]], texts: Texts, cells: Cells
) -> tuple[list[Row], list[Row], list[Row]]:
    """The rows of `results`, checkpoints and cell_causes for the results whose cell the run does not hold yet
    (`verdicts`, updated as they are added); each distinct text stored once."""
    rows, checkpoint_rows, cause_rows = [], [], []
    for result in results:
        if result.cell in verdicts:
            continue
        if result.checkpoints:
            checkpoint_rows.append((run_key, cells.id(result.cell), json.dumps(list(result.checkpoints))))
        if result.cause:
            cause_rows.append((run_key, cells.id(result.cell), *mechanism_ids(texts, result)))
        rows.append(
            (
                run_key,
                cells.id(result.cell),
                result.outcome,
                result.failure_class,
                texts.id(result.signature),
                texts.id(result.message),
                json.dumps(result.metrics, sort_keys=True),
            )
        )
        verdicts[result.cell] = (result.outcome, result.failure_class)
    return rows, checkpoint_rows, cause_rows


def mechanism_ids(texts: Texts, result: CellResult) -> tuple[int, int | None, int | None]:
    """The text ids of a failure's cause, break point and AutoTP record (redacted at the door, as every text of a
    record), each stored as JSON (a row of `cell_causes`)."""
    cause, broke_at, autotp = result.cause, result.broke_at, result.autotp
    assert cause is not None
    return (
        texts.id(json.dumps(write_record(cause), sort_keys=True)),
        texts.id(json.dumps(write_record(broke_at), sort_keys=True)) if broke_at else None,
        texts.id(json.dumps(write_record(autotp), sort_keys=True)) if autotp else None,
    )


def mechanism_fields(cause: str, broke_at: str, autotp: str) -> Mechanism:
    """CellResult's cause, broke_at and autotp from their stored JSON ("" where none was stored)."""
    return Mechanism(
        cause=read_record(Cause, json.loads(cause)),
        broke_at=read_record(BreakPoint, json.loads(broke_at)) if broke_at else None,
        autotp=read_record(AutoTPRecord, json.loads(autotp)) if autotp else None,
    )


def explain(path: Path, error: sqlite3.Error) -> str:
    """What a SQLite error means for the store at `path`, and what to do about it."""
    text = str(error)
    if any(words in text for words in ("malformed", "not a database", "encrypted", "disk I/O error")):
        return (
            f"{path}: the history store is damaged or not SQLite ({text}); restore it from a backup, or move it "
            "aside and re-import the JUnit files with `python -m reports merge`"
        )
    if any(words in text for words in ("no such table", "no such column", "has no column", "values for")):
        return (
            f"{path}: marked as an autotp-matrix history store, but its tables are not those of schema "
            f"{SCHEMA_VERSION} ({text}); it was written by something else: pass another --store, or move it "
            "aside and re-import the JUnit files with `python -m reports merge`"
        )
    if "readonly" in text:
        return f"{path}: cannot write the history store ({text}); make the file and its folder writable"
    if "locked" in text or "busy" in text:
        return (
            f"{path}: another process kept the history store locked for over {LOCK_TIMEOUT_S} s ({text}); "
            "let it finish and run this again"
        )
    if "unable to open" in text:
        return f"{path}: cannot open the history store ({text}); --store must be a file in an existing, readable folder"
    return f"{path}: SQLite error on the history store ({text})"

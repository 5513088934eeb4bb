"""The results of `nox -s remedy` (matrix/remedies.py `RemedyResult`) as rows of the store's `remedy_results` table,
and back: each result once, as its canonical JSON, so merging a file again adds nothing."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from matrix.json_records import read_record, write_record
from matrix.remedies import RemedyResult


def canonical(result: RemedyResult) -> str:
    """A result's JSON with sorted keys: equal results, equal texts (what makes storing and archiving idempotent)."""
    return json.dumps(write_record(result), sort_keys=True)


def insert_results(conn: sqlite3.Connection, results: Iterable[RemedyResult]) -> int:
    """Store the results not stored yet; how many were new."""
    before = conn.total_changes
    conn.executemany(
        "INSERT OR IGNORE INTO remedy_results (remedy, recorded_at, record) VALUES (?, ?, ?)",
        [(result.remedy, result.taken_at.recorded_at, canonical(result)) for result in results],
    )
    return conn.total_changes - before


def newest_results(conn: sqlite3.Connection) -> list[RemedyResult]:
    """The newest result of each remedy (by when its runs were taken, then by when it was merged), by remedy name:
    a remedy verified at one release and not at a later one proves nothing at the later one."""
    newest: dict[str, RemedyResult] = {}
    for (record,) in conn.execute("SELECT record FROM remedy_results ORDER BY remedy, recorded_at, rowid"):
        result = read_record(RemedyResult, json.loads(record))
        newest[result.remedy] = result
    return list(newest.values())

"""The history store's tables: the first schema, every migration that brings an older store to SCHEMA_VERSION (a new
store takes the same ones, so the two never differ), and the aggregates that import keeps up to date."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from reports import ReportsError
from reports.store.ids import Texts, inserted_id
from reports.store.records import AXES, deepspeed_git_of

Row = tuple[Any, ...]
"""A row as sqlite3 reads or writes it: its stubs type every value Any (a column's SQLite type is the value's own)."""

# 2 added the bisections table; 3 the runs' harness_git and cleaned deepspeed_git; 4 triage: suspects and
# confirmations in bisections, and the triage_attempts table; 5 the transition kind an answer is for and the
# range its search ran over (reports.analysis.history.answer_for); 6 compaction: results keyed by integer run and cell
# ids, signatures and messages stored once each in `texts`, detail dropped from old results (HistoryStore.compact).
# 7 the hub ids each faithful cell stands for (cell_checkpoints, a table of its own: most results have none).
# 8 the report's aggregates kept up to date by import (result_groups, point_metrics, points; HistoryStore.aggregates).
# 9 which runs are trusted (a pull request's are not: never a baseline, never archived) and the hash of each archive
# entry the store was built from (`python -m reports verify` compares them).
# 10 each failure's cause, break point and AutoTP record (cell_causes), and each result group's cause.
# 11 the outcome `unsupported` (DeepSpeed refuses what the cell asks for here: suites.verdicts.outcome.Outcome) in
#    results.
# 12 the results of `nox -s remedy` (remedy_results): the proofs a report states, kept with the history.
# A new store is schema 1 brought up by the same migrations an old one takes, so the two can never differ.
SCHEMA_VERSION = 12
# Marks the file as ours (PRAGMA application_id), so an unrelated SQLite file is never misread.
APPLICATION_ID = 0x41545058  # "ATPX"
DEFAULT_STORE = Path("results/history.sqlite")
LOCK_TIMEOUT_S = 120

FIRST_SCHEMA = (
    """
CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,
    session       TEXT NOT NULL,
    host          TEXT NOT NULL,
    started       TEXT NOT NULL,
    accelerator   TEXT NOT NULL,
    backend       TEXT NOT NULL,
    deepspeed     TEXT NOT NULL,
    deepspeed_git TEXT NOT NULL,
    transformers  TEXT NOT NULL,
    torch         TEXT NOT NULL,
    python        TEXT NOT NULL,
    imported_from TEXT NOT NULL,
    imported_at   TEXT NOT NULL
)""",
    """
CREATE TABLE results (
    run_id        TEXT NOT NULL REFERENCES runs(run_id),
    model         TEXT NOT NULL,
    variant       TEXT NOT NULL,
    dtype         TEXT NOT NULL,
    tp            INTEGER NOT NULL,
    outcome       TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'skip')),
    failure_class TEXT NOT NULL,
    signature     TEXT NOT NULL,
    message       TEXT NOT NULL,
    metrics       TEXT NOT NULL,  -- JSON object name -> float
    PRIMARY KEY (run_id, model, variant, dtype, tp)
)""",
)
# Schema 2: answers of `python -m reports bisect`, one row per bisection (re-running one adds a row).
_BISECTIONS = """
CREATE TABLE bisections (
    model         TEXT NOT NULL,
    variant       TEXT NOT NULL,
    dtype         TEXT NOT NULL,
    tp            INTEGER NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ('broken', 'fixed')),
    axis          TEXT NOT NULL,
    before        TEXT NOT NULL,
    after         TEXT NOT NULL,
    held_fixed    TEXT NOT NULL,
    failure_class TEXT NOT NULL,
    signature     TEXT NOT NULL,
    commit_sha    TEXT NOT NULL,
    subject       TEXT NOT NULL,
    pr            INTEGER,
    files         TEXT NOT NULL,  -- JSON list
    untestable    TEXT NOT NULL,  -- JSON list
    recorded_at   TEXT NOT NULL
)"""
# Schema 3: the commit of the harness that recorded each run.
_HARNESS_GIT = "ALTER TABLE runs ADD COLUMN harness_git TEXT NOT NULL DEFAULT ''"


def _clean_deepspeed_git(conn: sqlite3.Connection) -> None:
    """Schema 3: drop the harness's own commit from deepspeed_git, by the rule import applies to incoming
    old JUnit files (model.deepspeed_git_of): runs stored before schema 3 have no harness_git, so a
    deepspeed_git is kept only where the DeepSpeed version has a PEP 440 local segment (a source build
    from git, e.g. 0.18.1+abc1234); a release install never carried a real commit."""
    rows = conn.execute("SELECT run_id, deepspeed, deepspeed_git FROM runs WHERE deepspeed_git != ''")
    for run_id, deepspeed, deepspeed_git in rows.fetchall():
        cleaned = deepspeed_git_of(deepspeed, deepspeed_git, harness_git=None)
        if cleaned != deepspeed_git:
            conn.execute("UPDATE runs SET deepspeed_git = ? WHERE run_id = ?", (cleaned, run_id))


# Schema 4: what triage adds to an answer, and the questions it could not answer.
_TRIAGE = (
    "ALTER TABLE bisections ADD COLUMN suspects TEXT NOT NULL DEFAULT '[]'",  # JSON list of commits
    "ALTER TABLE bisections ADD COLUMN confirmed_from TEXT NOT NULL DEFAULT ''",
    """
CREATE TABLE triage_attempts (
    model         TEXT NOT NULL,
    variant       TEXT NOT NULL,
    dtype         TEXT NOT NULL,
    tp            INTEGER NOT NULL,
    axis          TEXT NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ('broken', 'fixed')),
    before        TEXT NOT NULL,
    after         TEXT NOT NULL,
    held_fixed    TEXT NOT NULL,
    reason        TEXT NOT NULL,
    recorded_at   TEXT NOT NULL
)""",
)

# Schema 5: which transition an answer is for, so it attaches only where it was proven ('' in older rows).
_ANSWER_SCOPE = (
    "ALTER TABLE bisections ADD COLUMN kind TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE bisections ADD COLUMN searched_older TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE bisections ADD COLUMN searched_newer TEXT NOT NULL DEFAULT ''",
)

# Schema 6: a store that stays small. Runs and cells get integer ids (a result row is two small integers, not a run id
# and a cell spelled out, twice with its primary key index); each distinct signature or message is one row of
# `texts` (found by a 64-bit hash of it) that results refer to; `message` and `metrics` are NULL once compacted.
_COMPACT_TABLES = (
    "CREATE TABLE texts (id INTEGER PRIMARY KEY, hash INTEGER NOT NULL, text TEXT NOT NULL)",
    "CREATE INDEX texts_by_hash ON texts (hash)",
    """
CREATE TABLE cells (
    id            INTEGER PRIMARY KEY,
    model         TEXT NOT NULL,
    variant       TEXT NOT NULL,
    dtype         TEXT NOT NULL,
    tp            INTEGER NOT NULL,
    UNIQUE (model, variant, dtype, tp)
)""",
    """
CREATE TABLE compacted_runs (
    id            INTEGER PRIMARY KEY,
    run_id        TEXT NOT NULL UNIQUE,
    session       TEXT NOT NULL,
    host          TEXT NOT NULL,
    started       TEXT NOT NULL,
    accelerator   TEXT NOT NULL,
    backend       TEXT NOT NULL,
    deepspeed     TEXT NOT NULL,
    deepspeed_git TEXT NOT NULL,
    transformers  TEXT NOT NULL,
    torch         TEXT NOT NULL,
    python        TEXT NOT NULL,
    imported_from TEXT NOT NULL,
    imported_at   TEXT NOT NULL,
    harness_git   TEXT NOT NULL DEFAULT ''
)""",
    """
CREATE TABLE compacted_results (
    run           INTEGER NOT NULL REFERENCES runs(id),
    cell          INTEGER NOT NULL REFERENCES cells(id),
    outcome       TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'skip')),
    failure_class TEXT NOT NULL,
    signature     INTEGER NOT NULL REFERENCES texts(id),
    message       INTEGER REFERENCES texts(id),  -- NULL once compacted
    metrics       TEXT,  -- JSON object name -> float; NULL once compacted
    PRIMARY KEY (run, cell)
) WITHOUT ROWID""",
    # How many results the last compaction saw, and how many recent runs it kept: compact() does nothing while
    # neither changed; and how many results lost their detail since the store was last rewritten (VACUUM).
    "CREATE TABLE compaction (results INTEGER NOT NULL, keep_runs INTEGER NOT NULL, since_vacuum INTEGER NOT NULL)",
    "INSERT INTO compaction VALUES (0, 0, 0)",
)


def _into_compact_tables(conn: sqlite3.Connection) -> None:
    """Schema 6: copy runs and results into the new tables (runs numbered in start order), then swap them in. The
    columns are those both tables have, not today's: a later step may add a column (a new version axis)."""
    kept = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    columns = ", ".join(row[1] for row in conn.execute("PRAGMA table_info(compacted_runs)") if row[1] in kept)
    conn.execute(f"INSERT INTO compacted_runs ({columns}) SELECT {columns} FROM runs ORDER BY started, run_id")
    conn.execute(
        "INSERT INTO cells (model, variant, dtype, tp) SELECT DISTINCT model, variant, dtype, tp FROM results "
        "ORDER BY model, variant, dtype, tp"
    )
    run_ids = dict(conn.execute("SELECT run_id, id FROM compacted_runs"))
    cell_ids = {tuple(key): cell for cell, *key in conn.execute("SELECT id, model, variant, dtype, tp FROM cells")}
    texts = Texts(conn)
    rows = conn.execute(
        "SELECT run_id, model, variant, dtype, tp, outcome, failure_class, signature, message, metrics FROM results"
    ).fetchall()
    conn.executemany(
        "INSERT INTO compacted_results VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            (
                run_ids[run_id],
                cell_ids[model, variant, dtype, tp],
                outcome,
                failure_class,
                texts.id(signature),
                texts.id(message),
                metrics,
            )
            for run_id, model, variant, dtype, tp, outcome, failure_class, signature, message, metrics in rows
        ),
    )
    for statement in (
        "DROP TABLE results",
        "DROP TABLE runs",
        "ALTER TABLE compacted_runs RENAME TO runs",
        "ALTER TABLE compacted_results RENAME TO results",
    ):
        conn.execute(statement)


# Schema 7: the real checkpoints (hub ids) a faithful cell's verdict stands for (matrix.shapes.faithful_groups).
_CELL_CHECKPOINTS = """
CREATE TABLE cell_checkpoints (
    run           INTEGER NOT NULL REFERENCES runs(id),
    cell          INTEGER NOT NULL REFERENCES cells(id),
    checkpoints   TEXT NOT NULL,  -- JSON list of hub ids
    PRIMARY KEY (run, cell)
) WITHOUT ROWID"""

# Schema 8: what the report reads, kept by import so that render reads ~75 k groups instead of grouping every result
# (reports.store.aggregates). A point is a version set with harness commit (`points`, keyed by those columns as JSON); a
# group is the results of one cell at one point with one outcome, failure class and signature: how many, and three
# of their runs — the smallest run id (store order), the earliest and the newest by (start, run id). Results are
# never deleted and compaction keeps verdict and signature, so a group only changes when a result is added.
# point_metrics: each cell × point's newest result with metrics (compaction keeps that result's metrics).
_AGGREGATE_TABLES = (
    "CREATE TABLE points (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE)",
    """
CREATE TABLE result_groups (
    cell          INTEGER NOT NULL REFERENCES cells(id),
    point         INTEGER NOT NULL REFERENCES points(id),
    outcome       TEXT NOT NULL,
    failure_class TEXT NOT NULL,
    signature     INTEGER NOT NULL REFERENCES texts(id),
    count         INTEGER NOT NULL,
    first_listed  INTEGER NOT NULL REFERENCES runs(id),
    earliest      INTEGER NOT NULL REFERENCES runs(id),
    newest        INTEGER NOT NULL REFERENCES runs(id),
    PRIMARY KEY (cell, point, outcome, failure_class, signature)
) WITHOUT ROWID""",
    """
CREATE TABLE point_metrics (
    cell          INTEGER NOT NULL REFERENCES cells(id),
    point         INTEGER NOT NULL REFERENCES points(id),
    run           INTEGER NOT NULL REFERENCES runs(id),
    PRIMARY KEY (cell, point)
) WITHOUT ROWID""",
)
# One result added to its group: (cell, point, outcome, failure class, signature, run). A run's (start, run id) is
# compared as a row value, as reports.store.aggregates.started_order orders runs.
_ADD_TO_GROUP = """
INSERT INTO result_groups (cell, point, outcome, failure_class, signature, count, first_listed, earliest, newest)
VALUES (:cell, :point, :outcome, :failure_class, :signature, 1, :run, :run, :run)
ON CONFLICT (cell, point, outcome, failure_class, signature) DO UPDATE SET
    count = count + 1,
    first_listed = CASE WHEN (SELECT run_id FROM runs WHERE id = excluded.first_listed)
                           < (SELECT run_id FROM runs WHERE id = first_listed) THEN excluded.first_listed
                        ELSE first_listed END,
    earliest = CASE WHEN (SELECT started, run_id FROM runs WHERE id = excluded.earliest)
                       < (SELECT started, run_id FROM runs WHERE id = earliest) THEN excluded.earliest
                    ELSE earliest END,
    newest = CASE WHEN (SELECT started, run_id FROM runs WHERE id = excluded.newest)
                     > (SELECT started, run_id FROM runs WHERE id = newest) THEN excluded.newest
                  ELSE newest END"""
# A result with metrics: the newer of it and the point's known one (started later; started together: the smaller run
# id, as reports.store.aggregates.newer_metrics decides).
_ADD_METRICS = """
INSERT INTO point_metrics VALUES (:cell, :point, :run)
ON CONFLICT (cell, point) DO UPDATE SET run = excluded.run
WHERE ((SELECT started FROM runs WHERE id = excluded.run), (SELECT run_id FROM runs WHERE id = point_metrics.run))
    > ((SELECT started FROM runs WHERE id = point_metrics.run), (SELECT run_id FROM runs WHERE id = excluded.run))"""


# Schema 10: a failure's cause, where it broke and what AutoTP did (suites/verdicts/mechanism.py), as JSON each stored
# once in `texts` (a night's failures repeat a few), in a table of their own (passes have none); and the cause of each
# result group's newest result, which the report groups failures by. Results stored before have none: they group by
# their signature (reports.analysis.signatures.failure_key).
_CELL_CAUSES = (
    """
CREATE TABLE cell_causes (
    run           INTEGER NOT NULL REFERENCES runs(id),
    cell          INTEGER NOT NULL REFERENCES cells(id),
    cause         INTEGER NOT NULL REFERENCES texts(id),
    broke_at      INTEGER REFERENCES texts(id),
    autotp        INTEGER REFERENCES texts(id),
    PRIMARY KEY (run, cell)
) WITHOUT ROWID""",
    "ALTER TABLE result_groups ADD COLUMN cause INTEGER REFERENCES texts(id)",
)
# A group's cause: its newest result's (set after the result joined the group, so the group's newest is known).
_SET_GROUP_CAUSE = """
UPDATE result_groups SET cause = :cause
WHERE cell = :cell AND point = :point AND outcome = :outcome AND failure_class = :failure_class
    AND signature = :signature AND newest = :run"""


def point_key(row: Row) -> str:
    """A point's key in `points`: its version columns and harness commit (POINT_COLUMNS's order), as JSON."""
    return json.dumps(list(row))


class Points:
    """A point's id in `points`, added the first time it is seen."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._ids = dict(conn.execute("SELECT key, id FROM points"))

    def id(self, key: str) -> int:
        known = self._ids.get(key)
        if known is None:
            known = self._ids[key] = inserted_id(self._conn.execute("INSERT INTO points (key) VALUES (?)", (key,)))
        return known


def add_to_aggregates(conn: sqlite3.Connection, rows: list[tuple[int, int, str, str, int, bool]], point: int) -> None:
    """Add results of one run, (run, cell, outcome, failure class, signature id, has metrics), to the aggregates."""
    conn.executemany(
        _ADD_TO_GROUP,
        (
            {
                "cell": cell,
                "point": point,
                "outcome": outcome,
                "failure_class": failure_class,
                "signature": sig,
                "run": run,
            }
            for run, cell, outcome, failure_class, sig, _ in rows
        ),
    )
    conn.executemany(
        _ADD_METRICS, ({"cell": cell, "point": point, "run": run} for run, cell, *_, measured in rows if measured)
    )


def set_group_causes(conn: sqlite3.Connection, rows: list[tuple[int, int, str, str, int, int]], point: int) -> None:
    """Give the groups of one run's failures, (run, cell, outcome, failure class, signature id, cause id), the cause
    of the results that are their newest."""
    conn.executemany(
        _SET_GROUP_CAUSE,
        (
            {
                "cell": cell,
                "point": point,
                "outcome": outcome,
                "failure_class": failure_class,
                "signature": sig,
                "run": run,
                "cause": cause,
            }
            for run, cell, outcome, failure_class, sig, cause in rows
        ),
    )


SCHEMA_8_POINT_COLUMNS = "deepspeed, transformers, torch, deepspeed_git, harness_git"
"""A point's columns when schema 8 came: its migration reads these, not today's POINT_COLUMNS — a later step may add
a column (a new version axis; that step also extends the stored points' keys with its value)."""


def _fill_aggregates(conn: sqlite3.Connection) -> None:
    """Schema 8: the aggregates of the results already stored, added run by run as import adds them."""
    points = Points(conn)
    for run, *point in conn.execute(f"SELECT id, {SCHEMA_8_POINT_COLUMNS} FROM runs ORDER BY id").fetchall():
        rows = conn.execute(
            "SELECT run, cell, outcome, failure_class, signature, metrics IS NOT NULL AND metrics NOT IN ('{}', '') "
            "FROM results WHERE run = ?",
            (run,),
        ).fetchall()
        add_to_aggregates(conn, rows, points.id(point_key(tuple(point))))


# Schema 9: runs merged from a pull request's results are untrusted (every run before was merged from the history's
# own runs); the archive entries whose records the store holds, by their path in the archive, with their SHA-256.
_TRUST = (
    "ALTER TABLE runs ADD COLUMN trusted INTEGER NOT NULL DEFAULT 1",
    "CREATE TABLE archive_entries (name TEXT PRIMARY KEY, sha256 TEXT NOT NULL) WITHOUT ROWID",
)


# Schema 11: results take the outcome `unsupported`. SQLite cannot change a CHECK in place: the table is rebuilt with
# the columns and keys of schema 6's, its rows copied in order.
_RESULTS_WITH_UNSUPPORTED = """
CREATE TABLE results_with_unsupported (
    run           INTEGER NOT NULL REFERENCES runs(id),
    cell          INTEGER NOT NULL REFERENCES cells(id),
    outcome       TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'skip', 'unsupported')),
    failure_class TEXT NOT NULL,
    signature     INTEGER NOT NULL REFERENCES texts(id),
    message       INTEGER REFERENCES texts(id),  -- NULL once compacted
    metrics       TEXT,  -- JSON object name -> float; NULL once compacted
    PRIMARY KEY (run, cell)
) WITHOUT ROWID"""
_UNSUPPORTED_OUTCOME = (
    _RESULTS_WITH_UNSUPPORTED,
    "INSERT INTO results_with_unsupported (run, cell, outcome, failure_class, signature, message, metrics) "
    "SELECT run, cell, outcome, failure_class, signature, message, metrics FROM results ORDER BY run, cell",
    "DROP TABLE results",
    "ALTER TABLE results_with_unsupported RENAME TO results",
)


# Schema 12: each RemedyResult merged, as its canonical JSON (matrix.json_records write_record), once; the remedy's
# name and when its runs were taken beside it, for the newest of each remedy.
_REMEDY_RESULTS = (
    "CREATE TABLE remedy_results (remedy TEXT NOT NULL, recorded_at TEXT NOT NULL, record TEXT NOT NULL UNIQUE)",
)


# from version -> steps (SQL statements, or functions of the connection) that bring it to version + 1
_MIGRATIONS = {
    1: (_BISECTIONS,),
    2: (_HARNESS_GIT, _clean_deepspeed_git),
    3: _TRIAGE,
    4: _ANSWER_SCOPE,
    5: (*_COMPACT_TABLES, _into_compact_tables),
    6: (_CELL_CHECKPOINTS,),
    7: (*_AGGREGATE_TABLES, _fill_aggregates),
    8: _TRUST,
    9: _CELL_CAUSES,
    10: _UNSUPPORTED_OUTCOME,
    11: _REMEDY_RESULTS,
}


def migrate(conn: sqlite3.Connection, version: int) -> None:
    for step in range(version, SCHEMA_VERSION):
        for statement in _MIGRATIONS[step]:
            if callable(statement):
                statement(conn)
            else:
                conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


RUN_FIELDS = ("session", "host", "started", "accelerator", "backend", "harness_git", "trusted")
VERSION_FIELDS = (*AXES, "deepspeed_git")
"""The runs table's version columns: one per axis (matrix/versions.py, and python), and DeepSpeed's commit."""

POINT_COLUMNS = ", ".join((*VERSION_FIELDS, "harness_git"))
"""A point's columns: its version set with the harness commit (with the cell, what a result group and compaction key
on)."""


def store_identity(conn: sqlite3.Connection) -> tuple[int, int, bool]:
    """application_id, user_version, and whether the file has any table."""
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    return application_id, version, conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] > 0


def check_version(path: Path, application_id: int, version: int) -> None:
    """Raises ReportsError unless the file at `path` is a history store of a schema this code can read or migrate."""
    if application_id != APPLICATION_ID:
        raise ReportsError(
            f"{path}: this SQLite file is not an autotp-matrix history store; pass a different --store path"
        )
    if version > SCHEMA_VERSION:
        raise ReportsError(
            f"{path}: store schema version {version} is newer than this tool understands "
            f"({SCHEMA_VERSION}); update the reports package before reading it"
        )
    if version < 1:
        # Schema 1 is the first released schema, so there is no migration path from older ones.
        raise ReportsError(
            f"{path}: store schema version {version} predates version 1 and cannot "
            "be migrated; move it aside and re-import the JUnit files with `python -m reports merge`"
        )

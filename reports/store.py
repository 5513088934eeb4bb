"""Append-only SQLite history of runs and cell results.

Every write happens in a `BEGIN IMMEDIATE` transaction, so concurrent importers into the
same file serialise on SQLite's lock instead of interleaving half-written runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Collection
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from matrix.redaction import Redactor, redact
from reports import ReportsError
from reports.aggregates import Aggregates, PointMetrics, ResultGroup, recent_runs
from reports.records import (
    AXES,
    Bisection,
    CellKey,
    CellResult,
    Commit,
    Observation,
    Run,
    TriageAttempt,
    Versions,
    deepspeed_git_of,
    parse_pins,
    pins_text,
)

# 2 added the bisections table; 3 the runs' harness_git and cleaned deepspeed_git; 4 triage: suspects and
# confirmations in bisections, and the triage_attempts table; 5 the transition kind an answer is for and the
# range its search ran over (reports.history.answer_for); 6 compaction: results keyed by integer run and cell
# ids, signatures and messages stored once each in `texts`, detail dropped from old results (HistoryStore.compact).
# 7 the hub ids each faithful cell stands for (cell_checkpoints, a table of its own: most results have none).
# 8 the report's aggregates kept up to date by import (result_groups, point_metrics, points; HistoryStore.aggregates).
# A new store is schema 1 brought up by the same migrations an old one takes, so the two can never differ.
SCHEMA_VERSION = 8
# Marks the file as ours (PRAGMA application_id), so an unrelated SQLite file is never misread.
APPLICATION_ID = 0x41545058  # "ATPX"
DEFAULT_STORE = Path("results/history.sqlite")
LOCK_TIMEOUT_S = 120

_SCHEMA = (
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
# Schema 2: answers of `python -m reports.bisect`, one row per bisection (re-running one adds a row).
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
    texts = _Texts(conn)
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
# (reports.aggregates). A point is a version set with harness commit (`points`, keyed by those columns as JSON); a
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
# compared as a row value, as reports.aggregates.started_order orders runs.
_ADD_TO_GROUP = """
INSERT INTO result_groups VALUES (:cell, :point, :outcome, :failure_class, :signature, 1, :run, :run, :run)
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
# id, as reports.aggregates.newer_metrics decides).
_ADD_METRICS = """
INSERT INTO point_metrics VALUES (:cell, :point, :run)
ON CONFLICT (cell, point) DO UPDATE SET run = excluded.run
WHERE ((SELECT started FROM runs WHERE id = excluded.run), (SELECT run_id FROM runs WHERE id = point_metrics.run))
    > ((SELECT started FROM runs WHERE id = point_metrics.run), (SELECT run_id FROM runs WHERE id = excluded.run))"""


def _point_key(row: tuple) -> str:
    """A point's key in `points`: its version columns and harness commit (_POINT's order), as JSON."""
    return json.dumps(list(row))


class _Points:
    """A point's id in `points`, added the first time it is seen."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._ids = dict(conn.execute("SELECT key, id FROM points"))

    def id(self, key: str) -> int:
        known = self._ids.get(key)
        if known is None:
            known = self._ids[key] = _inserted_id(self._conn.execute("INSERT INTO points (key) VALUES (?)", (key,)))
        return known


def _add_to_aggregates(conn: sqlite3.Connection, rows: list[tuple[int, int, str, str, int, bool]], point: int) -> None:
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


def _fill_aggregates(conn: sqlite3.Connection) -> None:
    """Schema 8: the aggregates of the results already stored, added run by run as import adds them."""
    points = _Points(conn)
    for run, *point in conn.execute(f"SELECT id, {_POINT} FROM runs ORDER BY id").fetchall():
        rows = conn.execute(
            "SELECT run, cell, outcome, failure_class, signature, metrics IS NOT NULL AND metrics NOT IN ('{}', '') "
            "FROM results WHERE run = ?",
            (run,),
        ).fetchall()
        _add_to_aggregates(conn, rows, points.id(_point_key(tuple(point))))


# from version -> steps (SQL statements, or functions of the connection) that bring it to version + 1
_MIGRATIONS = {
    1: (_BISECTIONS,),
    2: (_HARNESS_GIT, _clean_deepspeed_git),
    3: _TRIAGE,
    4: _ANSWER_SCOPE,
    5: (*_COMPACT_TABLES, _into_compact_tables),
    6: (_CELL_CHECKPOINTS,),
    7: (*_AGGREGATE_TABLES, _fill_aggregates),
}


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    for step in range(version, SCHEMA_VERSION):
        for statement in _MIGRATIONS[step]:
            if callable(statement):
                statement(conn)
            else:
                conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


_RUN_FIELDS = ("session", "host", "started", "accelerator", "backend", "harness_git")
_VERSION_FIELDS = (*AXES, "deepspeed_git")
"""The runs table's version columns: one per axis (matrix/versions.py, and python), and DeepSpeed's commit."""


@dataclass(frozen=True)
class ImportCounts:
    new_runs: int
    new_results: int


@dataclass(frozen=True)
class CompactionCounts:
    results: int  # results whose detail was dropped
    texts: int  # texts deleted: no result refers to them any more


# Detail (message, metrics) is kept for the newest runs of each session: a month of nightlies.
KEEP_RECENT_RUNS = 30
# A result that loses its detail shrinks in place, and new results never go into the pages of old ones: the
# store is rewritten (VACUUM, seconds for a year's store) once this share of its results shrank since the last time.
VACUUM_SHARE = 0.1

# HistoryStore.compact, in integers: each run's place in time (`age` in its session, `ord` overall, and
# `measured_ord`, which orders runs started at the same time as reports.history.summarise breaks such a tie: the
# first in run id order wins) and its version set with harness commit (`point`, with the cell what
# reports.history.point_status groups; every version column, so a new axis joins it).
_POINT = ", ".join((*_VERSION_FIELDS, "harness_git"))
_COMPACTING = (
    f"""
CREATE TEMP TABLE compacting_runs AS
SELECT id,
       row_number() OVER (PARTITION BY session ORDER BY started DESC, run_id DESC) AS age,
       row_number() OVER (ORDER BY started, run_id) AS ord,
       row_number() OVER (ORDER BY started, run_id DESC) AS measured_ord,
       dense_rank() OVER (ORDER BY {_POINT}) AS point
FROM runs""",
    "CREATE UNIQUE INDEX temp.compacting_runs_id ON compacting_runs (id)",
    # each point's first and newest result, and its newest with metrics: one pass over the results
    """
CREATE TEMP TABLE compacting_ends AS
SELECT r.cell, ru.point, min(ru.ord) AS first, max(ru.ord) AS newest,
       max(CASE WHEN r.metrics NOT IN ('{}', '') THEN ru.measured_ord END) AS measured
FROM results r JOIN compacting_runs ru ON ru.id = r.run
GROUP BY r.cell, ru.point""",
    "CREATE UNIQUE INDEX temp.compacting_ends_point ON compacting_ends (cell, point)",
)
_COMPACT_RESULTS = """
UPDATE results SET message = NULL, metrics = NULL
WHERE (message IS NOT NULL OR metrics IS NOT NULL)
  AND run IN (SELECT id FROM compacting_runs WHERE age > :keep_runs)
  AND NOT EXISTS (SELECT 1 FROM compacting_runs ru JOIN compacting_ends e ON e.cell = results.cell AND e.point = ru.point
                  WHERE ru.id = results.run AND (ru.ord IN (e.first, e.newest) OR ru.measured_ord = e.measured))"""


class _Texts:
    """Signatures and messages, each distinct text one row of `texts`, looked up by a 64-bit hash of it."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._ids: dict[str, int] = {}

    def id(self, text: str) -> int:
        known = self._ids.get(text)
        if known is None:
            digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)
            row = self._conn.execute("SELECT id FROM texts WHERE hash = ? AND text = ?", (digest, text)).fetchone()
            known = (
                row[0]
                if row
                else _inserted_id(self._conn.execute("INSERT INTO texts (hash, text) VALUES (?, ?)", (digest, text)))
            )
            self._ids[text] = known
        return known


class _Cells:
    """A cell's id in `cells`, added the first time it is seen."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._ids = {
            CellKey(*key): cell for cell, *key in conn.execute("SELECT id, model, variant, dtype, tp FROM cells")
        }

    def id(self, cell: CellKey) -> int:
        known = self._ids.get(cell)
        if known is None:
            known = self._ids[cell] = _inserted_id(
                self._conn.execute(
                    "INSERT INTO cells (model, variant, dtype, tp) VALUES (?, ?, ?, ?)",
                    (cell.model, cell.variant, cell.dtype, cell.tp),
                )
            )
        return known


def _inserted_id(cursor: sqlite3.Cursor) -> int:
    """The rowid of the row an INSERT just added (sqlite3 types it optional: None before any INSERT)."""
    if cursor.lastrowid is None:
        raise RuntimeError("sqlite3 gave no rowid for an INSERT")
    return cursor.lastrowid


def _explain(path: Path, error: sqlite3.Error) -> str:
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


def _naming_the_file(method):
    """A method of HistoryStore whose SQLite errors become one line naming the file and what to do."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        with self._sqlite_errors():
            return method(self, *args, **kwargs)

    return wrapped


class StoreConflict(ReportsError):
    """A file contradicts what the store already holds for the same run id: never imported, and merge fails."""


class HistoryStore:
    """The history store at `path`. `create`: make a new store when there is none (merge). `read_only`: open it
    with SQLite's `mode=ro`, so reading commands never write (a read-only file works, a reader never waits behind
    a writer's migration); an older schema is then migrated in a copy in memory, never in the file."""

    def __init__(self, path: Path, *, create: bool, read_only: bool = False):
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise ReportsError(
                    f"{self.path}: no history store here; import results first with "
                    f"`python -m reports merge <junit files> --store {self.path}`"
                )
            self._create()
        elif self.path.is_file() and self.path.stat().st_size == 0:
            # SQLite would take an empty file for an empty database: a history truncated by a failed copy or restore
            # must not silently become a new, empty history. (A new store never has 0 bytes: see _create.)
            raise ReportsError(
                f"{self.path}: an empty file (0 bytes), not a history store; restore the store, or "
                "delete the file to start a new history with `python -m reports merge`"
            )
        with self._sqlite_errors():
            if read_only:
                uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, timeout=LOCK_TIMEOUT_S, isolation_level=None)
                self._check_read_only_schema()
            else:
                self._conn = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S, isolation_level=None)
                self._check_or_create_schema()

    def _create(self) -> None:
        """A new store appears whole: built under a temporary name beside it, then hard-linked into place, so no
        other process ever sees it as a 0-byte file; when another creator won, its store is the one opened."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".new")
            os.close(fd)
            building = Path(name)
            try:
                building.unlink()  # SQLite creates the file itself
                with self._sqlite_errors():
                    self._conn = sqlite3.connect(building, isolation_level=None)
                    self._check_or_create_schema()
                    self._conn.close()
                os.link(building, self.path)
            except FileExistsError:
                pass  # another process created it first: its store is the one opened
            finally:
                building.unlink(missing_ok=True)
        except OSError as exc:
            raise ReportsError(
                f"{self.path}: cannot create the history store ({exc.strerror}); --store must be a "
                "path in a folder that can be written"
            ) from None

    @contextmanager
    def _sqlite_errors(self):
        """Any SQLite error becomes one line naming the file and what to do."""
        try:
            yield
        except sqlite3.Error as exc:
            raise ReportsError(_explain(self.path, exc)) from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "HistoryStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _write(self):
        """One `BEGIN IMMEDIATE` transaction: committed when the block ends, rolled back when it raises."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _check_or_create_schema(self) -> None:
        conn = self._conn
        with self._write():  # two processes creating a new store must not both create tables
            application_id, version, has_tables = self._identity()
            if not has_tables and application_id == 0:
                for statement in _SCHEMA:  # not executescript(): it would commit our transaction
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                _migrate(conn, 1)
            else:
                self._check_version(application_id, version)
                _migrate(conn, version)

    def _check_read_only_schema(self) -> None:
        application_id, version, has_tables = self._identity()
        if not has_tables and application_id == 0:
            raise ReportsError(
                f"{self.path}: an empty SQLite file, not a history store; import results first with "
                f"`python -m reports merge <junit files> --store {self.path}`"
            )
        self._check_version(application_id, version)
        if version < SCHEMA_VERSION:  # migrate a copy: the file stays as it is, and may be read-only
            memory = sqlite3.connect(":memory:", isolation_level=None)
            self._conn.backup(memory)
            self._conn.close()
            self._conn = memory
            with self._write():
                _migrate(memory, version)

    def _identity(self) -> tuple[int, int, bool]:
        """application_id, user_version, and whether the file has any table."""
        conn = self._conn
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        return application_id, version, conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] > 0

    def _check_version(self, application_id: int, version: int) -> None:
        if application_id != APPLICATION_ID:
            raise ReportsError(
                f"{self.path}: this SQLite file is not an autotp-matrix history store; pass a different --store path"
            )
        if version > SCHEMA_VERSION:
            raise ReportsError(
                f"{self.path}: store schema version {version} is newer than this tool understands "
                f"({SCHEMA_VERSION}); update the reports package before reading it"
            )
        if version < 1:
            # Schema 1 is the first released schema, so there is no migration path from older ones.
            raise ReportsError(
                f"{self.path}: store schema version {version} predates version 1 and cannot "
                "be migrated; move it aside and re-import the JUnit files with `python -m reports merge`"
            )

    @_naming_the_file
    def import_runs(self, runs: list[tuple[Run, list[CellResult]]], source: Path) -> ImportCounts:
        """Add runs and results not yet stored, all or nothing; known ones are left untouched. Raises StoreConflict
        when a stored run has other provenance, or a stored cell of it another verdict (outcome, failure class):
        one run id is one run, so the file and the store cannot both be right. Messages and signatures are stored
        with their secrets redacted, each distinct text once."""
        conn = self._conn
        redact = functools.lru_cache(maxsize=4096)(Redactor())  # a night's failures repeat a few texts
        new_runs = new_results = 0
        with self._write():
            # Read the known ids under the write lock: another importer may have added them since the store opened.
            texts, cells, points = _Texts(conn), _Cells(conn), _Points(conn)
            for run, results in runs:
                stored = conn.execute(
                    f"SELECT id, {', '.join(_RUN_FIELDS + _VERSION_FIELDS)} FROM runs WHERE run_id = ?", (run.run_id,)
                ).fetchone()
                if stored is None:
                    columns = ("run_id", *_RUN_FIELDS, *_VERSION_FIELDS, "imported_from", "imported_at")
                    run_key = _inserted_id(
                        conn.execute(
                            f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                            (run.run_id, *_run_row(run), str(source), datetime.now(timezone.utc).isoformat()),
                        )
                    )
                    new_runs += 1
                    verdicts = {}
                else:
                    run_key, *provenance = stored
                    if tuple(provenance) != _run_row(run):
                        raise StoreConflict(
                            f"{source}: run {run.run_id!r} is already stored with different provenance/versions; "
                            "run ids must be unique per session — check how the file was produced"
                        )
                    verdicts = {
                        CellKey(*key): (outcome, failure_class)
                        for *key, outcome, failure_class in conn.execute(
                            "SELECT c.model, c.variant, c.dtype, c.tp, r.outcome, r.failure_class FROM results r "
                            "JOIN cells c ON c.id = r.cell WHERE r.run = ?",
                            (run_key,),
                        )
                    }
                changed = [
                    f"{result.cell.id} stored {'/'.join(filter(None, verdicts[result.cell]))}, "
                    f"now {'/'.join(filter(None, (result.outcome, result.failure_class)))}"
                    for result in results
                    if verdicts.get(result.cell, (result.outcome, result.failure_class))
                    != (result.outcome, result.failure_class)
                ]
                if changed:
                    raise StoreConflict(
                        f"{source}: run {run.run_id!r} is already stored with other verdicts for {len(changed)} "
                        f"cell(s) ({'; '.join(changed[:3])}{'; …' if len(changed) > 3 else ''}); a run id names one "
                        "run — check how the file was produced, nothing of it was imported"
                    )
                rows, checkpoint_rows = [], []
                for result in results:
                    if result.cell in verdicts:
                        continue
                    if result.checkpoints:
                        checkpoint_rows.append((run_key, cells.id(result.cell), json.dumps(list(result.checkpoints))))
                    rows.append(
                        (
                            run_key,
                            cells.id(result.cell),
                            result.outcome,
                            result.failure_class,
                            texts.id(redact(result.signature)),
                            texts.id(redact(result.message)),
                            json.dumps(result.metrics, sort_keys=True),
                        )
                    )
                    verdicts[result.cell] = (result.outcome, result.failure_class)
                conn.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                conn.executemany("INSERT INTO cell_checkpoints VALUES (?, ?, ?)", checkpoint_rows)
                point = conn.execute(f"SELECT {_POINT} FROM runs WHERE id = ?", (run_key,)).fetchone()
                _add_to_aggregates(
                    conn,
                    [(*row[:5], row[6] != "{}") for row in rows],
                    points.id(_point_key(tuple(point))),
                )
                new_results += len(rows)
        return ImportCounts(new_runs, new_results)

    @_naming_the_file
    def runs(self) -> list[Run]:
        rows = self._conn.execute(
            f"SELECT run_id, {', '.join(_RUN_FIELDS + _VERSION_FIELDS)} FROM runs ORDER BY started, run_id"
        )
        return [_run_from_row(row) for row in rows]

    @_naming_the_file
    def observations(self, run_ids: Collection[str] | None = None) -> list[Observation]:
        """Every result with its run (or only those of run_ids), ordered by run id and cell. A compacted result has
        its verdict and signature; its message is "" and its metrics {} (compact() keeps them wherever a report
        reads them)."""
        conn = self._conn
        shared: dict[Versions, Versions] = {}
        runs = {
            key: _run_from_row(row, shared)
            for key, *row in conn.execute(f"SELECT id, run_id, {', '.join(_RUN_FIELDS + _VERSION_FIELDS)} FROM runs")
        }
        if run_ids is not None:
            runs = {key: run for key, run in runs.items() if run.run_id in run_ids}
        cells = self._cells()
        checkpoints = self._checkpoints(runs)
        run_rank = {key: rank for rank, key in enumerate(sorted(runs, key=lambda key: runs[key].run_id))}
        cell_rank = {key: rank for rank, key in enumerate(sorted(cells, key=cells.__getitem__))}
        query = "SELECT run, cell, outcome, failure_class, signature, message, metrics FROM results"
        if run_ids is None:
            rows = conn.execute(query).fetchall()
        else:
            rows = [row for key in runs for row in conn.execute(f"{query} WHERE run = ?", (key,))]
        texts = self._texts({text for row in rows for text in row[4:6]} if run_ids is not None else None)
        observations = []
        for run, cell, outcome, failure_class, signature, message, metrics in sorted(
            rows, key=lambda row: (run_rank[row[0]], cell_rank[row[1]])
        ):
            result = CellResult(
                run_id=runs[run].run_id,
                cell=cells[cell],
                outcome=outcome,
                failure_class=failure_class,
                signature=texts[signature],
                message=texts[message],
                metrics=json.loads(metrics) if metrics else {},
                checkpoints=checkpoints.get((runs[run].run_id, cells[cell]), ()),
            )
            observations.append(Observation(result=result, run=runs[run]))
        return observations

    def _texts(self, ids: set[int | None] | None) -> dict[int | None, str]:
        """The texts of these ids (None: every text); the id None (a compacted message) is ""."""
        if ids is None:
            texts: dict[int | None, str] = dict(self._conn.execute("SELECT id, text FROM texts"))
        else:
            wanted = sorted(key for key in ids if key is not None)
            texts = {
                key: text
                for start in range(0, len(wanted), 500)
                for key, text in self._conn.execute(
                    f"SELECT id, text FROM texts WHERE id IN ({', '.join('?' * len(wanted[start : start + 500]))})",
                    wanted[start : start + 500],
                )
            }
        texts[None] = ""
        return texts

    def _cells(self) -> dict[int, CellKey]:
        return {
            key: CellKey(*row) for key, *row in self._conn.execute("SELECT id, model, variant, dtype, tp FROM cells")
        }

    def _checkpoints(self, runs: dict[int, Run]) -> dict[tuple[str, CellKey], tuple[str, ...]]:
        """The hub ids stored for results of these runs, by (run id, cell)."""
        cells = self._cells()
        return {
            (runs[run].run_id, cells[cell]): tuple(json.loads(names))
            for run, cell, names in self._conn.execute("SELECT run, cell, checkpoints FROM cell_checkpoints")
            if run in runs
        }

    @_naming_the_file
    def aggregates(self) -> Aggregates:
        """The per-point aggregates the report reads (reports.aggregates), as import keeps them (result_groups,
        point_metrics): no result is read but those of the two newest runs of each session."""
        conn = self._conn
        shared: dict[Versions, Versions] = {}
        runs = {
            key: _run_from_row(row, shared)
            for key, *row in conn.execute(
                f"SELECT id, run_id, {', '.join(_RUN_FIELDS + _VERSION_FIELDS)} FROM runs "
                "WHERE EXISTS (SELECT 1 FROM results WHERE results.run = runs.id)"
            )
        }
        cells = self._cells()
        signatures = self._texts({row[0] for row in conn.execute("SELECT DISTINCT signature FROM result_groups")})
        groups = []
        for cell, outcome, failure_class, signature, count, first_listed, earliest, newest in conn.execute(
            "SELECT cell, outcome, failure_class, signature, count, first_listed, earliest, newest FROM result_groups"
        ):
            point = runs[earliest]  # every run of a group is at its point
            groups.append(
                ResultGroup(
                    cells[cell],
                    point.versions,
                    point.harness_git,
                    outcome,
                    failure_class,
                    signatures[signature],
                    count,
                    runs[first_listed].run_id,
                    point,
                    runs[newest],
                )
            )
        metrics = {}
        for cell, run, text in conn.execute(
            "SELECT m.cell, m.run, r.metrics FROM point_metrics m JOIN results r ON r.run = m.run AND r.cell = m.cell "
            "WHERE r.metrics IS NOT NULL"  # compaction keeps them: only a store damaged by hand lacks them
        ):
            measured = runs[run]
            metrics[cells[cell], measured.versions, measured.harness_git] = PointMetrics(
                measured.started, measured.run_id, json.loads(text)
            )
        recent = recent_runs(list(runs.values()))
        return Aggregates(groups, metrics, self.observations(recent), self._checkpoints(runs))

    @_naming_the_file
    def compact(self, keep_runs: int = KEEP_RECENT_RUNS) -> CompactionCounts:
        """Drop the detail (message, metrics) of results no report reads it from, keeping the verdict (outcome,
        failure class) and the signature of every result. Detail stays for the newest `keep_runs` runs of each
        session, and at each point (a cell at one version set and harness commit) for its first and its newest
        result (so the last-good and first-bad runs of every transition, whichever order the versions are put in)
        and its newest result with metrics (the one the report's key metric comes from). Texts no result refers
        to any more are deleted. What a result keeps only shrinks as results are added, so compacting again after
        each merge gives what compacting once at the end would; it does nothing when no result came since the last
        time (the `compaction` table). The file is rewritten (VACUUM) once VACUUM_SHARE of the results shrank."""
        conn = self._conn
        with self._write():
            *seen, since_vacuum = conn.execute("SELECT results, keep_runs, since_vacuum FROM compaction").fetchone()
            results = conn.execute("SELECT count(*) FROM results").fetchone()[0]
            if tuple(seen) == (results, keep_runs):
                return CompactionCounts(0, 0)
            for statement in _COMPACTING:
                conn.execute(statement)
            compacted = conn.execute(_COMPACT_RESULTS, {"keep_runs": keep_runs}).rowcount
            conn.execute("DROP TABLE temp.compacting_ends")
            conn.execute("DROP TABLE temp.compacting_runs")
            dropped = conn.execute(
                "DELETE FROM texts WHERE id NOT IN (SELECT signature FROM results) "
                "AND id NOT IN (SELECT message FROM results WHERE message IS NOT NULL)"
            ).rowcount
            since_vacuum += compacted
            rewrite = since_vacuum > results * VACUUM_SHARE
            conn.execute(
                "UPDATE compaction SET results = ?, keep_runs = ?, since_vacuum = ?",
                (results, keep_runs, 0 if rewrite else since_vacuum),
            )
        if rewrite:  # outside the transaction, as SQLite requires
            conn.execute("VACUUM")
        return CompactionCounts(compacted, dropped)

    @_naming_the_file
    def add_bisection(self, bisection: Bisection) -> None:
        cell = bisection.cell
        conn = self._conn
        with self._write():
            conn.execute(
                "INSERT INTO bisections VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    cell.model,
                    cell.variant,
                    cell.dtype,
                    cell.tp,
                    bisection.mode,
                    bisection.axis,
                    bisection.before,
                    bisection.after,
                    pins_text(bisection.held_fixed),
                    bisection.failure_class,
                    redact(bisection.signature),
                    bisection.commit,
                    redact(bisection.subject),
                    bisection.pr,
                    json.dumps(list(bisection.files)),
                    json.dumps(list(bisection.untestable)),
                    bisection.recorded_at,
                    json.dumps([asdict(commit) for commit in bisection.suspects]),
                    bisection.confirmed_from,
                    bisection.kind,
                    bisection.searched_older,
                    bisection.searched_newer,
                ),
            )

    @_naming_the_file
    def bisections(self) -> list[Bisection]:
        """Every recorded bisection, oldest first."""
        rows = self._conn.execute("SELECT * FROM bisections ORDER BY recorded_at, rowid")
        return [
            Bisection(
                CellKey(model, variant, dtype, tp),
                mode,
                axis,
                before,
                after,
                parse_pins(held_fixed),
                failure_class,
                signature,
                commit,
                subject,
                pr,
                tuple(json.loads(files)),
                tuple(json.loads(untestable)),
                recorded_at,
                tuple(_commit(c) for c in json.loads(suspects)),
                confirmed_from,
                kind,
                searched_older,
                searched_newer,
            )
            for (
                model,
                variant,
                dtype,
                tp,
                mode,
                axis,
                before,
                after,
                held_fixed,
                failure_class,
                signature,
                commit,
                subject,
                pr,
                files,
                untestable,
                recorded_at,
                suspects,
                confirmed_from,
                kind,
                searched_older,
                searched_newer,
            ) in rows
        ]

    @_naming_the_file
    def add_triage_attempt(self, attempt: TriageAttempt) -> None:
        cell = attempt.cell
        conn = self._conn
        with self._write():
            conn.execute(
                "INSERT INTO triage_attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    cell.model,
                    cell.variant,
                    cell.dtype,
                    cell.tp,
                    attempt.axis,
                    attempt.mode,
                    attempt.before,
                    attempt.after,
                    pins_text(attempt.held_fixed),
                    redact(attempt.reason),
                    attempt.recorded_at,
                ),
            )

    @_naming_the_file
    def triage_attempts(self) -> list[TriageAttempt]:
        """Every unanswered triage question, oldest first."""
        rows = self._conn.execute("SELECT * FROM triage_attempts ORDER BY recorded_at, rowid")
        return [
            TriageAttempt(
                CellKey(model, variant, dtype, tp),
                axis,
                mode,
                before,
                after,
                parse_pins(held_fixed),
                reason,
                recorded_at,
            )
            for model, variant, dtype, tp, axis, mode, before, after, held_fixed, reason, recorded_at in rows
        ]


def _commit(fields: dict) -> Commit:
    return Commit(**{**fields, "files": tuple(fields.get("files", ()))})


def _run_row(run: Run) -> tuple:
    return (*(getattr(run, f) for f in _RUN_FIELDS), *(getattr(run.versions, f) for f in _VERSION_FIELDS))


def _run_from_row(row, shared: dict[Versions, Versions] | None = None) -> Run:
    """The run of a row; with `shared`, runs at the same version set share one Versions object: the analysis looks
    points up by (cell, versions) hundreds of thousands of times at a year, and a dict compares a key that is the
    same object without calling the dataclass's __eq__."""
    run_id, *values = row
    fields = dict(zip(_RUN_FIELDS + _VERSION_FIELDS, values))
    versions = Versions(**{f: fields[f] for f in _VERSION_FIELDS})
    if shared is not None:
        versions = shared.setdefault(versions, versions)
    return Run(run_id=run_id, **{f: fields[f] for f in _RUN_FIELDS}, versions=versions)

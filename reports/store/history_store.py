"""Append-only SQLite history of runs and cell results (and of `nox -s remedy`'s results: proof_rows). Every write
happens in a `BEGIN IMMEDIATE` transaction, so concurrent importers into the same file serialise on SQLite's lock
instead of interleaving half-written runs. What comes in has passed the door (reports.store.door: redacted and
validated); what goes out passes the redactor of this environment again, before any analysis masks a number: a
secret known only now (its variable set for render, not for the merge) leaves the store as `***`, never as a partly
masked remainder."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

from matrix.json_records import read_record
from matrix.remedies import RemedyResult
from reports import ReportsError
from reports.store.aggregates import Aggregates, PointMetrics, ResultGroup, recent_runs, without_remedies
from reports.store.answer_rows import (
    BISECTION_COLUMNS,
    TRIAGE_COLUMNS,
    bisection_from_row,
    bisection_row,
    insert_statement,
    select_statement,
    triage_from_row,
    triage_row,
)
from reports.store.compaction import KEEP_RECENT_RUNS, CompactionCounts, compact_results
from reports.store.door import redact_fields, redactor, source_name
from reports.store.ids import Cells, Texts, inserted_id
from reports.store.proof_rows import insert_results, newest_results
from reports.store.records import Bisection, CellKey, CellResult, Mechanism, Observation, Run, TriageAttempt, Versions
from reports.store.rows import (
    changed_verdicts,
    explain,
    mechanism_fields,
    result_rows,
    run_from_row,
    run_row,
    stored_verdicts,
)
from reports.store.schema import (
    APPLICATION_ID,
    FIRST_SCHEMA,
    LOCK_TIMEOUT_S,
    POINT_COLUMNS,
    RUN_FIELDS,
    SCHEMA_VERSION,
    VERSION_FIELDS,
    Points,
    Row,
    add_to_aggregates,
    check_version,
    migrate,
    point_key,
    set_group_causes,
    store_identity,
)
from suites.verdicts.cause import Cause


@dataclass(frozen=True)
class ImportCounts:
    new_runs: int
    new_results: int


P = ParamSpec("P")
R = TypeVar("R")


def _naming_the_file(method: Callable[Concatenate[HistoryStore, P], R]) -> Callable[Concatenate[HistoryStore, P], R]:
    """A method of HistoryStore whose SQLite errors become one line naming the file and what to do."""

    @functools.wraps(method)
    def wrapped(self: HistoryStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._sqlite_errors():
            return method(self, *args, **kwargs)

    return wrapped


class StoreConflict(ReportsError):
    """A file contradicts what the store already holds for the same run id: never imported, and merge fails."""


class HistoryStore:
    """The history store at `path`. `create`: make a new store when there is none (merge). `read_only`: open it
    with SQLite's `mode=ro`, so reading commands never write (a read-only file works, a reader never waits behind
    a writer's migration); an older schema is then migrated in a copy in memory, never in the file."""

    def __init__(self, path: Path, *, create: bool, read_only: bool = False) -> None:
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
        self._redact = redactor()
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
    def _sqlite_errors(self) -> Iterator[None]:
        """Any SQLite error becomes one line naming the file and what to do."""
        try:
            yield
        except sqlite3.Error as exc:
            raise ReportsError(explain(self.path, exc)) from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One `BEGIN IMMEDIATE` transaction: committed when the block ends, rolled back when it raises. Inside an
        open transaction (`transaction()`), a savepoint: the block's writes are undone alone when it raises."""
        if self._conn.in_transaction:
            self._conn.execute("SAVEPOINT part")
            try:
                yield
            except BaseException:
                self._conn.execute("ROLLBACK TO part")
                self._conn.execute("RELEASE part")
                raise
            self._conn.execute("RELEASE part")
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Writes that land together or not at all (rebuild: a store is never left half-imported); an import inside
        it that raises is undone alone."""
        with self._sqlite_errors(), self._write():
            yield

    def _check_or_create_schema(self) -> None:
        conn = self._conn
        with self._write():  # two processes creating a new store must not both create tables
            application_id, version, has_tables = store_identity(self._conn)
            if not has_tables and application_id == 0:
                for statement in FIRST_SCHEMA:  # not executescript(): it would commit our transaction
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                migrate(conn, 1)
            else:
                check_version(self.path, application_id, version)
                migrate(conn, version)

    def _check_read_only_schema(self) -> None:
        application_id, version, has_tables = store_identity(self._conn)
        if not has_tables and application_id == 0:
            raise ReportsError(
                f"{self.path}: an empty SQLite file, not a history store; import results first with "
                f"`python -m reports merge <junit files> --store {self.path}`"
            )
        check_version(self.path, application_id, version)
        if version < SCHEMA_VERSION:  # migrate a copy: the file stays as it is, and may be read-only
            memory = sqlite3.connect(":memory:", isolation_level=None)
            self._conn.backup(memory)
            self._conn.close()
            self._conn = memory
            with self._write():
                migrate(memory, version)

    @_naming_the_file
    def import_runs(self, runs: list[tuple[Run, list[CellResult]]], source: Path) -> ImportCounts:
        """Add runs and results not yet stored, all or nothing; known ones are left untouched. Raises StoreConflict
        when a stored run has other provenance, or a stored cell of it another verdict (outcome, failure class):
        one run id is one run, so the file and the store cannot both be right. The records come redacted from the
        door (reports.store.door); each distinct message and signature is stored once."""
        conn = self._conn
        new_runs = new_results = 0
        with self._write():
            # Read the known ids under the write lock: another importer may have added them since the store opened.
            texts, cells, points = Texts(conn), Cells(conn), Points(conn)
            for run, results in runs:
                stored = conn.execute(
                    f"SELECT id, {', '.join(RUN_FIELDS + VERSION_FIELDS)} FROM runs WHERE run_id = ?", (run.run_id,)
                ).fetchone()
                if stored is None:
                    columns = ("run_id", *RUN_FIELDS, *VERSION_FIELDS, "imported_from", "imported_at")
                    run_key = inserted_id(
                        conn.execute(
                            f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                            (
                                run.run_id,
                                *run_row(run),
                                self._redact(source_name(source)),
                                datetime.now(timezone.utc).isoformat(),
                            ),
                        )
                    )
                    new_runs += 1
                    verdicts = {}
                else:
                    run_key, *provenance = stored
                    if tuple(provenance) != run_row(run):
                        raise StoreConflict(
                            f"{source}: run {run.run_id!r} is already stored with different provenance/versions; "
                            "run ids must be unique per session — check how the file was produced"
                        )
                    verdicts = stored_verdicts(conn, run_key)
                changed = changed_verdicts(results, verdicts)
                if changed:
                    raise StoreConflict(
                        f"{source}: run {run.run_id!r} is already stored with other verdicts for {len(changed)} "
                        f"cell(s) ({'; '.join(changed[:3])}{'; …' if len(changed) > 3 else ''}); a run id names one "
                        "run — check how the file was produced, nothing of it was imported"
                    )
                rows, checkpoint_rows, cause_rows = result_rows(run_key, results, verdicts, texts, cells)
                conn.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                conn.executemany("INSERT INTO cell_checkpoints VALUES (?, ?, ?)", checkpoint_rows)
                conn.executemany("INSERT INTO cell_causes VALUES (?, ?, ?, ?, ?)", cause_rows)
                point = conn.execute(f"SELECT {POINT_COLUMNS} FROM runs WHERE id = ?", (run_key,)).fetchone()
                point_id = points.id(point_key(tuple(point)))
                add_to_aggregates(conn, [(*row[:5], row[6] != "{}") for row in rows], point_id)
                causes = {cell: cause for _, cell, cause, *_ in cause_rows}
                set_group_causes(conn, [(*row[:5], causes[row[1]]) for row in rows if row[1] in causes], point_id)
                new_results += len(rows)
        return ImportCounts(new_runs, new_results)

    @_naming_the_file
    def runs(self) -> list[Run]:
        rows = self._conn.execute(
            f"SELECT run_id, {', '.join(RUN_FIELDS + VERSION_FIELDS)} FROM runs ORDER BY started, run_id"
        )
        return [self._run(row) for row in rows]

    @_naming_the_file
    def observations(self, run_ids: Collection[str] | None = None) -> list[Observation]:
        """Every result with its run (or only those of run_ids), ordered by run id and cell; never a remedied run's
        (`Run.remedied`: not DeepSpeed's state). A compacted result has its verdict and signature; its message is ""
        and its metrics {} (compact() keeps them wherever a report reads them)."""
        conn = self._conn
        shared: dict[Versions, Versions] = {}
        runs = {
            key: run
            for key, *row in conn.execute(f"SELECT id, run_id, {', '.join(RUN_FIELDS + VERSION_FIELDS)} FROM runs")
            if not (run := self._run(row, shared)).remedied and (run_ids is None or run.run_id in run_ids)
        }
        cells = self._cells()
        checkpoints = self._checkpoints(runs)
        mechanisms = self._mechanisms(runs)
        run_rank = {key: rank for rank, key in enumerate(sorted(runs, key=lambda key: runs[key].run_id))}
        cell_rank = {key: rank for rank, key in enumerate(sorted(cells, key=cells.__getitem__))}
        query = "SELECT run, cell, outcome, failure_class, signature, message, metrics FROM results"
        if run_ids is None:
            rows = [row for row in conn.execute(query) if row[0] in runs]
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
                **mechanisms.get((run, cell), {}),
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
        texts = {key: self._redact(text) for key, text in texts.items()}
        texts[None] = ""
        return texts

    def _run(self, row: Row, shared: dict[Versions, Versions] | None = None) -> Run:
        """A run of a row, its texts redacted as they leave the store."""
        return run_from_row(tuple(self._redact(v) if isinstance(v, str) else v for v in row), shared)

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

    def _mechanisms(self, runs: dict[int, Run]) -> dict[tuple[int, int], Mechanism]:
        """The cause, break point and AutoTP record stored for failures of these runs, by (run, cell) key, as
        CellResult's fields."""
        rows = [
            row
            for row in self._conn.execute("SELECT run, cell, cause, broke_at, autotp FROM cell_causes")
            if row[0] in runs
        ]
        texts = self._texts({text for row in rows for text in row[2:]})
        return {
            (run, cell): mechanism_fields(texts[cause], texts[broke_at], texts[autotp])
            for run, cell, cause, broke_at, autotp in rows
        }

    @_naming_the_file
    def aggregates(self) -> Aggregates:
        """The per-point aggregates the report reads (reports.store.aggregates) of the runs without a remedy, as
        import keeps them (result_groups, point_metrics; `without_remedies` reads a remedied run's point again)."""
        conn = self._conn
        shared: dict[Versions, Versions] = {}
        runs = {
            key: self._run(row, shared)
            for key, *row in conn.execute(
                f"SELECT id, run_id, {', '.join(RUN_FIELDS + VERSION_FIELDS)} FROM runs "
                "WHERE EXISTS (SELECT 1 FROM results WHERE results.run = runs.id)"
            )
        }
        cells = self._cells()
        signatures = self._texts(
            {text for row in conn.execute("SELECT DISTINCT signature, cause FROM result_groups") for text in row}
        )
        groups = []
        for cell, outcome, failure_class, signature, count, first_listed, earliest, newest, cause in conn.execute(
            "SELECT cell, outcome, failure_class, signature, count, first_listed, earliest, newest, cause "
            "FROM result_groups"
        ):
            point = runs[earliest]  # every run of a group is at its point
            groups.append(
                ResultGroup(
                    cell=cells[cell],
                    versions=point.versions,
                    harness_git=point.harness_git,
                    outcome=outcome,
                    failure_class=failure_class,
                    signature=signatures[signature],
                    count=count,
                    first_listed=runs[first_listed].run_id,
                    earliest=point,
                    newest=runs[newest],
                    cause=read_record(Cause, json.loads(signatures[cause])) if cause is not None else None,
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
        groups, metrics = without_remedies(groups, metrics, runs.values(), self.observations)
        runs = {key: run for key, run in runs.items() if not run.remedied}
        return Aggregates(groups, metrics, self.observations(recent_runs(list(runs.values()))), self._checkpoints(runs))

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
        with self._write():
            counts, rewrite = compact_results(self._conn, keep_runs)
        if rewrite:  # outside the transaction, as SQLite requires
            self._conn.execute("VACUUM")
        return counts

    @_naming_the_file
    def add_bisection(self, bisection: Bisection) -> None:
        with self._write():
            self._conn.execute(insert_statement("bisections", BISECTION_COLUMNS), bisection_row(bisection))

    @_naming_the_file
    def bisections(self) -> list[Bisection]:
        """Every recorded bisection, oldest first."""
        return [
            redact_fields(bisection_from_row(row), self._redact)
            for row in self._conn.execute(select_statement("bisections", BISECTION_COLUMNS))
        ]

    @_naming_the_file
    def add_triage_attempt(self, attempt: TriageAttempt) -> None:
        with self._write():
            self._conn.execute(insert_statement("triage_attempts", TRIAGE_COLUMNS), triage_row(attempt))

    @_naming_the_file
    def triage_attempts(self) -> list[TriageAttempt]:
        """Every unanswered triage question, oldest first."""
        return [
            redact_fields(triage_from_row(row), self._redact)
            for row in self._conn.execute(select_statement("triage_attempts", TRIAGE_COLUMNS))
        ]

    @_naming_the_file
    def add_remedy_results(self, results: list[RemedyResult]) -> int:
        """Store results of `nox -s remedy` that passed the door (reports.store.remedy_door); how many were new."""
        with self._write():
            return insert_results(self._conn, results)

    @_naming_the_file
    def remedy_results(self) -> list[RemedyResult]:
        """The newest stored result of each remedy (proof_rows.newest_results), redacted as read."""
        return [redact_fields(result, self._redact) for result in newest_results(self._conn)]

    def answers(self) -> list[Bisection | TriageAttempt]:
        """Every bisection, then every triage attempt, each oldest first."""
        return [*self.bisections(), *self.triage_attempts()]

    @_naming_the_file
    def record_entries(self, hashes: dict[str, str]) -> None:
        """The SHA-256 of archive entries (by their path in the archive) whose records the store now holds; the first
        hash recorded for a name stays, so an entry changed later is what `verify` finds."""
        with self._write():
            self._conn.executemany("INSERT OR IGNORE INTO archive_entries VALUES (?, ?)", hashes.items())

    @_naming_the_file
    def entry_hashes(self) -> dict[str, str]:
        """The SHA-256 recorded for each archive entry the store was built from (`verify` compares them)."""
        return dict(self._conn.execute("SELECT name, sha256 FROM archive_entries"))

"""Compaction: what a result keeps once no report reads its detail (HistoryStore.compact), in SQL over integer ids."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from reports.store.schema import POINT_COLUMNS


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
# `measured_ord`, which orders runs started at the same time as reports.analysis.history.summarise breaks such a tie:
# the first in run id order wins) and its version set with harness commit (`point`, with the cell what
# reports.analysis.history.point_status groups; every version column, so a new axis joins it).
_COMPACTING = (
    f"""
CREATE TEMP TABLE compacting_runs AS
SELECT id,
       row_number() OVER (PARTITION BY session ORDER BY started DESC, run_id DESC) AS age,
       row_number() OVER (ORDER BY started, run_id) AS ord,
       row_number() OVER (ORDER BY started, run_id DESC) AS measured_ord,
       dense_rank() OVER (ORDER BY {POINT_COLUMNS}) AS point
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
  AND NOT EXISTS (SELECT 1 FROM compacting_runs ru
                  JOIN compacting_ends e ON e.cell = results.cell AND e.point = ru.point
                  WHERE ru.id = results.run AND (ru.ord IN (e.first, e.newest) OR ru.measured_ord = e.measured))"""


def compact_results(conn: sqlite3.Connection, keep_runs: int) -> tuple[CompactionCounts, bool]:
    """HistoryStore.compact's work inside its write transaction: the counts, and whether the file is due a VACUUM."""
    *seen, since_vacuum = conn.execute("SELECT results, keep_runs, since_vacuum FROM compaction").fetchone()
    results = conn.execute("SELECT count(*) FROM results").fetchone()[0]
    if tuple(seen) == (results, keep_runs):
        return CompactionCounts(0, 0), False
    for statement in _COMPACTING:
        conn.execute(statement)
    compacted = conn.execute(_COMPACT_RESULTS, {"keep_runs": keep_runs}).rowcount
    conn.execute("DROP TABLE temp.compacting_ends")
    conn.execute("DROP TABLE temp.compacting_runs")
    dropped = conn.execute(
        "DELETE FROM texts WHERE id NOT IN (SELECT signature FROM results) "
        "AND id NOT IN (SELECT message FROM results WHERE message IS NOT NULL) "
        "AND id NOT IN (SELECT cause FROM cell_causes) "
        "AND id NOT IN (SELECT broke_at FROM cell_causes WHERE broke_at IS NOT NULL) "
        "AND id NOT IN (SELECT autotp FROM cell_causes WHERE autotp IS NOT NULL)"
    ).rowcount
    since_vacuum += compacted
    rewrite = since_vacuum > results * VACUUM_SHARE
    conn.execute(
        "UPDATE compaction SET results = ?, keep_runs = ?, since_vacuum = ?",
        (results, keep_runs, 0 if rewrite else since_vacuum),
    )
    return CompactionCounts(compacted, dropped), rewrite

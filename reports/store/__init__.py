"""What was recorded, kept for good: records every room shares, JUnit read at the door, the append-only results
archive (the source of truth) and the SQLite history store indexed over it (schema, migrations, aggregates).

Other rooms import these names from here; modules inside the room import each other directly."""

from reports.store.aggregates import (
    Aggregates,
    PointKey,
    PointMetrics,
    ResultGroup,
    ResultGrouping,
    aggregate,
    group_results,
    newer_metrics,
    started_order,
)
from reports.store.archive import (
    ArchiveConflict,
    ResultsArchive,
    answer_key,
    default_archive,
    needed_paths,
)
from reports.store.compaction import (
    KEEP_RECENT_RUNS,
)
from reports.store.history_store import (
    HistoryStore,
    StoreConflict,
)
from reports.store.junit import (
    KNOWN_FAILURE_CLASSES,
    find_junit_files,
    read_junit,
)
from reports.store.records import (
    AXES,
    BisectMode,
    Bisection,
    CellKey,
    CellResult,
    Commit,
    GITHUB_REPOSITORY,
    KEY_METRIC,
    Observation,
    Pins,
    Run,
    TransitionKind,
    TriageAttempt,
    Versions,
    parse_pins,
    pins_text,
    release,
    short_commit,
)
from reports.store.schema import (
    DEFAULT_STORE,
)

__all__ = [
    "AXES",
    "Aggregates",
    "ArchiveConflict",
    "BisectMode",
    "Bisection",
    "CellKey",
    "CellResult",
    "Commit",
    "DEFAULT_STORE",
    "GITHUB_REPOSITORY",
    "HistoryStore",
    "KEEP_RECENT_RUNS",
    "KEY_METRIC",
    "KNOWN_FAILURE_CLASSES",
    "Observation",
    "Pins",
    "PointKey",
    "PointMetrics",
    "ResultGroup",
    "ResultGrouping",
    "ResultsArchive",
    "Run",
    "StoreConflict",
    "TransitionKind",
    "TriageAttempt",
    "Versions",
    "aggregate",
    "answer_key",
    "default_archive",
    "find_junit_files",
    "group_results",
    "needed_paths",
    "newer_metrics",
    "parse_pins",
    "pins_text",
    "read_junit",
    "release",
    "short_commit",
    "started_order",
]

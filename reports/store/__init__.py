"""What was recorded, kept for good: records every room shares, the door every run comes in by (JUnit read, redacted and
validated), the append-only results archive (the source of truth) and the SQLite history store indexed over it
(schema, migrations, aggregates).

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
    ArchiveListing,
    DamagedEntry,
    ResultsArchive,
    answer_key,
    default_archive,
    needed_paths,
)
from reports.store.compaction import (
    KEEP_RECENT_RUNS,
)
from reports.store.door import (
    Redact,
    Rejected,
    admit,
    redact_fields,
    redactor,
)
from reports.store.history_store import (
    HistoryStore,
    StoreConflict,
)
from reports.store.junit import (
    KNOWN_FAILURE_CLASSES,
    find_junit_files,
)
from reports.store.proof_rows import canonical
from reports.store.published import (
    RebuildCounts,
    bring_up_to_date,
    with_published_history,
)
from reports.store.records import (
    AXES,
    GITHUB_REPOSITORY,
    KEY_METRIC,
    Bisection,
    BisectMode,
    CellDetail,
    CellKey,
    CellResult,
    Commit,
    JSONObject,
    Observation,
    Pins,
    Run,
    RunRecords,
    TransitionKind,
    TriageAttempt,
    Versions,
    parse_pins,
    pins_text,
    release,
    short_commit,
)
from reports.store.remedy_door import admit_remedies, find_remedy_files, refused_untrusted
from reports.store.schema import (
    DEFAULT_STORE,
)

__all__ = [
    "RebuildCounts",
    "bring_up_to_date",
    "with_published_history",
    "AXES",
    "Aggregates",
    "ArchiveConflict",
    "ArchiveListing",
    "BisectMode",
    "Bisection",
    "CellDetail",
    "CellKey",
    "CellResult",
    "Commit",
    "DamagedEntry",
    "DEFAULT_STORE",
    "GITHUB_REPOSITORY",
    "HistoryStore",
    "KEEP_RECENT_RUNS",
    "KEY_METRIC",
    "KNOWN_FAILURE_CLASSES",
    "JSONObject",
    "Observation",
    "Pins",
    "PointKey",
    "PointMetrics",
    "ResultGroup",
    "Redact",
    "Rejected",
    "ResultGrouping",
    "ResultsArchive",
    "Run",
    "RunRecords",
    "StoreConflict",
    "TransitionKind",
    "TriageAttempt",
    "Versions",
    "admit",
    "admit_remedies",
    "aggregate",
    "answer_key",
    "canonical",
    "default_archive",
    "find_junit_files",
    "find_remedy_files",
    "group_results",
    "needed_paths",
    "newer_metrics",
    "parse_pins",
    "pins_text",
    "redact_fields",
    "redactor",
    "refused_untrusted",
    "release",
    "short_commit",
    "started_order",
]

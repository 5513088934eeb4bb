"""The report model: everything a report says, built from the History (reports/analysis/history.py) and the store's
aggregates (reports/store/aggregates.py) as a `Report`, which every renderer (reports/outputs/render.py: markdown, HTML,
step summary; reports/outputs/publish.py; reports/outputs/draft_issue.py) formats and none computes again. `report_json`
is its one JSON form (report.json), written from its fields by matrix.json_records.write_record, `read_report` the
Report again from it.

What grows with the history (every combination's matrix, the timeline, each transition, flaky point and answer)
is split off into report-details.json (split_report), so report.json stays the size of its first screen.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from matrix.json_records import read_record, write_record
from matrix.known_failures import KnownFailure
from reports.analysis import (
    NO_RESULT_FILES,
    NO_VERDICT_STATUSES,
    TRANSITION_LISTS,
    CellStatus,
    CheckpointVerdicts,
    EntryStatus,
    FailingNow,
    History,
    NewArchitectures,
    ResultFiles,
    RootCause,
    Transition,
    TransitionEntry,
    all_session_deltas,
    answer_json,
    architectures_new_in_release,
    bisection_from_json,
    build_failing_now,
    cause_name_text,
    cell_checkpoints,
    checkpoint_verdicts,
    harness_change_text,
    named_causes,
    root_causes,
)
from reports.outputs.docs import Drift
from reports.outputs.report_parts import (
    CombinationMatrix,
    FlakyEntry,
    HarnessChangeEntry,
    MatrixEntry,
    MatrixRow,
    SupportMatrix,
    Timeline,
    TimelineCell,
    TimelineColumn,
)
from reports.outputs.since_previous import SincePreviousRun, since_previous_run
from reports.outputs.support import SupportedModels, model_families, supported_models
from reports.store import (
    AXES,
    KEY_METRIC,
    Aggregates,
    Bisection,
    CellKey,
    JSONObject,
    Run,
    Versions,
    release,
    started_order,
)

# What report.json leaves to report-details.json (split_report): what grows with the history (every combination's
# matrix, the timeline, each transition, flaky point and answer); report.json's root causes count and name them.
DETAILS_FILE = "report-details.json"
DETAIL_KEYS = (
    "matrices",
    "timeline",
    "regressions",
    "fixes",
    "class_changes",
    "flaky",
    "harness_changes",
    "bisections",
)


@dataclass(frozen=True)
class Report:
    """What every output says, in report.json's order, each part a typed record (report_json: its JSON)."""

    generated_at: str
    latest_versions: Versions
    latest_label: str
    latest_harness: list[str]  # harness commits that recorded the latest versions
    key_metric: str
    since_previous_run: SincePreviousRun
    new_architectures: NewArchitectures
    matrix: SupportMatrix  # at the latest versions
    matrices: tuple[CombinationMatrix, ...]  # at every version combination, the newest first
    regressions: tuple[TransitionEntry, ...]
    fixes: tuple[TransitionEntry, ...]
    class_changes: tuple[TransitionEntry, ...]
    flaky: tuple[FlakyEntry, ...]
    harness_changes: tuple[HarnessChangeEntry, ...]
    timeline: Timeline
    bisections: tuple[Bisection, ...]  # every one recorded, oldest first
    docs_drift: Drift | None  # None without a copy of DeepSpeed's docs to compare with
    checkpoints: CheckpointVerdicts
    root_causes: tuple[RootCause, ...]
    failing_now: FailingNow
    supported_models: SupportedModels

    def members(self, root_cause: RootCause) -> list[TransitionEntry]:
        """A root cause's transitions, as the report states them."""
        listed = getattr(self, TRANSITION_LISTS[root_cause.kind])
        return [listed[i] for i in root_cause.members]

    def root_cause(self, cause_id: str) -> RootCause:
        return next(root for root in self.root_causes if root.id == cause_id)

    def json_shape(self, written: JSONObject) -> JSONObject:
        """report.json names a bisection's cell by its id and its pins as text (read_report reads them back)."""
        bisections = [answer_json(entry, answer) for entry, answer in zip(written["bisections"], self.bisections)]
        return {**written, "bisections": bisections}


def build_report(
    history: History,
    aggregates: Aggregates,
    drift: Drift | None,
    known_failures: dict[str, KnownFailure],
    files: ResultFiles = NO_RESULT_FILES,
) -> Report:
    """The report; `files`: what the results folder it is written to holds for the failing cells (logs, repro
    scripts, draft issues), which it names."""
    grid = _grid(history)
    listed_of = {
        kind: tuple(transition_entry(t) for t in history.transitions if t.kind == kind) for kind in TRANSITION_LISTS
    }
    causes = root_causes(listed_of, history.transitions, history.latest)
    failing = build_failing_now(causes, history, aggregates, known_failures, files)
    names = {entry.id: cause_name_text(entry) for entry in failing.causes}
    # a root cause whose failing end fails now is named as failing now names it
    named_roots = {root: names[entry.id] for entry in failing.causes for root in entry.root_causes}
    causes = tuple(replace(root, name=named_roots.get(root.id, root.name)) for root in causes)
    checkpoints = cell_checkpoints(aggregates, history)
    return Report(
        generated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        latest_versions=history.latest,
        latest_label=history.latest.describe(),
        latest_harness=list(history.harness.get(history.latest, ())),
        key_metric=KEY_METRIC,
        since_previous_run=since_previous_run(all_session_deltas(aggregates.recent, history), names),
        new_architectures=architectures_new_in_release(aggregates.groups),
        matrix=_matrix(history.cells, [row[-1] for row in grid]),
        matrices=tuple(
            CombinationMatrix(
                versions=versions,
                label=versions.describe(),
                harness=tuple(history.harness.get(versions, ())),
                matrix=_matrix(history.cells, [row[index] for row in grid]),
            )
            # the newest first, as a reader looks for it
            for index, versions in reversed(list(enumerate(history.version_sets)))
        ),
        regressions=listed_of["broke"],
        fixes=listed_of["fixed"],
        class_changes=listed_of["class-change"],
        flaky=tuple(FlakyEntry(cell.id, versions, entry_status(status)) for cell, versions, status in history.flaky),
        harness_changes=tuple(
            _harness_change(cell, versions, status) for cell, versions, status in history.harness_changes
        ),
        timeline=_timeline(history, grid, _runs_by_point(aggregates, history)),
        bisections=tuple(history.bisections),
        docs_drift=drift,
        checkpoints=checkpoint_verdicts(history, checkpoints, named_causes(failing)),
        root_causes=causes,
        failing_now=failing,
        supported_models=supported_models(history, failing, model_families(), aggregates, checkpoints),
    )


def report_json(report: Report) -> JSONObject:
    """The report as report.json (with report-details.json: split_report) has it: what json.loads gives back."""
    return write_record(report)


def split_report(report: Report) -> tuple[JSONObject, JSONObject]:
    """(report.json, report-details.json): what grows with the history (DETAIL_KEYS) goes to the second, which the
    first names under "details", so report.json stays the size of its first screen however long the history."""
    whole = report_json(report)
    details = {key: whole[key] for key in DETAIL_KEYS}
    first_screen = {key: value for key, value in whole.items() if key not in DETAIL_KEYS}
    return {**first_screen, "details": {"file": DETAILS_FILE, "keys": list(DETAIL_KEYS)}}, details


def read_report(out_dir: Path) -> Report:
    """The whole report a render wrote to out_dir: report.json with its details file put back."""
    first_screen = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    details = first_screen.pop("details")
    whole = {**first_screen, **json.loads((out_dir / details["file"]).read_text(encoding="utf-8"))}
    latest = read_record(Versions, whole["latest_versions"])
    timeline = read_record(Timeline, whole["timeline"])
    cells = {entry.cell.id: entry.cell for entry in timeline.cells}  # the JSON names a bisection's cell by its id
    return read_record(
        Report,
        {
            **whole,
            "latest_versions": latest,
            "timeline": timeline,
            "root_causes": [RootCause.from_json(entry, latest) for entry in whole["root_causes"]],
            "bisections": [bisection_from_json(entry, cells[entry["cell"]]) for entry in whole["bisections"]],
        },
    )


# ---- JSON-ready pieces -------------------------------------------------------------------------------------------


def _labels(versions: Versions) -> dict[str, str]:
    """Each axis as reports print it (a DeepSpeed git build as 0.19.8@abc1234567)."""
    return {axis: versions.label(axis) for axis in AXES}


def entry_status(status: CellStatus) -> EntryStatus:
    """A verdict as the report states it."""
    return EntryStatus(
        status=status.status,
        passes=status.passes,
        fails=status.fails,
        skips=status.skips,
        failure_class=status.failure_class,
        signature=status.signature,
        key_metric=status.metrics.get(KEY_METRIC),
    )


def _harness_change(cell: CellKey, versions: Versions, status: CellStatus) -> HarnessChangeEntry:
    older = status.harness_change
    assert older is not None, "History.harness_changes lists only points whose verdict changed with the harness"
    return HarnessChangeEntry(
        cell=cell.id,
        versions_label=versions.describe(),
        change=harness_change_text(status),
        before_status=entry_status(older),
        after_status=entry_status(status),
    )


def _column(cell: CellKey) -> str:
    return f"tp{cell.tp} {cell.variant}/{cell.dtype}"


def _grid(history: History) -> list[list[CellStatus | None]]:
    """history.statuses as a grid: a row per cell (history.cells), a column per version set (history.version_sets),
    None where the cell did not run. The matrices and the timeline read every cell at every version set (~72 k points
    at a year): each point is looked up once here, not once per reader."""
    set_index = {versions: index for index, versions in enumerate(history.version_sets)}
    cell_index = {cell: index for index, cell in enumerate(history.cells)}
    grid: list[list[CellStatus | None]] = [[None] * len(set_index) for _ in cell_index]
    for (cell, versions), status in history.statuses.items():
        grid[cell_index[cell]][set_index[versions]] = status
    return grid


def _matrix(cells: list[CellKey], statuses: list[CellStatus | None]) -> SupportMatrix:
    """The support matrix at one version combination (each cell's status there, None where it did not run): a row
    per model run there, a column per tp × variant × dtype."""
    by_model: dict[str, dict[tuple[int, str, str], tuple[CellKey, CellStatus]]] = defaultdict(dict)
    for cell, status in zip(cells, statuses):
        if status is not None:
            by_model[cell.model][cell.tp, cell.variant, cell.dtype] = cell, status
    columns = sorted({column for here in by_model.values() for column in here})
    rows = []
    for model in sorted(by_model):
        here = by_model[model]
        row = {}
        for column in columns:
            if column in here:
                cell, status = here[column]
                row[_column(cell)] = MatrixEntry(cell.id, entry_status(status))
        rows.append(MatrixRow(model, row))
    names = tuple(f"tp{tp} {variant}/{dtype}" for tp, variant, dtype in columns)
    return SupportMatrix(names, tuple(rows), _class_counts(rows, names))


def outcome_class(verdict: EntryStatus | CellStatus) -> str:
    """pass, skip, unsupported, flaky, or the failure class of a failing cell."""
    return (verdict.failure_class or "fail") if verdict.status == "fail" else verdict.status


def _class_counts(rows: list[MatrixRow], columns: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """{outcome class: {column: cells, ..., "all": cells}}, pass first, then the most common classes."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        for column, entry in row.cells.items():
            per_column = counts.setdefault(outcome_class(entry.verdict), dict.fromkeys([*columns, "all"], 0))
            per_column[column] += 1
            per_column["all"] += 1
    return dict(
        sorted(
            counts.items(),
            key=lambda item: (item[0] != "pass", item[0] in NO_VERDICT_STATUSES, -item[1]["all"], item[0]),
        )
    )


def transition_entry(transition: Transition) -> TransitionEntry:
    return TransitionEntry(
        cell=transition.cell,
        kind=transition.kind,
        axis=transition.axis,
        before=transition.before.label(transition.axis),
        after=transition.after.label(transition.axis),
        held_fixed=transition.held_fixed,
        before_status=entry_status(transition.before_status),
        after_status=entry_status(transition.after_status),
        commits=tuple(transition.commits),
        bisection=transition.bisection,
        attempt=transition.attempt,
    )


@dataclass(frozen=True)
class PointRuns:
    """How many runs recorded each cell at each version set, and the newest of them (started last; started together:
    the larger run id), in the grid's places (_grid: a row per cell, a column per version set)."""

    counts: list[list[int]]
    newest: list[list[Run | None]]


def _runs_by_point(aggregates: Aggregates, history: History) -> PointRuns:
    set_index = {versions: index for index, versions in enumerate(history.version_sets)}
    cell_index = {cell: index for index, cell in enumerate(history.cells)}
    counts = [[0] * len(set_index) for _ in cell_index]
    newest: list[list[Run | None]] = [[None] * len(set_index) for _ in cell_index]
    for group in aggregates.groups:
        row, column = cell_index[group.cell], set_index[group.versions]
        counts[row][column] += group.count
        known = newest[row][column]
        if known is None or started_order(group.newest) > started_order(known):
            newest[row][column] = group.newest
    return PointRuns(counts, newest)


def _axis_order(axis: str, version_sets: list[Versions]) -> dict[str, tuple[object, ...]]:
    """A sort key per label of an axis: releases by PEP 440, then the history's order (which places DeepSpeed
    git builds topologically when a clone was given, and labels such as pr/1234 after the releases)."""
    first_seen: dict[str, int] = {}
    for index, versions in enumerate(version_sets):
        first_seen.setdefault(versions.label(axis), index)
    keys: dict[str, tuple[object, ...]] = {}
    for versions in version_sets:
        version = release(getattr(versions, axis))
        label = versions.label(axis)
        keys[label] = (0, version, first_seen[label]) if version is not None else (1, first_seen[label])
    return keys


def _timeline(history: History, grid: list[list[CellStatus | None]], runs: PointRuns) -> Timeline:
    """Every cell at every version set. Columns are shown grouped by the axes that change besides the one that
    changes most (the primary axis), then ordered by version along the primary axis; axes that never change
    are stated once."""
    sets = history.version_sets
    labels = [_labels(v) for v in sets]
    varying = [axis for axis in AXES if len({label[axis] for label in labels}) > 1]
    primary = max(varying, key=lambda axis: len({label[axis] for label in labels}), default=AXES[0])
    grouping = [axis for axis in varying if axis != primary]
    order = {axis: _axis_order(axis, sets) for axis in varying}
    shown = sorted(
        range(len(sets)),
        key=lambda i: (
            tuple(order[a][labels[i][a]] for a in grouping),
            order[primary][labels[i][primary]] if varying else 0,
        ),
    )
    cells = []
    for cell, points, newest_runs, run_counts in zip(history.cells, grid, runs.newest, runs.counts):
        verdicts = {outcome_class(p) for p in points if p is not None and p.status not in NO_VERDICT_STATUSES}
        cells.append(
            TimelineCell(
                cell=cell,
                statuses=tuple(p.status if p else None for p in points),
                failure_classes=tuple(p.failure_class if p else "" for p in points),
                signatures=tuple(p.signature if p else "" for p in points),
                key_metric=tuple(p.metrics.get(KEY_METRIC) if p else None for p in points),
                newest_runs=tuple(run.run_id if run else None for run in newest_runs),
                run_counts=tuple(run_counts),
                changed=len(verdicts) > 1,
            )
        )
    return Timeline(
        version_sets=tuple(v.describe() for v in sets),
        labels=tuple(labels),
        harness=tuple(tuple(history.harness.get(v, ())) for v in sets),
        varying_axes=tuple(varying),
        primary_axis=primary,
        fixed_axes={axis: labels[0][axis] for axis in AXES if axis not in varying},
        columns=tuple(
            TimelineColumn(i, ", ".join(f"{a} {labels[i][a]}" for a in grouping), labels[i][primary]) for i in shown
        ),
        cells=tuple(cells),
    )

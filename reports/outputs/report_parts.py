"""The report's parts as typed records (reports.outputs.model.Report holds them): the support matrix at a version
combination, the timeline of every cell at every version set, flaky points and verdicts the harness changed. Each `json()` is its part of report.json
(key for key what the report has always written); matrix.json_records.read_record reads each part again from it
(read_report), by the `own_shape` of a record whose JSON is flattened."""

from __future__ import annotations

from dataclasses import dataclass, fields

from matrix.json_records import split_keys
from reports.analysis import CELL_FIELDS, EntryStatus
from reports.store import AXES, CellKey, Commit, JSONObject, Versions

FlatRecord = CellKey | Commit | EntryStatus
"""Records whose fields hold no record (flat_json writes them as report.json has them)."""


def flat_json(record: FlatRecord) -> JSONObject:
    """asdict of a record whose fields hold no record (text, numbers, tuples of them): the same JSON, without
    asdict's deep copy of every value (~90 k of them for a year's transitions and flaky points)."""
    return {field.name: getattr(record, field.name) for field in fields(record)}


@dataclass(frozen=True)
class MatrixEntry:
    """A cell's verdict in a support matrix."""

    cell: str  # the cell's id
    verdict: EntryStatus

    def json(self) -> JSONObject:
        return {"cell": self.cell, **flat_json(self.verdict)}

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        cell, verdict = split_keys(entry, ("cell",))
        return {**cell, "verdict": verdict}


@dataclass(frozen=True)
class MatrixRow:
    """A model's row: its cells by column ("tp2 eager/fp32"), only the columns it ran."""

    model: str
    cells: dict[str, MatrixEntry]

    def json(self) -> JSONObject:
        return {"model": self.model, "cells": {column: entry.json() for column, entry in self.cells.items()}}


@dataclass(frozen=True)
class SupportMatrix:
    """The support matrix at one version combination: a row per model run there, a column per tp × variant × dtype."""

    columns: tuple[str, ...]  # "tp2 eager/fp32", sorted by tp, variant, dtype
    rows: tuple[MatrixRow, ...]  # by model name
    counts: dict[str, dict[str, int]]  # {outcome class: {column: cells, ..., "all": cells}}, pass first

    def json(self) -> JSONObject:
        return {"columns": list(self.columns), "rows": [row.json() for row in self.rows], "counts": self.counts}


@dataclass(frozen=True)
class CombinationMatrix:
    """The support matrix at one version combination of the history, with the combination (report.json's
    "matrices", the newest first)."""

    versions: Versions
    label: str  # versions.describe()
    harness: tuple[str, ...]  # the harness commits that recorded it
    matrix: SupportMatrix

    def json(self) -> JSONObject:
        return {
            "versions": versions_json(self.versions),
            "label": self.label,
            "harness": list(self.harness),
            **self.matrix.json(),
        }

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        combination, matrix = split_keys(entry, ("versions", "label", "harness"))
        return {**combination, "matrix": matrix}


def versions_json(versions: Versions) -> dict[str, str]:
    """A version set as report.json has it: each axis by name, then DeepSpeed's commit."""
    return {**{axis: getattr(versions, axis) for axis in AXES}, "deepspeed_git": versions.deepspeed_git}


@dataclass(frozen=True)
class TimelineColumn:
    """A column of the timeline as it is shown: a version set, grouped and ordered."""

    index: int  # the version set's index in Timeline.version_sets (and in each cell's lists)
    group: str  # the labels of the other axes that change ("torch 2.12.0, python 3.11.7"), "" when none does
    label: str  # the label of the primary axis


@dataclass(frozen=True)
class TimelineCell:
    """One cell at every version set (its lists are indexed like Timeline.version_sets)."""

    cell: CellKey
    statuses: tuple[str | None, ...]  # pass, fail, flaky, skip; None where it did not run
    failure_classes: tuple[str, ...]  # "" where it did not fail or run
    signatures: tuple[str, ...]
    key_metric: tuple[float | None, ...]
    newest_runs: tuple[str | None, ...]  # the run id of the newest run there (every run id of a year: ~1.5 M)
    run_counts: tuple[int, ...]  # how many runs recorded it there
    changed: bool  # its outcome differs somewhere (a skip says nothing about the cell, so it changes nothing)

    def json(self) -> JSONObject:
        return {
            "cell": self.cell.id,
            **flat_json(self.cell),
            "statuses": list(self.statuses),
            "failure_classes": list(self.failure_classes),
            "signatures": list(self.signatures),
            "key_metric": list(self.key_metric),
            "newest_runs": list(self.newest_runs),
            "run_counts": list(self.run_counts),
            "changed": self.changed,
        }

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        cell, timeline = split_keys(entry, CELL_FIELDS)
        return {**timeline, "cell": cell}  # in place of the cell's id


@dataclass(frozen=True)
class Timeline:
    """Every cell at every version set (report.json's "timeline"). Columns are shown grouped by the axes that change
    besides the one that changes most (the primary axis), then ordered by version along the primary axis."""

    version_sets: tuple[str, ...]  # each described, oldest first (History.version_sets)
    labels: tuple[dict[str, str], ...]  # each version set's label per axis
    harness: tuple[tuple[str, ...], ...]  # the harness commits that recorded each version set
    varying_axes: tuple[str, ...]  # the axes whose label changes across the version sets
    primary_axis: str  # the one that changes most
    fixed_axes: dict[str, str]  # the others, with their one label
    columns: tuple[TimelineColumn, ...]  # in the order shown
    cells: tuple[TimelineCell, ...]  # History.cells' order

    def json(self) -> JSONObject:
        return {
            "version_sets": list(self.version_sets),
            "labels": list(self.labels),
            "harness": [list(commits) for commits in self.harness],
            "varying_axes": list(self.varying_axes),
            "primary_axis": self.primary_axis,
            "fixed_axes": self.fixed_axes,
            "columns": [{"index": c.index, "group": c.group, "label": c.label} for c in self.columns],
            "cells": [cell.json() for cell in self.cells],
        }


@dataclass(frozen=True)
class FlakyEntry:
    """A cell that both passed and failed at one version set (report.json's "flaky")."""

    cell: str  # the cell's id
    versions: Versions
    status: EntryStatus

    def json(self) -> JSONObject:
        """Its versions, their label, and its verdict's parts."""
        return {
            "cell": self.cell,
            "versions": versions_json(self.versions),
            "versions_label": self.versions.describe(),
            **flat_json(self.status),
        }

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        status, point = split_keys(entry, tuple(field.name for field in fields(EntryStatus)))
        return {"cell": point["cell"], "versions": point["versions"], "status": status}  # versions_label: no field


@dataclass(frozen=True)
class HarnessChangeEntry:
    """A verdict that changed at the same versions when the harness commit did (report.json's
    "harness_changes")."""

    cell: str  # the cell's id
    versions_label: str
    change: str  # "pass ×2 at harness aaaaaaaaaa → fail ×1 at harness bbbbbbbbbb"
    before_status: EntryStatus  # under the older harness commits
    after_status: EntryStatus

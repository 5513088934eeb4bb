"""The report's parts as typed records (reports.outputs.model.Report holds them): the support matrix at a version
combination, the timeline of every cell at every version set, flaky points and verdicts the harness changed.
matrix.json_records.write_record writes each as its part of report.json (key for key what the report has always
written) and read_record reads it again (read_report): a record whose JSON is flattened into its parent has the two
reshapings side by side, `json_shape` (written) and `own_shape` (read)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from matrix.json_records import split_keys
from reports.analysis import CELL_FIELDS, EntryStatus
from reports.store import CellKey, JSONObject, Versions


@dataclass(frozen=True)
class MatrixEntry:
    """A cell's verdict in a support matrix."""

    cell: str  # the cell's id
    verdict: EntryStatus

    def json_shape(self, written: JSONObject) -> JSONObject:
        return {"cell": written["cell"], **written["verdict"]}

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        cell, verdict = split_keys(entry, ("cell",))
        return {**cell, "verdict": verdict}


@dataclass(frozen=True)
class MatrixRow:
    """A model's row: its cells by column ("tp2 eager/fp32"), only the columns it ran."""

    model: str
    cells: dict[str, MatrixEntry]


@dataclass(frozen=True)
class SupportMatrix:
    """The support matrix at one version combination: a row per model run there, a column per tp × variant × dtype."""

    columns: tuple[str, ...]  # "tp2 eager/fp32", sorted by tp, variant, dtype
    rows: tuple[MatrixRow, ...]  # by model name
    counts: dict[str, dict[str, int]]  # {outcome class: {column: cells, ..., "all": cells}}, pass first


@dataclass(frozen=True)
class CombinationMatrix:
    """The support matrix at one version combination of the history, with the combination (report.json's
    "matrices", the newest first)."""

    versions: Versions
    label: str  # versions.describe()
    harness: tuple[str, ...]  # the harness commits that recorded it
    matrix: SupportMatrix

    def json_shape(self, written: JSONObject) -> JSONObject:
        combination = {name: written[name] for name in ("versions", "label", "harness")}
        return {**combination, **written["matrix"]}

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        combination, matrix = split_keys(entry, ("versions", "label", "harness"))
        return {**combination, "matrix": matrix}


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

    def json_shape(self, written: JSONObject) -> JSONObject:
        cell, timeline = written["cell"], {name: item for name, item in written.items() if name != "cell"}
        return {"cell": self.cell.id, **cell, **timeline}  # the cell's id, then its parts

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


@dataclass(frozen=True)
class FlakyEntry:
    """A cell that both passed and failed at one version set (report.json's "flaky")."""

    cell: str  # the cell's id
    versions: Versions
    status: EntryStatus

    def json_shape(self, written: JSONObject) -> JSONObject:
        """Its versions, their label, and its verdict's parts."""
        point = {"cell": written["cell"], "versions": written["versions"]}
        return {**point, "versions_label": self.versions.describe(), **written["status"]}

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

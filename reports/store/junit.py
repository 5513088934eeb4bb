"""Read session JUnit files (README.md "Results") into typed run records, one testcase at a time: their structure only.
What the values may be (names, versions, ranges, lengths) is checked by reports.store.validation, after redaction, at
the door (reports.store.door): read_junit alone is not a way in."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import cast
from xml.etree import ElementTree

from junitparser import Error, Failure, Skipped
from junitparser.xunit2 import TestCase

from matrix.json_records import read_record
from reports import ReportsError
from reports.store.records import (
    AXES,
    CellDetail,
    CellKey,
    CellResult,
    Mechanism,
    Run,
    RunRecords,
    Versions,
    deepspeed_git_of,
)
from suites.verdicts.cause import Cause
from suites.verdicts.check_names import current_metric_name
from suites.verdicts.mechanism import WHOSE, AutoTPRecord, BreakPoint
from suites.verdicts.vocabulary import FAILURE_CLASSES

KNOWN_FAILURE_CLASSES = (*FAILURE_CLASSES, "unknown")  # unknown: a failure whose JUnit names no class
# How much of a file is looked at for a document type declaration: it comes before the root element.
_PROLOGUE_BYTES = 64 * 1024


def shown(value: object) -> str:
    """A value as Python writes it, cut to a screen line: a message names the file beside it."""
    text = repr(value)
    return text if len(text) <= 120 else text[:100] + f"…' ({len(text)} characters)"


class MalformedJUnit(ReportsError):
    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def find_junit_files(inputs: list[Path]) -> list[Path]:
    """Expand files, session folders and downloaded artifact folders into JUnit paths."""
    files: list[Path] = []
    for path in inputs:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.xml") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise ReportsError(f"{path}: no such file or folder; pass JUnit files or folders containing them")
    return files


@dataclass(frozen=True)
class JUnitCase:
    """One autotp cell's testcase as read from a JUnit file: its run, its result and what else it says about the cell;
    not yet redacted nor validated (reports.store.door does both, one testcase at a time)."""

    run: Run  # the run the testcase names, the same record for every testcase of that run
    dependencies_as_of: str  # the run's run.dependencies_as_of property
    result: CellResult
    detail: CellDetail


def read_junit(path: Path) -> list[RunRecords]:
    """Each run in the file with its cell results and details; raise MalformedJUnit if unusable."""
    return gather(junit_cases(path))


def junit_cases(path: Path) -> Iterator[JUnitCase]:
    """The file's autotp cells, one testcase at a time, parsed as they are read (the parser's tree holds one testcase,
    however many the file has); raise MalformedJUnit where the file is unusable. A run that lists one cell twice is
    unusable: a run gives each cell one verdict, and which of two a reader keeps would decide whether a failure shows (a
    pass listed first would hide it)."""
    _refuse_document_type(path)
    runs: dict[str, Run] = {}
    cells: dict[str, set[str]] = {}
    for case in _testcases(path):
        # junitparser leaves TestCase.properties unannotated
        props = {p.name: p.value or "" for p in case.properties()}  # type: ignore[no-untyped-call]
        if "cell.id" not in props:
            continue  # a test that is not an autotp cell (e.g. a helper test in the same session)
        if props.get("faults"):
            continue  # a harness self-test with injected faults: never a verdict about DeepSpeed
        where = f"testcase {shown(case.name)}"
        run = _run_from(props, path, where)
        known = runs.setdefault(run.run_id, run)
        if known != run:
            raise MalformedJUnit(
                path, f"{where}: run {shown(run.run_id)} has different provenance than earlier testcases"
            )
        result = _result_from(case, props, known.run_id, path, where)
        listed = cells.setdefault(known.run_id, set())
        if result.cell.id in listed:
            raise MalformedJUnit(
                path,
                f"{where}: run {shown(known.run_id)} lists cell {shown(result.cell.id)} twice; a run gives each cell "
                "one verdict, so none of this file was imported — check how the file was produced",
            )
        listed.add(result.cell.id)
        detail = CellDetail(
            result.cell,
            checkpoint_source=props.get("checkpoint.source", ""),
            checkpoint_revision=props.get("checkpoint.revision", ""),
            logs=props.get("logs", ""),
        )
        yield JUnitCase(known, props.get("run.dependencies_as_of", ""), result, detail)
    if not runs:
        raise MalformedJUnit(path, "contains no autotp cells (no testcase has a 'cell.id' property)")


def gather(cases: Iterable[JUnitCase]) -> list[RunRecords]:
    """The cases' runs, in the order the file first names them, each with its results and its details that say
    something; a run's run.dependencies_as_of is its first testcase's."""
    runs: dict[str, RunRecords] = {}
    results: dict[str, list[CellResult]] = {}
    details: dict[str, list[CellDetail]] = {}
    for case in cases:
        run_id = case.run.run_id
        if run_id not in runs:
            runs[run_id] = RunRecords(case.run, (), (), case.dependencies_as_of)
        results.setdefault(run_id, []).append(case.result)
        if case.detail != CellDetail(case.detail.cell):
            details.setdefault(run_id, []).append(case.detail)
    return [
        replace(records, results=tuple(results.pop(run_id)), details=tuple(details.pop(run_id, ())))
        for run_id, records in runs.items()
    ]


def _testcases(path: Path) -> Iterator[TestCase]:
    """The testcases of the file's suites (a <testsuites> root's <testsuite> children, or a <testsuite> root), as the
    parser reaches the end of each: each is dropped from the tree once read, with everything else outside a
    testcase, so the tree never holds more than one. The standard library's parser (expat) fetches nothing a file
    names and refuses undeclared entities; a declared one never reaches it (_refuse_document_type)."""
    depth = 0  # of a testcase: 1 under a <testsuite> root, 2 under <testsuites>
    open_elements: list[ElementTree.Element] = []
    open_cases = 0  # testcases among them: what is inside one stays until it ends
    try:
        with open(path, "rb") as stream:
            for event, element in ElementTree.iterparse(stream, events=("start", "end")):
                if event == "start":
                    if not open_elements:
                        depth = _TESTCASE_DEPTH.get(element.tag, 0)
                        if not depth:
                            raise MalformedJUnit(
                                path, "not a JUnit file (root element is not <testsuites> or <testsuite>)"
                            )
                    open_elements.append(element)
                    open_cases += element.tag == "testcase"
                    continue
                open_elements.pop()
                if element.tag == "testcase":
                    open_cases -= 1
                    if open_cases == 0 and len(open_elements) == depth and open_elements[-1].tag == "testsuite":
                        # junitparser's typed view of the element (properties, results), no tree of its own
                        yield cast(TestCase, TestCase.fromelem(element))  # type: ignore[no-untyped-call]
                if open_elements and open_cases == 0:
                    open_elements[-1].remove(element)
    except ElementTree.ParseError as exc:
        raise MalformedJUnit(path, f"unreadable XML ({exc}); the session was probably interrupted") from None
    except OSError as exc:
        raise MalformedJUnit(path, f"cannot read it ({exc.strerror})") from None


_TESTCASE_DEPTH = {"testsuite": 1, "testsuites": 2}


def _refuse_document_type(path: Path) -> None:
    """A session file has no document type: one that declares entities could make the parser expand them into
    gigabytes (or read other files), so it is refused before parsing."""
    try:
        with open(path, "rb") as stream:
            prologue = stream.read(_PROLOGUE_BYTES)
    except OSError as exc:
        raise MalformedJUnit(path, f"cannot read it ({exc.strerror})") from None
    if b"<!DOCTYPE" in prologue.upper() or b"<!ENTITY" in prologue.upper():
        raise MalformedJUnit(path, "declares a document type or entities, which no session file has")


_OPTIONAL_AXES = {field.name for field in fields(Versions) if field.default is not MISSING}


def _require(props: dict[str, str], name: str, path: Path, where: str) -> str:
    value = props.get(name, "").strip()
    if not value:
        raise MalformedJUnit(path, f"{where}: property {shown(name)} is missing or empty")
    return value


def _run_from(props: dict[str, str], path: Path, where: str) -> Run:
    # An axis added after records were first written has a default in Versions ("": not recorded then), so files
    # from before it exist may lack it; every other axis must be there.
    versions = {
        axis: _require(props, f"version.{axis}", path, where)
        for axis in AXES
        if f"version.{axis}" in props or axis not in _OPTIONAL_AXES
    }
    harness_git = props["run.harness_git"].strip() if "run.harness_git" in props else None  # None: an old file
    deepspeed_git = deepspeed_git_of(versions["deepspeed"], props.get("version.deepspeed_git", "").strip(), harness_git)
    return Run(
        run_id=_require(props, "run.id", path, where),
        session=props.get("run.session", ""),
        host=props.get("run.host", ""),
        started=_require(props, "run.started", path, where),
        accelerator=props.get("run.accelerator", ""),
        backend=props.get("run.backend", ""),
        versions=Versions(**versions, deepspeed_git=deepspeed_git),
        harness_git=harness_git or "",
    )


def _result_from(case: TestCase, props: dict[str, str], run_id: str, path: Path, where: str) -> CellResult:
    try:
        cell = CellKey(
            model=_require(props, "cell.model", path, where),
            variant=_require(props, "cell.variant", path, where),
            dtype=_require(props, "cell.dtype", path, where),
            tp=int(_require(props, "cell.tp", path, where)),
        )
    except ValueError:
        raise MalformedJUnit(path, f"{where}: cell.tp={shown(props['cell.tp'])} is not an integer") from None
    if cell.id != props["cell.id"]:
        raise MalformedJUnit(
            path, f"{where}: cell.id={shown(props['cell.id'])} does not match its parts ({shown(cell.id)})"
        )
    checkpoints = tuple(props["checkpoints"].split(",")) if props.get("checkpoints") else ()
    # The JUnit result element is the authoritative outcome; properties add the detail.
    problems = [r for r in case.result if isinstance(r, (Failure, Error))]
    if problems:
        message = problems[0].message or ""
        prefix, _, rest = message.partition(": ")
        failure_class = props.get("failure_class") or (prefix if rest and prefix in FAILURE_CLASSES else "unknown")
        return CellResult(
            run_id=run_id,
            cell=cell,
            outcome="fail",
            failure_class=failure_class,
            signature=props.get("signature") or rest or message,
            message=problems[0].text or message,
            metrics=_metrics_from(props, path, where),
            checkpoints=checkpoints,
            **_mechanism_from(props, path, where),
        )
    skipped = [r for r in case.result if isinstance(r, Skipped)]
    if skipped:  # JUnit has one skipped element for both: the `outcome` property says DeepSpeed refused the cell
        outcome = "unsupported" if props.get("outcome") == "unsupported" else "skip"
        return CellResult(
            run_id=run_id, cell=cell, outcome=outcome, message=skipped[0].message or "", checkpoints=checkpoints
        )
    return CellResult(
        run_id=run_id, cell=cell, outcome="pass", metrics=_metrics_from(props, path, where), checkpoints=checkpoints
    )


def _mechanism_from(props: dict[str, str], path: Path, where: str) -> Mechanism:
    """A failure's cause, where it broke and what AutoTP did (suites/verdicts/mechanism.py), where the file records
    them."""
    found = Mechanism()
    try:
        if props.get("cause.key"):
            stored = {name.removeprefix("cause."): value for name, value in props.items() if name.startswith("cause.")}
            cause = read_record(Cause, stored)
            if cause.whose not in WHOSE:
                raise ValueError(f"cause.whose={cause.whose!r} is not one of {', '.join(WHOSE)}")
            found["cause"] = cause
        if props.get("broke_at.path") is not None and props.get("broke_at.how"):
            found["broke_at"] = read_record(
                BreakPoint, {name: props.get(f"broke_at.{name}", "") for name in BreakPoint.__dataclass_fields__}
            )
        if props.get("autotp"):
            found["autotp"] = read_record(AutoTPRecord, json.loads(props["autotp"]))
    except (ValueError, KeyError, TypeError) as error:
        raise MalformedJUnit(
            path, f"{where}: its cause, break point or AutoTP record is unreadable ({error})"
        ) from None
    return found


def _metrics_from(props: dict[str, str], path: Path, where: str) -> dict[str, float]:
    metrics = {}
    for name, value in props.items():
        if name.startswith("metric.") and value.strip():
            try:
                metrics[current_metric_name(name.removeprefix("metric."))] = float(value)
            except ValueError:
                raise MalformedJUnit(path, f"{where}: {shown(name)[1:-1]}={shown(value)} is not a number") from None
    return metrics

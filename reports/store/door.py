"""The one way into the history: a session's JUnit file (and the cells.jsonl beside it) read into typed records, every
text field passed through the one redactor (matrix.redaction), then every value validated (reports.store.validation),
before anything is archived or stored. merge, archive-needs and the archive's read-back of entries written before
their records were typed (format 1: the JUnit as it came) all go through here, so they see the same runs."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

from matrix.redaction import Redactor
from reports import ReportsError
from reports.store.junit import JUnitCase, gather, junit_cases, shown
from reports.store.records import CellDetail, CellKey, CellResult, JSONObject, RunRecords, Versions
from reports.store.validation import Problem, first_problem, in_utc, problems_of
from suites.records.run_records import MalformedRecord, read_records

Redact = Callable[[str], str]
T = TypeVar("T")
Kind = type | tuple[type, ...]
"""The Python type(s) a record's value must have (isinstance's second argument)."""


class Rejected(ReportsError):
    """A file whose values a session does not write: skipped whole, named with the first field and value that
    failed (the value redacted, cut to a line)."""

    def __init__(self, path: Path, problem: Problem | str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.reason = str(problem)


def redactor() -> Redact:
    """The redactor of this environment, caching its answers: a night's results repeat a few texts many times."""
    return functools.lru_cache(maxsize=4096)(Redactor())


def redact_fields(record: T, redact: Redact) -> T:
    """The record with the redactor run over every text it holds: each str field, each str in a tuple or a dict
    (keys too), and the fields of the records it holds, whatever their names; numbers and flags stay."""
    return cast(T, _redacted(record, redact))  # each value rebuilt as its own type: the record's type stays


def _redacted(value: Any, redact: Redact) -> Any:
    if isinstance(value, str):
        return redact(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _redacted(getattr(value, f.name), redact) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(_redacted(item, redact) for item in value)
    if isinstance(value, dict):
        return {_redacted(key, redact): _redacted(item, redact) for key, item in value.items()}
    return value


def admit(path: Path, redact: Redact, *, trusted: bool = True) -> list[RunRecords]:
    """The runs of a JUnit file, redacted and validated, each start in UTC; raise ReportsError naming the file (and
    the first field and value that failed) when it is unusable. `trusted` False marks them as a pull request's (never
    archived), and so is every remedied run (`Run.remedied`: a patched DeepSpeed's, wherever its file was found). Each
    testcase is redacted as it is read, so only the records are held, never the file's tree or a second copy."""
    raw_run_ids: set[str] = set()  # as cells.jsonl names them

    def redacted(cases: Iterator[JUnitCase]) -> Iterator[JUnitCase]:
        for case in cases:
            raw_run_ids.add(case.run.run_id)
            yield redact_fields(case, redact)

    runs = gather(redacted(junit_cases(path)))
    runs = [
        dataclasses.replace(r, run=dataclasses.replace(r.run, trusted=False)) if not trusted or r.run.remedied else r
        for r in runs
    ]
    for records in runs:
        if problem := first_problem(records):
            raise Rejected(path, problem)
    _check_cells_beside(path, raw_run_ids, redact)
    return [in_utc(records) for records in runs]


def source_name(source: Path) -> str:
    """What the history keeps of the file a run came from: the file with the folder holding it, and above a `junit/`
    folder the results folder or artifact it is in (`matrix-ds0.19.8/junit/matrix.xml`, `results/junit/matrix.xml`);
    never the folders of the machine that merged it."""
    parts = source.absolute().parts[1:]
    return "/".join(parts[-3:] if len(parts) > 2 and parts[-2] == "junit" else parts[-2:])


def admitted_bytes(junit: bytes, scratch: Path, redact: Redact) -> list[RunRecords]:
    """The runs of a JUnit file's bytes (an archive entry of format 1), through the same door as a merged file."""
    staged = scratch / "junit.xml"
    staged.write_bytes(junit)
    return admit(staged, redact)


def _check_cells_beside(junit: Path, run_ids: set[str], redact: Redact) -> None:
    """The records of these runs in the cells.jsonl of the results folder the JUnit file came from
    (`<results>/junit/`): each a cell record whose values pass the same rules as the JUnit's. The archive keeps the
    JUnit's records (the same fields, README.md "Results"), so a file beside it that contradicts the rules is a sign
    the folder was not written by the harness: the JUnit file is skipped."""
    folder = junit.parent
    results_dir = folder.parent if folder.name == "junit" else folder
    cells = results_dir / "cells.jsonl"
    if not cells.exists():
        return
    try:
        records = read_records(results_dir)
    except MalformedRecord as error:
        raise Rejected(junit, f"the cells.jsonl beside it: {error}") from None
    except (OSError, ValueError) as error:  # a folder named cells.jsonl, bytes that are not UTF-8
        raise Rejected(junit, f"{cells}: not a readable cells.jsonl ({error})") from None
    for record in records:
        run = record.get("run")
        if not isinstance(run, dict) or run.get("id") not in run_ids or record.get("faults"):
            continue  # another run's record (a results folder keeps every run's), or a harness self-test's
        problem = _record_problem(record, redact)
        if problem is not None:
            raise Rejected(junit, f"{cells}: the record of cell {_cell_id(record)!r}: {problem}")


def _cell_id(record: JSONObject) -> str:
    cell = record.get("cell")
    return str(cell.get("id", "?"))[:100] if isinstance(cell, dict) else "?"


class _NotTyped(Exception):
    def __init__(self, problem: Problem) -> None:
        self.problem = problem


def _record_problem(record: JSONObject, redact: Redact) -> Problem | None:
    """The first value of a cells.jsonl record that is not what the harness writes: its fields typed as the JUnit's
    (CellKey, CellResult, CellDetail, Versions), redacted, and checked by the same rules."""
    try:
        cell_fields = _get(record, "cell", dict, "cell")
        cell = CellKey(
            model=_get(cell_fields, "model", str, "cell.model"),
            variant=_get(cell_fields, "variant", str, "cell.variant"),
            dtype=_get(cell_fields, "dtype", str, "cell.dtype"),
            tp=_integer(_get(cell_fields, "tp", (str, int), "cell.tp"), "cell.tp"),
        )
        if cell.id != cell_fields.get("id"):
            return Problem("cell.id", cell_fields.get("id"), f"does not match its parts ({shown(cell.id)})")
        checkpoint = _get(record, "checkpoint", dict, "checkpoint", {})
        typed = [
            CellResult(
                run_id=_get(_get(record, "run", dict, "run"), "id", str, "run.id"),
                cell=cell,
                outcome=_get(record, "outcome", str, "outcome"),
                failure_class=_get(record, "failure_class", str, "failure_class", ""),
                signature=_get(record, "signature", str, "signature", ""),
                message=_get(record, "message", str, "message", ""),
                metrics=_get(record, "metrics", dict, "metrics", {}),
                checkpoints=tuple(_get(record, "checkpoints", list, "checkpoints", [])),
            ),
            CellDetail(
                cell,
                checkpoint_source=_get(checkpoint, "source", str, "checkpoint.source", ""),
                checkpoint_revision=_get(checkpoint, "revision", str, "checkpoint.revision", ""),
                logs=_get(record, "logs", str, "logs", ""),
            ),
            Versions(**{key: _get(record["versions"], key, str, f"version.{key}") for key in _versions(record)}),
        ]
    except _NotTyped as error:
        return error.problem
    except TypeError as error:  # a version axis Versions does not have, or one it needs missing
        return Problem("versions", record.get("versions"), f"are not the version axes a session records ({error})")
    found = [problem for item in typed for problem in problems_of(redact_fields(item, redact))]
    return found[0] if found else None


_MISSING = object()


def _get(mapping: JSONObject, key: str, kind: Kind, field: str, default: Any = _MISSING) -> Any:
    value = mapping.get(key, default)
    if value is _MISSING:
        raise _NotTyped(Problem(field, None, "is missing"))
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _NotTyped(Problem(field, value, f"is not {_kind_text(kind)}"))
    return value


def _kind_text(kind: Kind) -> str:
    names = {str: "text", int: "an integer", dict: "a table", list: "a list"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _integer(value: str | int, field: str) -> int:
    if isinstance(value, int):
        return value
    if not value.isascii() or not value.isdigit() or len(value) > 9:
        raise _NotTyped(Problem(field, value, "is not an integer"))
    return int(value)


def _versions(record: JSONObject) -> list[str]:
    versions = _get(record, "versions", dict, "versions")
    return list(versions)

"""Every record the harness writes as JSON comes back the same through `read_record(cls, write_record(record))`: the
records are found by walking the packages for dataclasses whose fields JSON can hold (text, numbers, literals,
containers and records of them), so a new record is covered without being named here. Each gets an instance built
from its type hints, with every container holding one item and every optional field set, so each field is written
and read."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

from matrix import PROJECT_ROOT
from matrix.json_records import read_record, write_record
from reports.outputs.support import LEVELS
from reports.store import AXES

PACKAGES = ("matrix", "suites", "sessions", "reports")
READ_WITH_CONTEXT = {
    "reports.analysis.causes.RootCause": "RootCause.from_json derives `elsewhere` from the latest versions",
    "reports.outputs.model.Report": "read_report finds a bisection's cell, named by its id, in the timeline",
}
"""Records whose JSON leaves out what the reader derives from its context (tested by their own readers)."""


KEYED = {
    ("TestedAt", "versions"): {axis: "1.0" for axis in AXES},
    ("SupportedModels", "levels"): {level: ("family",) for level in LEVELS},
}
"""Objects whose keys are a fixed set that report.json flattens into their parent (the examples' "key" would not
come back apart from the parent's own keys)."""


class NotJSON(Exception):
    """A hint JSON holds no value of (a tensor, Any, a callable): the record is no JSON record."""


def _value(hint: Any, seen: tuple[type, ...]) -> object:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return "any JSON value"
    if origin is Literal:
        return args[0]
    if origin in (Union, UnionType):
        return _value(next(arg for arg in args if arg is not NoneType), seen)
    if origin is tuple:
        return tuple(_value(arg, seen) for arg in (args[:1] if args[-1] is Ellipsis else args))
    if origin is list:
        return [_value(args[0], seen)]
    if origin is dict and args[0] is str:
        return {"key": _value(args[1], seen)}
    if isinstance(hint, type) and is_dataclass(hint):
        return _instance(hint, seen)
    examples: dict[Any, object] = {str: "text", int: 3, float: 0.5, bool: True}
    if hint in examples:
        return examples[hint]
    raise NotJSON(hint)


def _instance(cls: type, seen: tuple[type, ...] = ()) -> object:
    if cls in seen:
        raise NotJSON(cls)  # a record that holds itself: none of the harness's
    try:
        hints = get_type_hints(cls)
    except NameError as unresolved:  # a hint only the type checker reads: read_record cannot read it either
        raise NotJSON(cls) from unresolved
    values = {
        f.name: KEYED.get((cls.__name__, f.name)) or _value(hints[f.name], (*seen, cls)) for f in fields(cls) if f.init
    }
    return cls(**values)


def _json_records() -> dict[str, type]:
    """Every JSON record of the packages by its qualified name. Every module is imported for the walk in a process of
    its own (some set process-wide state when imported: the rank groups a later test forks would inherit it); this
    process imports only the modules that define a record."""
    walk = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(1, {str(Path(__file__).parent)!r}); {WALK}"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "AUTOTP_RECORD_WALK": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    records = {}
    answer = next(line for line in walk.stdout.splitlines() if line.startswith(WALK_MARK))
    for name in answer.removeprefix(WALK_MARK).split():
        module, _, qualname = name.rpartition(".")
        records[name] = getattr(importlib.import_module(module), qualname)
    return records


WALK_MARK = "records:"
WALK = f"import {Path(__file__).stem} as walk; print({WALK_MARK!r}, *walk.walked_records())"
"""The walk's answer is its marked line: a module may print when imported (DeepSpeed logs its accelerator)."""


def walked_records() -> list[str]:
    """The qualified names of the packages' JSON records (run in a child process by _json_records)."""
    found: dict[str, type] = {}
    for package in PACKAGES:
        for module in pkgutil.walk_packages([str(PROJECT_ROOT / package)], f"{package}."):
            if module.name.endswith(("test_autotp", "__main__")):  # a test module, a command run on import
                continue
            for value in vars(importlib.import_module(module.name)).values():
                if isinstance(value, type) and is_dataclass(value) and value.__module__ == module.name:
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    records = []
    for name, cls in sorted(found.items()):
        try:
            _instance(cls)
        except NotJSON:
            continue
        except (ValueError, TypeError):  # its own rules refuse the example values: still a record, which fails below
            pass
        records.append(name)
    return records


RECORDS = {} if os.environ.get("AUTOTP_RECORD_WALK") else _json_records()  # the walk's own process: none


def test_the_walk_finds_the_records_written_as_json() -> None:
    """The records of cells.jsonl, a rank's files, what a training rank hands rank 0 and report.json are among those
    found (the walk can fail)."""
    assert {
        "suites.verdicts.outcome.CellOutcome",
        "suites.verdicts.outcome.RankError",
        "suites.verdicts.mechanism.AutoTPRecord",
        "suites.checks.contracts.Job",
        "suites.checks.contracts.ComparisonRecord",
        "reports.outputs.model.Report",
        "reports.analysis.answers.TransitionEntry",
    } <= set(RECORDS)


@pytest.mark.parametrize("name", sorted(set(RECORDS) - set(READ_WITH_CONTEXT)))
def test_every_record_round_trips(name: str) -> None:
    record = _instance(RECORDS[name])
    written = json.loads(json.dumps(write_record(record)))  # type: ignore[arg-type]
    assert read_record(RECORDS[name], written) == record

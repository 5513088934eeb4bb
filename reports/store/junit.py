"""Read session JUnit files (README.md "Results") into runs and cell results."""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import cast

from junitparser import Error, Failure, JUnitXmlError, Skipped
from junitparser.xunit2 import JUnitXml, TestCase
from reports import ReportsError
from reports.store.records import AXES, CellKey, CellResult, Run, Versions, deepspeed_git_of, release
from suites.mechanism import WHOSE, AutoTPRecord, BreakPoint, Cause
from suites.outcome import FAILURE_CLASSES

# What an install failure records where no version exists yet (matrix.versions.Pin.label): a git ref as
# written (pr/1234, master, a sha) or local-<folder>.
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]*")
# Every field reports print outside a code span is checked here (publish posts them to GitHub, where a field
# like `@org/team ![x](https://…)` would notify people and load images): names of models, variants and dtypes
# (registry keys, transformers model types), a commit, and the failure class from its known set.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-fA-F]{4,40}")
KNOWN_FAILURE_CLASSES = (*FAILURE_CLASSES, "unknown")  # unknown: a failure whose JUnit names no class


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


def read_junit(path: Path) -> list[tuple[Run, list[CellResult]]]:
    """Return each run in the file with its cell results; raise MalformedJUnit if unusable."""
    try:
        xml = JUnitXml.fromfile(str(path))
    except JUnitXmlError:
        raise MalformedJUnit(path, "not a JUnit file (root element is not <testsuites> or <testsuite>)") from None
    except Exception as exc:  # the XML parser (lxml or ElementTree) raises its own types
        raise MalformedJUnit(path, f"unreadable XML ({exc}); the session was probably interrupted") from None

    runs: dict[str, Run] = {}
    results: dict[str, list[CellResult]] = {}
    for suite in xml:
        for case in suite:
            # An xunit2 suite yields xunit2 test cases (which carry properties); junitparser types them as the base.
            props = {p.name: p.value or "" for p in cast(TestCase, case).properties()}
            if "cell.id" not in props:
                continue  # a test that is not an autotp cell (e.g. a helper test in the same session)
            if props.get("faults"):
                continue  # a harness self-test with injected faults: never a verdict about DeepSpeed
            where = f"testcase {case.name!r}"
            run = _run_from(props, path, where)
            known = runs.setdefault(run.run_id, run)
            if known != run:
                raise MalformedJUnit(
                    path, f"{where}: run {run.run_id!r} has different provenance than earlier testcases"
                )
            results.setdefault(run.run_id, []).append(_result_from(case, props, run.run_id, path, where))
    if not runs:
        raise MalformedJUnit(path, "contains no autotp cells (no testcase has a 'cell.id' property)")
    return [(runs[run_id], results[run_id]) for run_id in runs]


_OPTIONAL_AXES = {field.name for field in fields(Versions) if field.default is not MISSING}


def _require(props: dict[str, str], name: str, path: Path, where: str) -> str:
    value = props.get(name, "").strip()
    if not value:
        raise MalformedJUnit(path, f"{where}: property {name!r} is missing or empty")
    return value


def _run_from(props: dict[str, str], path: Path, where: str) -> Run:
    # An axis added after records were first written has a default in Versions ("": not recorded then), so files
    # from before it exist may lack it; every other axis must be there.
    versions = {
        axis: _require(props, f"version.{axis}", path, where)
        for axis in AXES
        if f"version.{axis}" in props or axis not in _OPTIONAL_AXES
    }
    for axis, value in versions.items():
        if release(value) is None and not _LABEL.fullmatch(value):
            raise MalformedJUnit(
                path,
                f"{where}: version.{axis}={value!r} is not a PEP 440 version, nor a git ref or local-<folder> "
                "label, so it cannot be ordered",
            )
    harness_git = props["run.harness_git"].strip() if "run.harness_git" in props else None  # None: an old file
    deepspeed_git = deepspeed_git_of(versions["deepspeed"], props.get("version.deepspeed_git", "").strip(), harness_git)
    if deepspeed_git and not _COMMIT.fullmatch(deepspeed_git):
        raise MalformedJUnit(path, f"{where}: version.deepspeed_git={deepspeed_git!r} is not a git commit (hex)")
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


def _result_from(case, props: dict[str, str], run_id: str, path: Path, where: str) -> CellResult:
    try:
        cell = CellKey(
            model=_require(props, "cell.model", path, where),
            variant=_require(props, "cell.variant", path, where),
            dtype=_require(props, "cell.dtype", path, where),
            tp=int(_require(props, "cell.tp", path, where)),
        )
    except ValueError:
        raise MalformedJUnit(path, f"{where}: cell.tp={props['cell.tp']!r} is not an integer") from None
    if cell.id != props["cell.id"]:
        raise MalformedJUnit(path, f"{where}: cell.id={props['cell.id']!r} does not match its parts ({cell.id!r})")
    for part in ("model", "variant", "dtype"):
        if not _NAME.fullmatch(getattr(cell, part)):
            raise MalformedJUnit(
                path, f"{where}: cell.{part}={getattr(cell, part)!r} is not a name (letters, digits, '.', '_', '-')"
            )

    checkpoints = tuple(props["checkpoints"].split(",")) if props.get("checkpoints") else ()
    for hub_id in checkpoints:
        if not _HUB_ID.fullmatch(hub_id):
            raise MalformedJUnit(
                path,
                f"{where}: checkpoints={props['checkpoints']!r} is not a comma-separated list of hub ids (owner/name)",
            )
    # The JUnit result element is the authoritative outcome; properties add the detail.
    problems = [r for r in case.result if isinstance(r, (Failure, Error))]
    if problems:
        message = problems[0].message or ""
        prefix, _, rest = message.partition(": ")
        failure_class = props.get("failure_class") or (prefix if rest and prefix in FAILURE_CLASSES else "unknown")
        if failure_class not in KNOWN_FAILURE_CLASSES:
            raise MalformedJUnit(
                path, f"{where}: failure_class={failure_class!r} is not one of {', '.join(KNOWN_FAILURE_CLASSES)}"
            )
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
    if skipped:
        return CellResult(
            run_id=run_id, cell=cell, outcome="skip", message=skipped[0].message or "", checkpoints=checkpoints
        )
    return CellResult(
        run_id=run_id, cell=cell, outcome="pass", metrics=_metrics_from(props, path, where), checkpoints=checkpoints
    )


def _mechanism_from(props: dict[str, str], path: Path, where: str) -> dict:
    """A failure's cause, where it broke and what AutoTP did (suites/mechanism.py), where the file records them."""
    found: dict = {}
    try:
        if props.get("cause.key"):
            found["cause"] = Cause(props["cause.key"], props.get("cause.words", ""), props.get("cause.whose", ""))
            if found["cause"].whose not in WHOSE:
                raise ValueError(f"cause.whose={found['cause'].whose!r} is not one of {', '.join(WHOSE)}")
        if props.get("broke_at.path") is not None and props.get("broke_at.how"):
            found["broke_at"] = BreakPoint.from_dict(
                {name: props.get(f"broke_at.{name}", "") for name in BreakPoint.__dataclass_fields__}
            )
        if props.get("autotp"):
            found["autotp"] = AutoTPRecord.from_dict(json.loads(props["autotp"]))
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
                metrics[name.removeprefix("metric.")] = float(value)
            except ValueError:
                raise MalformedJUnit(path, f"{where}: {name}={value!r} is not a number") from None
    return metrics

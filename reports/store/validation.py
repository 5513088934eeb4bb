"""What every value of a run may be, checked at the door (reports.store.door) before anything is written: every field of
the records (Run, Versions, CellKey, CellResult, CellDetail, RunRecords) has one rule here, named after the JUnit
property it is read from (README.md "Results"), and a record class that gains a field without one fails at import.

Names that become path components, markup outside code spans or SQLite integers are held to a character set, a length
and a range: a session or run id names the archive's folders and files, so `..` or a 10,000-character name could
write outside the archive or fail every later rebuild; a tp past SQLite's integers, or an infinite metric, would be
archived and then break the store or the report. Free text (messages, signatures) is any UTF-8 up to a length."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from packaging.version import InvalidVersion, Version

from matrix.json_records import write_record
from reports.store.junit import KNOWN_FAILURE_CLASSES, shown
from reports.store.records import (
    AXES,
    Bisection,
    CellDetail,
    CellKey,
    CellResult,
    Commit,
    Run,
    RunRecords,
    TriageAttempt,
    Versions,
)
from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import WHOSE, AutoTPRecord, BreakPoint
from suites.verdicts.vocabulary import OUTCOMES

Rule = Callable[[Any], "str | None"]
"""A value's problem in words ("is not a name (...)"), None when it is fine."""

# A name reports print outside code spans and logs and repro scripts use in file names: registry keys, variants,
# dtypes, accelerators (publish posts them to GitHub, where `@org/team ![x](https://…)` would notify and load).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# An id that names a folder or file of the archive (percent-encoded there): a session, a run id (session@start@host)
# and the host in it. It starts with a letter or digit, so `.`, `..` and hidden names cannot be made; `*` is what
# redaction leaves of a secret.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@()+,=*~-]*")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-fA-F]{4,40}")
_HARNESS_COMMIT = re.compile(r"[0-9a-fA-F]{4,40}(-dirty)?")
# What an install failure records where no version exists yet (matrix.version_axes.Pin.label): a git ref as written
# (pr/1234, master, a sha) or local-<folder>.
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]*")
# ASCII digits only (`\d` would pass Arabic-Indic ones, which int() reads and a text comparison sorts apart).
_VERSION_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!/-]*", re.ASCII)
_STARTED = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"(?:T(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})(?:\.[0-9]{1,9})?)?)?"
    r"(?P<zone>Z|(?P<sign>[+-])(?P<zone_hours>[0-9]{2}):?(?P<zone_minutes>[0-9]{2}))?",
    re.ASCII,
)
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]*")
_DAY = re.compile(r"[0-9][0-9A-Za-z:.+-]*")
_METRIC = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# A file of a library's tree a commit touched (an answer's files): path components, none of them `.` or `..`.
_REPO_FILE = re.compile(r"(?!\.\.?(?:/|$))[A-Za-z0-9_.+-]+(?:/(?!\.\.?(?:/|$))[A-Za-z0-9_.+-]+)*")

NAME_LENGTH = 100
MAX_PR = 10**9
MAX_ANSWER_ITEMS = 10_000  # files, untestable candidates and suspects of one answer
ID_LENGTH = 200
SIGNATURE_LENGTH = 4_000
MESSAGE_LENGTH = 1_000_000  # a failure's traceback and rank log tails; the default matrix's longest is 4 KB
MAX_TP = 1024
EARLIEST_YEAR = 2000  # a start before this is a runner's clock gone wrong
CLOCK_SKEW = timedelta(days=1)  # a start may lie this far past the time it is imported at, never further
MAX_METRIC = 1e18  # byte counts of the largest hosts are ~1e12; ratios and tolerances are small
MAX_METRICS = 1_000
MAX_CHECKPOINTS = 64
MECHANISM_BYTES = 1_000_000  # what AutoTP did to one model as JSON: the default matrix's largest is ~60 KB


@dataclass(frozen=True)
class Problem:
    """The first value of a file that fails its rule."""

    field: str  # the JUnit property it came from: cell.model, run.id, metric.logits_max_abs, ...
    value: Any
    reason: str
    where: str = ""  # the cell whose value it is ("cell llama-eager-fp32-tp2"), "" for a run's

    def __str__(self) -> str:
        return f"{self.where + ': ' if self.where else ''}{self.field}={_shown(self.value)} {self.reason}"


def _shown(value: Any) -> str:
    """The value as the JUnit file writes it (a list comma-separated), quoted as Python writes strings, cut to a
    screen line: the file is named beside it."""
    if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
        value = ",".join(value)
    return shown(value)


# ---- rules ---------------------------------------------------------------------------------------------------------


def _text(limit: int, *, one_line: bool = False) -> Rule:
    """Free text: any characters a traceback or log holds (tabs, colour escapes), but no NUL (SQLite and C strings
    end there) and nothing UTF-8 cannot encode (the store, the archive and every output are UTF-8)."""

    def rule(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"is not text ({type(value).__name__})"
        if len(value) > limit:
            return f"is {len(value)} characters long, more than the {limit} a session writes"
        if "\0" in value:
            return "holds a NUL character"
        if one_line and ("\n" in value or "\r" in value):
            return "spans several lines"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not UTF-8 text (a lone surrogate)"
        return None

    return rule


def _matching(pattern: re.Pattern[str], limit: int, what: str, *, empty: bool = False) -> Rule:
    def rule(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"is not text ({type(value).__name__})"
        if empty and value == "":
            return None
        if len(value) > limit:
            return f"is {len(value)} characters long, more than the {limit} a {what} may have"
        return None if pattern.fullmatch(value) else f"is not a {what}"

    return rule


def _version(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > NAME_LENGTH:
        return f"is not a version of at most {NAME_LENGTH} characters"
    if not _VERSION_TEXT.fullmatch(value):  # PEP 440 parsing forgives spaces and a trailing newline; printing doesn't
        return "is not a version (ASCII letters, digits and . _ + ! / - only, no spaces or line breaks)"
    try:
        Version(value)
        return None
    except InvalidVersion:
        pass
    if _LABEL.fullmatch(value):
        return None
    return "is not a PEP 440 version, nor a git ref or local-<folder> label, so it cannot be ordered"


def started_utc(text: str) -> datetime:
    """A run's start as the door reads it: ISO 8601 in ASCII digits, a date alone at midnight, no zone read as UTC,
    in UTC to the second; ValueError when it is not one."""
    parts = _STARTED.fullmatch(text)
    if parts is None:
        raise ValueError("is not a start time (ISO 8601, e.g. 2026-12-06T07:26:44Z)")
    zone = timezone.utc
    if parts["sign"]:
        offset = timedelta(hours=int(parts["zone_hours"]), minutes=int(parts["zone_minutes"]))
        zone = timezone(-offset if parts["sign"] == "-" else offset)  # ValueError past 24 h
    year, month, day, hour, minute, second = (
        int(parts[name] or 0) for name in ("year", "month", "day", "hour", "minute", "second")
    )
    local = datetime(year, month, day, hour, minute, second, tzinfo=zone)
    return local.astimezone(timezone.utc)


def utc_text(moment: datetime) -> str:
    """The one spelling of a start the store and the archive keep: 2026-12-06T07:26:44Z (text order is time order)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _started(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 40:
        return "is not a start time of at most 40 characters"
    try:
        moment = started_utc(value)
    except ValueError as error:
        return str(error) if "start time" in str(error) else f"is not a time ({error})"
    if moment.year < EARLIEST_YEAR:
        return f"is before {EARLIEST_YEAR}: the runner's clock was wrong"
    latest = datetime.now(timezone.utc) + CLOCK_SKEW
    if moment > latest:
        return f"is after {utc_text(latest)}, a day past the time it is read at: the runner's clock was wrong"
    return None


def _tp(value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return "is not an integer"
    return None if 1 <= value <= MAX_TP else f"is not a tensor-parallel size from 1 to {MAX_TP}"


def _outcome(value: Any) -> str | None:
    return None if value in OUTCOMES else f"is not one of {', '.join(OUTCOMES)}"


def _failure_class(value: Any) -> str | None:
    if value == "":
        return None
    return None if value in KNOWN_FAILURE_CLASSES else f"is not one of {', '.join(KNOWN_FAILURE_CLASSES)}"


def _metrics(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "is not a table of metrics"
    if len(value) > MAX_METRICS:
        return f"holds {len(value)} metrics, more than the {MAX_METRICS} a cell records"
    for name, number in value.items():
        if not isinstance(name, str) or len(name) > NAME_LENGTH or not _METRIC.fullmatch(name):
            return f"names a metric {_shown(name)}, which is not a metric name"
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            return f"gives {name} a value that is not a number"
        if not math.isfinite(number) or abs(number) > MAX_METRIC:
            return f"gives {name} the value {number!r}, not a finite number within ±{MAX_METRIC:g}"
    return None


def _checkpoints(value: Any) -> str | None:
    if not isinstance(value, tuple) or len(value) > MAX_CHECKPOINTS:
        return f"is not a list of at most {MAX_CHECKPOINTS} hub ids"
    rule = _matching(_HUB_ID, ID_LENGTH, "hub id (owner/name)")
    for hub_id in value:
        if problem := rule(hub_id):
            return f"lists {_shown(hub_id)}, which {problem}"
    return None


def _checkpoint_source(value: Any) -> str | None:
    return None if value in ("", "tiny") else _matching(_HUB_ID, ID_LENGTH, "hub id (owner/name) or 'tiny'")(value)


def _mechanism(cls: type[Cause] | type[BreakPoint] | type[AutoTPRecord]) -> Rule:
    """A failure's cause, break point or AutoTP record (suites/verdicts/mechanism.py), or none: every text in it one
    line of at most SIGNATURE_LENGTH (reports print its words and paths), a cause's `whose` one of WHOSE, the whole
    bounded."""
    line = _text(SIGNATURE_LENGTH, one_line=True)

    def texts(value: Any) -> list[Any]:
        if isinstance(value, dict):
            return [text for item in value.values() for text in texts(item)]
        if isinstance(value, (list, tuple)):
            return [text for item in value for text in texts(item)]
        return [value] if isinstance(value, str) else []

    def rule(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, cls):
            return f"is not a {cls.__name__} record"
        if isinstance(value, Cause) and value.whose not in WHOSE:
            return f"names whose bug it is as {shown(value.whose)}, not one of {', '.join(WHOSE)}"
        data = write_record(value)  # as stored
        if len(repr(data)) > MECHANISM_BYTES:
            return f"is more than the {MECHANISM_BYTES} characters a session writes"
        return next((f"holds a text that {problem}" for text in texts(data) if (problem := line(text))), None)

    return rule


def _run_id(value: Any) -> str | None:
    return _matching(_ID, ID_LENGTH, "run id (session@start@host: letters, digits and ._:@()+,=~-)")(value)


# Names Windows gives its devices, whatever follows a dot: a folder named so cannot be checked out there.
_DEVICE_NAME = re.compile(r"(?:CON|PRN|AUX|NUL|COM[0-9]|LPT[0-9]|CONIN\$|CONOUT\$)(?:\..*)?", re.IGNORECASE | re.ASCII)
_SESSION = _matching(_ID, NAME_LENGTH, "session name (letters, digits, ._()+,=@-)", empty=True)


def _session(value: Any) -> str | None:
    """A session names the archive's folder its runs are kept in: one every OS can check out (no device name such
    as `nul` or `CON`, nothing ending in `.`); case twins are refused where they meet (ResultsArchive.add)."""
    if problem := _SESSION(value):
        return problem
    if _DEVICE_NAME.fullmatch(value):
        return "is a device name on Windows, so its archive folder could not be checked out there"
    if value.endswith("."):
        return "ends in '.', which Windows drops from a folder's name"
    return None


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "is not true or false"


_NAME_RULE = _matching(_NAME, NAME_LENGTH, "name (letters, digits, '.', '_', '-')")


def _one_of(*allowed: str) -> Rule:
    return lambda value: None if value in allowed else f"is not one of {', '.join(map(repr, allowed))}"


def _pr(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_PR:
        return f"is not a pull request number from 1 to {MAX_PR}"
    return None


def _each(rule: Rule, what: str) -> Rule:
    """A tuple of values, each passing `rule`, at most MAX_ANSWER_ITEMS of them."""

    def each(value: Any) -> str | None:
        if not isinstance(value, tuple) or len(value) > MAX_ANSWER_ITEMS:
            return f"is not a list of at most {MAX_ANSWER_ITEMS} {what}s"
        return next((f"lists {_shown(item)}, which {problem}" for item in value if (problem := rule(item))), None)

    return each


def _pins(value: Any) -> str | None:
    if not isinstance(value, tuple) or len(value) > len(AXES):
        return "is not a list of pinned version axes"
    for pin in value:
        if not isinstance(pin, tuple) or len(pin) != 2 or pin[0] not in AXES:
            return f"pins {_shown(pin)}, which is not an axis ({', '.join(AXES)}) and its version"
        if problem := _version(pin[1]):
            return f"pins {pin[0]} to {_shown(pin[1])}, which {problem}"
    return None


_ANSWER_VERSION = _version
_COMMIT_RULE = _matching(_COMMIT, 40, "git commit (hex)", empty=True)
_ANSWER_CELL = _matching(_ID, ID_LENGTH, "cell id", empty=True)
_RECORDED_AT = _matching(_DAY, 40, "time (ISO 8601)", empty=True)

# Every field of every record, by class: (the JUnit property it is read from, its rule). A nested record (a Run's
# Versions, a result's CellKey) is checked by its own class's rules.
RULES: dict[type, dict[str, tuple[str, Rule]]] = {
    CellKey: {
        "model": ("cell.model", _NAME_RULE),
        "variant": ("cell.variant", _NAME_RULE),
        "dtype": ("cell.dtype", _NAME_RULE),
        "tp": ("cell.tp", _tp),
    },
    Versions: {
        "deepspeed": ("version.deepspeed", _version),
        "transformers": ("version.transformers", _version),
        "torch": ("version.torch", _version),
        "python": ("version.python", _version),
        "deepspeed_git": ("version.deepspeed_git", _matching(_COMMIT, 40, "git commit (hex)", empty=True)),
    },
    Run: {
        "run_id": ("run.id", _run_id),
        "session": ("run.session", _session),
        "host": ("run.host", _matching(_ID, NAME_LENGTH, "host name (letters, digits, ._-)", empty=True)),
        "started": ("run.started", _started),
        "accelerator": ("run.accelerator", _matching(_NAME, NAME_LENGTH, "name", empty=True)),
        "backend": ("run.backend", _matching(_NAME, NAME_LENGTH, "name", empty=True)),
        "harness_git": ("run.harness_git", _matching(_HARNESS_COMMIT, 47, "git commit (hex)", empty=True)),
        "trusted": ("trusted", _bool),
    },
    CellResult: {
        "run_id": ("run.id", _run_id),
        "outcome": ("outcome", _outcome),
        "failure_class": ("failure_class", _failure_class),
        "signature": ("signature", _text(SIGNATURE_LENGTH)),
        "message": ("message", _text(MESSAGE_LENGTH)),
        "metrics": ("metric.*", _metrics),
        "checkpoints": ("checkpoints", _checkpoints),
        "cause": ("cause.*", _mechanism(Cause)),
        "broke_at": ("broke_at.*", _mechanism(BreakPoint)),
        "autotp": ("autotp", _mechanism(AutoTPRecord)),
    },
    CellDetail: {
        "checkpoint_source": ("checkpoint.source", _checkpoint_source),
        "checkpoint_revision": (
            "checkpoint.revision",
            _matching(_REVISION, NAME_LENGTH, "revision (a commit or sha256:<hash>)", empty=True),
        ),
        "logs": ("logs", _text(1_000, one_line=True)),
    },
    RunRecords: {
        "dependencies_as_of": (
            "run.dependencies_as_of",
            _matching(_DAY, 40, "day or time (ISO 8601)", empty=True),
        ),
    },
}
# An answer of bisect or triage, archived and read back (reports.store.archive): the same door as a run's records, so
# a commit becomes a link only where it is hex and a cell's tp is one a session runs.
RULES |= {
    Commit: {
        "sha": ("commit.sha", _matching(_COMMIT, 40, "git commit (hex)")),
        "subject": ("commit.subject", _text(SIGNATURE_LENGTH)),
        "pr": ("commit.pr", _pr),
        "files": ("commit.files", _each(_matching(_REPO_FILE, 1_000, "file of a repository"), "file")),
        "relevant": ("commit.relevant", _bool),
    },
    Bisection: {
        "mode": ("mode", _one_of("broken", "fixed")),
        "axis": ("axis", _one_of(*AXES)),
        "before": ("before", _ANSWER_VERSION),
        "after": ("after", _ANSWER_VERSION),
        "held_fixed": ("held_fixed", _pins),
        "failure_class": ("failure_class", _failure_class),
        "signature": ("signature", _text(SIGNATURE_LENGTH)),
        "commit": ("commit", _COMMIT_RULE),
        "subject": ("subject", _text(SIGNATURE_LENGTH)),
        "pr": ("pr", _pr),
        "files": ("files", _each(_matching(_REPO_FILE, 1_000, "file of a repository"), "file")),
        "untestable": ("untestable", _each(_ANSWER_VERSION, "version")),
        "recorded_at": ("recorded_at", _RECORDED_AT),
        "confirmed_from": ("confirmed_from", _ANSWER_CELL),
        "kind": ("kind", _one_of("broke", "fixed", "class-change", "supported", "")),
        "searched_older": ("searched_older", lambda value: None if value == "" else _ANSWER_VERSION(value)),
        "searched_newer": ("searched_newer", lambda value: None if value == "" else _ANSWER_VERSION(value)),
    },
    TriageAttempt: {
        "axis": ("axis", _one_of(*AXES)),
        "mode": ("mode", _one_of("broken", "fixed")),
        "before": ("before", _ANSWER_VERSION),
        "after": ("after", _ANSWER_VERSION),
        "held_fixed": ("held_fixed", _pins),
        "reason": ("reason", _text(SIGNATURE_LENGTH)),
        "recorded_at": ("recorded_at", _RECORDED_AT),
    },
}
# Fields checked by the classes they hold (or, for a result's and a detail's cell, by their run and results).
_NESTED = {(Run, "versions"), (CellResult, "cell"), (CellDetail, "cell"), (RunRecords, "run"), (RunRecords, "results")}
_NESTED |= {(RunRecords, "details"), (Bisection, "cell"), (Bisection, "suspects"), (TriageAttempt, "cell")}


def _every_field_has_a_rule() -> None:
    for cls, rules in RULES.items():
        unruled = [f.name for f in fields(cls) if f.name not in rules and (cls, f.name) not in _NESTED]
        if unruled:
            raise AssertionError(f"{cls.__name__} fields without a rule in reports/store/validation.py: {unruled}")


_every_field_has_a_rule()


def problems_of(record: Any) -> list[Problem]:
    """Every field of a record (and of the records it holds) that fails its rule, in field order; a result's or a
    detail's names its cell."""
    cell = getattr(record, "cell", None)
    where = f"cell {_shown(cell.id)[1:-1]}" if isinstance(cell, CellKey) and isinstance(cell.id, str) else ""
    found = []
    for field in fields(record):
        value = getattr(record, field.name)
        if (type(record), field.name) in _NESTED:
            for nested in value if isinstance(value, tuple) else (value,):
                if is_dataclass(nested) and type(nested) in RULES:
                    found += [replace(p, where=p.where or where) for p in problems_of(nested)]
                else:
                    found.append(Problem(field.name, nested, f"is not a {field.name} record", where))
            continue
        name, rule = RULES[type(record)][field.name]
        if problem := rule(value):
            found.append(Problem(name, value, problem, where))
    return found


def in_utc(records: RunRecords) -> RunRecords:
    """A valid run with its start in the one spelling (utc_text): what merge stores and archives, and what an entry
    written before it read back as, so runs compare and sort by time wherever their start was written."""
    started = utc_text(started_utc(records.run.started))
    return records if started == records.run.started else replace(records, run=replace(records.run, started=started))


def first_problem(records: RunRecords) -> Problem | None:
    """The first value of a run that fails its rule, or that contradicts the run (a result of another run, a failure
    class on a cell that did not fail, a detail of a cell without a result)."""
    found = problems_of(records)
    if found:
        return found[0]
    run = records.run
    cells = set()
    for result in records.results:
        if result.run_id != run.run_id:
            return Problem("run.id", result.run_id, f"differs from its run's {shown(run.run_id)}")
        if result.outcome == "fail" and not result.failure_class:
            return Problem("failure_class", "", f"is empty on the failing cell {result.cell.id}")
        if result.outcome != "fail" and result.failure_class:
            return Problem(
                "failure_class", result.failure_class, f"is set on the cell {result.cell.id}, which did not fail"
            )
        cells.add(result.cell)
    for detail in records.details:
        if detail.cell not in cells:
            return Problem("cell.id", detail.cell.id, "has details but no result in this run")
    return None

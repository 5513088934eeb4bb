"""The door for `nox -s remedy`'s results (`<results>/remedies.json`, matrix/remedies.py `RemedyResult`): what a
report states as a cause's proof, so the file is hostile input like a runner's JUnit. Each file is read (a regular
file, bounded), typed (matrix.json_records), redacted (one redactor, every text) and validated before anything of it
is stored or archived; one that fails is refused whole, the error naming the file, the entry, the field and what to
do. A result must name where it was taken (`TakenAt`: DeepSpeed release or commit, harness revision, time): a file
written before the field existed takes it from the runs beside it (`<results>/remedy/without`), else it is refused.

What is checked: the remedy is one of matrix/remedies.toml, of its kind; a patch's result was taken at the release
its diff is against; a verified result's fixed cells are every one of its cause cells and no other verdict changed;
every cell is one of its cause models'; numbers are not negative; texts have no NUL and fit their bounds."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from pathlib import Path

from matrix import PROJECT_ROOT
from matrix.json_records import RecordError, read_record
from matrix.remedies import REMEDIES_FILE, RESULTS_NAME, Remedy, RemedyResult, TakenAt, load_remedies
from reports import ReportsError
from reports.store.door import Redact, Rejected, redact_fields
from reports.store.entry_files import EntryRefused, read_regular
from reports.store.validation import started_utc
from sessions.remedy import taken_at
from suites.records.run_records import MalformedRecord

MAX_RESULTS_BYTES = 16 * 1024 * 1024
"""A remedies.json: a few hundred KB with every patch's diff; one far larger is refused unread."""
TEXT_LENGTH = 1_000_000
"""The longest text of a result (a patch's diff)."""
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*(?:[A-Za-z0-9.+!-]*)", re.ASCII)
_COMMIT = re.compile(r"[0-9a-f]{7,40}(?:-dirty)?", re.ASCII)
_CELL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
WHAT_TO_DO = "re-run `nox -s remedy` with this harness and merge its results folder"


def find_remedy_files(inputs: Iterable[Path]) -> list[Path]:
    """The remedies.json of each input: the file itself, the one in a folder or below it (artifacts hold results
    folders), or the one beside a `junit/` folder given (a session's results folder)."""
    found: list[Path] = []
    for path in inputs:
        if path.name == RESULTS_NAME and not path.is_dir():
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p in path.rglob(RESULTS_NAME) if not p.is_symlink())
            if path.name == "junit" and (path.parent / RESULTS_NAME).exists():
                found.append(path.parent / RESULTS_NAME)
    return list(dict.fromkeys(found))


def admit_remedies(path: Path, redact: Redact) -> list[RemedyResult]:
    """The results of one remedies.json, redacted and validated; Rejected naming the file, the entry and the field
    when anything of it is not what `nox -s remedy` writes."""
    try:
        content = read_regular(path, MAX_RESULTS_BYTES)
    except EntryRefused as error:
        raise Rejected(path, f"not a remedies results file ({error.reason}); {WHAT_TO_DO}") from None
    return admit_remedies_text(path, content, redact)


def admit_remedies_text(path: Path, content: bytes, redact: Redact) -> list[RemedyResult]:
    """The results of a remedies.json's bytes (read from `path`; an archived result is one wrapped in a list),
    through the same door as `admit_remedies`."""
    try:
        entries = json.loads(content)
    except ValueError as error:
        raise Rejected(path, f"not a remedies results file ({error}); {WHAT_TO_DO}") from None
    if not isinstance(entries, list):
        raise Rejected(path, f"not a remedies results file (a list of results), got {type(entries).__name__}")
    known = {remedy.name: remedy for remedy in load_remedies(REMEDIES_FILE, PROJECT_ROOT)}
    beside: TakenAt | None = None
    admitted = []
    for index, entry in enumerate(entries, 1):
        try:
            result = redact_fields(read_record(RemedyResult, entry), redact)
        except RecordError as error:
            raise Rejected(path, f"entry {index}: {error}; {WHAT_TO_DO}") from None
        if not result.taken_at.named and result.status != "not applied":
            beside = beside or _taken_beside(path, redact)
            result = dataclasses.replace(result, taken_at=beside)
        if problem := result_problem(result, known):
            raise Rejected(path, f"entry {index} (remedy {result.remedy[:100]!r}): {problem}")
        admitted.append(result)
    return admitted


def _taken_beside(path: Path, redact: Redact) -> TakenAt:
    """Where a file written before `taken_at` existed was taken: its results folder's runs without a remedy."""
    folder = path.parent / "remedy" / "without"
    try:
        found = redact_fields(taken_at(folder), redact)
    except (MalformedRecord, OSError, ValueError) as error:
        raise Rejected(path, f"its results were taken by the runs of {folder}, which do not read: {error}") from None
    if not found.named:
        raise Rejected(
            path,
            "names no DeepSpeed release, harness revision and time its results were taken at (a file from before "
            f"they were recorded), and {folder} holds no run to read them from; {WHAT_TO_DO}",
        )
    return found


def result_problem(result: RemedyResult, known: dict[str, Remedy]) -> str:
    """The first thing of a typed, redacted result that `nox -s remedy` never writes; "" when there is none."""
    remedy = known.get(result.remedy)
    if remedy is None:
        return f"no [[remedy]] of matrix/remedies.toml is named so (known: {', '.join(sorted(known))}); {WHAT_TO_DO}"
    if result.kind != remedy.kind:
        return f"kind={result.kind!r}, but matrix/remedies.toml makes it a {remedy.kind}"
    return _taken_problem(result, remedy) or _cells_problem(result) or _texts_problem(result)


def _taken_problem(result: RemedyResult, remedy: Remedy) -> str:
    taken = result.taken_at
    if result.status == "not applied" and not taken.named:
        return ""
    if not _VERSION.fullmatch(taken.deepspeed):
        return f"taken_at.deepspeed={taken.deepspeed[:100]!r} is not a DeepSpeed release"
    if remedy.kind == "patch" and taken.deepspeed != remedy.deepspeed:
        return (
            f"taken at DeepSpeed {taken.deepspeed}, but its patch is against {remedy.deepspeed}: the result is not "
            f"this patch's; {WHAT_TO_DO}"
        )
    for name, value in (("deepspeed_git", taken.deepspeed_git), ("harness_git", taken.harness_git)):
        if (value or name == "harness_git") and not _COMMIT.fullmatch(value):
            return f"taken_at.{name}={value[:100]!r} is not a git commit"
    if taken.transformers and not _VERSION.fullmatch(taken.transformers):
        return f"taken_at.transformers={taken.transformers[:100]!r} is not a release"
    try:
        started_utc(taken.recorded_at)
    except ValueError as error:
        return f"taken_at.recorded_at={taken.recorded_at[:100]!r} {error}"
    return ""


def _cells_problem(result: RemedyResult) -> str:
    prefixes = tuple(f"{model}-" for model in result.cause_models)
    for cell in (*result.cause_cells, *result.fixed):
        if not _CELL.fullmatch(cell) or not cell.startswith(prefixes):
            return f"cell {cell[:100]!r} is not a cell of its cause models ({', '.join(result.cause_models)})"
    if not set(result.fixed) <= set(result.cause_cells):
        return "fixed names cells that are not its cause cells"
    if result.seconds < 0 or result.others_compared < 0:
        return "seconds and others_compared are never negative"
    if result.status == "verified" and (
        not result.cause_cells or set(result.fixed) != set(result.cause_cells) or result.changed
    ):
        return (
            f"status 'verified' with {len(result.fixed)} of {len(result.cause_cells)} cause cells passing and "
            f"{len(result.changed)} other verdicts changed: verified means every cause cell passes and none changed"
        )
    return ""


def _texts_problem(result: RemedyResult) -> str:
    texts = (result.summary, result.mechanism, result.how, result.problem, *result.changed, *result.requires)
    for text in texts:
        if "\0" in text or len(text) > TEXT_LENGTH:
            return f"a text ({text[:60]!r}...) holds a NUL or is over {TEXT_LENGTH} characters"
    return ""


def refused_untrusted(path: Path) -> ReportsError:
    """A pull request's remedies.json: never merged (a proof is a claim the report makes; a pull request's runs
    chose it)."""
    return ReportsError(
        f"{path}: a pull request's remedy results are not merged (--untrusted): a cause is proven only by the "
        "history's own `nox -s remedy`"
    )

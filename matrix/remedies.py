"""Remedies: what turns a cause's failing cells green, as data in `matrix/remedies.toml` (one `[[remedy]]` table
each) and DeepSpeed patches in `matrix/remedy_patches/<name>.diff`. A workaround is what a user passes today (an
`injection_policy`, a model keyword, an attention mask); a patch is a unified diff against one DeepSpeed release's
source. `nox -s remedy` (sessions/remedy.py) runs each and records whether it is verified (`RemedyResult`).

A remedy is an axis value of a run, never a baseline: a run with one is kept in the store as its own (untrusted,
never archived) run of a `remedied` session, which no report, draft, gate, since-previous comparison or bisection
ever reads as the library's state."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomllib

from matrix.cell_arguments import NO_ARGUMENTS, CellArguments, ForwardMask, KwargValue
from matrix.toml_tables import NOT_IN_FILE, TableError, read_table, written_as

MATRIX_DIR = Path(__file__).resolve().parent
REMEDIES_FILE = MATRIX_DIR / "remedies.toml"
PATCHES_DIR = MATRIX_DIR / "remedy_patches"
RESULTS_NAME = "remedies.json"
"""`nox -s remedy`'s results file in a results folder, which the draft issues rendered there read."""
SESSION_PREFIX = "remedy-"
"""What every session of `nox -s remedy` is named by: `remedy-<name>[+<name>...]` for its runs with remedies,
WITHOUT_SESSION for its runs without any."""
WITHOUT_SESSION = f"{SESSION_PREFIX}without"
"""The session of `nox -s remedy`'s runs without any remedy: the release itself, history like any run."""


def remedy_session(remedies: tuple[str, ...]) -> str:
    """The session of runs with these remedies applied (a stack's required patches first)."""
    return SESSION_PREFIX + "+".join(remedies)


def remedied(session: str) -> bool:
    """Whether a run of this session ran DeepSpeed with a remedy: a patched DeepSpeed (a stack's runs without its
    own patch included) or a workaround's arguments. Such a run is never the state of DeepSpeed: no report, draft,
    gate, bisection or comparison reads it (reports.store leaves it out), only its remedy's result speaks for it."""
    return session.startswith(SESSION_PREFIX) and session != WITHOUT_SESSION


RemedyKind = Literal["workaround", "patch"]
RemedyStatus = Literal["verified", "unverified", "not applied"]


class RemedyError(ValueError):
    """matrix/remedies.toml or a patch it names is wrong; the message names the file, the line and the value."""


@dataclass(frozen=True)
class Remedy:
    """One `[[remedy]]` table of matrix/remedies.toml."""

    name: str = field(metadata=written_as('a slug such as "ctrl-row-parallel-policy"'))
    """Unique slug: the remedy's name in runs, results and reports."""
    kind: RemedyKind
    """`workaround`: arguments a user can pass today; `patch`: a diff against a DeepSpeed release."""
    cause_models: tuple[str, ...] = field(metadata=written_as('registry model ids, e.g. ["ctrl.faithful"]'))
    """The registry model ids (with their shape) whose failing cells of the default matrix form the cause."""
    summary: str
    """One line a user reads: what to pass, or what the patch changes."""
    mechanism: str
    """The one sentence this remedy proves when verified, true for every cell of the cause."""
    injection_policy: dict[str, tuple[str, ...]] = field(
        default_factory=dict, metadata=written_as('a table: { CTRLEncoderLayer = ["multi_head_attention.dense"] }')
    )
    """Workaround: block class name -> its row-parallel linears, as `init_inference(injection_policy=...)` takes
    them."""
    forward_inputs: dict[Literal["attention_mask"], ForwardMask] = field(
        default_factory=dict, metadata=written_as('{ attention_mask = "all-ones" }')
    )
    """Workaround: what every forward is given (`attention_mask = "all-ones"`: a mask where the probe passes none)."""
    model_kwargs: dict[str, Any] = field(default_factory=dict, metadata=written_as('{ attn_implementation = "eager" }'))
    """Workaround: `from_pretrained` keywords (strings, numbers, booleans)."""
    patch: str = ""
    """Patch: the diff's path relative to the repository (`matrix/remedy_patches/<name>.diff`)."""
    deepspeed: str = ""
    """Patch: the DeepSpeed release the diff applies to (`0.19.8`)."""
    requires: tuple[str, ...] = field(default=(), metadata=written_as('remedy names, e.g. ["fused-experts-split"]'))
    """Patches applied together with this remedy, by name: their diffs first (each after its own `requires`), then
    this one's, on one checkout of the release. Its cells are compared with the required patches alone, so a verified
    result proves this remedy's mechanism given the required ones, not theirs."""
    line: int = field(default=0, metadata=NOT_IN_FILE)
    """The line of the file the table starts at (for messages)."""

    def validate(self) -> None:
        if not re.fullmatch(r"[a-z0-9]+(?:[-_.][a-z0-9]+)*", self.name):
            raise TableError("name", f"must be a lowercase slug (letters, digits, - _ .), got {self.name!r}")
        if not self.cause_models:
            raise TableError("cause_models", "must name at least one model id of the cause")
        for key, value in self.model_kwargs.items():
            if not isinstance(value, (str, int, float, bool)):
                raise TableError(f"model_kwargs.{key}", f"must be a string, number or boolean, got {value!r}")
        has_arguments = bool(self.injection_policy or self.forward_inputs or self.model_kwargs)
        if self.kind == "workaround" and (self.patch or self.deepspeed or not has_arguments):
            raise TableError(
                "", "a workaround passes injection_policy, forward_inputs or model_kwargs, and has no patch/deepspeed"
            )
        if self.kind == "patch" and (has_arguments or not self.patch or not self.deepspeed):
            raise TableError("", "a patch names `patch` (its .diff) and `deepspeed` (the release), and passes nothing")
        for block, names in self.injection_policy.items():
            if not names:
                raise TableError(f"injection_policy.{block}", "must name at least one row-parallel linear")
        if len(set(self.requires)) != len(self.requires):
            raise TableError("requires", f"names a remedy twice: {list(self.requires)}")

    @property
    def arguments(self) -> CellArguments:
        """What the remedy's cells pass (empty for a patch)."""
        kwargs: tuple[tuple[str, KwargValue], ...] = tuple(sorted(self.model_kwargs.items()))
        return CellArguments(
            injection_policy=tuple((block, tuple(names)) for block, names in self.injection_policy.items()),
            model_kwargs=kwargs,
            forward_mask=self.forward_inputs.get("attention_mask", ""),
        )

    def patch_path(self, root: Path) -> Path:
        return root / self.patch


@dataclass(frozen=True)
class TakenAt:
    """Where a remedy's result was taken: the versions and the harness revision of its runs without the remedy
    (`nox -s remedy`'s baseline), which a stated proof names."""

    deepspeed: str = ""
    """The DeepSpeed release the runs installed (a patch's is the release its diff is against)."""
    deepspeed_git: str = ""
    """DeepSpeed's commit where the runs were not at a release ("" at a release)."""
    transformers: str = ""
    harness_git: str = ""
    """The harness's commit that ran them."""
    recorded_at: str = ""
    """When the runs without the remedy started (UTC, `2026-12-07T09:30:48Z`)."""

    @property
    def named(self) -> bool:
        """Whether it names the DeepSpeed release, the harness revision and the time (a result before the field
        existed names none)."""
        return bool(self.deepspeed and self.harness_git and self.recorded_at)

    def words(self) -> str:
        """ "DeepSpeed 0.19.8 (commit a38ff00), transformers 5.25.0" as a stated proof says it (a maintainer reads it;
        the report's cause line names the harness revision too, reports.analysis.failing_now_text `files_text`)."""
        commit = f" (commit {self.deepspeed_git[:12]})" if self.deepspeed_git else ""
        transformers = f", transformers {self.transformers}" if self.transformers else ""
        return f"DeepSpeed {self.deepspeed}{commit}{transformers}"


NOT_TAKEN = TakenAt()
"""A result that names no runs (files written before `taken_at` existed; a patch that was not applied)."""


def change_words(summary: str) -> str:
    """A remedy's summary as its proof and its draft name the change, for a reader who knows no remedy names: "AutoTP
    splits ...", first letter up, no final period."""
    return summary[:1].upper() + summary[1:].rstrip(".")


@dataclass(frozen=True)
class RemedyResult:
    """What `nox -s remedy` found for one remedy (results/remedies.json; `python -m reports merge` takes it into the
    history through reports/store/remedy_door.py, and
    suites/verdicts/statements.py `proof_of` states a cause proven by one verified on every cell of it)."""

    remedy: str
    kind: RemedyKind
    cause_models: tuple[str, ...]
    summary: str
    mechanism: str
    how: str
    """What to pass (a workaround's arguments as a user writes them) or the patch's diff text."""
    status: RemedyStatus
    """`verified`: every cause cell passes and no other cell changed verdict; `not applied`: the patch did not apply
    or its DeepSpeed could not be installed (`problem` says why)."""
    cause_cells: tuple[str, ...]
    """The cause's cells: those of `cause_models` that fail without the remedy."""
    fixed: tuple[str, ...]
    """Cause cells that pass with it."""
    changed: tuple[str, ...]
    """Other cells whose verdict differs with it (`cell: before -> after`)."""
    others_compared: int
    """Other cells run with and without it."""
    seconds: float
    """Wall time of this remedy's runs (on whatever machine ran them)."""
    problem: str = ""
    arguments: CellArguments = NO_ARGUMENTS
    """Workaround: what its cells pass, typed (a draft writes the `init_inference` call from it); empty for a patch
    and in files written before the field was added."""
    requires: tuple[str, ...] = ()
    """The patches applied with it (`Remedy.requires`, in application order): both runs had them, so the result
    proves this remedy's mechanism given theirs."""
    taken_at: TakenAt = NOT_TAKEN
    """The versions and harness revision its runs without the remedy ran at (NOT_TAKEN in files written before the
    field existed: `python -m reports merge` reads them from the runs beside such a file, or refuses it)."""

    @property
    def change(self) -> str:
        """What the remedy changes, in a maintainer's words (`change_words` of its summary)."""
        return change_words(self.summary)

    def claim(self) -> str:
        """The heading a draft issue carries for a verified remedy ("Workaround (verified: 3 of 3 cells pass)"), ""
        otherwise."""
        if self.status != "verified":
            return ""
        proof = f"verified: {len(self.fixed)} of {len(self.cause_cells)} cells pass"
        if (
            self.requires
        ):  # the required patches are named by what they change, under the diff (a reader knows no names)
            proof += f", on top of {len(self.requires)} other proposed fix{'es' if len(self.requires) > 1 else ''}"
        return f"Workaround ({proof})" if self.kind == "workaround" else f"Proposed fix ({proof})"


def _table_lines(text: str) -> list[int]:
    """The line number of each `[[remedy]]` header, in order."""
    return [number for number, line in enumerate(text.splitlines(), 1) if line.strip() == "[[remedy]]"]


def load_remedies(path: Path = REMEDIES_FILE, root: Path = MATRIX_DIR.parent) -> list[Remedy]:
    """Every remedy of `path`, each checked (patch files exist under `root`); a `RemedyError` names the file, the
    line of the table and the field and value that are wrong."""
    if not path.exists():
        return []
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RemedyError(f"{path}: not valid TOML: {error}") from None
    if unknown := sorted(set(data) - {"remedy"}):
        raise RemedyError(f"{path}: unknown top-level key(s) {unknown}; each remedy is a [[remedy]] table")
    tables, lines = data.get("remedy", []), _table_lines(text)
    remedies: list[Remedy] = []
    for index, table in enumerate(tables):
        line = lines[index] if index < len(lines) else 0
        label = table.get("name", f"#{index + 1}") if isinstance(table, dict) else f"#{index + 1}"
        remedy = read_table(
            Remedy, table, where=f"{path}: line {line} ([[remedy]] {label!r}):", error=RemedyError, given={"line": line}
        )
        if remedy.patch and not remedy.patch_path(root).is_file():
            raise RemedyError(f"{path}: line {line} ([[remedy]] {remedy.name!r}): patch {remedy.patch!r} is no file")
        if any(known.name == remedy.name for known in remedies):
            raise RemedyError(f"{path}: line {line}: remedy name {remedy.name!r} is used twice; names are unique")
        remedies.append(remedy)
    for remedy in remedies:
        _check_requires(path, remedy, remedies)
    return remedies


def _check_requires(path: Path, remedy: Remedy, remedies: list[Remedy]) -> None:
    """Every name `remedy.requires` gives is a patch of the file, against the remedy's release, and no chain of
    `requires` leads back to it; a `RemedyError` names the file, the line of the table and the names."""
    where = f"{path}: line {remedy.line} ([[remedy]] {remedy.name!r}): requires"
    by_name = {known.name: known for known in remedies}
    for name in remedy.requires:
        required = by_name.get(name)
        if required is None:
            raise RemedyError(f"{where} {name!r}, which no [[remedy]] is named; known: {', '.join(sorted(by_name))}")
        if required.kind != "patch":
            raise RemedyError(f"{where} {name!r}, a workaround; only patches are applied together (one checkout)")
        if remedy.kind == "patch" and required.deepspeed != remedy.deepspeed:
            raise RemedyError(
                f"{where} {name!r}, a patch against deepspeed {required.deepspeed}, not {remedy.deepspeed}"
            )
    chain = _cycle(remedy.name, by_name, (remedy.name,))
    if chain:
        raise RemedyError(f"{where} a cycle: {' -> '.join(chain)}; a remedy cannot need itself")


def _cycle(name: str, by_name: dict[str, Remedy], path: tuple[str, ...]) -> tuple[str, ...]:
    """The chain of `requires` from `path[0]` back to itself through `name`, or () when there is none."""
    for required in by_name[name].requires:
        if required == path[0]:
            return (*path, required)
        if required in by_name and required not in path and (found := _cycle(required, by_name, (*path, required))):
            return found
    return ()


def required_patches(remedy: Remedy, remedies: list[Remedy]) -> tuple[Remedy, ...]:
    """The patches `remedy` requires, in the order they are applied: each after its own `requires`, each once
    (`load_remedies` has checked the names exist and form no cycle)."""
    by_name = {known.name: known for known in remedies}
    ordered: list[Remedy] = []
    for name in remedy.requires:
        for required in (*required_patches(by_name[name], remedies), by_name[name]):
            if required not in ordered:
                ordered.append(required)
    return tuple(ordered)


def remedies_for(cause: str, remedies: list[Remedy]) -> list[Remedy]:
    """The remedies of a cause given as a remedy name, a model id (`ctrl.faithful`) or a model name (`ctrl`)."""
    picked = [
        remedy
        for remedy in remedies
        if cause == remedy.name or any(cause in (model, model.split(".")[0]) for model in remedy.cause_models)
    ]
    if not picked:
        known = sorted({model for remedy in remedies for model in remedy.cause_models} | {r.name for r in remedies})
        raise RemedyError(f"--cause {cause!r}: no remedy in matrix/remedies.toml names it; known: {', '.join(known)}")
    return picked

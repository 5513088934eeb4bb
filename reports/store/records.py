"""The records of the history: cells, versions, runs, results, bisections and triage attempts, shared by the
store, the analysis and the renderers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from packaging.version import InvalidVersion, Version

from matrix.cells import cell_id
from matrix.remedies import remedied
from matrix.version_axes import AXES as INSTALLED_AXES
from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import AutoTPRecord, BreakPoint

BisectMode = Literal["broken", "fixed"]
"""broken: before = last good, after = first bad; fixed: before = last bad, after = first good (`reports.search.bisect
--mode gone` searches for where a failure turns into another and stores its answer as broken)."""
TransitionKind = Literal["broke", "fixed", "class-change"]
"""How a cell's verdict changed between neighbouring version sets (reports/analysis/history.py)."""

# Version axes along which transitions are detected, in the order used to sort version sets: the axes the
# matrix installs, and the python that ran them.
AXES = (*INSTALLED_AXES, "python")

JSONObject = dict[str, Any]
"""A JSON object as json.loads gives it (a report.json part, a cells.jsonl record): what it holds is read by key."""
# The metric shown next to each cell in the matrix and plotted in the trend chart.
KEY_METRIC = "logits_max_abs"
# Where each axis's commits and PRs live, for links in reports.
GITHUB_REPOSITORY = {
    "deepspeed": "deepspeedai/DeepSpeed",
    "transformers": "huggingface/transformers",
    "torch": "pytorch/pytorch",
}


@dataclass(frozen=True, order=True)
class CellKey:
    model: str
    variant: str
    dtype: str
    tp: int

    @property
    def id(self) -> str:
        return cell_id(self.model, self.variant, self.dtype, self.tp)


@dataclass(frozen=True)
class Versions:
    deepspeed: str
    transformers: str
    torch: str
    python: str
    deepspeed_git: str = ""  # DeepSpeed's own commit when it was installed from git, else ""
    # A version axis added later goes here with a default "" (not recorded): JUnit files from before it may lack it.

    def label(self, axis: str) -> str:
        if axis == "deepspeed" and self.deepspeed_git:
            return f"{self.deepspeed}@{self.deepspeed_git[:10]}"
        return str(getattr(self, axis))

    def pins(self, axes: tuple[str, ...] = AXES) -> Pins:
        return tuple((axis, self.label(axis)) for axis in axes)

    def describe(self, axes: tuple[str, ...] = AXES) -> str:
        return pins_text(self.pins(axes))


Pins = tuple[tuple[str, str], ...]
"""Versions held fixed, as (axis, version label) pairs: (("transformers", "5.24.0"), ("torch", "2.13.0"))."""


def pins_text(pins: Pins) -> str:
    """ "transformers 5.24.0, torch 2.13.0": how the store, the reports and the terminal write pins."""
    return ", ".join(f"{axis} {value}" for axis, value in pins)


def parse_pins(text: str) -> Pins:
    """The pins of `pins_text`'s form, where they are kept as text: store rows, archived answers, report.json."""
    return tuple((axis, value) for axis, _, value in (pin.partition(" ") for pin in text.split(", ") if pin))


@dataclass(frozen=True)
class Run:
    run_id: str
    session: str
    host: str
    started: str  # ISO 8601 UTC
    accelerator: str
    backend: str
    versions: Versions
    harness_git: str = ""  # the harness's own commit that recorded the run ("" in files from before it was kept)
    trusted: bool = True
    """A scheduled or dispatched run on the default branch, or a person's own merge; False for a pull request's run
    (`merge --untrusted`): never archived, never a gate's baseline or publish's previous run."""

    @property
    def remedied(self) -> bool:
        """A run of `nox -s remedy` with a remedy (a patched DeepSpeed, a workaround's arguments): never the state of
        DeepSpeed, so the store gives no reader its results (its remedy's result in `remedy_results` speaks for it)."""
        return remedied(self.session)


@dataclass(frozen=True)
class CellResult:
    run_id: str
    cell: CellKey
    outcome: str  # one of suites.verdicts.outcome.OUTCOMES
    failure_class: str = ""
    signature: str = ""
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoints: tuple[str, ...] = ()
    """The hub ids a faithful cell's verdict stands for (matrix.registry.ModelEntry.checkpoints); empty otherwise."""
    cause: Cause | None = None
    """A failure's cause as the harness keyed it (suites/verdicts/mechanism.py); None in files from before it was
    kept."""
    broke_at: BreakPoint | None = None
    """Where it broke, where the ranks located it."""
    autotp: AutoTPRecord | None = None
    """What AutoTP did to the model (rank 0), where it sharded."""


class Mechanism(TypedDict, total=False):
    """CellResult's mechanism fields (cause, broke_at, autotp) as a JUnit file or the store gives them: what a
    reader passes on to CellResult(**...)."""

    cause: Cause | None
    broke_at: BreakPoint | None
    autotp: AutoTPRecord | None


@dataclass(frozen=True)
class CellDetail:
    """What a cell's JUnit properties say beyond its result (README.md "Results"): kept in the archive with it."""

    cell: CellKey
    checkpoint_source: str = ""  # "tiny", or the hub id the cell loaded
    checkpoint_revision: str = ""  # the hub commit, or sha256:<hash> of the tiny checkpoint
    logs: str = ""  # the folder the cell's rank logs were kept in, on the machine that ran it


@dataclass(frozen=True)
class RunRecords:
    """One run as it passed the door (reports.store.door): read, redacted and validated; what the archive keeps and
    the store imports."""

    run: Run
    results: tuple[CellResult, ...]
    details: tuple[CellDetail, ...] = ()
    dependencies_as_of: str = ""  # the day the run's dependencies were resolved as of (`--as-of`); "" for the newest


@dataclass(frozen=True)
class Observation:
    """One cell result joined with the provenance of the run that produced it."""

    result: CellResult
    run: Run

    @property
    def cell(self) -> CellKey:
        return self.result.cell

    @property
    def versions(self) -> Versions:
        return self.run.versions


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    pr: int | None  # from a "Subject (#1234)" squash-merge title
    files: tuple[str, ...] = ()  # what it touched, where asked for
    relevant: bool = False  # touches the paths the question is about (AutoTP's code, the failure's files)


@dataclass(frozen=True)
class Bisection:
    """The answer of `python -m reports bisect` or `python -m reports triage` for one cell along one axis."""

    cell: CellKey
    mode: BisectMode
    axis: str
    before: str  # a release, or a commit sha when only commits were bisected
    after: str
    held_fixed: Pins  # the other axes it pinned, e.g. (("transformers", "5.24.0"), ("torch", "2.13.0"))
    failure_class: str
    signature: str
    commit: str = ""  # the first bad (first good) commit when DeepSpeed commits were bisected
    subject: str = ""
    pr: int | None = None
    files: tuple[str, ...] = ()
    untestable: tuple[str, ...] = ()  # skipped candidates between before and after
    recorded_at: str = ""  # ISO 8601 UTC
    # Commits of the range that touched the failure's files or the model's folder, most likely first: the
    # answer on a side whose commits were listed, not bisected (transformers without a buildable clone).
    suspects: tuple[Commit, ...] = ()
    # The cell whose bisection this answer repeats, after this cell was run at both ends of it ("" when
    # this cell was bisected itself).
    confirmed_from: str = ""
    # The transition kind this answers (broke | fixed | class-change), or `supported` (mode fixed: before = the last
    # release DeepSpeed refused the cell at, after = the first it ran it at; `--mode supported`); "" in stores from
    # before it was kept, where the mode alone says it (broken: broke or class-change).
    kind: TransitionKind | Literal["supported", ""] = ""
    # The ends the search ran between, older first, as given (a release, a tag v0.16.4 or a commit sha); ""
    # in stores from before they were kept. They place an answer whose ends are commits on the release line.
    searched_older: str = ""
    searched_newer: str = ""


@dataclass(frozen=True)
class TriageAttempt:
    """A triage question that got no answer, and why (its ends no longer differ, every step untestable,
    an axis triage cannot install): shown in the report instead of "not yet triaged"."""

    cell: CellKey
    axis: str
    mode: BisectMode
    before: str
    after: str
    held_fixed: Pins
    reason: str
    recorded_at: str = ""


def release(value: str) -> Version | None:
    """The PEP 440 version of an axis value, or None for a label that stands where no version exists
    (an install failure at a git ref or local clone: pr/1234, master, local-DeepSpeed)."""
    try:
        return Version(value)
    except InvalidVersion:
        return None


def deepspeed_git_of(deepspeed: str, deepspeed_git: str, harness_git: str | None) -> str:
    """A run's deepspeed_git with the harness's own commit removed.

    Runs recorded before the fix stamped the harness's HEAD as deepspeed_git (DeepSpeed's setup.py
    takes `git rev-parse HEAD` of the repository its build folder sits in, and nox builds under .nox/
    inside this one). A value equal to the run's harness_git is never DeepSpeed's. harness_git None
    means the run was recorded before harness_git was kept (a JUnit file without run.harness_git, a
    store from before schema 3), so it cannot be checked that way; there a DeepSpeed version without a
    PEP 440 local segment is a release install, which never carries a real commit (a source build from
    git is versioned like 0.18.1+abc1234), so its deepspeed_git is dropped."""
    if not deepspeed_git:
        return ""
    if harness_git is None:
        version = release(deepspeed)
        return "" if version is not None and version.local is None else deepspeed_git
    harness = harness_git.removesuffix("-dirty")
    same = harness and (harness.startswith(deepspeed_git) or deepspeed_git.startswith(harness))
    return "" if same else deepspeed_git


def short_commit(sha: str) -> str:
    """abc1234567 or abc1234567-dirty: a commit as reports print it."""
    commit, dash, suffix = sha.partition("-")
    return commit[:10] + dash + suffix

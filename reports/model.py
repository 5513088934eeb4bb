"""Plain records shared by the store, the analysis and the renderers."""

from __future__ import annotations

from dataclasses import dataclass, field

# Version axes along which transitions are detected, in the order used to sort version sets.
AXES = ("deepspeed", "transformers", "torch", "python")
OUTCOMES = ("pass", "fail", "skip")
# The metric shown next to each cell in the matrix and plotted in the trend chart.
KEY_METRIC = "logits_max_abs"


@dataclass(frozen=True, order=True)
class CellKey:
    model: str
    variant: str
    dtype: str
    tp: int

    @property
    def id(self) -> str:
        return f"{self.model}-{self.variant}-{self.dtype}-tp{self.tp}"


@dataclass(frozen=True)
class Versions:
    deepspeed: str
    transformers: str
    torch: str
    python: str
    deepspeed_git: str = ""  # sha when DeepSpeed was installed from git, else ""

    def label(self, axis: str) -> str:
        if axis == "deepspeed" and self.deepspeed_git:
            return f"{self.deepspeed}@{self.deepspeed_git[:10]}"
        return getattr(self, axis)

    def describe(self, axes=AXES) -> str:
        return ", ".join(f"{axis} {self.label(axis)}" for axis in axes)


@dataclass(frozen=True)
class Run:
    run_id: str
    session: str
    host: str
    started: str  # ISO 8601 UTC
    accelerator: str
    backend: str
    versions: Versions


@dataclass(frozen=True)
class CellResult:
    run_id: str
    cell: CellKey
    outcome: str  # one of OUTCOMES
    failure_class: str = ""
    signature: str = ""
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


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
class Bisection:
    """The answer of `python -m reports.bisect` for one cell along one axis."""

    cell: CellKey
    mode: str  # broken (before = last good, after = first bad) | fixed (before = last bad, after = first good)
    axis: str
    before: str  # a release, or a commit sha when only commits were bisected
    after: str
    held_fixed: str  # the other axes, e.g. "transformers 5.24.0, torch 2.13.0"
    failure_class: str
    signature: str
    commit: str = ""  # the first bad (first good) commit when DeepSpeed commits were bisected
    subject: str = ""
    pr: int | None = None
    files: tuple[str, ...] = ()
    untestable: tuple[str, ...] = ()  # skipped candidates between before and after
    recorded_at: str = ""  # ISO 8601 UTC

"""One cell at one candidate: its environment built or reused, the cell run there by `pytest suites`, its record
read back and judged good, bad or untestable (CellProbe); the releases between two ends that are candidates."""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from matrix import PROJECT_ROOT
from matrix.cells import parse_cell_id, replay_name
from matrix.redaction import redact
from matrix.registry import RegistryError, load_models
from matrix.releases import load_releases
from matrix.variants import load_variants
from matrix.versions import supports_python
from reports.analysis import same_failure
from reports.search.steps import BAD, GOOD, SKIP, BisectError, Step, Untestable, Verdict
from reports.store import (
    CellKey,
)
from sessions.environments import (
    EnvironmentBuildError,
    EnvironmentSpec,
    ensure_environment,
    environment_variables,
)
from suites.records.run_records import read_records
from suites.run.command import CELL_TIMEOUT_S, suites_command
from suites.verdicts.mechanism import role

# ---- The cell ----------------------------------------------------------------------------------------------------


def parse_cell(text: str) -> CellKey:
    """--cell, checked against the registries."""
    try:
        return CellKey(*parse_cell_id(text, load_models(), load_variants()))
    except RegistryError as error:
        raise BisectError(f"--cell {error}") from None


@dataclass(frozen=True)
class CellRun:
    outcome: str
    failure_class: str
    signature: str
    message: str
    broke_at: str = ""
    """The role of the module it broke in (suites/verdicts/mechanism.py `role`), where the harness located it."""


def classify(
    run: CellRun,
    reference: tuple[str, str] | None,
    any_failure: bool,
    absent_is_good: bool = False,
    reference_at: str = "",
    runs_are_good: bool = False,
) -> Verdict:
    """good = pass; bad = the reference failure (the same class, exception and masked message whatever function it
    surfaced in, and the same breaking module where both name one: reports.analysis.signatures.same_failure; any
    failure with any_failure); another failure is untestable, unless absent_is_good: then every end without the
    reference failure counts as good, another failure as much as a pass. That is the one rule for a failure
    that turns into another: `--mode gone` (is the failure gone?) and triage's class changes (is the new
    failure there yet? the old one stands for good). An install failure or a skipped cell is untestable.
    runs_are_good (`--mode supported`: since when does DeepSpeed run it): a cell DeepSpeed refuses (`unsupported`)
    is bad, one that ran is good whatever its verdict on AutoTP, unless the harness or its environment failed it
    (setup, install: untestable)."""
    if runs_are_good:
        return _support_verdict(run)
    failure = f"{run.failure_class}: {run.signature}"
    if run.outcome == "pass":
        return Verdict(GOOD, "pass")
    if run.outcome in ("skip", "unsupported"):
        return Verdict(SKIP, f"the cell was not run ({run.outcome}): {run.message}")
    if run.failure_class == "install":
        return Verdict(SKIP, failure)
    if (
        any_failure
        or reference is None
        or same_failure(run.failure_class, run.signature, reference, run.broke_at, reference_at)
    ):
        return Verdict(BAD, failure)
    if absent_is_good:
        return Verdict(GOOD, f"another failure ({failure})")
    return Verdict(SKIP, f"a different failure ({failure}); --any-failure counts it as bad, --mode gone as gone")


def _support_verdict(run: CellRun) -> Verdict:
    """`classify` for `--mode supported`: bad where DeepSpeed refuses the cell, good where it ran."""
    if run.outcome == "unsupported":
        return Verdict(BAD, f"unsupported: {run.message}")
    if run.outcome == "pass":
        return Verdict(GOOD, "runs (pass)")
    if run.outcome == "fail" and run.failure_class not in ("setup", "install"):
        return Verdict(GOOD, f"runs (fails: {run.failure_class}: {run.signature})")
    detail = f"{run.failure_class}: {run.signature}" if run.outcome == "fail" else f"skipped: {run.message}"
    return Verdict(SKIP, f"the cell could not be tried ({detail})")


def suite_command(python: Path, cells: list[CellKey], results: Path, cell_timeout: float) -> list[str]:
    """`pytest suites` selecting every given cell (and, when they differ in more than one field, the other
    cells of their cross product too: tiny cells cost less than a second run each)."""

    def joined(values: Iterable[object]) -> str:
        return ",".join(sorted({str(v) for v in values}))

    return suites_command(
        python,
        models=joined(replay_name(c.model) for c in cells),
        variants=joined(c.variant for c in cells),
        dtypes=joined(c.dtype for c in cells),
        tp=joined(c.tp for c in cells),
        results=results,
        session_name="bisect",
        cell_timeout=cell_timeout,
        extra=["-q"],
    )


CellCommand = Callable[[Path, list[CellKey], Path, float], list[str]]


def run_cells(
    python: Path, cells: list[CellKey], cell_timeout: float, command: CellCommand = suite_command
) -> dict[CellKey, CellRun]:
    """Run these cells in one session with the environment's python and read their records from cells.jsonl;
    a cell without a record is missing from the answer (Untestable when none has one)."""
    with tempfile.TemporaryDirectory(prefix="autotp-bisect-") as results:
        argv = command(python, cells, Path(results), cell_timeout)
        try:
            completed = subprocess.run(
                argv,
                cwd=PROJECT_ROOT,
                env=environment_variables(python),
                text=True,
                capture_output=True,
                timeout=cell_timeout * len(cells) + 600,
            )  # + imports
        except subprocess.TimeoutExpired:
            raise Untestable(f"`{shlex.join(argv)}` did not finish") from None
        records = read_records(Path(results))
    wanted = {cell.id: cell for cell in cells}
    # a cell's text reaches the terminal, the store and the reports from here
    found = {
        wanted[r["cell"]["id"]]: CellRun(
            r["outcome"],
            r["failure_class"],
            redact(r["signature"]),
            redact(r["message"]),
            role(r["broke_at"]["path"]) if r.get("broke_at") else "",
        )
        for r in records
        if r["cell"]["id"] in wanted
    }
    if not found:
        raise Untestable(f"no result for {', '.join(wanted)} (exit code {completed.returncode}): {_tail(completed)}")
    return found


def _tail(completed: subprocess.CompletedProcess[str], lines: int = 8) -> str:
    text = f"{completed.stdout}\n{completed.stderr}"
    return redact(" | ".join([line for line in text.splitlines() if line.strip()][-lines:]))


# ---- Candidates --------------------------------------------------------------------------------------------------


def release_candidates(package: str, older: str, newer: str, python: Version) -> list[str]:
    """Installable releases from older to newer, both included; pre-releases only when an end is one."""
    releases = load_releases(package)
    known = {str(release.version): release for release in releases}
    for text in (older, newer):
        try:
            Version(text)
        except InvalidVersion:
            raise BisectError(
                f"{text!r} is not a {package} version; release bisection takes versions like "
                "0.16.4 (commits need --deepspeed-repo)"
            ) from None
        if text not in known:
            raise BisectError(
                f"{package} {text} is not a release on PyPI (cached release data, refresh with "
                "`python -m matrix.versions --refresh`)"
            )
    low, high = Version(older), Version(newer)
    prereleases = low.is_prerelease or high.is_prerelease
    # The ends are what the user named; between them only what the matrix itself would install.
    return [
        str(r.version)
        for r in releases
        if r.version in (low, high)
        or (
            low < r.version < high
            and not r.yanked
            and not r.version.is_devrelease
            and (prereleases or not r.version.is_prerelease)
            and supports_python(r.requires_python, python)
        )
    ]


# ---- Putting it together -----------------------------------------------------------------------------------------


@dataclass
class CellProbe:
    """probe(candidate): build or reuse its environment, run the cell there, and judge the outcome."""

    cell: CellKey
    env_root: Path
    environment: Callable[[str], EnvironmentSpec] | None = None  # candidate -> its environment
    any_failure: bool = False
    cell_timeout: float = CELL_TIMEOUT_S
    command: CellCommand = suite_command
    reference: tuple[str, str] | None = None  # (failure class, signature) of the first failure seen
    reference_at: str = ""  # the role of the module the first failure seen broke in, where the harness located it
    absent_is_good: bool = False  # an end without the reference failure is good, failing otherwise or not
    runs_are_good: bool = False  # --mode supported: good where the cell runs, bad where DeepSpeed refuses it
    runs: dict[str, CellRun] = field(default_factory=dict)  # the cell's last run at each candidate probed

    def __call__(self, candidate: str) -> Verdict:
        if self.environment is None:
            raise BisectError("the probe was given no environment to build a candidate in")
        try:
            python = ensure_environment(self.env_root, self.environment(candidate), log=lambda line: None)
            run = run_cells(python, [self.cell], self.cell_timeout, self.command)[self.cell]
        except (Untestable, EnvironmentBuildError) as error:
            return Verdict(SKIP, str(error).replace("\n", " | "))
        self.runs[candidate] = run
        verdict = classify(
            run, self.reference, self.any_failure, self.absent_is_good, self.reference_at, self.runs_are_good
        )
        if verdict.kind == BAD and self.reference is None and not self.runs_are_good:
            self.reference, self.reference_at = (run.failure_class, run.signature), run.broke_at
        return verdict


def print_step(label: str) -> Callable[[Step], None]:
    def show(step: Step) -> None:
        print(f"  {label} {step.candidate:<14} {step.verdict:<5} {step.seconds:7.1f} s  {step.detail}", flush=True)

    return show

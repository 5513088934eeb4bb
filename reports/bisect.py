"""Bisect one cell along one version axis: which release, and with a DeepSpeed clone which commit
(and PR), broke it (--mode broken) or fixed it (--mode fixed).

    python -m reports.bisect --cell llama-eager-fp32-tp3 --axis deepspeed --good 0.16.4 --bad 0.17.0
    python -m reports.bisect --cell llama-eager-fp32-tp3 --good 0.16.4 --bad 0.17.0 \
        --deepspeed-repo ~/DeepSpeed --refine
    python -m reports.bisect --cell llama-eager-fp32-tp3 --good v0.16.4 --bad 3f1c2a9 --deepspeed-repo ~/DeepSpeed

"good" always means the cell passes and "bad" that it fails, so --mode broken takes --good older than
--bad and --mode fixed takes --bad older than --good. Each step runs only that cell, in an environment
of its own under .nox/envs/<key> that later bisections and matrix sessions reuse. "Bad" means the failure seen at the
failing end (same failure class and signature) unless --any-failure; a step that cannot be tested
(install failure, a different failure, a skipped cell) is skipped like `git bisect skip` and the
search continues on its neighbours. The answer goes into the history store, so the report can say
"broken by #NNNN" next to the transition.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from packaging.version import InvalidVersion, Version

from matrix import PROJECT_ROOT
from matrix.cells import parse_cell_id, replay_name
from matrix.redaction import redact
from matrix.registry import RegistryError, load_models, load_variants
from matrix.versions import (
    AXES,
    AxisValueError,
    ReleaseDataUnavailable,
    combinations,
    load_config,
    load_releases,
    parse_pins,
    skip_reason,
    supports_python,
)
from sessions.environments import (
    EnvironmentBuildError,
    EnvironmentSpec,
    commit_environment,
    ensure_environment,
    env_root,
    environment_variables,
    release_environment,
)
from suites.command import CELL_TIMEOUT_S, suites_command
from suites.records.run_records import read_records
from reports import ReportsError
from reports.git import GitRepo
from reports.history import AxisRange, answer_for
from reports.records import Bisection, BisectMode, CellKey, Commit, Pins, TransitionKind, pins_text, release
from reports.signatures import same_failure
from reports.store import DEFAULT_STORE, HistoryStore

GOOD, BAD, SKIP = "good", "bad", "skip"
END_REPEATS = 2  # runs of each end before a bisection trusts it (--end-repeats)


class BisectError(ReportsError):
    """The bisection cannot start or cannot conclude; the message says what to change."""


class Untestable(Exception):
    """This candidate cannot be tested (install failure, no result): the search skips it."""


# ---- The search --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    kind: str  # good | bad | skip
    detail: str = ""  # failure class and signature, or why the step could not be tested


@dataclass(frozen=True)
class Step:
    candidate: str
    verdict: str
    detail: str
    seconds: float


@dataclass(frozen=True)
class Answer:
    before: str  # last good (broken) / last bad (fixed)
    after: str  # first bad (broken) / first good (fixed)
    untestable: tuple[str, ...]  # skipped candidates between the two: the change may be in any of them too
    steps: tuple[Step, ...]


def search(
    candidates: Sequence[str],
    probe: Callable[[str], Verdict],
    *,
    start: str = GOOD,
    on_step: Callable[[Step], None] = lambda step: None,
    end_repeats: int = 1,
) -> Answer:
    """Binary search over candidates (oldest first) for the change from `start` (the verdict at
    candidates[0]) to the other verdict (at candidates[-1]).

    Both ends are probed first, end_repeats times each, the failing end first so its failure becomes the
    reference; an end whose verdicts differ is flaky and nothing is concluded (transformers' daily CI re-runs
    a new failure at both ends before it bisects). Then at most ceil(log2(N - 1)) steps when nothing is
    skipped. A skipped candidate is replaced by the untested one nearest the middle, like `git bisect skip`.
    """
    if len(candidates) < 2:
        raise BisectError(f"need at least two candidates to bisect, got {list(candidates)}")
    if end_repeats < 1:
        raise BisectError(f"--end-repeats {end_repeats}: each end must run at least once")
    end = BAD if start == GOOD else GOOD
    steps: list[Step] = []

    def run(index: int) -> str:
        began = time.monotonic()
        verdict = probe(candidates[index])
        step = Step(candidates[index], verdict.kind, verdict.detail, time.monotonic() - began)
        steps.append(step)
        on_step(step)
        return verdict.kind

    ends = [(0, start), (len(candidates) - 1, end)]
    for index, expected in ends if start == BAD else ends[::-1]:
        kinds = [run(index) for _ in range(end_repeats)]
        if len(set(kinds)) > 1:
            details = "; ".join(
                f"{step.verdict}" + (f" ({step.detail})" if step.detail else "") for step in steps[-end_repeats:]
            )
            raise BisectError(
                f"{candidates[index]} is flaky: {details} in {end_repeats} runs; a bisection needs "
                "ends whose verdict repeats"
            )
        if (kind := kinds[0]) != expected:
            detail = f" ({steps[-1].detail})" if steps[-1].detail else ""
            raise BisectError(
                f"{candidates[index]} should be {expected} but is {kind}{detail}: "
                f"the ends of the range must differ; check the versions and --mode"
            )
    low, high, skipped = 0, len(candidates) - 1, set()
    while untested := [i for i in range(low + 1, high) if i not in skipped]:
        middle = (low + high) / 2
        index = min(untested, key=lambda i: (abs(i - middle), i))
        kind = run(index)
        if kind == SKIP:
            skipped.add(index)
        elif kind == start:
            low = index
        else:
            high = index
    return Answer(candidates[low], candidates[high], tuple(candidates[low + 1 : high]), tuple(steps))


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


def classify(
    run: CellRun, reference: tuple[str, str] | None, any_failure: bool, absent_is_good: bool = False
) -> Verdict:
    """good = pass; bad = the reference failure (the same class and cause, reports.signatures.same_failure; any
    failure with any_failure); another failure is untestable, unless absent_is_good: then every end without the
    reference failure counts as good, another failure as much as a pass. That is the one rule for a failure
    that turns into another: `--mode gone` (is the failure gone?) and triage's class changes (is the new
    failure there yet? the old one stands for good). An install failure or a skipped cell is untestable."""
    failure = f"{run.failure_class}: {run.signature}"
    if run.outcome == "pass":
        return Verdict(GOOD, "pass")
    if run.outcome == "skip":
        return Verdict(SKIP, f"the cell was skipped: {run.message}")
    if run.failure_class == "install":
        return Verdict(SKIP, failure)
    if any_failure or reference is None or same_failure(run.failure_class, run.signature, reference):
        return Verdict(BAD, failure)
    if absent_is_good:
        return Verdict(GOOD, f"another failure ({failure})")
    return Verdict(SKIP, f"a different failure ({failure}); --any-failure counts it as bad, --mode gone as gone")


def suite_command(python: Path, cells: list[CellKey], results: Path, cell_timeout: float) -> list[str]:
    """`pytest suites` selecting every given cell (and, when they differ in more than one field, the other
    cells of their cross product too: tiny cells cost less than a second run each)."""

    def joined(values) -> str:
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
        wanted[r["cell"]["id"]]: CellRun(r["outcome"], r["failure_class"], redact(r["signature"]), redact(r["message"]))
        for r in records
        if r["cell"]["id"] in wanted
    }
    if not found:
        raise Untestable(f"no result for {', '.join(wanted)} (exit code {completed.returncode}): {_tail(completed)}")
    return found


def _tail(completed: subprocess.CompletedProcess, lines: int = 8) -> str:
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
    absent_is_good: bool = False  # an end without the reference failure is good, failing otherwise or not
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
        verdict = classify(run, self.reference, self.any_failure, self.absent_is_good)
        if verdict.kind == BAD and self.reference is None:
            self.reference = (run.failure_class, run.signature)
        return verdict


def print_step(label: str) -> Callable[[Step], None]:
    def show(step: Step) -> None:
        print(f"  {label} {step.candidate:<14} {step.verdict:<5} {step.seconds:7.1f} s  {step.detail}", flush=True)

    return show


def bisect_releases(
    cell: CellKey,
    axis: str,
    good: str,
    bad: str,
    mode: str,
    pins: dict[str, str],
    probe: CellProbe,
    python: Version,
    end_repeats: int = 1,
) -> Answer:
    """pins hold the other axes; probe.environment gives the environment of a candidate release."""
    older, newer = (good, bad) if mode == "broken" else (bad, good)
    _check_order(axis, older, newer, mode)
    candidates = release_candidates(axis, older, newer, python)
    # Releases declared incompatible in versions.toml are not worth an install: skip them up front.
    incompatible = {c: reason for c in candidates[1:-1] if (reason := skip_reason({**pins, axis: c}))}
    print(
        f"bisecting {cell.id} over {len(candidates)} {axis} releases {older} .. {newer} "
        f"({pins_text(_held_fixed(pins, axis))}), at most {_budget(len(candidates), end_repeats)} cell runs"
    )

    def judge(candidate: str) -> Verdict:
        if candidate in incompatible:
            return Verdict(SKIP, f"declared incompatible in versions.toml: {incompatible[candidate]}")
        return probe(candidate)

    return search(
        candidates, judge, start=GOOD if mode == "broken" else BAD, on_step=print_step(axis), end_repeats=end_repeats
    )


def bisect_commits(
    cell: CellKey, clone: GitRepo, good: str, bad: str, mode: str, probe: CellProbe, end_repeats: int = 1
) -> tuple[Answer, Commit]:
    """probe.environment gives the environment of a candidate commit (a full sha)."""
    older, newer = (good, bad) if mode == "broken" else (bad, good)
    candidates = clone.line(older, newer)
    print(
        f"bisecting {cell.id} over {len(candidates)} commits of {clone.path} {older} .. {newer}, "
        f"at most {_budget(len(candidates), end_repeats)} cell runs"
    )
    answer = search(
        candidates,
        probe,
        start=GOOD if mode == "broken" else BAD,
        on_step=print_step("commit"),
        end_repeats=end_repeats,
    )
    return answer, clone.info(answer.after)


def _budget(candidates: int, end_repeats: int) -> int:
    # ceil(log2 N) + 2, each end repeated
    return (candidates - 1).bit_length() + 2 * end_repeats if candidates > 1 else 2 * end_repeats


def _check_order(axis: str, older: str, newer: str, mode: str) -> None:
    names = ("--good", "--bad") if mode == "broken" else ("--bad", "--good")
    try:
        ordered = Version(older) < Version(newer)
    except InvalidVersion as error:
        raise BisectError(f"{axis}: {error}; release bisection takes versions like 0.16.4") from None
    if older == newer or Version(older) == Version(newer):
        raise BisectError(f"--good and --bad are both {older}; give two different {axis} versions")
    if not ordered:
        raise BisectError(
            f"in --mode {mode}, {names[0]} {older} must be older than {names[1]} {newer}"
            + (" (to find a fix, use --mode fixed)" if mode == "broken" else "")
        )


def _held_fixed(pins: dict[str, str], axis: str) -> Pins:
    return tuple((other, pins[other]) for other in AXES if other != axis)


def held_fixed_pins(cell: CellKey, axis: str, failing: str, overrides: dict[str, str], store: Path) -> dict[str, str]:
    """The other axes as in the cell's failing run at `failing` in the store, else at the latest
    combination of versions.toml; --pin overrides either."""
    pins: dict[str, str] = {}
    if store.exists():
        with HistoryStore(store, create=False, read_only=True) as history:
            runs = [
                o
                for o in history.observations()
                if o.cell == cell and o.result.outcome == "fail" and getattr(o.versions, axis) == failing
            ]
        if runs:
            latest = max(runs, key=lambda o: o.run.started).versions
            pins = {other: getattr(latest, other) for other in AXES}
    if not pins:
        try:
            combo = combinations("latest")[0]
        except ReleaseDataUnavailable as error:
            raise BisectError(f"cannot pick the other axes: {error}; pass them with --pin AXIS=VERSION") from None
        pins = {pin.package: str(pin.version) for pin in combo.pins if pin.version is not None}
    pins.update(overrides)
    if missing := [other for other in AXES if other != axis and other not in pins]:
        raise BisectError(f"no release for {', '.join(missing)} to hold fixed; pass --pin AXIS=VERSION")
    return pins


def stored_release_answer(
    store: Path, cell: CellKey, axis: str, mode: str, good: str, bad: str, held_fixed: Pins
) -> Bisection | None:
    """The newest release-level answer already recorded for this cell inside --good .. --bad, at the same
    held-fixed versions: --refine then goes straight to the commits. --mode gone learns only at the end
    whether its answer is a fix or a change of failure, so it reuses none."""
    kind = {"broken": "broke", "fixed": "fixed"}.get(mode)
    if not store.exists() or kind is None:
        return None
    try:
        low, high = sorted((good, bad), key=Version)
    except InvalidVersion:
        return None  # bisect_releases explains what a version looks like
    with HistoryStore(store, create=False, read_only=True) as history:
        answers = [
            b
            for b in history.bisections()
            if not b.commit and b.failure_class and None not in (release(b.before), release(b.after))
        ]
    return answer_for(answers, cell, kind, None, AxisRange(axis, low, high), held_fixed)


def record(store: Path, bisection: Bisection) -> None:
    with HistoryStore(store, create=True) as history:
        history.add_bisection(bisection)
    print(f"recorded in {store}; `python -m reports render --store {store}` shows it in the report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reports.bisect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cell", required=True, help="cell id, e.g. llama-eager-fp32-tp3")
    parser.add_argument("--axis", choices=AXES, default="deepspeed", help="the axis to bisect (default deepspeed)")
    parser.add_argument("--good", required=True, help="a version (or, with --deepspeed-repo, a tag or sha) that passes")
    parser.add_argument("--bad", required=True, help="a version (or tag or sha) that fails")
    parser.add_argument(
        "--mode",
        choices=("broken", "fixed", "gone"),
        default="broken",
        help="broken: first bad after --good (default); fixed: first good after --bad; gone: the "
        "first version after --bad without --bad's failure (its class and cause), where the "
        "cell passes or fails another way (--good names such a version)",
    )
    parser.add_argument(
        "--any-failure",
        action="store_true",
        help="count every failure as bad, not only the failing end's class and signature",
    )
    parser.add_argument("--deepspeed-repo", type=Path, help="local DeepSpeed clone: bisect its commits")
    parser.add_argument(
        "--refine",
        action="store_true",
        help="with --deepspeed-repo: bisect releases first, then the commits between the answer",
    )
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="AXIS=VERSION",
        help="hold another axis at this release (default: as in the stored failing run, else latest)",
    )
    add_cell_run_options(parser)
    return parser


def add_cell_run_options(parser: argparse.ArgumentParser) -> None:
    """What bisect and triage share: the store they read and answer into, and where and how long cells run."""
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"history store (default {DEFAULT_STORE})")
    parser.add_argument(
        "--env-root",
        type=Path,
        default=env_root(),
        help="where environments live (default .nox/envs, shared with the nox sessions; reused)",
    )
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, help="seconds a cell may take per run")
    parser.add_argument(
        "--end-repeats",
        type=int,
        default=END_REPEATS,
        help=f"runs of each end of a range before bisecting it; ends whose verdicts differ are "
        f"flaky and not bisected (default {END_REPEATS})",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _bisect(args)
    except (ReportsError, ReleaseDataUnavailable) as error:
        print(f"error: {redact(str(error))}", file=sys.stderr)
        return 2


def _bisect(args: argparse.Namespace) -> int:
    cell = parse_cell(args.cell)
    if args.good == args.bad:
        raise BisectError(f"--good and --bad are both {args.good}; give the two ends of the range")
    if (args.deepspeed_repo or args.refine) and args.axis != "deepspeed":
        raise BisectError("--deepspeed-repo and --refine bisect DeepSpeed commits; use --axis deepspeed")
    if args.refine and not args.deepspeed_repo:
        raise BisectError("--refine bisects commits after releases and needs --deepspeed-repo PATH")
    if args.mode == "gone" and args.any_failure:
        raise BisectError("--mode gone follows --bad's failure; --any-failure would count every failure as it")
    try:
        overrides = parse_pins(args.pin, "--pin")
    except AxisValueError as error:
        raise BisectError(str(error)) from None
    clone = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    commits_only = clone is not None and not args.refine
    failing = args.bad
    pins = held_fixed_pins(
        cell, args.axis, failing.removeprefix("v") if commits_only else failing, overrides, args.store
    )
    # One probe for both levels: the failure it matches stays the one seen at the release level.
    probe = CellProbe(
        cell,
        env_root=args.env_root,
        any_failure=args.any_failure,
        cell_timeout=args.cell_timeout,
        absent_is_good=args.mode == "gone",
    )
    before_word, after_word = {
        "broken": ("last good", "first bad"),
        "fixed": ("last bad", "first good"),
        "gone": ("last with the failure", "first without it"),
    }[args.mode]
    searched = (args.good, args.bad) if args.mode == "broken" else (args.bad, args.good)
    good, bad = args.good, args.bad
    commit = None
    stored = (
        stored_release_answer(args.store, cell, args.axis, args.mode, good, bad, _held_fixed(pins, args.axis))
        if args.refine
        else None
    )
    if stored is not None:
        print(f"using the stored release-level answer: {before_word} {stored.before}, {after_word} {stored.after}")
        answer = Answer(stored.before, stored.after, stored.untestable, ())
        probe.reference = (stored.failure_class, stored.signature)
    elif not commits_only:
        probe.environment = lambda version: release_environment({**pins, args.axis: version})
        answer = bisect_releases(
            cell, args.axis, good, bad, args.mode, pins, probe, load_config().python, args.end_repeats
        )
        print(_answer_text(args.axis, answer, before_word, after_word, len(answer.steps)))
        first_changed = probe.runs.get(answer.after)
    if not commits_only:
        good, bad = (answer.before, answer.after) if args.mode == "broken" else (answer.after, answer.before)
        release_answer = answer
    if clone is not None:
        # Commit builds of the two ends are run again: a source build is not the release wheel.
        probe.environment = lambda sha: commit_environment(args.env_root, clone.path, sha, pins)
        answer, commit = bisect_commits(cell, clone, good, bad, args.mode, probe, args.end_repeats)
        print(_answer_text("commit", answer, before_word, after_word, len(answer.steps)))
        first_changed = probe.runs.get(answer.after)
        print(
            f"  {after_word} commit {commit.sha}\n  subject: {commit.subject}\n"
            f"  PR: {'#' + str(commit.pr) if commit.pr else 'unknown'}\n  files: {', '.join(commit.files)}"
        )
        if not commits_only:
            answer = replace(
                answer,
                before=release_answer.before,
                after=release_answer.after,
                untestable=release_answer.untestable + answer.untestable,
            )
    failure_class, signature = probe.reference or ("", "")
    if args.mode == "gone":
        if probe.reference is None or first_changed is None:  # the search ran the cell at both of its ends
            raise BisectError(f"{cell.id}: the search ended without a run at {answer.after}")
        kind, mode, failure_class, signature = gone_answer(probe.reference, first_changed)
        print(f"  {after_word}: " + ("the cell passes" if kind == "fixed" else f"{failure_class}: {signature}"))
    else:
        kind, mode = "broke" if args.mode == "broken" else "fixed", args.mode
    record(
        args.store,
        Bisection(
            cell=cell,
            mode=mode,
            axis=args.axis,
            before=answer.before,
            after=answer.after,
            held_fixed=_held_fixed(pins, args.axis),
            failure_class=failure_class,
            signature=signature,
            commit=commit.sha if commit else "",
            subject=commit.subject if commit else "",
            pr=commit.pr if commit else None,
            files=commit.files if commit else (),
            untestable=answer.untestable,
            recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            kind=kind,
            searched_older=searched[0],
            searched_newer=searched[1],
        ),
    )
    return 0


def gone_answer(reference: tuple[str, str], first_without: CellRun) -> tuple[TransitionKind, BisectMode, str, str]:
    """What a `--mode gone` answer answers, by what the cell did where the failure was first gone: a fix
    (kind fixed, mode fixed, keyed on the failure that went) where it passes, else a class change (mode
    broken, keyed on the failure that came, as triage keys one): (kind, mode, failure class, signature)."""
    if first_without.outcome == "pass":
        return "fixed", "fixed", *reference
    return "class-change", "broken", first_without.failure_class, first_without.signature


def _answer_text(level: str, answer: Answer, before_word: str, after_word: str, runs: int) -> str:
    text = f"answer ({runs} steps): {before_word} {level} {answer.before}, {after_word} {level} {answer.after}"
    if answer.untestable:
        text += f"; untestable in between, so the change may be in any of: {', '.join(answer.untestable)}"
    return text


if __name__ == "__main__":
    sys.exit(main())

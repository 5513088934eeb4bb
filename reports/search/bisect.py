"""Bisect one cell along one version axis: which release, and with a DeepSpeed clone which commit
(and PR), broke it (--mode broken), fixed it (--mode fixed) or first ran it where an older one refused it
(--mode supported: the cell's outcome `unsupported` is bad, any run good).

    python -m reports bisect --cell llama-eager-fp32-tp3 --axis deepspeed --good 0.16.4 --bad 0.17.0
    python -m reports bisect --cell llama-eager-fp32-tp3 --good 0.16.4 --bad 0.17.0 \
        --deepspeed-repo ~/DeepSpeed --refine
    python -m reports bisect --cell llama-eager-fp32-tp3 --good v0.16.4 --bad 3f1c2a9 --deepspeed-repo ~/DeepSpeed

"good" always means the cell passes and "bad" that it fails, so --mode broken takes --good older than
--bad and --mode fixed takes --bad older than --good. Each step runs only that cell, in an environment
of its own under .nox/envs/<key> that later bisections and matrix sessions reuse. "Bad" means the failure seen at the
failing end (same failure class and signature) unless --any-failure; a step that cannot be tested
(install failure, a different failure, a skipped cell) is skipped like `git bisect skip` and the
search continues on its neighbours. The answer goes into the history store, so the report can say
"broken by #NNNN" next to the transition.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

from matrix.releases import ReleaseDataUnavailable
from matrix.version_axes import AXES, AxisValueError, load_config, parse_pins
from matrix.versions import combinations, skip_reason
from reports.analysis import AxisRange, answer_for
from reports.clones import GitRepo
from reports.search.cell_runs import CellProbe, CellRun, parse_cell, print_step, release_candidates
from reports.search.steps import BAD, GOOD, SKIP, Answer, BisectError, Verdict, search
from reports.store import (
    Bisection,
    BisectMode,
    CellKey,
    Commit,
    HistoryStore,
    Pins,
    TransitionKind,
    pins_text,
    release,
)
from sessions.environments import commit_environment, release_environment


def bisect_releases(
    cell: CellKey,
    *,
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
        f"({pins_text(held_fixed_of(pins, axis))}), at most {_budget(len(candidates), end_repeats)} cell runs"
    )

    def judge(candidate: str) -> Verdict:
        if candidate in incompatible:
            return Verdict(SKIP, f"declared incompatible in versions.toml: {incompatible[candidate]}")
        return probe(candidate)

    return search(
        candidates, judge, start=GOOD if mode == "broken" else BAD, on_step=print_step(axis), end_repeats=end_repeats
    )


def bisect_commits(
    cell: CellKey, clone: GitRepo, *, good: str, bad: str, mode: str, probe: CellProbe, end_repeats: int = 1
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


def held_fixed_of(pins: dict[str, str], axis: str) -> Pins:
    return tuple((other, pins[other]) for other in AXES if other != axis)


def held_fixed_pins(
    cell: CellKey, axis: str, failing: str, overrides: dict[str, str], store: Path, bad_outcome: str = "fail"
) -> dict[str, str]:
    """The other axes as in the cell's bad run (`bad_outcome`: fail, or unsupported) at `failing` in the store, else
    at the latest combination of versions.toml; --pin overrides either."""
    pins: dict[str, str] = {}
    if store.exists():
        with HistoryStore(store, create=False, read_only=True) as history:
            runs = [
                o
                for o in history.observations()
                if o.cell == cell and o.result.outcome == bad_outcome and getattr(o.versions, axis) == failing
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
    store: Path, cell: CellKey, *, axis: str, mode: str, good: str, bad: str, held_fixed: Pins
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
    return answer_for(
        answers, cell, kind=kind, failure_class=None, span=AxisRange(axis, low, high), held_fixed=held_fixed
    )


def record(store: Path, bisection: Bisection) -> None:
    with HistoryStore(store, create=True) as history:
        history.add_bisection(bisection)
    print(f"recorded in {store}; `python -m reports render --store {store}` shows it in the report")


def gone_answer(reference: tuple[str, str], first_without: CellRun) -> tuple[TransitionKind, BisectMode, str, str]:
    """What a `--mode gone` answer answers, by what the cell did where the failure was first gone: a fix
    (kind fixed, mode fixed, keyed on the failure that went) where it passes, else a class change (mode
    broken, keyed on the failure that came, as triage keys one): (kind, mode, failure class, signature)."""
    if first_without.outcome == "pass":
        return "fixed", "fixed", *reference
    return "class-change", "broken", first_without.failure_class, first_without.signature


def answer_text(level: str, answer: Answer, before_word: str, after_word: str, runs: int) -> str:
    text = f"answer ({runs} steps): {before_word} {level} {answer.before}, {after_word} {level} {answer.after}"
    if answer.untestable:
        text += f"; untestable in between, so the change may be in any of: {', '.join(answer.untestable)}"
    return text


def what_it_answers(
    request: BisectRequest, probe: CellProbe, answer: Answer, first_changed: CellRun | None
) -> tuple[TransitionKind | Literal["supported"], BisectMode, str, str]:
    """The answer's (kind, mode, failure class, signature) as the store keeps it: --mode gone by what the cell did
    where the failure was first gone (`gone_answer`); --mode supported as a fix of DeepSpeed's refusal, its signature
    the refusal at the last release that refused the cell; broken and fixed keyed on the failure the probe followed."""
    failure_class, signature = probe.reference or ("", "")
    if request.mode == "gone":
        if probe.reference is None or first_changed is None:  # the search ran the cell at both of its ends
            raise BisectError(f"{request.cell}: the search ended without a run at {answer.after}")
        return gone_answer(probe.reference, first_changed)
    if request.mode == "supported":
        refused = probe.runs.get(answer.before)
        return "supported", "fixed", "", f"unsupported: {refused.message}" if refused else ""
    return ("broke" if request.mode == "broken" else "fixed"), request.mode, failure_class, signature


AskedMode = Literal["broken", "fixed", "gone", "supported"]
"""What `--mode` asks: the store keeps the first two (BisectMode), gone and supported as one of them
(what_it_answers)."""


@dataclass(frozen=True)
class BisectRequest:
    """One bisection as `python -m reports bisect` asks for it (its options, reports/commands/bisect.py)."""

    cell: str
    """The cell id, e.g. llama-eager-fp32-tp3."""
    axis: str
    """The version axis to bisect (deepspeed, transformers, torch)."""
    good: str
    """A version (or with deepspeed_repo a tag or sha) where the cell passes (mode gone: is without the failure)."""
    bad: str
    """A version (or tag or sha) where it fails."""
    mode: AskedMode
    """broken: first bad after good; fixed: first good after bad; gone: first without bad's failure; supported: the
    first that runs the cell after bad, where DeepSpeed refused it (outcome unsupported)."""
    any_failure: bool
    """Every failure counts as bad, not only the failing end's class and cause."""
    deepspeed_repo: Path | None
    """A DeepSpeed clone: bisect its commits (after the releases with refine)."""
    refine: bool
    """Bisect releases first, then the commits between the answer (needs deepspeed_repo)."""
    pin: tuple[str, ...]
    """AXIS=VERSION pins of the other axes (default: as in the stored failing run, else latest)."""
    store: Path
    """The history store read for the failing run and answered into."""
    env_root: Path
    """Where the steps' environments live (shared with the nox sessions)."""
    cell_timeout: float
    """Seconds the cell may take per run."""
    end_repeats: int
    """Runs of each end of a range before it is bisected."""


def bisect_cell(request: BisectRequest) -> None:
    """Run the bisection asked for, print each step and the answer, and record the answer in the store."""
    cell = parse_cell(request.cell)
    refuse_contradictions(request)
    try:
        overrides = parse_pins(list(request.pin), "--pin")
    except AxisValueError as error:
        raise BisectError(str(error)) from None
    clone = GitRepo(request.deepspeed_repo) if request.deepspeed_repo else None
    commits_only = clone is not None and not request.refine
    failing = request.bad
    pins = held_fixed_pins(
        cell,
        request.axis,
        failing.removeprefix("v") if commits_only else failing,
        overrides,
        request.store,
        bad_outcome="unsupported" if request.mode == "supported" else "fail",
    )
    probe = probe_for(request, cell)
    before_word, after_word = ENDS_IN_WORDS[request.mode]
    searched = (request.good, request.bad) if request.mode == "broken" else (request.bad, request.good)
    good, bad = request.good, request.bad
    commit = None
    first_changed: CellRun | None = None
    stored = (
        stored_release_answer(
            request.store,
            cell,
            axis=request.axis,
            mode=request.mode,
            good=good,
            bad=bad,
            held_fixed=held_fixed_of(pins, request.axis),
        )
        if request.refine
        else None
    )
    if stored is not None:
        print(f"using the stored release-level answer: {before_word} {stored.before}, {after_word} {stored.after}")
        answer = Answer(stored.before, stored.after, stored.untestable, ())
        probe.reference = (stored.failure_class, stored.signature)
    elif not commits_only:
        probe.environment = lambda version: release_environment({**pins, request.axis: version})
        answer = bisect_releases(
            cell,
            axis=request.axis,
            good=good,
            bad=bad,
            mode=request.mode,
            pins=pins,
            probe=probe,
            python=load_config().python,
            end_repeats=request.end_repeats,
        )
        print(answer_text(request.axis, answer, before_word, after_word, len(answer.steps)))
        first_changed = probe.runs.get(answer.after)
    if not commits_only:
        good, bad = (answer.before, answer.after) if request.mode == "broken" else (answer.after, answer.before)
        release_answer = answer
    if clone is not None:
        answer, commit, first_changed = bisect_commit_level(
            request, cell, clone, pins, probe, (good, bad), None if commits_only else release_answer
        )
    record_answer(
        request,
        cell,
        held_fixed_of(pins, request.axis),
        answer,
        commit,
        what_it_answers(request, probe, answer, first_changed),
        searched,
    )


ENDS_IN_WORDS: dict[AskedMode, tuple[str, str]] = {
    "broken": ("last good", "first bad"),
    "fixed": ("last bad", "first good"),
    "gone": ("last with the failure", "first without it"),
    "supported": ("last refusing it", "first running it"),
}
"""Each mode's two ends of the answer, as the steps and the answer print them."""


def refuse_contradictions(request: BisectRequest) -> None:
    """A BisectError for options that contradict each other, before anything runs."""
    if request.good == request.bad:
        raise BisectError(f"--good and --bad are both {request.good}; give the two ends of the range")
    if (request.deepspeed_repo or request.refine) and request.axis != "deepspeed":
        raise BisectError("--deepspeed-repo and --refine bisect DeepSpeed commits; use --axis deepspeed")
    if request.refine and not request.deepspeed_repo:
        raise BisectError("--refine bisects commits after releases and needs --deepspeed-repo PATH")
    if request.mode in ("gone", "supported") and request.any_failure:
        raise BisectError(f"--mode {request.mode} decides bad by itself; --any-failure does not apply to it")


def record_answer(
    request: BisectRequest,
    cell: CellKey,
    held_fixed: Pins,
    answer: Answer,
    commit: Commit | None,
    answers: tuple[TransitionKind | Literal["supported"], BisectMode, str, str],
    searched: tuple[str, str],
) -> None:
    """The answer into the store as a Bisection (`answers`: what_it_answers's kind, mode, class and signature);
    --mode gone also prints what the first cell without the failure did."""
    kind, mode, failure_class, signature = answers
    if request.mode == "gone":
        print(
            f"  {ENDS_IN_WORDS[request.mode][1]}: "
            + ("the cell passes" if kind == "fixed" else f"{failure_class}: {signature}")
        )
    record(
        request.store,
        Bisection(
            cell=cell,
            mode=mode,
            axis=request.axis,
            before=answer.before,
            after=answer.after,
            held_fixed=held_fixed,
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


def bisect_commit_level(
    request: BisectRequest,
    cell: CellKey,
    clone: GitRepo,
    pins: dict[str, str],
    probe: CellProbe,
    ends: tuple[str, str],
    release_answer: Answer | None,
) -> tuple[Answer, Commit, CellRun | None]:
    """The commits between the two ends (`ends`: good, bad), printed: the answer (its ends the release level's when
    there was one, the commits' untestable steps added), the commit that changed the cell and its run."""
    before_word, after_word = ENDS_IN_WORDS[request.mode]
    # Commit builds of the two ends are run again: a source build is not the release wheel.
    probe.environment = lambda sha: commit_environment(request.env_root, clone.path, sha, pins)
    answer, commit = bisect_commits(
        cell, clone, good=ends[0], bad=ends[1], mode=request.mode, probe=probe, end_repeats=request.end_repeats
    )
    print(answer_text("commit", answer, before_word, after_word, len(answer.steps)))
    first_changed = probe.runs.get(answer.after)
    print(
        f"  {after_word} commit {commit.sha}\n  subject: {commit.subject}\n"
        f"  PR: {'#' + str(commit.pr) if commit.pr else 'unknown'}\n  files: {', '.join(commit.files)}"
    )
    if release_answer is not None:
        answer = replace(
            answer,
            before=release_answer.before,
            after=release_answer.after,
            untestable=release_answer.untestable + answer.untestable,
        )
    return answer, commit, first_changed


def probe_for(request: BisectRequest, cell: CellKey) -> CellProbe:
    """One probe for both levels: the failure it matches stays the one seen at the release level."""
    return CellProbe(
        cell,
        env_root=request.env_root,
        any_failure=request.any_failure,
        cell_timeout=request.cell_timeout,
        absent_is_good=request.mode == "gone",
        runs_are_good=request.mode == "supported",
    )

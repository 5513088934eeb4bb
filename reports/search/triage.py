"""Answer every open transition of the history store by itself: which release, commit and PR broke (or
fixed) each red (or newly green) cell, on the DeepSpeed and the transformers side.

    python -m reports triage --store results/history.sqlite [--deepspeed-repo PATH] [--transformers-repo PATH]
                             [--max-cells 200] [--max-minutes 60]

Transitions that changed along the same axis, over the same release range, at the same other versions,
with the same failure class and cause (the signature with tp-dependent detail masked) are one question:
one representative cell (the smallest tp) is bisected — releases first, then commits when a clone is
given — and every other cell of the question is run once at each end of the answer, which confirms it
for that cell. A cell that does not confirm becomes a question of its own. On the transformers side a
clone also lists the commits of the range that touched the failure's files and the model's folder. The
budget stops the work between cell runs; what is left stays "not yet triaged" in the report, and a
question that cannot be answered is recorded with its reason. Answers go into the store like those of
`python -m reports bisect`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from matrix.releases import ReleaseDataUnavailable
from matrix.version_axes import AXES as INSTALLED_AXES
from matrix.version_axes import load_config
from reports.analysis import Transition, frame_files, mask_signature
from reports.clones import GitError, GitRepo
from reports.search.cell_runs import (
    CellCommand,
    CellProbe,
    classify,
    print_step,
    release_candidates,
    run_cells,
    suite_command,
)
from reports.search.steps import BAD, GOOD, SKIP, Answer, BisectError, Untestable, Verdict, search
from reports.store import (
    Bisection,
    BisectMode,
    Commit,
    HistoryStore,
    Pins,
    TransitionKind,
    TriageAttempt,
    pins_text,
    release,
)
from sessions.environments import (
    EnvironmentBuildError,
    EnvironmentSpec,
    commit_environment,
    ensure_environment,
    release_environment,
)
from suites.run.command import CELL_TIMEOUT_S

TRIAGED_AXES = ("deepspeed", "transformers")  # the axes whose releases and commits triage can install
DEEPSPEED_REPO_ENV = "AUTOTP_DEEPSPEED_REPO"
TRANSFORMERS_REPO_ENV = "AUTOTP_TRANSFORMERS_REPO"
# Where transformers keeps a file that an installed transformers names transformers/…
TRANSFORMERS_SOURCE_ROOT = "src/"
MAX_REASON = 400  # characters of an unanswered question's reason kept in the store (an installer's log is long)


class BudgetSpent(Exception):
    """The budget allows no more cell runs: what is left stays not yet triaged."""


@dataclass
class Budget:
    max_cells: int
    max_minutes: float
    spent_cells: int = 0
    started: float = field(default_factory=time.monotonic)

    def spend(self, cells: int) -> None:
        minutes = (time.monotonic() - self.started) / 60
        if minutes >= self.max_minutes:
            raise BudgetSpent(f"--max-minutes {self.max_minutes:g} reached")
        if self.spent_cells + cells > self.max_cells:
            raise BudgetSpent(
                f"--max-cells {self.max_cells} reached ({self.spent_cells} cell runs spent, "
                f"the next step needs {cells})"
            )
        self.spent_cells += cells


@dataclass(frozen=True)
class Question:
    """Transitions that one bisection answers."""

    kind: TransitionKind  # bisected as broken for a class change: the old failure stands for "good"
    axis: str
    mode: BisectMode
    older: str  # the axis value at the older end (last good when broken, last bad when fixed)
    newer: str
    held_fixed: Pins  # the other axes, as the transitions name them
    pins: tuple[tuple[str, str], ...]  # the other installable axes' versions
    failure_class: str
    cause: str
    transitions: tuple[Transition, ...]
    old_failure: tuple[str, str] | tuple[()] = ()  # a class change's failure before it changed: (class, cause)

    @property
    def representative(self) -> Transition:
        """The cheapest cell to run many times: the smallest tp, then the first by name."""
        return min(self.transitions, key=lambda t: (t.cell.tp, t.cell))

    @property
    def failing(self) -> str:
        return self.newer if self.mode == "broken" else self.older

    @property
    def absent_is_good(self) -> bool:
        """A class change is bisected for where its new failure came: any end without it is good, the old
        failure as much as a pass (reports.search.bisect.classify, the rule of `--mode gone`)."""
        return self.kind == "class-change"

    def describe(self) -> str:
        verb = {"broke": "broke", "fixed": "fixed", "class-change": "changed failure"}[self.kind]
        old = f"{self.old_failure[0]}: {self.old_failure[1]} → " if self.old_failure else ""
        return (
            f"{len(self.transitions)} cell(s) {verb} at {self.axis} {self.older} → {self.newer} "
            f"({pins_text(self.held_fixed)}), {old}{self.failure_class}: {self.cause}"
        )


def open_transitions(transitions: list[Transition], refine: tuple[str, ...] = ()) -> list[Transition]:
    """Transitions that no bisection answers yet, and with refine, those of these axes answered at release
    level only."""
    return [t for t in transitions if t.bisection is None or (t.axis in refine and not t.bisection.commit)]


def unanswerable(transition: Transition) -> str:
    """Why triage cannot bisect this transition, or ""."""
    axis = transition.axis
    if axis not in TRIAGED_AXES:
        return f"triage installs {' and '.join(TRIAGED_AXES)} releases; a {axis} change is shown with its range only"
    ends = (getattr(transition.before, axis), getattr(transition.after, axis))
    if labels := [value for value in ends if release(value) is None]:
        return f"{axis} {labels[0]} is not a release (an install failure at a git ref or a local clone)"
    if transition.after.deepspeed_git or transition.before.deepspeed_git:
        return "DeepSpeed was built from git here; triage installs releases (bisect commits with reports.search.bisect)"
    return ""


def questions(transitions: list[Transition]) -> list[Question]:
    """Group transitions into questions, the one answering the most cells first."""
    # (the transitions' cause key, held-fixed pins, a class change's old failure class and cause) -> transitions
    grouped: dict[tuple[tuple[str, ...], Pins, tuple[str, str] | tuple[()]], list[Transition]] = defaultdict(list)
    for t in transitions:
        # A root cause at one set of held-fixed versions; a class change's old failure also by its own cause.
        old: tuple[str, str] | tuple[()] = (
            (t.before_status.failure_class, mask_signature(t.before_status.signature))
            if t.kind == "class-change"
            else ()
        )
        grouped[t.cause_key, t.held_fixed, old].append(t)
    found = []
    for (_, held_fixed, old), members in grouped.items():
        first = members[0]
        axis, failing = first.axis, first.failing_end
        pins = tuple((other, getattr(first.after, other)) for other in INSTALLED_AXES if other != axis)
        found.append(
            Question(
                kind=first.kind,
                axis=axis,
                mode=first.mode,
                older=getattr(first.before, axis),
                newer=getattr(first.after, axis),
                held_fixed=held_fixed,
                pins=pins,
                failure_class=failing.failure_class,
                cause=mask_signature(failing.signature),
                transitions=tuple(sorted(members, key=lambda t: (t.cell.tp, t.cell))),
                old_failure=old,
            )
        )
    return sorted(found, key=lambda q: (-len(q.transitions), q.axis, q.older, q.cause))


@dataclass(frozen=True)
class Installer:
    """How a candidate becomes an environment; tests replace it with fake packages."""

    releases: Callable[[str, str, str], list[str]]  # (axis, older, newer) -> releases from older to newer
    release: Callable[[dict[str, str]], EnvironmentSpec]  # all three axes' releases
    commit: Callable[[str, GitRepo, str, dict[str, str]], EnvironmentSpec]  # (axis, clone, sha, other pins)


def real_installer(root: Path) -> Installer:
    python = load_config().python
    return Installer(
        releases=lambda axis, older, newer: release_candidates(axis, older, newer, python),
        release=release_environment,
        commit=lambda axis, clone, sha, pins: commit_environment(root, clone.path, sha, pins, axis),
    )


@dataclass
class Triage:
    store: Path
    env_root: Path
    installer: Installer
    budget: Budget
    repos: dict[str, GitRepo] = field(default_factory=dict)  # axis -> clone
    command: CellCommand = suite_command
    cell_timeout: float = CELL_TIMEOUT_S
    end_repeats: int = 1  # runs of each end of a search (the command line passes --end-repeats, default 2)
    model_types: dict[str, str] = field(default_factory=dict)  # registry name -> transformers model_type
    log: Callable[[str], None] = print
    answered: int = 0
    confirmed: int = 0
    steps: int = 0
    # Answers found in this run, by (axis, held-fixed versions, release | commit): tried first by later questions.
    found: dict[tuple[str, Pins, str], list[Answer]] = field(default_factory=dict)

    # ---- one question -------------------------------------------------------------------------------------------

    def answer(self, question: Question) -> list[Question]:
        """Bisect the question's representative, record the answers, confirm the others; returns the
        questions of cells that did not confirm (each of its own)."""
        rep = question.representative
        pins = dict(question.pins)
        start = GOOD if question.mode == "broken" else BAD
        failing = rep.failing_end
        probe = CellProbe(
            rep.cell,
            env_root=self.env_root,
            cell_timeout=self.cell_timeout,
            command=self.command,
            reference=(failing.failure_class, failing.signature),
            absent_is_good=question.absent_is_good,
        )
        probe.environment = lambda version: self.installer.release({**pins, question.axis: version})
        self.log(f"question: {question.describe()}; representative {rep.cell.id}")
        if (known := rep.bisection) is not None:  # refining a release-level answer
            answer = Answer(known.before, known.after, known.untestable, ())
        elif len(candidates := self.installer.releases(question.axis, question.older, question.newer)) > 2:
            answer = self._search(question, "release", candidates, probe, start)
        else:  # adjacent releases: the history already ran both ends
            answer = Answer(question.older, question.newer, (), ())
        self.log(f"  release answer: {question.axis} {answer.before} → {answer.after}")
        commit, ends = None, ("release", answer.before, answer.after)
        suspects: tuple[Commit, ...] = ()
        repo = self.repos.get(question.axis)
        if repo is not None:
            if question.axis == "transformers":
                suspects = tuple(self.suspects(repo, answer, question, rep))
                self.log(f"  {len(suspects)} suspect commit(s) touched the failure's files or the model's folder")
            commit_answer, commit = self._bisect_commits(repo, answer, question, probe, start)
            if commit_answer is not None:
                ends = ("commit", commit_answer.before, commit_answer.after)
                answer = Answer(answer.before, answer.after, answer.untestable + commit_answer.untestable, ())
        if known is not None and commit is None and suspects == known.suspects:
            self.log(
                f"  refinement found nothing beyond the stored answer {known.before} → {known.after}; nothing recorded"
            )
            return []
        now = _now()
        common: dict[str, Any] = dict(
            mode=question.mode,
            axis=question.axis,
            before=answer.before,
            after=answer.after,
            held_fixed=question.held_fixed,
            commit=commit.sha if commit else "",
            subject=commit.subject if commit else "",
            pr=commit.pr if commit else None,
            files=commit.files if commit else (),
            untestable=answer.untestable,
            suspects=suspects,
            recorded_at=now,
            kind=question.kind,
            searched_older=question.older,
            searched_newer=question.newer,
        )
        self._record(
            Bisection(cell=rep.cell, failure_class=failing.failure_class, signature=failing.signature, **common)
        )
        self.answered += 1
        others = [t for t in question.transitions if t is not rep]
        confirmed, unconfirmed = self._confirm(question, others, ends, pins) if others else ([], [])
        for t in confirmed:
            status = t.failing_end
            self._record(
                Bisection(
                    cell=t.cell,
                    failure_class=status.failure_class,
                    signature=status.signature,
                    confirmed_from=rep.cell.id,
                    **common,
                )
            )
        self.confirmed += len(confirmed)
        self.log(f"  answered {rep.cell.id}, confirmed {len(confirmed)} of {len(others)} other cell(s)")
        return [_alone(question, t) for t in unconfirmed]

    def _search(self, question: Question, level: str, line: list[str], probe: CellProbe, start: str) -> Answer:
        """The change along line (releases or commits, oldest first). An earlier question of this run with the
        same axis and other versions is often the same change seen through another failure (a fix that lets
        cells get further and fail later): its answer, where it lies on this line, is tried first — two runs
        instead of a search — and the search runs only when the cell does not change there. Each end of a
        search runs end_repeats times (reports.search.bisect.search)."""
        run = self._counted(probe)
        show = print_step(question.axis if level == "release" else "commit")
        for earlier in self.found.get((question.axis, question.held_fixed, level), []):
            if earlier.before in line and earlier.after in line:
                low, high = line.index(earlier.before), line.index(earlier.after)
                if low < high and tuple(line[low + 1 : high]) == earlier.untestable:
                    self.log(f"  trying {earlier.before} → {earlier.after} first (an earlier question's answer)")
                    try:
                        search(
                            [earlier.before, earlier.after],
                            run,
                            start=start,
                            on_step=show,
                            end_repeats=self.end_repeats,
                        )
                        return Answer(earlier.before, earlier.after, earlier.untestable, ())
                    except BisectError as error:
                        self.log(f"  not there: {error}")
                        break
        answer = search(line, run, start=start, on_step=show, end_repeats=self.end_repeats)
        self.found.setdefault((question.axis, question.held_fixed, level), []).append(answer)
        return answer

    def _counted(self, probe: CellProbe) -> Callable[[str], Verdict]:
        def run(candidate: str) -> Verdict:
            self.budget.spend(1)
            self.steps += 1
            return probe(candidate)

        return run

    def _bisect_commits(
        self, repo: GitRepo, answer: Answer, question: Question, probe: CellProbe, start: str
    ) -> tuple[Answer | None, Commit | None]:
        """The commit-level answer between the release answer's ends, or (None, None) when the commits
        cannot be bisected (the ends built from source do not reproduce, every build fails)."""
        pins = dict(question.pins)
        transformers = question.axis == "transformers"
        try:
            # transformers tags patch releases on release branches: the line starts at the merge base.
            line = repo.line(answer.before, answer.after, from_merge_base=transformers)
        except GitError as error:
            self.log(f"  commits not bisected: {error}")
            return None, None
        probe.environment = lambda sha: self.installer.commit(question.axis, repo, sha, pins)
        self.log(f"  bisecting {len(line)} {question.axis} commits {answer.before} .. {answer.after}")
        try:
            commit_answer = self._search(question, "commit", line, probe, start)
        except BisectError as error:
            self.log(f"  commits not bisected: {error}")
            return None, None
        return commit_answer, repo.info(commit_answer.after)

    def suspects(self, repo: GitRepo, answer: Answer, question: Question, rep: Transition) -> list[Commit]:
        """The range's commits that touched the failure's files (most specific first), then the model's folder."""
        status = rep.failing_end
        files = [
            TRANSFORMERS_SOURCE_ROOT + path
            for path in frame_files(status.signature, self._message(question, rep))
            if path.startswith("transformers/")
        ]
        model_type = self.model_types.get(rep.cell.model, rep.cell.model)
        paths = [*files, f"{TRANSFORMERS_SOURCE_ROOT}transformers/models/{model_type}/"]
        return [
            Commit(c.sha, c.subject, c.pr, c.files, relevant=True)
            for c in repo.touching(answer.before, answer.after, paths)
        ]

    def _message(self, question: Question, transition: Transition) -> str:
        """The failing run's message (it holds the traceback), from the store: the failure asked about, so a
        class change's new failure, not the old one it replaced."""
        with HistoryStore(self.store, create=False, read_only=True) as history:
            failing = transition.failing_versions
            messages = [
                o.result.message
                for o in history.observations()  # compacted results have none
                if o.cell == transition.cell
                and o.versions == failing
                and o.result.outcome == "fail"
                and o.result.message
            ]
        return messages[-1] if messages else ""

    def _confirm(
        self, question: Question, others: list[Transition], ends: tuple[str, str, str], pins: dict[str, str]
    ) -> tuple[list[Transition], list[Transition]]:
        """Run the other cells once at each end of the answer: confirmed where each is good at the good end
        and fails with its own recorded failure (class and cause) at the bad end, as the bisection judged."""
        level, before, after = ends
        good_end, bad_end = (before, after) if question.mode == "broken" else (after, before)
        repo = self.repos.get(question.axis)

        def environment(value: str) -> EnvironmentSpec:
            if level == "commit" and repo is not None:  # commit ends come only from an axis with a clone
                return self.installer.commit(question.axis, repo, value, pins)
            return self.installer.release({**pins, question.axis: value})

        cells = [t.cell for t in others]
        outcomes = {}
        for end in (good_end, bad_end):
            self.budget.spend(len(cells))
            try:
                python = ensure_environment(self.env_root, environment(end), log=lambda line: None)
                outcomes[end] = run_cells(python, cells, self.cell_timeout, self.command)
            except (Untestable, EnvironmentBuildError) as error:
                self.log(f"  could not confirm at {end}: {str(error).splitlines()[0]}")
                outcomes[end] = {}
        confirmed: list[Transition] = []
        unconfirmed: list[Transition] = []
        for t in others:
            status = t.failing_end
            reference = (status.failure_class, status.signature)
            verdicts = [
                classify(run, reference, False, question.absent_is_good).kind if run else SKIP
                for run in (outcomes[good_end].get(t.cell), outcomes[bad_end].get(t.cell))
            ]
            (confirmed if verdicts == [GOOD, BAD] else unconfirmed).append(t)
        return confirmed, unconfirmed

    def _record(self, bisection: Bisection) -> None:
        with HistoryStore(self.store, create=True) as history:
            history.add_bisection(bisection)

    def attempt(self, question: Question, reason: str) -> None:
        """Record why nothing answers this question (once per reason and held-fixed versions: the same
        transition at other versions of the other axes is another question), so the report says it."""
        reason = " ".join(reason.split())[:MAX_REASON]
        with HistoryStore(self.store, create=True) as history:
            known = {replace(a, recorded_at="") for a in history.triage_attempts()}
            for t in question.transitions:
                attempt = TriageAttempt(
                    cell=t.cell,
                    axis=question.axis,
                    mode=question.mode,
                    before=question.older,
                    after=question.newer,
                    held_fixed=question.held_fixed,
                    reason=reason,
                )
                if attempt not in known:
                    history.add_triage_attempt(replace(attempt, recorded_at=_now()))

    # ---- every question -----------------------------------------------------------------------------------------

    def run(self, transitions: list[Transition], refine: bool = False) -> list[Question]:
        """Answer what the budget allows (with refine, also bisect the commits of release-level answers on
        the axes with a clone); returns the questions left untriaged."""
        todo = open_transitions(transitions, tuple(self.repos) if refine else ())
        blocked = [t for t in todo if unanswerable(t)]
        for t in blocked:
            self.attempt(_alone(questions([t])[0], t), unanswerable(t))
        queue = questions([t for t in todo if not unanswerable(t)])
        self.log(
            f"triage: {len(todo)} open transition(s) in {len(queue)} question(s)"
            + (f"; {len(blocked)} cannot be bisected (reasons recorded)" if blocked else "")
        )
        while queue:
            question = queue.pop(0)
            try:
                queue.extend(self.answer(question))
            except BudgetSpent as spent:
                self.log(f"budget spent ({spent}): {len(queue) + 1} question(s) left not yet triaged")
                return [question, *queue]
            except (BisectError, GitError, ReleaseDataUnavailable) as error:  # this question's, not the run's
                self.log(f"  no answer: {error}")
                self.attempt(question, str(error))
        return []


def _alone(question: Question, transition: Transition) -> Question:
    return replace(question, transitions=(transition,))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

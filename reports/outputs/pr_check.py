"""A pull request's check in the shape of PyTorch's Dr.CI, computed once (`check`) and rendered twice: by the gate
(`python -m reports gate`, reports.outputs.gate) and by the PR comment (reports.outputs.pr_comment), so the two say
the same counts and the same causes.

"As of <head> with merge base <sha>": the candidate is the runs of the pull request's head commit (untrusted: the PR
wrote them), the base the trusted runs (the nightly) of the merge base's DeepSpeed commit — or, with a DeepSpeed clone,
of its nearest ancestor a trusted run tested — at the candidate's transformers, torch and python. A release gate
passes selectors instead (`--baseline deepspeed=0.19.7`); the comparison is the same. Causes carry the ids and words
of the report's "failing now" (reports.analysis.failing_now), failures their numbers, and on GitHub every failing
cell a link to its logs."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from matrix.known_failures import KnownFailure
from matrix.remedies import RemedyResult
from reports import ReportsError
from reports.analysis import CellStatus, GateRow, History, analyse, compare, failure_cause_id, summarise
from reports.clones import GitRepo
from reports.outputs.pr_failures import PrFailure, cause_words, classify
from reports.store import CellKey, Observation, Run

_SHA = re.compile(r"[0-9a-f]{40}")
_SHORT_SHA = 7  # DeepSpeed stamps its build with `git rev-parse --short HEAD`: at least 7 hex digits
_SERVER = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+")
_NUMBER = re.compile(r"[0-9]{1,20}")
OTHER_AXES = ("transformers", "torch", "python")  # held equal between base and candidate


def commit_sha(text: str, option: str) -> str:
    """A full commit sha as given on the command line (40 lowercase hex digits), else a clear error."""
    if not _SHA.fullmatch(text):
        raise ReportsError(f"{option} {text!r}: not a commit sha; pass all 40 hex digits (`git rev-parse HEAD`)")
    return text


@dataclass(frozen=True)
class Commits:
    """The commits a pull request's check compares."""

    head: str
    """The pull request's head commit: what its runs tested."""
    merge_base: str
    """The merge base of the head and the base branch."""
    tested_base: str
    """The DeepSpeed commit (as runs record it) of the trusted runs compared with: the merge base, or its nearest
    ancestor a trusted run tested."""


@dataclass(frozen=True)
class RunLinks:
    """Where the workflow run that made the check is read: its page (every job's log) and its report artifact
    (report.html and every failing cell's `logs/<cell>/`)."""

    run: str
    report: str = ""
    """The report artifact's page; "" where the run uploaded none."""


def run_links(environ: Mapping[str, str], report_url: str = "") -> RunLinks | None:
    """The run's links from GitHub Actions' variables (GITHUB_SERVER_URL, GITHUB_REPOSITORY, GITHUB_RUN_ID), each
    validated; None outside Actions. `report_url` must be an artifact of this run."""
    server, repo, run_id = (
        environ.get(name, "") for name in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")
    )
    if not run_id:
        if report_url:
            raise ReportsError("--report-url: given outside a GitHub Actions run (GITHUB_RUN_ID is not set)")
        return None
    for name, value, pattern in (
        ("GITHUB_SERVER_URL", server, _SERVER),
        ("GITHUB_REPOSITORY", repo, _REPO),
        ("GITHUB_RUN_ID", run_id, _NUMBER),
    ):
        if not pattern.fullmatch(value):
            raise ReportsError(f"{name}={value!r}: not what GitHub Actions sets; links to the run need it")
    run = f"{server}/{repo}/actions/runs/{run_id}"
    if report_url and not re.fullmatch(re.escape(f"{run}/artifacts/") + _NUMBER.pattern, report_url):
        raise ReportsError(f"--report-url {report_url!r}: not an artifact of this run ({run}/artifacts/<id>)")
    return RunLinks(run, report_url)


@dataclass(frozen=True)
class Fixed:
    """A cell failing on the base that passes in the candidate, with the base's cause."""

    cell: CellKey
    cause_id: str
    failure_class: str
    words: str


@dataclass(frozen=True)
class PrCheck:
    """The candidate against its base: what the gate decides and the comment says."""

    base: str
    """The base in words: the selector given, or the merge base's trusted runs."""
    commits: Commits | None
    """The commits compared, for a pull request's check (None for a release gate's selectors)."""
    base_runs: tuple[Run, ...]
    candidate_runs: tuple[Run, ...]
    failures: tuple[PrFailure, ...]
    """Every cell failing in the candidate, classified against the base (reports.outputs.pr_failures)."""
    fixed: tuple[Fixed, ...]
    rows: tuple[GateRow, ...]
    """Each cell's gate verdict (reports.analysis.comparison)."""

    @property
    def missing(self) -> list[CellKey]:
        """The base's cells with a verdict the candidate has none for: skipped, not run or renamed."""
        return [row.cell for row in self.rows if row.verdict == "missing"]


def check(
    base: list[Observation],
    candidate: list[Observation],
    history: History,
    known: dict[str, KnownFailure],
    *,
    base_text: str,
    commits: Commits | None = None,
    confirmations: int = 1,
    remedies: Sequence[RemedyResult] = (),
) -> PrCheck:
    """The one comparison the gate and the PR comment render (`remedies`: what `nox -s remedy` found, which states a
    cause proven)."""
    rows = compare(base, candidate, confirmations)
    fixed_causes: dict[str, dict[CellKey, CellStatus]] = defaultdict(dict)  # each cause's cells, in the rows' order
    for row in rows:
        if row.verdict == "fixed":
            status = summarise([obs for obs in base if obs.cell == row.cell])
            fixed_causes[failure_cause_id(status.failure_class, status.signature, status.cause)][row.cell] = status
    words = {cause_id: cause_words(cells, remedies) for cause_id, cells in fixed_causes.items()}
    order = {row.cell: place for place, row in enumerate(rows)}
    fixed = sorted(
        (
            Fixed(cell, cause_id, status.failure_class, words[cause_id])
            for cause_id, cells in fixed_causes.items()
            for cell, status in cells.items()
        ),
        key=lambda entry: order[entry.cell],
    )
    return PrCheck(
        base=base_text,
        commits=commits,
        base_runs=_runs(base),
        candidate_runs=_runs(candidate),
        failures=tuple(classify(base, candidate, history, known, remedies)),
        fixed=tuple(fixed),
        rows=tuple(rows),
    )


def check_history(observations: list[Observation], candidate: list[Observation]) -> History:
    """The history that says what is flaky: the trusted runs' and the candidate's, never another pull request's."""
    candidate_runs = {obs.run for obs in candidate}
    return analyse([obs for obs in observations if obs.run.trusted or obs.run in candidate_runs])


def _runs(observations: list[Observation]) -> tuple[Run, ...]:
    return tuple(sorted({obs.run for obs in observations}, key=lambda run: (run.started, run.run_id)))


def select_commits(
    observations: list[Observation], head: str, merge_base: str, repo: GitRepo | None
) -> tuple[list[Observation], list[Observation], Commits]:
    """The base's and the candidate's observations of a pull request's check: the candidate the runs of `head`, the
    base the trusted runs of the merge base's DeepSpeed commit (or, with `repo`, of its nearest ancestor a trusted
    run tested) at the candidate's other versions. A missing side is an error: the gate never passes what it did
    not see."""
    candidate = [obs for obs in observations if _tested(obs, head)]
    if not candidate:
        raise ReportsError(
            f"--head {head}: no stored run tested this commit, so the pull request's results are missing (its run "
            "failed, or `merge --untrusted` refused its files); nothing can pass the gate"
        )
    others = {_other_versions(obs) for obs in candidate}
    trusted = [
        obs for obs in observations if obs.run.trusted and obs.versions.deepspeed_git and _other_versions(obs) in others
    ]
    tested = sorted({obs.versions.deepspeed_git for obs in trusted})
    chosen = [sha for sha in tested if len(sha) >= _SHORT_SHA and merge_base.startswith(sha)]
    if not chosen and repo is not None:
        ancestors = [sha for sha in tested if (full := repo.find(sha)) and repo.is_ancestor(full, merge_base)]
        chosen = [max(ancestors, key=lambda sha: repo.topological_index(repo.resolve(sha)))] if ancestors else []
    if not chosen:
        raise ReportsError(
            f"--merge-base {merge_base}: no trusted run tested this DeepSpeed commit"
            + ("" if repo else " (pass --deepspeed-repo to compare with its nearest ancestor a nightly tested)")
            + f" at {', '.join(sorted(' '.join(v) for v in others))}; trusted runs tested "
            + (", ".join(sha[:10] for sha in tested) or "no DeepSpeed commit")
            + ". Run the nightly at the merge base (workflow_dispatch, pins deepspeed=deepspeed@<sha>) first"
        )
    base = [obs for obs in trusted if obs.versions.deepspeed_git in chosen]
    return base, candidate, Commits(head, merge_base, chosen[0])


def commits_base_text(commits: Commits, base: list[Observation]) -> str:
    """Which runs the base of a pull request's check is, as the gate and the comment name it."""
    runs = sorted({obs.run.run_id for obs in base})
    return f"base: DeepSpeed {commits.tested_base[:10]}: {len(runs)} trusted run(s): {', '.join(runs)}"


def _tested(obs: Observation, commit: str) -> bool:
    tested = obs.versions.deepspeed_git
    return len(tested) >= _SHORT_SHA and commit.startswith(tested)


def _other_versions(obs: Observation) -> tuple[str, ...]:
    return tuple(f"{axis} {obs.versions.label(axis)}" for axis in OTHER_AXES)

"""Post what changed since the last nightly: one PR comment, one issue per root cause of new regressions, and
with --upstream one bug report per such cause that no known failure covers, for DeepSpeed's tracker.

"Last nightly" is the previous run of the same session in the history store (reports.analysis.causes.session_deltas);
new failures, fixes and cells still failing are grouped by failure class and cause (reports.analysis.causes), so
45 cells fixed by one change are one line and a regression of 10 cells is one issue. Everything is written
to files first (results/publish/ and the step summary); with $GITHUB_TOKEN the same text is also posted,
and reruns edit what they posted before, found by a hidden HTML marker, instead of adding duplicates.
The upstream reports are reports.outputs.draft_issue's text; one closed upstream is left closed, never filed again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from matrix.known_failures import KnownFailure
from matrix.redaction import redact
from matrix.remedies import RemedyResult
from reports import Log, ReportsError
from reports.analysis import (
    SINCE_WHEN_SESSION,
    DeltaCause,
    History,
    ResultFiles,
    SessionDeltas,
    analyse,
    cause_name_text,
    cell_checkpoints,
    code,
    count_text,
    delta_causes,
    one_line,
    repro_command,
    select_baseline,
    session_deltas,
    trusted_history,
    without_since_when,
)
from reports.clones import GitRepo
from reports.outputs.draft_issue import draft_text, not_deepspeeds
from reports.outputs.github import API_URL_ENV, COMMENT_MARKER, DEFAULT_API_URL, TOKEN_ENV, Post, post_all
from reports.outputs.markdown_safety import inert
from reports.outputs.model import Report, build_report
from reports.outputs.pr_check import PrCheck, RunLinks, check, check_history, commits_base_text, select_commits
from reports.outputs.pr_comment import (
    cause_name,
    comment_markdown,
    compare_links,
    failure_class_text,
    placement_lines,
)
from reports.outputs.staging import staged, writing_to
from reports.store import (
    Bisection,
    CellKey,
    Observation,
    TriageAttempt,
    aggregate,
)

DELTA_TITLES = {"new failure": "New failures", "fixed": "Fixed", "flaky": "Flaky", "still failing": "Still failing"}
_REPO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+")
MAX_ISSUES = 5  # issues one run opens or edits (`--max-issues`); the causes past it are listed in one summary issue
SUMMARY_MARKER = "<!-- autotp-matrix:regression-summary -->"


# ---- Markdown ----------------------------------------------------------------------------------------------------


def issue_marker(delta_cause: DeltaCause) -> str:
    return f"<!-- autotp-matrix:regression cause={delta_cause.id} -->"


def regression_causes(sessions: list[SessionDeltas]) -> list[DeltaCause]:
    """The causes of new failures that passed in the last nightly: one issue each."""
    regressions = [replace(session, deltas=tuple(d for d in session.deltas if d.regression)) for session in sessions]
    return [c for c in delta_causes(regressions) if c.kind == "new failure"]


def issue_markdown(delta_cause: DeltaCause, names: Mapping[str, str] | None = None) -> tuple[str, str]:
    """A regression issue: titled by the cause's name (pr_comment.cause_name: the report's where `names` has it, else
    its own cells'), whole, its error text in the body."""
    cells = delta_cause.cells
    name = cause_name(names or {}, delta_cause.id, delta_cause.failure_class, delta_cause.title)
    title = inert(f"AutoTP regression: {one_line(name)} ({count_text(len(cells), 'cell')})", title=True)
    lines = [
        issue_marker(delta_cause),
        f"{count_text(len(cells), 'cell')} passed in the last nightly and fail now with one cause, "
        f"cause {delta_cause.id}:",
        "",
        f"- Failure: {failure_class_text(delta_cause.failure_class)}: {code(delta_cause.masked_signature)}",
        f"- Cells: {', '.join(code(cell.id) for cell in cells)}",
        "",
        "Sessions (last pass → first failure):",
        "",
    ]
    for session in delta_cause.sessions:
        ran = ", ".join(code(d.cell.id) for s, d in delta_cause.deltas if s is session)
        previous = session.previous
        if previous is None:  # a delta cause compares two runs of each of its sessions
            continue
        lines += [
            f"- {code(session.session)}: run {code(previous.run_id)} at "
            f"{previous.versions.describe()} → run {code(session.newest.run_id)} at "
            f"{session.newest.versions.describe()}: {ran}",
            *[f"  - changed: {line}" for line in compare_links(session)],
        ]
    placement = placement_lines(delta_cause)
    lines += [
        "",
        *(
            ["Where the history places it:", "", *placement]
            if placement
            else [
                "The history has no earlier pass on any single axis into these versions; `nox -s triage` or "
                "`python -m reports bisect` finds the change."
            ]
        ),
        "",
    ]
    lines += [
        f"Reproduce ({'one cell of the cause' if len(cells) > 1 else 'the cell'}):",
        "",
        "```bash",
        repro_command(cells[0]),
        "```",
    ]
    return title, issue_marker(delta_cause) + "\n" + inert("\n".join(lines[1:])) + "\n"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def build_posts(
    sessions: list[SessionDeltas],
    out_dir: Path,
    checkpoints: dict[CellKey, tuple[str, ...]],
    newest: list[Observation],
    pr: PrCheck | None = None,
    links: RunLinks | None = None,
    *,
    trusted: bool = True,
    names: Mapping[str, str] | None = None,
) -> tuple[Post, list[Post]]:
    """The comment, and one issue per cause of new regressions where every reported run is `trusted`: a pull
    request's run never opens or edits an issue, whatever its JUnit says. `names`: the report's failing-now names of
    causes, by id, which name them here too."""
    comment = Post(
        COMMENT_MARKER,
        "",
        comment_markdown(sessions, checkpoints, newest, inert, pr, links, names),
        out_dir / "publish" / "comment.md",
    )
    issues: list[Post] = []
    if not trusted:
        return comment, issues
    for delta_cause in regression_causes(sessions):
        title, body = issue_markdown(delta_cause, names)
        file = out_dir / "publish" / "issues" / f"{_slug(delta_cause.failure_class)}-{delta_cause.id}.md"
        issues.append(Post(issue_marker(delta_cause), title, body, file))
    return comment, issues


def capped(issues: list[Post], drafts: list[Post], limit: int, out_dir: Path) -> tuple[list[Post], list[Post]]:
    """At most `limit` issues for one run: regression issues first, then upstream reports; the causes past it are
    listed in one summary issue here (found again by its marker), so results with 300 causes open `limit` + 1
    issues, not 300 — in this repository or upstream."""
    kept_issues = issues[:limit]
    kept_drafts = drafts[: max(0, limit - len(kept_issues))]
    over = [*issues[len(kept_issues) :], *drafts[len(kept_drafts) :]]
    if not over:
        return kept_issues, kept_drafts
    title = f"AutoTP matrix: {count_text(len(over), 'more cause')} of new regressions than one run opens issues for"
    lines = [
        f"One run of `python -m reports publish` opens at most {limit} issues (`--max-issues`); these causes of new "
        "regressions have none yet (the PR comment and the step summary list each with its cells):",
        "",
        *[f"- {post.title}" + (" (a report for the upstream tracker)" if post in drafts else "") for post in over],
    ]
    summary = Post(
        SUMMARY_MARKER,
        title,
        f"{SUMMARY_MARKER}\n{inert(chr(10).join(lines))}\n",
        out_dir / "publish" / "issues" / "summary.md",
    )
    return [*kept_issues, summary], kept_drafts


def upstream_marker(cause: str) -> str:
    return f"<!-- autotp-matrix:upstream cause={cause} -->"


def upstream_posts(
    sessions: list[SessionDeltas],
    report: Report,
    history: History,
    observations: list[Observation],
    *,
    out_dir: Path,
    log: Log,
) -> list[Post]:
    """The draft-issue report of each cause of new regressions that fails at the latest versions (`report`, built by
    `latest_report`), is DeepSpeed's (reports.outputs.draft_issue.not_deepspeeds) and that no known failure covers,
    behind its marker."""
    failing = {entry.id: entry for entry in report.failing_now.causes}
    folder = out_dir / "publish" / "upstream"
    posts = []
    for delta_cause in regression_causes(sessions):
        entry = failing.get(delta_cause.id)
        if entry is None:
            log(
                f"upstream: cause {delta_cause.id} does not fail at the latest versions {history.latest.describe()}: "
                "no report"
            )
        elif entry.known is not None:
            log(f"upstream: cause {delta_cause.id} is known ({entry.known.upstream}): no report")
        elif not_deepspeeds(entry):
            log(f"upstream: no report: {not_deepspeeds(entry)}")
        else:
            title, body = draft_text(entry, report, history, observations, folder=folder, inert=inert)
            marker = upstream_marker(delta_cause.id)
            posts.append(Post(marker, title, f"{marker}\n{body}", folder / f"{delta_cause.id}.md"))
    return posts


def latest_report(
    history: History,
    observations: list[Observation],
    known: dict[str, KnownFailure],
    remedies: tuple[RemedyResult, ...] = (),
) -> Report:
    """The report of the trusted history, whose failing-now section names each cause failing at the latest versions
    and holds what an upstream draft says of it; `remedies`: the store's results of `nox -s remedy`
    (HistoryStore.remedy_results), which state a cause proven."""
    return build_report(history, aggregate(observations), None, known, ResultFiles(remedies=remedies))


def failing_names(report: Report) -> dict[str, str]:
    """The name of each cause failing at the latest versions, by id, as the report gives it (its classes and title,
    reports.analysis.cause_name_text): what the comment and the issues call a cause failing now."""
    return {entry.id: cause_name_text(entry) for entry in report.failing_now.causes}


def _pr_check(
    observations: list[Observation],
    newest: list[Observation],
    base: str | None,
    commits: tuple[str, str] | None,
    repo: GitRepo | None,
    known: dict[str, KnownFailure],
    log: Log,
    remedies: tuple[RemedyResult, ...] = (),
) -> PrCheck | None:
    """The pull request's check the gate prints too (reports.outputs.pr_check): the runs of the head against the
    trusted runs of the merge base (`commits`: head, merge base), or the newest runs against `base`; None without
    either. `remedies`: what `nox -s remedy` found, which states a cause proven."""
    if commits is not None:
        base_observations, candidate, tested = select_commits(observations, *commits, repo)
        base_text = commits_base_text(tested, base_observations)
    elif base is not None:
        base_observations, _ = select_baseline(observations, base, "--base")
        candidate, tested, base_text = newest, None, base
        if {obs.run for obs in base_observations} <= {obs.run for obs in newest}:
            log(f"--base {base}: selects the candidate's own run, so nothing is compared; pass the PR's base")
    else:
        return None
    history = check_history(observations, candidate)
    return check(base_observations, candidate, history, known, base_text=base_text, commits=tested, remedies=remedies)


# ---- Writing and posting -----------------------------------------------------------------------------------------


def publish_deltas(
    observations: list[Observation],
    bisections: list[Bisection],
    attempts: list[TriageAttempt],
    *,
    sessions: list[str] | None,
    out_dir: Path,
    repo: str | None,
    pr: int | None,
    deepspeed_repo: GitRepo | None,
    base: str | None = None,
    commits: tuple[str, str] | None = None,
    known: dict[str, KnownFailure] | None = None,
    upstream: str | None = None,
    max_issues: int = MAX_ISSUES,
    links: RunLinks | None = None,
    log: Log = print,
    remedies: tuple[RemedyResult, ...] = (),
) -> list[Path]:
    """Write the comment and issues under out_dir/publish/ and the step summary; post them when a token is set.
    With `base` (a PR run's base: run id or version set), the comment starts with the newest runs' failures
    classified against it (reports.outputs.pr_failures). With `upstream` (OWNER/NAME), also the bug reports for that
    repository's tracker (upstream_posts), under out_dir/publish/upstream/, opened there with the token."""
    _refuse_arguments(upstream, sessions)
    token = os.environ.get(TOKEN_ENV) or None
    all_observations = observations
    # A session's newest run is compared with its previous trusted run, and judged by trusted runs' flakiness: a pull
    # request's results are what is reported on, never the history they are compared with (reports.analysis.trust).
    observations = trusted_history(observations, sessions)
    history = analyse(observations, deepspeed_repo, bisections, attempts)
    names = sessions or sorted({obs.run.session for obs in without_since_when(observations)})
    deltas = [session_deltas(observations, history, name) for name in names]
    checkpoints = cell_checkpoints(aggregate(observations), history)
    newest_runs = {session.newest for session in deltas}
    newest = [obs for obs in observations if obs.run in newest_runs]
    checked = _pr_check(
        without_since_when(all_observations), newest, base, commits, deepspeed_repo, known or {}, log, remedies
    )
    # A pull request's run (untrusted) never opens or edits an issue, here or upstream: its JUnit chose its causes.
    untrusted = sorted(
        run.run_id for run in {*newest_runs, *(checked.candidate_runs if checked else ())} if not run.trusted
    )
    if untrusted:
        log(f"a pull request's run(s) {', '.join(untrusted)} (untrusted): the comment only, no issues opened or edited")
    with staged(out_dir) as stage:  # every text (and upstream repro script) moved into place together, or none
        report = latest_report(history, observations, known or {}, remedies)
        comment, issues = build_posts(
            deltas, stage, checkpoints, newest, checked, links, trusted=not untrusted, names=failing_names(report)
        )
        drafts = (
            upstream_posts(deltas, report, history, observations, out_dir=stage, log=log)
            if upstream and not untrusted
            else []
        )
        comment, issues, drafts = _write_redacted(comment, *capped(issues, drafts, max_issues, stage))
    written = [out_dir / post.file.relative_to(stage) for post in [comment, *issues, *drafts]]
    summary = Path(os.environ.get("GITHUB_STEP_SUMMARY") or out_dir / "step-summary.md")
    with writing_to(out_dir), summary.open("a", encoding="utf-8") as handle:  # GitHub expects steps to append
        handle.write(comment.body + "\n")
    written.append(summary)
    if token is None:
        log(
            f"{TOKEN_ENV} is not set: wrote the comment and {len(issues)} issue(s) (one per cause, at most "
            f"{max_issues} and a summary of the rest) to "
            f"{out_dir / 'publish'} and the step summary instead of posting them"
            + (f"; {len(drafts)} report(s) for {upstream} to {out_dir / 'publish' / 'upstream'}" if upstream else "")
        )
    else:
        _post(token, repo, pr, comment, issues, (upstream, drafts) if upstream else None, log)
    return written


def _refuse_arguments(upstream: str | None, sessions: list[str] | None) -> None:
    if upstream is not None and not _REPO_NAME.fullmatch(upstream):
        raise ReportsError(
            f"--upstream {upstream!r}: not a GitHub repository; pass OWNER/NAME, e.g. deepspeedai/DeepSpeed"
        )
    # A since-when run is no session's newest or previous run, nor a side of the check (reports.analysis.trust); the
    # history keeps it, as the drafts say since when from it.
    if sessions and SINCE_WHEN_SESSION in sessions:
        raise ReportsError(
            f"--session {SINCE_WHEN_SESSION}: its runs are earlier points of the new causes' example cells, never "
            "compared with each other; pass the nightly's sessions"
        )


def _write_redacted(comment: Post, issues: list[Post], drafts: list[Post]) -> tuple[Post, list[Post], list[Post]]:
    """The texts redacted and written to their files. The store redacts what it imports; a store written before it
    did, or a message quoting this environment's token, must not leak through the texts either."""
    comment = replace(comment, body=redact(comment.body))
    issues, drafts = (
        [replace(post, title=redact(post.title), body=redact(post.body)) for post in posts]
        for posts in (issues, drafts)
    )
    for post in [comment, *issues, *drafts]:
        post.file.parent.mkdir(parents=True, exist_ok=True)
        post.file.write_text(f"# {post.title}\n\n{post.body}" if post.title else post.body, encoding="utf-8")
    return comment, issues, drafts


def _post(
    token: str,
    repo: str | None,
    pr: int | None,
    comment: Post,
    issues: list[Post],
    upstream: tuple[str, list[Post]] | None,
    log: Log,
) -> None:
    """Post the comment and the issues (and the upstream reports) with the token; an error's text redacted."""
    if not repo:
        raise ReportsError(f"{TOKEN_ENV} is set but no repository: pass --repo OWNER/NAME or set GITHUB_REPOSITORY")
    api_url = os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    try:
        post_all(
            token=token,
            api_url=api_url,
            repo_name=repo,
            pr=pr,
            comment=comment,
            issues=issues,
            upstream=upstream,
            log=log,
        )
    except ReportsError as exc:
        raise ReportsError(redact(str(exc))) from None

"""Post what changed since the last nightly: one PR comment, one issue per new regression.

"Last nightly" is the previous run of the same session in the history store; the newest run is
compared with it cell by cell (reports.gate.compare), and flakiness comes from the whole history
(reports.history.analyse). Everything is written to files first (results/publish/ and the step
summary); with $GITHUB_TOKEN the same text is also posted, and reruns edit what they posted before,
found by a hidden HTML marker, instead of adding duplicates.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from reports import ReportsError
from reports.git import GitRepo
from reports.gate import compare
from reports.history import CellStatus, History, analyse
from reports.model import AXES, Bisection, CellKey, CellResult, Observation, Run, Versions, release
from reports.render import _one_line, _transition, commit_lines, transition_text
from suites.records import redact

TOKEN_ENV = "GITHUB_TOKEN"
API_URL_ENV = "GITHUB_API_URL"  # set by GitHub Actions (GitHub Enterprise has its own); tests point it at loopback
DEFAULT_API_URL = "https://api.github.com"
COMMENT_MARKER = "<!-- autotp-matrix:publish -->"
REGRESSION_LABEL = "autotp-regression"
HTTP_TIMEOUT_S = 30
WRITE_SPACING_S: float | None = 1.0  # GitHub asks integrations to space writes; tests set None
# Order of the comment's sections; a cell is in exactly one.
DELTA_KINDS = ("new failure", "fixed", "flaky", "still failing")


@dataclass(frozen=True)
class Delta:
    kind: str  # one of DELTA_KINDS
    cell: CellKey
    result: CellResult  # the cell's result in the newest run
    regression: bool  # new failure that passed in the last nightly: gets an issue
    flaky: CellStatus | None  # the tally at the newest versions, for flaky cells
    transitions: tuple[dict, ...] = ()  # for regressions: the history's "broke" transitions into the newest
    # versions (render's JSON form), with commits when a DeepSpeed clone is given and any bisection answer


@dataclass(frozen=True)
class SessionDeltas:
    session: str
    newest: Run
    previous: Run | None  # None: the first run of this session, nothing to compare with
    deltas: tuple[Delta, ...]
    suspects: tuple[str, ...]  # one line per version axis that changed between the two runs, with a compare link


@dataclass(frozen=True)
class Post:
    """One GitHub text, found again by its marker: the PR comment (no title) or a regression issue."""

    marker: str
    title: str
    body: str
    file: Path


def session_deltas(observations: list[Observation], history: History, session: str) -> SessionDeltas:
    runs = sorted({obs.run for obs in observations if obs.run.session == session}, key=lambda r: (r.started, r.run_id))
    if not runs:
        known = sorted({obs.run.session for obs in observations})
        raise ReportsError(f"--session {session!r}: no stored run of this session; stored sessions: {', '.join(known)}")
    newest, previous = runs[-1], (runs[-2] if len(runs) > 1 else None)
    newest_results = {obs.cell: obs.result for obs in observations if obs.run == newest}
    rows = compare(
        [obs for obs in observations if obs.run == previous],
        [obs for obs in observations if obs.run == newest],
        confirmations=1,
    )
    deltas = []
    for row in rows:
        if row.cell not in newest_results:
            continue  # not run tonight: nothing new to say about it
        status = history.statuses[row.cell, newest.versions]
        kind = _kind(row.verdict, status.status == "flaky")
        if not kind:
            continue
        regression = kind == "new failure" and row.verdict == "regression"
        transitions = tuple(
            _transition(t) for t in history.transitions
            if regression and t.kind == "broke" and t.cell == row.cell and t.after == newest.versions
        )
        deltas.append(Delta(kind, row.cell, newest_results[row.cell], regression,
                            status if kind == "flaky" else None, transitions))
    suspects = _suspects(previous, newest) if previous else ()
    if not suspects and any(delta.regression for delta in deltas):
        suspects = ("no version changed since the last nightly: suspect the runner or a nondeterministic failure",)
    return SessionDeltas(session, newest, previous, tuple(deltas), suspects)


def _kind(verdict: str, flaky_at_newest: bool) -> str:
    """Map a gate verdict (newest run vs last nightly) to a comment section; "" for cells not mentioned."""
    if flaky_at_newest:
        return "flaky"  # passed and failed at these exact versions: neither a regression nor a fix
    return {"regression": "new failure", "new failure": "new failure", "baseline flaky": "flaky",
            "fixed": "fixed", "known": "still failing"}.get(verdict, "")


def _suspects(previous: Run, newest: Run) -> tuple[str, ...]:
    from matrix.versions import load_config  # the axis repositories live with the version axes

    repos = {axis: rule.repo for axis, rule in load_config().axes.items()}
    lines = []
    for axis in AXES:
        before, after = previous.versions.label(axis), newest.versions.label(axis)
        if before != after:
            link = f" ({repos[axis]}/compare/{_git_ref(previous.versions, axis)}...{_git_ref(newest.versions, axis)})"
            lines.append(f"{axis} {before} → {after}{link if repos.get(axis) else ''}")
    return tuple(lines)


def _git_ref(versions: Versions, axis: str) -> str:
    if axis == "deepspeed" and versions.deepspeed_git:
        return versions.deepspeed_git
    value = getattr(versions, axis)
    return f"v{value}" if release(value) is not None else value  # a label (master, a sha) is a ref already


# ---- Markdown ----------------------------------------------------------------------------------------------------


def repro_command(cell: CellKey) -> str:
    return f"nox -s repro -- --models {cell.model} --variants {cell.variant} --dtypes {cell.dtype} --tp {cell.tp}"


def _delta_line(delta: Delta) -> str:
    result = delta.result
    if delta.kind == "flaky":
        tally = delta.flaky
        detail = f"{tally.passes} pass / {tally.fails} fail at these versions" if tally else "flaky in the last nightly"
    elif delta.kind == "fixed":
        detail = "passes now"
    else:
        detail = f"{result.failure_class}: {_one_line(result.signature)}"
        if delta.kind == "new failure" and not delta.regression:
            detail += " (no verdict in the last nightly)"
    return f"- `{delta.cell.id}` — {detail}"


def comment_markdown(sessions: list[SessionDeltas]) -> str:
    lines = [COMMENT_MARKER, "## AutoTP matrix: changes since the last nightly", ""]
    for session in sessions:
        newest = session.newest
        lines += [f"### `{session.session}`", "", f"Newest run `{newest.run_id}` at {newest.versions.describe()}."]
        if session.previous is None:
            lines += ["No previous run of this session is stored, so nothing is compared.", ""]
        else:
            lines += [f"Last nightly `{session.previous.run_id}` at {session.previous.versions.describe()}.", ""]
        if session.suspects:
            lines += ["Changed since the last nightly:", "", *[f"- {line}" for line in session.suspects], ""]
        by_kind = defaultdict(list)
        for delta in session.deltas:
            by_kind[delta.kind].append(delta)
        counts = ", ".join(f"{kind}: {len(by_kind[kind])}" for kind in DELTA_KINDS)
        lines += [counts, ""]
        for kind in DELTA_KINDS:
            if by_kind[kind]:
                lines += [f"**{kind.capitalize()}**", "", *map(_delta_line, by_kind[kind]), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def issue_marker(session: str, cell: CellKey) -> str:
    return f"<!-- autotp-matrix:regression session={session} cell={cell.id} -->"


def issue_markdown(session: SessionDeltas, delta: Delta) -> tuple[str, str]:
    cell, result = delta.cell, delta.result
    title = f"AutoTP regression: {cell.id} ({result.failure_class}) in {session.session}"
    lines = [
        issue_marker(session.session, cell),
        f"`{cell.id}` (model {cell.model}, variant {cell.variant}, dtype {cell.dtype}, tp {cell.tp}) passed in the "
        f"last nightly and fails now.",
        "",
        f"- Session: `{session.session}`",
        f"- Last pass: run `{session.previous.run_id}` at {session.previous.versions.describe()}",
        f"- First failure: run `{session.newest.run_id}` at {session.newest.versions.describe()}",
        f"- Failure: {result.failure_class}: {_one_line(result.signature)}",
        "",
        "Changed since the last nightly:",
        "",
        *[f"- {line}" for line in session.suspects],
        "",
        *_placement(delta),
        "Reproduce:",
        "",
        "```bash",
        repro_command(cell),
        "```",
    ]
    return title, "\n".join(lines) + "\n"


def _placement(delta: Delta) -> list[str]:
    """Where the whole history places the break: last good → first bad per axis, commits, bisection answer."""
    if not delta.transitions:
        return ["The history has no earlier pass on any single axis into these versions; bisect with "
                "`python -m reports.bisect` to find the change.", ""]
    lines = ["Where the history places it (last good → first bad on one axis, others held fixed):", ""]
    for transition in delta.transitions:
        lines += [f"- {transition_text(transition)}", *commit_lines(transition)]
    return [*lines, ""]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def build_posts(sessions: list[SessionDeltas], out_dir: Path) -> tuple[Post, list[Post]]:
    comment = Post(COMMENT_MARKER, "", comment_markdown(sessions), out_dir / "publish" / "comment.md")
    issues = []
    for session in sessions:
        for delta in session.deltas:
            if delta.regression:
                title, body = issue_markdown(session, delta)
                file = out_dir / "publish" / "issues" / f"{_slug(session.session)}--{delta.cell.id}.md"
                issues.append(Post(issue_marker(session.session, delta.cell), title, body, file))
    return comment, issues


# ---- Writing and posting -----------------------------------------------------------------------------------------


def publish(observations: list[Observation], bisections: list[Bisection], sessions: list[str] | None, out_dir: Path,
            *, repo: str | None, pr: int | None, deepspeed_repo: GitRepo | None, log=print) -> list[Path]:
    """Write the comment and issues under out_dir/publish/ and the step summary; post them when a token is set."""
    token = os.environ.get(TOKEN_ENV) or None
    history = analyse(observations, deepspeed_repo, bisections)
    names = sessions or sorted({obs.run.session for obs in observations})
    deltas = [session_deltas(observations, history, name) for name in names]
    comment, issues = build_posts(deltas, out_dir)
    # A failure message can quote the environment; no credential may leave this process either way.
    comment = replace(comment, body=redact(comment.body))
    issues = [replace(post, title=redact(post.title), body=redact(post.body)) for post in issues]

    written = []
    for post in [comment, *issues]:
        post.file.parent.mkdir(parents=True, exist_ok=True)
        post.file.write_text(f"# {post.title}\n\n{post.body}" if post.title else post.body, encoding="utf-8")
        written.append(post.file)
    summary = Path(os.environ.get("GITHUB_STEP_SUMMARY") or out_dir / "step-summary.md")
    with summary.open("a", encoding="utf-8") as handle:  # GitHub expects steps to append
        handle.write(comment.body + "\n")
    written.append(summary)

    if token is None:
        log(f"{TOKEN_ENV} is not set: wrote the comment and {len(issues)} regression issue(s) to "
            f"{out_dir / 'publish'} and the step summary instead of posting them")
        return written
    if not repo:
        raise ReportsError(f"{TOKEN_ENV} is set but no repository: pass --repo OWNER/NAME or set GITHUB_REPOSITORY")
    api_url = os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    try:
        _post(token, api_url, repo, pr, comment, issues, log)
    except ReportsError as exc:
        raise ReportsError(redact(str(exc))) from None
    return written


def _post(token: str, api_url: str, repo_name: str, pr: int | None, comment: Post, issues: list[Post], log) -> None:
    try:
        from github import Auth, Github, GithubException
    except ImportError:
        raise ReportsError("posting needs PyGithub: `pip install --group publish` (pinned in pyproject.toml)") from None
    client = Github(auth=Auth.Token(token), base_url=api_url, timeout=HTTP_TIMEOUT_S, retry=None,
                    seconds_between_requests=None, seconds_between_writes=WRITE_SPACING_S)
    try:
        repo = client.get_repo(repo_name)
        if pr is None:
            log("no --pr given: the comment is only in the files, not posted")
        else:
            thread = repo.get_issue(pr)
            mine = next((c for c in thread.get_comments() if COMMENT_MARKER in (c.body or "")), None)
            if mine is None:
                log(f"commented on {repo_name}#{pr}: {thread.create_comment(comment.body).html_url}")
            else:
                mine.edit(comment.body)
                log(f"updated the comment on {repo_name}#{pr}: {mine.html_url}")
        if issues:
            _post_issues(repo, repo_name, issues, log)
    except GithubException as exc:
        raise ReportsError(f"GitHub API {api_url} answered {exc.status}: {exc.data}; nothing further was posted") from None
    except OSError as exc:  # connection refused, timeouts, DNS
        raise ReportsError(f"cannot reach the GitHub API at {api_url}: {exc}") from None
    finally:
        client.close()


def _post_issues(repo, repo_name: str, issues: list[Post], log) -> None:
    from github import GithubException

    # Our issues are found again through their label, so it must exist: GitHub may drop unknown labels on creation.
    try:
        repo.get_label(REGRESSION_LABEL)
    except GithubException as exc:
        if exc.status != 404:
            raise
        repo.create_label(REGRESSION_LABEL, "d73a4a", "A cell of the AutoTP matrix that passed in the last nightly fails")
    open_issues = list(repo.get_issues(state="open", labels=[REGRESSION_LABEL]))
    for post in issues:
        existing = next((issue for issue in open_issues if post.marker in (issue.body or "")), None)
        if existing is None:
            created = repo.create_issue(post.title, post.body, labels=[REGRESSION_LABEL])
            log(f"opened {repo_name}#{created.number}: {post.title}")
        else:
            existing.edit(title=post.title, body=post.body)
            log(f"updated {repo_name}#{existing.number}: {post.title}")

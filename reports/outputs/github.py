"""Posting to GitHub (PyGithub, pinned in pyproject's publish group): the PR comment edited in place, regression
issues found again by their label and marker, reports opened in an upstream tracker; errors as one line.

Only the harness edits its texts: a comment or issue is ours only when the token's own user wrote it and it holds the
marker, so a marker pasted into someone else's comment or issue (a PR's author, a reviewer) is never edited. The
markers are computed from trusted data: publish opens or edits issues for trusted runs only
(reports.outputs.publish)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reports import Log, ReportsError

if TYPE_CHECKING:  # PyGithub is imported where it posts: only publishing needs it installed
    from github.Issue import Issue
    from github.Repository import Repository

TOKEN_ENV = "GITHUB_TOKEN"
API_URL_ENV = "GITHUB_API_URL"  # set by GitHub Actions (GitHub Enterprise has its own); tests point it at loopback
DEFAULT_API_URL = "https://api.github.com"
COMMENT_MARKER = "<!-- autotp-matrix:publish -->"
REGRESSION_LABEL = "autotp-regression"
HTTP_TIMEOUT_S = 30
WRITE_SPACING_S: float | None = 1.0  # GitHub asks integrations to space writes; tests set None


@dataclass(frozen=True)
class Post:
    """One GitHub text, found again by its marker: the PR comment (no title) or a regression issue."""

    marker: str
    title: str
    body: str
    file: Path


def post_all(
    *,
    token: str,
    api_url: str,
    repo_name: str,
    pr: int | None,
    comment: Post,
    issues: list[Post],
    upstream: tuple[str, list[Post]] | None,
    log: Log,
) -> None:
    try:
        # lazily: PyGithub is optional (the publish group): only posting to GitHub needs it
        from github import Auth, Github, GithubException
    except ImportError:
        raise ReportsError("posting needs PyGithub: `pip install --group publish` (pinned in pyproject.toml)") from None
    client = Github(
        auth=Auth.Token(token),
        base_url=api_url,
        timeout=HTTP_TIMEOUT_S,
        retry=None,
        seconds_between_requests=None,
        seconds_between_writes=WRITE_SPACING_S,
    )
    try:
        repo = client.get_repo(repo_name)
        me = client.get_user().login
        if pr is None:
            log("no --pr given: the comment is only in the files, not posted")
        else:
            thread = repo.get_issue(pr)
            mine = next(
                (
                    c
                    for c in thread.get_comments()
                    if c.user is not None and c.user.login == me and COMMENT_MARKER in (c.body or "")
                ),
                None,
            )
            if mine is None:
                log(f"commented on {repo_name}#{pr}: {thread.create_comment(comment.body).html_url}")
            else:
                mine.edit(comment.body)
                log(f"updated the comment on {repo_name}#{pr}: {mine.html_url}")
        if issues:
            _post_issues(repo, repo_name, issues, me, log)
        if upstream and upstream[1]:
            # Upstream labels are not ours to create: the reports are found again among the issues this token opened,
            # closed ones too (a maintainer closed it: it is not filed again).
            upstream_name, drafts = upstream
            upstream_repo = client.get_repo(upstream_name)
            # PyGithub takes the creator's login (its docstring: "string or NamedUser"; its annotation names only the
            # latter).
            opened = list(upstream_repo.get_issues(state="all", creator=me))  # type: ignore[arg-type]
            _open_or_edit(upstream_repo, upstream_name, drafts, listed=opened, labels=[], log=log)
    except GithubException as exc:
        raise ReportsError(
            f"GitHub API {api_url} answered {exc.status}: {exc.data}; nothing further was posted"
        ) from None
    except OSError as exc:  # connection refused, timeouts, DNS
        raise ReportsError(f"cannot reach the GitHub API at {api_url}: {exc}") from None
    finally:
        client.close()


def _post_issues(repo: Repository, repo_name: str, issues: list[Post], me: str, log: Log) -> None:
    # lazily: PyGithub is optional (the publish group): only posting to GitHub needs it
    from github import GithubException

    # Our issues are found again through their label, so it must exist: GitHub may drop unknown labels on creation.
    try:
        repo.get_label(REGRESSION_LABEL)
    except GithubException as exc:
        if exc.status != 404:
            raise
        repo.create_label(REGRESSION_LABEL, "d73a4a", "Cells of the AutoTP matrix that passed in the last nightly fail")
    # PyGithub takes the creator's login (see post_all).
    listed = list(repo.get_issues(state="open", labels=[REGRESSION_LABEL], creator=me))  # type: ignore[arg-type]
    _open_or_edit(repo, repo_name, issues, listed=listed, labels=[REGRESSION_LABEL], log=log)


def _open_or_edit(
    repo: Repository, repo_name: str, posts: list[Post], *, listed: list[Issue], labels: list[str], log: Log
) -> None:
    """Each post edits the listed issue carrying its marker (one that is closed is left alone), else is opened."""
    for post in posts:
        existing = next((issue for issue in listed if post.marker in (issue.body or "")), None)
        if existing is None:
            created = repo.create_issue(post.title, post.body, labels=labels)
            log(f"opened {repo_name}#{created.number}: {post.title}")
        elif existing.state == "closed":
            log(f"left {repo_name}#{existing.number} closed: {post.title}")
        else:
            existing.edit(title=post.title, body=post.body)
            log(f"updated {repo_name}#{existing.number}: {post.title}")

"""The one wrapper around a local git clone (DeepSpeed or transformers): resolving releases to commits,
the commits of a range with their PR numbers, and which commits touched which files.

Releases are tagged `v0.16.4` (DeepSpeed) and `v5.21.0` (transformers). Patch releases of transformers
live on release branches, so the older end of a range is not always an ancestor of the newer one; a
commit line then starts at their merge base."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Collection
from functools import cache, cached_property
from pathlib import Path

from reports import ReportsError
from reports.store import Commit
from suites.base.git import GitFailed, run_git

# GitHub squash merges title a commit "Subject (#1234)"; the last such number is the PR.
PR_NUMBER = re.compile(r"\(#(\d+)\)")


def pr_of(subject: str) -> int | None:
    numbers = PR_NUMBER.findall(subject)
    return int(numbers[-1]) if numbers else None


HARNESS_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this harness runs from: its commits are the ones runs record as run.harness_git."""


@cache
def harness_history() -> tuple[str, ...]:
    """The harness's own commits, oldest first (parents before children), from the checkout it runs from; () where
    that is no git checkout (an installed copy) or git cannot say."""
    try:
        listed = run_git("rev-list", "--topo-order", "--reverse", "HEAD", folder=HARNESS_ROOT, timeout=60)
    except GitFailed:
        return ()
    return tuple(listed.stdout.split()) if listed.returncode == 0 else ()


def harness_order(commits: Collection[str]) -> dict[str, int] | None:
    """Each recorded harness commit's place in the harness's history (a run's `-dirty` build at its commit's), or
    None when git cannot place every one (a shallow checkout, a fork's commit, a file from before they were kept)."""
    history = harness_history()
    places = {sha: place for place, sha in enumerate(history)}
    order = {}
    for commit in commits:
        sha = commit.removesuffix("-dirty")
        place = places.get(sha)
        if place is None and len(sha) >= 7:
            place = next((n for prefix, n in places.items() if prefix.startswith(sha)), None)
        if place is None:
            return None
        order[commit] = place
    return order


class GitError(ReportsError):
    """A git command failed or a ref is missing in the clone: the message names the clone and the ref."""


# A file every commit of the project has had since its first release, by the option that names its clone: any
# other repository (the harness's own, a fork of something else) would answer git and give wrong commit ranges.
PROJECT_FILE = {"--deepspeed-repo": "deepspeed/__init__.py", "--transformers-repo": "src/transformers/__init__.py"}
PROJECT_NAME = {"--deepspeed-repo": "DeepSpeed", "--transformers-repo": "transformers"}


class GitRepo:
    def __init__(self, path: Path, option: str = "--deepspeed-repo"):
        """option names the command-line flag the path came from, so errors say which one to fix; a clone that lacks
        its project's file (PROJECT_FILE) at HEAD is refused."""
        self.path = Path(path)
        self.option = option
        if self._status("rev-parse", "--git-dir") != 0:
            raise GitError(f"{option} {self.path}: not a git clone; pass the path of a local clone")
        root = Path(self._git("rev-parse", "--show-toplevel").strip())
        if root.resolve() != self.path.resolve():  # a folder inside some other repository answers git too
            raise GitError(
                f"{option} {self.path}: a folder inside the git repository {root}, not the root of a "
                "clone; pass the root folder of a local clone"
            )
        if self._status("cat-file", "-e", f"HEAD:{PROJECT_FILE[option]}") != 0:
            raise GitError(
                f"{option} {self.path}: not a {PROJECT_NAME[option]} clone (no {PROJECT_FILE[option]} at HEAD); "
                f"pass the root folder of a local {PROJECT_NAME[option]} clone"
            )

    def _git(self, *args: str) -> str:
        completed = self._run(*args)
        if completed.returncode != 0:
            raise GitError(f"git {' '.join(args)} failed in {self.path}: {completed.stderr.strip()}")
        return completed.stdout

    def _status(self, *args: str) -> int:
        return self._run(*args).returncode

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return run_git(*args, folder=self.path)
        except GitFailed:  # no timeout given: git is not installed
            raise GitError(f"`git` is not installed; install it or drop {self.option}") from None

    @cache  # noqa: B019 (one GitRepo per command, kept to its end) history ordering asks for the same refs many times; each answer costs a git process
    def find(self, ref: str) -> str | None:
        """The full sha of a commit, tag or release (0.16.4 finds the tag v0.16.4), or None."""
        for candidate in (ref, f"v{ref}"):
            if self._status("rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}") == 0:
                return self._git("rev-parse", f"{candidate}^{{commit}}").strip()
        return None

    def resolve(self, ref: str) -> str:
        if (sha := self.find(ref)) is None:
            raise GitError(
                f"{self.option} {self.path}: no commit or tag {ref!r} (nor v{ref}); "
                f"`git -C {self.path} fetch --tags origin` may bring it"
            )
        return sha

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self._status("merge-base", "--is-ancestor", self.resolve(older), self.resolve(newer)) == 0

    def line(self, older: str, newer: str, *, from_merge_base: bool = False) -> list[str]:
        """older, then the first-parent line from older to newer (oldest first), shas in full. With
        from_merge_base, an older end on another branch (a patch release) is replaced by the merge base."""
        low, high = self.resolve(older), self.resolve(newer)
        if low == high:
            raise GitError(f"{older} and {newer} are the same commit {low[:12]}; nothing to bisect")
        if not self.is_ancestor(low, high):
            if not from_merge_base:
                raise GitError(
                    f"{older} ({low[:12]}) is not an ancestor of {newer} ({high[:12]}); the older "
                    "end must come first in history (swap them, or check --mode)"
                )
            low = self._git("merge-base", low, high).strip()
        return [low, *self._git("rev-list", "--reverse", "--first-parent", "--ancestry-path", f"{low}..{high}").split()]

    def info(self, sha: str) -> Commit:
        """One commit: subject, PR number and the files it touched."""
        subject = self._git("log", "-1", "--format=%s", sha).strip()
        files = self._git("diff-tree", "--root", "--no-commit-id", "--name-only", "-r", sha).split()
        return Commit(self.resolve(sha), subject, pr_of(subject), tuple(files))

    @cache  # noqa: B019 (one GitRepo per command, kept to its end) many cells change in the same range
    def between(self, older: str, newer: str, relevant_paths: tuple[str, ...] = ()) -> tuple[Commit, ...]:
        """Commits in newer but not in older, newest first; those touching relevant_paths (files or
        folders) first, each part newest first."""
        revision_range = f"{self.resolve(older)}..{self.resolve(newer)}"
        log = self._git("log", "--topo-order", "--format=%H%x1f%s", revision_range)
        touching = (
            set(self._git("log", "--format=%H", revision_range, "--", *relevant_paths).split())
            if relevant_paths
            else set()
        )
        commits = [
            Commit(sha, subject, pr_of(subject), relevant=sha in touching)
            for sha, subject in (line.split("\x1f", 1) for line in log.splitlines())
        ]
        return tuple(sorted(commits, key=lambda commit: not commit.relevant))  # stable: git order in each part

    def touching(self, older: str, newer: str, paths: list[str]) -> list[Commit]:
        """The commits of older..newer that touched any of paths, those touching the earliest-named path first
        (paths go from most to least specific), each part newest first, each commit once, with its files."""
        revision_range = f"{self.resolve(older)}..{self.resolve(newer)}"
        found: dict[str, Commit] = {}
        for path in paths:
            for sha in self._git("log", "--topo-order", "--format=%H", revision_range, "--", path).split():
                if sha not in found:
                    found[sha] = self.info(sha)
        return list(found.values())

    @cached_property
    def _topological_index(self) -> dict[str, int]:
        shas = self._git("rev-list", "--topo-order", "--reverse", "--all").split()
        return {sha: index for index, sha in enumerate(shas)}

    def topological_index(self, sha: str) -> int:
        if sha not in self._topological_index:
            raise GitError(
                f"{self.option} {self.path}: commit {sha} is not on any branch or tag, so it cannot "
                "be ordered; fetch the branch that contains it"
            )
        return self._topological_index[sha]

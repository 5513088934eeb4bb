"""Map DeepSpeed versions onto a local git clone: ordering and the commits/PRs in a range."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

from reports import ReportsError
from reports.model import Versions

# Commits under these paths most often change AutoTP behaviour, so they are listed first.
AUTOTP_PATHS = ("deepspeed/module_inject/", "deepspeed/inference/", "deepspeed/accelerator/")
_PR_NUMBER = re.compile(r"\(#(\d+)\)")


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    pr: int | None  # from a "Subject (#1234)" squash-merge title
    touches_autotp: bool


class DeepSpeedRepo:
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self._git("rev-parse", "--git-dir")
        except ReportsError:
            raise ReportsError(
                f"--deepspeed-repo {self.path}: not a git clone; pass the path of a local DeepSpeed clone"
            ) from None

    def _git(self, *args: str) -> str:
        try:
            completed = subprocess.run(
                ["git", "-C", str(self.path), *args], capture_output=True, text=True, check=True
            )
        except FileNotFoundError:
            raise ReportsError("`git` is not installed; install it or drop --deepspeed-repo") from None
        except subprocess.CalledProcessError as exc:
            raise ReportsError(f"git {' '.join(args)} failed in {self.path}: {exc.stderr.strip()}") from None
        return completed.stdout

    @cache  # sorting asks for the same versions many times; each answer costs a git process
    def resolve(self, versions: Versions) -> str:
        """The commit a run's DeepSpeed came from: its git sha, else the release tag."""
        if versions.deepspeed_git:
            candidates = [versions.deepspeed_git]
        else:
            candidates = [f"v{versions.deepspeed}", versions.deepspeed]
        for ref in candidates:
            try:
                return self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
            except ReportsError:
                continue
        raise ReportsError(
            f"--deepspeed-repo {self.path}: cannot find DeepSpeed {versions.label('deepspeed')} "
            f"(tried {', '.join(candidates)}); run `git -C {self.path} fetch --tags origin` or drop --deepspeed-repo"
        )

    @cached_property
    def _topological_index(self) -> dict[str, int]:
        shas = self._git("rev-list", "--topo-order", "--reverse", "--all").split()
        return {sha: index for index, sha in enumerate(shas)}

    def topological_index(self, versions: Versions) -> int:
        sha = self.resolve(versions)
        if sha not in self._topological_index:
            raise ReportsError(
                f"--deepspeed-repo {self.path}: commit {sha} of DeepSpeed {versions.label('deepspeed')} is not on "
                "any branch or tag, so it cannot be ordered; fetch the branch that contains it"
            )
        return self._topological_index[sha]

    def commits_between(self, older: Versions, newer: Versions) -> list[Commit]:
        """Commits in newer but not in older, AutoTP-relevant ones first, each group newest first."""
        return self._commits_in_range(f"{self.resolve(older)}..{self.resolve(newer)}")

    @cache  # many cells usually break in the same release range
    def _commits_in_range(self, revision_range: str) -> list[Commit]:
        log = self._git("log", "--topo-order", "--format=%H%x1f%s", revision_range)
        touching = set(self._git("log", "--format=%H", revision_range, "--", *AUTOTP_PATHS).split())
        commits = []
        for line in log.splitlines():
            sha, subject = line.split("\x1f", 1)
            pr = _PR_NUMBER.findall(subject)
            commits.append(Commit(sha, subject, int(pr[-1]) if pr else None, sha in touching))
        return sorted(commits, key=lambda commit: not commit.touches_autotp)  # stable: keeps git order in groups

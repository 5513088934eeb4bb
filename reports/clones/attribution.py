"""Place DeepSpeed versions on a local DeepSpeed clone: the commit of a run's DeepSpeed, their order, and
the commits and PRs between two versions."""

from __future__ import annotations

from reports import ReportsError
from reports.clones.git import GitRepo
from reports.store import Commit, Versions

# Commits under these paths most often change AutoTP behaviour, so they are listed first.
AUTOTP_PATHS = ("deepspeed/module_inject/", "deepspeed/inference/", "deepspeed/accelerator/")


def deepspeed_commit(repo: GitRepo, versions: Versions) -> str:
    """The commit a run's DeepSpeed came from: its git sha, else the release tag."""
    ref = versions.deepspeed_git or versions.deepspeed
    if (sha := repo.find(ref)) is None:
        tried = ref if versions.deepspeed_git else f"v{ref}, {ref}"
        raise ReportsError(
            f"--deepspeed-repo {repo.path}: cannot find DeepSpeed {versions.label('deepspeed')} "
            f"(tried {tried}); run `git -C {repo.path} fetch --tags origin` or drop --deepspeed-repo"
        )
    return sha


def deepspeed_order(repo: GitRepo, versions: Versions) -> int:
    return repo.topological_index(deepspeed_commit(repo, versions))


def commits_between(repo: GitRepo, older: Versions, newer: Versions) -> tuple[Commit, ...]:
    """Commits in newer but not in older, AutoTP-relevant ones first, each group newest first."""
    return repo.between(deepspeed_commit(repo, older), deepspeed_commit(repo, newer), AUTOTP_PATHS)

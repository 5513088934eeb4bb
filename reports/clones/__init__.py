"""What a DeepSpeed or transformers clone says: commits, their order and PRs, DeepSpeed versions by commit.

Other rooms import these names from here; modules inside the room import each other directly."""

from reports.clones.attribution import (
    commits_between,
    deepspeed_order,
)
from reports.clones.git import (
    GitError,
    GitRepo,
    harness_order,
)

__all__ = [
    "GitError",
    "GitRepo",
    "commits_between",
    "deepspeed_order",
    "harness_order",
]

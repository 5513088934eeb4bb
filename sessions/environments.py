"""One environment per version combination, shared by every nox session that runs cells (`matrix`,
`autotp(<combo>)`, `tests`) and by bisection steps, built in layers joined by `.pth` files:

    <root>/torch-pt2.13.0/                 torch alone, unpacked once per torch version
    <root>/base-ds0.19.8-pt2.13.0/         DeepSpeed and its dependencies, over the torch layer; its CPU comm
                                            op prebuilt once per hash of its sources (sessions/deepspeed_ops.py)
    <root>/ds0.19.8-tf5.24.0-pt2.13.0/     transformers + the harness's dependencies, over the DeepSpeed layer

A layer's `.pth` file lists the site-packages of every layer below it, nearest first; its own packages
come before them, so an upper layer that needs another version of a lower package holds its own, and a
lower layer is never modified by an install above it (sessions/installers.py: uv, or pip as a fallback,
give the same packages). Names follow the combination ids of matrix/versions.py, torch spelled as its
public version (`2.13.0`, never `2.13.0+cpu`).

torch is installed in its own layer (from `AUTOTP_TORCH_INDEX` pip options on GPU runners; on CPU machines
the pinned version comes from a local wheel); layers above never install torch again. An environment is
complete once its marker is written; one without it (an interrupted build) is built again. Builds of the
same folder are serialised by a lock.

The torch and DeepSpeed layers hold their modules' bytecode, compiled once when they are built (or, for a layer
built before, the first time it is ensured: it gets its own marker, the packages are not touched): every python
process of every combination imports torch and DeepSpeed, and where PYTHONDONTWRITEBYTECODE is set (container
images often set it) each process would otherwise compile them from source again (docs/findings.md: ~4.6 CPU s
a process on 2 cores). A combination's own layer is left to Python, which the harness's commands let write the
bytecode of what they import (`environment_variables`): compiling a whole transformers costs more than the few
modules of it a session imports.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.version import InvalidVersion, Version

from matrix import PROJECT_ROOT
from matrix.redaction import redact
from matrix.version_axes import AXES, short_prefixes
from sessions.checkouts import checkout_path, prepare_deepspeed_checkout, prepare_transformers_checkout, requirements_of
from sessions.deepspeed_ops import install_prebuilt_ops
from sessions.installers import Installer, InstallError, installer, sysconfig_purelib
from suites.base.git import GitFailed, git_output

ENV_ROOT_ENV = "AUTOTP_ENV_ROOT"
TORCH_INDEX_ENV = "AUTOTP_TORCH_INDEX"
"""Extra pip options for torch only, e.g. `--index-url https://download.pytorch.org/whl/cu124` on GPU runners."""
READY_MARKER = ".autotp-env-ready"  # written last: its content is the spec the environment was built from
BYTECODE_MARKER = ".autotp-bytecode"  # a shared layer's bytecode is compiled (after READY_MARKER)
BASE_LINK = "autotp-base.pth"


class EnvironmentBuildError(RuntimeError):
    """An environment could not be built; the message ends with the installer's own output."""


def env_root() -> Path:
    return Path(os.environ.get(ENV_ROOT_ENV) or PROJECT_ROOT / ".nox" / "envs")


def torch_spelling(version: str) -> str:
    """torch reports `2.13.0+cpu` once installed, pins say `2.13.0`: one spelling in every name."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


@dataclass(frozen=True)
class EnvironmentSpec:
    key: str
    """Folder name under the environment root."""
    installs: tuple[tuple[str, ...], ...]
    """`pip install` argument lists, in order."""
    source: tuple[Path, str] | None = None
    """(clone, sha) checked out into <env>/src before installing (a commit of DeepSpeed or transformers)."""
    checkout: str = ""
    """"deepspeed" or "transformers": the source checkout itself is that package, on this layer's path
    (sessions/checkouts.py)."""
    as_of: str = ""
    """A date (2024-05-30): this layer's packages as they were that day, the harness's own excepted
    (sessions/installers.py Installer.resolve_missing); "" for the newest."""
    base: EnvironmentSpec | None = None
    """The layer below: this one sees its packages (and those of the layers below it), and uses its JIT builds."""
    shared: bool = False
    """A layer other layers sit on (torch, DeepSpeed): its bytecode is compiled once (see the module's text)."""

    def lower(self) -> list[EnvironmentSpec]:
        """The layers below this one, nearest first."""
        return [self.base, *self.base.lower()] if self.base else []


def project_dependencies() -> list[str]:
    return [
        str(line) for line in tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]


def torch_options() -> list[str]:
    return shlex.split(os.environ.get(TORCH_INDEX_ENV, ""))


def axis_id(axis: str, value: str) -> str:
    """An axis value in an environment's name: the axis's `short` prefix (matrix/versions.toml) and the value
    (`ds0.19.8`, `tf@<sha>` for a commit)."""
    return f"{short_prefixes()[axis]}{value}"


COMBINATION_AXES = tuple(axis for axis in AXES if axis not in ("deepspeed", "torch"))
"""The axes a combination's own layer installs (transformers first): every axis but DeepSpeed, whose layer is its
base, and torch, the layer under that."""


def released(pins: dict[str, str], but: str = "") -> list[tuple[str, str]]:
    """(axis id, requirement) of each of COMBINATION_AXES (but `but`) at its released version in `pins`."""
    return [(axis_id(axis, pins[axis]), f"{axis}=={pins[axis]}") for axis in COMBINATION_AXES if axis != but]


def torch_layer(torch: str) -> EnvironmentSpec:
    """torch alone: the layer every DeepSpeed layer of this torch version sits on."""
    return EnvironmentSpec(
        key=f"torch-{axis_id('torch', torch_spelling(torch))}",
        installs=((f"torch=={torch_spelling(torch)}", *torch_options()),),
        shared=True,
    )


def _deepspeed_base(
    deepspeed_id: str,
    deepspeed_installs: tuple[tuple[str, ...], ...],
    torch: str,
    source: tuple[Path, str] | None = None,
) -> EnvironmentSpec:
    return EnvironmentSpec(
        key=f"base-{deepspeed_id}-{axis_id('torch', torch_spelling(torch))}",
        installs=deepspeed_installs,
        source=source,
        base=torch_layer(torch),
        shared=True,
    )


def combination_environment(
    deepspeed_id: str,
    deepspeed_requirement: str,
    layered: list[tuple[str, str]],
    torch: str,
    *,
    extras: tuple[str, ...] = (),
    extras_name: str = "",
    as_of: str = "",
) -> EnvironmentSpec:
    """The environment of one combination; `deepspeed_id` and the ids in `layered` ((axis id, requirement) of each of
    COMBINATION_AXES, in order) are the axis ids of matrix/versions.py (`ds0.19.8`, `ds@pr1234`, `tf5.24.0`),
    `extras` more requirements (a dependency group) in a sibling environment named `<combination>+<extras_name>`
    over the same base; `as_of` a date: transformers' dependencies as of that day, in a sibling named
    `<combination>-asof<date>`."""
    torch_pin = f"torch=={torch_spelling(torch)}"
    base = _deepspeed_base(deepspeed_id, ((deepspeed_requirement, torch_pin),), torch)
    key = (
        "-".join((deepspeed_id, *(value_id for value_id, _ in layered), axis_id("torch", torch_spelling(torch))))
        + (f"+{extras_name}" if extras_name else "")
        + (f"-asof{as_of}" if as_of else "")
    )
    # transformers first: an as-of resolution takes the first requirement as the layer's subject
    return EnvironmentSpec(
        key=key,
        installs=((*(requirement for _, requirement in layered), *project_dependencies(), *extras, torch_pin),),
        base=base,
        as_of=as_of,
    )


def release_environment(pins: dict[str, str], extras: tuple[str, ...] = (), extras_name: str = "") -> EnvironmentSpec:
    """Released deepspeed, transformers and torch (`{"deepspeed": "0.19.8", ...}`)."""
    return combination_environment(
        axis_id("deepspeed", pins["deepspeed"]),
        f"deepspeed=={pins['deepspeed']}",
        released(pins),
        pins["torch"],
        extras=extras,
        extras_name=extras_name,
    )


def commit_environment(
    root: Path, clone: Path, sha: str, pins: dict[str, str], axis: str = "deepspeed"
) -> EnvironmentSpec:
    """`axis` (deepspeed or transformers) at one commit of a local clone, the other axes released. Neither is
    built: the commit's checkout is the package (sessions/checkouts.py), its requirements installed like a
    release's. A DeepSpeed commit is a base of its own; a transformers commit sits over the released
    DeepSpeed's base like a release would."""
    torch = torch_spelling(pins["torch"])
    torch_pin = f"torch=={torch}"
    if axis == "transformers":
        deepspeed_id = axis_id("deepspeed", pins["deepspeed"])
        others = released(pins, but="transformers")
        key = "-".join(
            (
                deepspeed_id,
                axis_id("transformers", "@" + sha[:12]),
                *(value_id for value_id, _ in others),
                axis_id("torch", torch),
            )
        )
        base = _deepspeed_base(deepspeed_id, ((f"deepspeed=={pins['deepspeed']}", torch_pin),), torch)
        # transformers' own requirements are added at checkout, from its setup.py
        return EnvironmentSpec(
            key=key,
            installs=((*(requirement for _, requirement in others), *project_dependencies(), torch_pin),),
            source=(clone, sha),
            base=base,
            checkout="transformers",
        )
    deepspeed_id = axis_id("deepspeed", f"@{sha[:12]}")
    base_key = f"base-{deepspeed_id}-{axis_id('torch', torch)}"
    base = EnvironmentSpec(
        key=base_key,
        installs=(("-r", str(root / base_key / "src" / "requirements" / "requirements.txt"), torch_pin),),
        source=(clone, sha),
        base=torch_layer(torch),
        checkout="deepspeed",
        shared=True,
    )
    layered = released(pins)
    return EnvironmentSpec(
        key="-".join((deepspeed_id, *(value_id for value_id, _ in layered), axis_id("torch", torch))),
        installs=((*(requirement for _, requirement in layered), *project_dependencies(), torch_pin),),
        base=base,
    )


def layer_paths(root: Path, spec: EnvironmentSpec) -> list[str]:
    """What a layer puts on the path of the layers over it: its site-packages, then its checkout if it is one."""
    return [
        _site_packages(root / spec.key),
        *([str(checkout_path(root / spec.key / "src", spec.checkout))] if spec.checkout else []),
    ]


def ensure_environment(
    root: Path, spec: EnvironmentSpec, log: Callable[[str], None] = print, tool: Installer | None = None
) -> Path:
    """The python of spec's environment under root, built now (with the layers below it) unless a complete
    one from the same spec is already there; with `tool`, or uv (else pip: sessions/installers.py)."""
    if spec.base is not None:
        ensure_environment(root, spec.base, log, tool)
    folder = root / spec.key
    python = folder / "bin" / "python"
    wanted = json.dumps(_describe(spec))
    marker = folder / READY_MARKER

    def complete() -> bool:
        built = marker.exists() and marker.read_text() == wanted
        return built and (not spec.shared or (folder / BYTECODE_MARKER).exists())

    if complete():
        _launchers_of_lower_layers(root, spec)
        return python
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{spec.key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel session may be building the same folder
        if not (marker.exists() and marker.read_text() == wanted):
            _build(root, spec, folder=folder, python=python, log=log, tool=tool)
            marker.write_text(wanted)
        if not complete() and _compile_bytecode(root, spec, python, log):
            (folder / BYTECODE_MARKER).write_text("")
        _launchers_of_lower_layers(root, spec)
    return python


def _launchers_of_lower_layers(root: Path, spec: EnvironmentSpec) -> None:
    """The console scripts of the layers below (`deepspeed`, `torchrun`, ...) in this layer's bin, run by this layer's
    python: the lower layer's own `deepspeed` runs the DeepSpeed layer's python, whose ranks cannot import transformers
    (a standalone repro script started from a combination's environment died with ModuleNotFoundError). Written
    whenever the environment is ensured, so one built before has them too; a layer's own script is never replaced."""
    bin_folder = root / spec.key / "bin"
    for layer in spec.lower():
        lower_python = f"#!{root / layer.key / 'bin' / 'python'}"
        for script in sorted((root / layer.key / "bin").glob("*")):
            launcher = bin_folder / script.name
            if launcher.exists() or not script.is_file():
                continue
            with open(script, "rb") as text:
                first_line = text.readline().decode(errors="replace").rstrip("\n")
            if first_line not in (lower_python, lower_python + "3"):  # a console script of that layer's python
                continue
            body = script.read_text().split("\n", 1)[1]
            launcher.write_text(f"#!{bin_folder / 'python'}\n{body}")
            launcher.chmod(0o755)


COMPILED = (0, 1)
"""compileall's exit codes once it went through every file: 1 says some did not compile (torch ships a test module in
Python 3.12 syntax), which are then left to fail where they are imported, as they would without this."""


def _compile_bytecode(root: Path, spec: EnvironmentSpec, python: Path, log: Callable[[str], None]) -> bool:
    """Compile the layer's modules on every core; False when compileall was stopped (the next ensure compiles on)."""
    log(f"compiling the bytecode of {root / spec.key} (once: every combination over it imports it)")
    compiled = subprocess.run(
        [str(python), "-m", "compileall", "-q", "-j", "0", *layer_paths(root, spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return compiled.returncode in COMPILED


def _build(
    root: Path, spec: EnvironmentSpec, *, folder: Path, python: Path, log: Callable[[str], None], tool: Installer | None
) -> None:
    """Build spec's layer into folder afresh (the caller holds its lock)."""
    tool = tool or installer(root, log)
    log(f"building environment {folder} with {tool.name}")
    shutil.rmtree(folder, ignore_errors=True)
    lower = [path for layer in spec.lower() for path in layer_paths(root, layer)]
    try:
        tool.create(folder)
        if lower:
            (Path(_site_packages(folder)) / BASE_LINK).write_text("".join(f"{path}\n" for path in lower))
        if spec.source is not None:
            clone, sha = spec.source
            # A --shared clone borrows the objects of the user's clone: no network, no copy, and DeepSpeed's
            # setup.py finds the right commit with `git rev-parse` for its recorded git hash.
            try:
                git_output("clone", "--quiet", "--shared", "--no-checkout", str(clone), str(folder / "src"))
                git_output("checkout", "--quiet", "--detach", sha, folder=folder / "src")
            except GitFailed as failed:
                raise InstallError(redact(f"could not check out {sha}: {failed}")) from None
        env = {**environment_variables(python), "DS_BUILD_OPS": "0", **_build_outside_any_clone()}
        site_packages = Path(_site_packages(folder))
        installs = list(spec.installs)
        if spec.checkout == "transformers" and spec.source is not None:
            clone, sha = spec.source
            version, requirements = prepare_transformers_checkout(
                folder / "src", clone=clone, sha=sha, site_packages=site_packages, python=python, env=env
            )
            log(
                f"transformers {version}: the checkout of {sha[:12]} on the path, with {len(requirements)} requirements"
            )
            installs[0] = (*requirements, *installs[0])
        for arguments in installs:
            tool.install(python, arguments, lower=lower, env=env, log=log, as_of=spec.as_of)
        if spec.checkout == "deepspeed" and spec.source is not None:
            clone, sha = spec.source
            version = prepare_deepspeed_checkout(folder / "src", clone, sha, site_packages, lower)
            log(
                f"deepspeed {version}: the checkout of {sha[:12]} on the path, with "
                f"{len(requirements_of(folder / 'src'))} "
                f"requirements"
            )
        package_root = folder / "src" if spec.checkout == "deepspeed" else site_packages
        if (package_root / "deepspeed" / "ops" / "op_builder").is_dir():
            try:
                install_prebuilt_ops(
                    root, python, package_root=package_root, lower=[str(site_packages), *lower], env=env, log=log
                )
            except InstallError as error:  # a DeepSpeed whose builders differ: its cells JIT-build as before
                log(f"DeepSpeed's CPU comm op is not prebuilt, the cells JIT-build it: {str(error)[-2000:]}")
    except InstallError as error:
        raise EnvironmentBuildError(str(error)) from None
    (folder / "torch_extensions").mkdir(exist_ok=True)


def _describe(spec: EnvironmentSpec) -> dict[str, object]:
    return {
        "installs": spec.installs,
        "source": [str(spec.source[0]), spec.source[1]] if spec.source else None,
        "base": spec.base.key if spec.base else None,
        "checkout": spec.checkout,
        "as_of": spec.as_of,
    }


def _site_packages(folder: Path) -> str:
    return sysconfig_purelib(folder / "bin" / "python")


def _build_outside_any_clone() -> dict[str, str]:
    """DeepSpeed's setup.py stamps `git rev-parse HEAD` of whatever repository its build folder sits in;
    a temporary folder inside this project would stamp the harness's own commit as DeepSpeed's. Builds
    from a DeepSpeed clone (`src/`) still find their own repository."""
    return {"TMPDIR": os.environ.get("AUTOTP_BUILD_TMPDIR", "/tmp")}


def torch_extensions_of(python: Path) -> Path:
    """Where DeepSpeed JIT-builds its ops for this environment: the folder of the layer just below when it
    has one (the DeepSpeed layer of a combination)."""
    folder = python.parent.parent
    link = Path(_site_packages(folder)) / BASE_LINK
    if link.exists():
        return Path(link.read_text().splitlines()[0]).parents[2] / "torch_extensions"
    return folder / "torch_extensions"


def environment_variables(python: Path) -> dict[str, str]:
    """The variables a command run with this environment's python needs: the venv on PATH, DeepSpeed's JIT builds in
    the (base) environment's own folder, and Python writing the bytecode of what it imports from the combination's
    own layer (the shared layers have theirs: see the module's text): PYTHONDONTWRITEBYTECODE is dropped, else every
    rank of every group compiles the modeling modules it imports again (docs/findings.md, "Figures from the
    docstrings")."""
    return {
        **{name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"},
        "VIRTUAL_ENV": str(python.parent.parent),
        "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}",
        "TORCH_EXTENSIONS_DIR": str(torch_extensions_of(python)),
    }

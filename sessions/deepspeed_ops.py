"""DeepSpeed's CPU comm op, built once per hash of what it is built from and installed as a prebuilt op
into every DeepSpeed layer whose op hashes the same.

torch's JIT build is keyed on the absolute paths of the op's sources, so each DeepSpeed release or commit,
in its own layer, would build the same C++ again (~60 s here). Instead, when a DeepSpeed layer is built:

1. the op is described from the layer's files, without importing DeepSpeed or torch (importing both costs most
   of a commit step: docs/findings.md, "Figures from the docstrings"): its builder class (`ShareMemCommBuilder` in
   `op_builder/cpu/comm.py`, read with `ast`) lists its sources and include folders as literals, torch's
   `version.py` and DeepSpeed's `git_version_info_installed.py` say the build is for the CPU. Where they do
   not (torch built for CUDA, a builder that computes its lists), the layer's python describes it
   (sessions/deepspeed_op_probe.py);
2. the key is a hash of the op's sources, the other files of their folders (headers such as shm.h), the
   include folders, the source of its builder class and of the CPU builder it derives from (they give its
   flags), torch's version and the compiler's `--version`: a release or commit that changes
   `csrc/cpu/comm`, its includes or its builder gets its own. DeepSpeed's generic `op_builder/builder.py`
   (changed by most CUDA-op commits) is left out: the flags it gives every op are the same for each;
3. `<env root>/.ops/<key>/` holds the built library, JIT-built there by the first layer with that key
   (the probe imports DeepSpeed then: a build costs a minute anyway), with `built-from.json`;
4. the layer gets it as DeepSpeed's own install would with `DS_BUILD_SHM_COMM=1`: the library at
   `deepspeed/ops/comm/<name>_op.so` and the op marked installed in `git_version_info_installed.py`
   (DeepSpeed's `OpBuilder.load` then imports it instead of JIT-building).

Where DeepSpeed would not use the CPU op (torch sees CUDA; DeepSpeed installed for another accelerator)
nothing is done and the cells JIT-build the op themselves.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from matrix.installed import module_constants
from sessions.checkouts import torch_of
from sessions.installers import InstallError, run_checked

OPS_FOLDER = ".ops"
PROBE = Path(__file__).with_name("deepspeed_op_probe.py")
MARK = "# autotp-matrix: prebuilt"
BUILT_FROM = "built-from.json"


class BuiltOp(TypedDict):
    """The op as the probe's `describe` prints it (sessions/deepspeed_op_probe.py), kept beside its build as
    BUILT_FROM."""

    name: str  # DeepSpeed's name of the op (its key in installed_ops)
    module: str  # the import name of its prebuilt module, deepspeed.ops.comm.deepspeed_shm_comm_op
    torch: str  # the version of the torch it is built against
    sources: list[str]  # absolute paths
    include_dirs: list[str]
    flags: list[str]  # compiler, then linker


def compiler_identity(env: dict[str, str] | None = None) -> str:
    """The first line of the C++ compiler's `--version` (the one torch's JIT build runs: $CXX, else c++)."""
    compiler = (env or os.environ).get("CXX", "c++")
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.partition("\n")[0]
    except OSError:
        return f"{compiler}: not found"


BUILDERS = (("op_builder/cpu/comm.py", "ShareMemCommBuilder"), ("op_builder/cpu/builder.py", "CPUOpBuilder"))
"""(file under deepspeed/ops, class): the op's builder and the CPU builder it derives from."""


@dataclass(frozen=True)
class CommOp:
    """What the comm op of one DeepSpeed layer is built from."""

    sources: tuple[Path, ...]
    include_dirs: tuple[Path, ...]
    builders: tuple[str, ...]
    """The source text of the builder classes (BUILDERS): they give the op's flags."""
    torch: str
    """torch.__version__ of the layer's torch (`2.13.0+cpu`)."""


def op_key(op: CommOp, compiler: str) -> str:
    """A hash of everything the op's build reads: the sources, every file of their folders (headers included
    as "shm.h") and of the include folders, by path relative to its folder (the same files elsewhere hash the
    same), the builder classes' source, torch's version and the compiler."""
    digest = hashlib.sha256()
    for label, value in (
        ("torch", op.torch),
        ("compiler", compiler),
        ("sources", " ".join(s.name for s in op.sources)),
        *(("builder", text) for text in op.builders),
    ):
        digest.update(f"{label}={value}\n".encode())
    for n, folder in enumerate([*dict.fromkeys(source.parent for source in op.sources), *op.include_dirs]):
        for file in sorted(path for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts):
            digest.update(f"{n} {file.relative_to(folder)}\n".encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def _class_source(file: Path, name: str) -> tuple[str, ast.ClassDef] | None:
    text = file.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return ast.get_source_segment(text, node) or "", node
    return None


def _returned_strings(cls: ast.ClassDef, method: str) -> list[str] | None:
    """The list of strings `method` returns when it returns a literal (directly or through a local name)."""
    function = next((node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == method), None)
    if function is None:
        return None
    local: dict[str, ast.expr] = {}
    for statement in function.body:
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            local[statement.targets[0].id] = statement.value
        elif isinstance(statement, ast.Return) and statement.value is not None:
            value = local.get(statement.value.id) if isinstance(statement.value, ast.Name) else statement.value
            try:
                found = ast.literal_eval(value) if value is not None else None
            except ValueError:
                return None
            return found if isinstance(found, list) and all(isinstance(item, str) for item in found) else None
    return None


def describe_from_files(package_root: Path, lower: list[str]) -> CommOp | str:
    """The comm op of the DeepSpeed under package_root as its files state it, or why they do not (the layer's
    python must describe it)."""
    ops = package_root / "deepspeed" / "ops"
    try:
        torch = torch_of(lower)
    except InstallError as error:
        return str(error)
    if torch.accelerator != "cpu":
        return f"torch {torch.version} is built for CUDA/ROCm: whether the cells use the CPU op depends on the machine"
    installed = package_root / "deepspeed" / "git_version_info_installed.py"
    accelerator = module_constants(installed).get("accelerator_name") if installed.is_file() else None
    if accelerator != "cpu":
        return f"{installed} does not say accelerator_name='cpu' (it says {accelerator!r})"
    classes = []
    for relative, name in BUILDERS:
        found = _class_source(ops / relative, name) if (ops / relative).is_file() else None
        if found is None:
            return f"no class {name} in {ops / relative}"
        classes.append(found)
    (_, comm), _ = classes
    sources, includes = _returned_strings(comm, "sources"), _returned_strings(comm, "include_paths")
    if sources is None or includes is None:
        return f"{ops / BUILDERS[0][0]}: {BUILDERS[0][1]}'s sources() or include_paths() is not a list of strings"
    return CommOp(
        tuple(ops / source for source in sources),
        tuple(ops / folder for folder in includes),
        tuple(text for text, _ in classes),
        torch.version,
    )


def _describe_by_import(python: Path, package_root: Path, env: dict[str, str]) -> tuple[CommOp, BuiltOp] | str:
    """The op as the layer's python describes it (DeepSpeed imported), with the probe's own output; or why
    it is not used."""
    probed = _probe_description(python, env)
    if isinstance(probed, str):
        return probed
    ops = package_root / "deepspeed" / "ops"
    builders = tuple(
        found[0]
        for relative, name in BUILDERS
        if (ops / relative).is_file() and (found := _class_source(ops / relative, name))
    )
    return CommOp(
        tuple(Path(p) for p in probed["sources"]),
        tuple(Path(p) for p in probed["include_dirs"]),
        builders,
        probed["torch"],
    ), probed


def _probe_description(python: Path, env: dict[str, str]) -> BuiltOp | str:
    """The op as the layer's python describes it, or why it is not used (the probe's "skip")."""
    printed = run_checked([str(python), str(PROBE), "describe"], "describe DeepSpeed's comm op", env)
    probed: dict[str, object] = json.loads(printed.splitlines()[-1])
    if "skip" in probed:
        return str(probed["skip"])
    return BuiltOp(
        name=str(probed["name"]),
        module=str(probed["module"]),
        torch=str(probed["torch"]),
        sources=_texts(probed["sources"]),
        include_dirs=_texts(probed["include_dirs"]),
        flags=_texts(probed["flags"]),
    )


def _texts(value: object) -> list[str]:
    assert isinstance(value, list), f"the comm op probe prints lists of paths and flags, not {value!r}"
    return [str(item) for item in value]


def install_prebuilt_ops(
    root: Path,
    python: Path,
    *,
    package_root: Path,
    lower: list[str],
    env: dict[str, str],
    log: Callable[[str], None] = print,
) -> str:
    """Give the DeepSpeed layer of `python` (its package under package_root, the site-packages of the layers
    below in `lower`) its CPU comm op, built now unless its key has a build: the key, or "" with a line
    saying why not (the cells then JIT-build it)."""
    env = {**env, "DS_ACCELERATOR": env.get("DS_ACCELERATOR", "cpu")}
    op = describe_from_files(package_root, lower)
    probed: BuiltOp | None = None
    if isinstance(op, str):
        log(f"DeepSpeed's CPU comm op is described by importing DeepSpeed: {op}")
        described = _describe_by_import(python, package_root, env)
        if isinstance(described, str):
            log(f"DeepSpeed's CPU comm op is not prebuilt: {described}")
            return ""
        op, probed = described
    key = op_key(op, compiler_identity(env))
    store = root / OPS_FOLDER / key
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store.parent / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built: BuiltOp
        if (store / BUILT_FROM).exists():
            built = json.loads((store / BUILT_FROM).read_text())  # what this function wrote there below
            log(f"{built['module']}: reusing the build of key {key}")
        else:
            description = probed or _probe_description(python, env)
            if isinstance(description, str):  # described from its files, but the layer's python would not build it
                log(f"DeepSpeed's CPU comm op is not prebuilt: {description}")
                return ""
            built = description
            log(f"{built['module']}: building it for key {key} (once for every DeepSpeed whose op hashes the same)")
            with tempfile.TemporaryDirectory(dir=store.parent, prefix=f".{key}-") as scratch:
                library = json.loads(
                    run_checked(
                        [str(python), str(PROBE), "build"],
                        f"build {built['module']}",
                        {**env, "TORCH_EXTENSIONS_DIR": scratch},
                    ).splitlines()[-1]
                )["library"]
                (Path(scratch) / "out").mkdir()
                shutil.copy2(library, Path(scratch) / "out" / library_name(built))
                (Path(scratch) / "out" / BUILT_FROM).write_text(json.dumps(built, indent=1))
                (Path(scratch) / "out").rename(store)
    library = store / library_name(built)
    package = package_root / Path(*built["module"].split(".")[:-1])
    package.mkdir(parents=True, exist_ok=True)
    (package / library.name).unlink(missing_ok=True)
    (package / library.name).symlink_to(library)
    # What DeepSpeed's setup.py writes for an op built at install: OpBuilder.load imports it when the op is marked
    # installed for this accelerator and torch's major.minor matches torch_info's.
    info = package_root / "deepspeed" / "git_version_info_installed.py"
    torch_minor = ".".join(op.torch.split("+")[0].split(".")[:2])
    lines = [line for line in info.read_text().splitlines() if MARK not in line]
    lines += [
        f"installed_ops = {{**installed_ops, {built['name']!r}: True}}  {MARK} {key}",
        f"torch_info = {{**torch_info, 'version': {torch_minor!r}}}  {MARK} {key}",
    ]
    info.write_text("\n".join(lines) + "\n")
    return key


def library_name(built: BuiltOp) -> str:
    """`deepspeed_shm_comm_op.so`: the op's import name, as DeepSpeed's install names it."""
    return f"{built['module'].rsplit('.', 1)[1]}.so"

"""DeepSpeed's CPU comm op, built once per hash of what it is built from and installed as a prebuilt op
into every DeepSpeed layer whose op hashes the same.

torch's JIT build is keyed on the absolute paths of the op's sources, so each DeepSpeed release or commit,
in its own layer, would build the same C++ again (~60 s here). Instead, when a DeepSpeed layer is built:

1. its python describes the op (sessions/deepspeed_op_probe.py): sources, include folders, flags, torch;
2. the key is a hash of those sources' and headers' contents, the flags, torch's version and the
   compiler's `--version`: a release or commit that changes `csrc/cpu/comm` or its includes gets its own;
3. `<env root>/.ops/<key>/` holds the built library, JIT-built there by the first layer with that key;
4. the layer gets it as DeepSpeed's own install would with `DS_BUILD_SHM_COMM=1`: the library at
   `deepspeed/ops/comm/<name>_op.so` and the op marked installed in `git_version_info_installed.py`
   (DeepSpeed's `OpBuilder.load` then imports it instead of JIT-building).

Where DeepSpeed would not use the CPU op (torch sees CUDA; DeepSpeed installed for another accelerator)
nothing is done and the cells JIT-build as before.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sessions.installers import run_checked

OPS_FOLDER = ".ops"
PROBE = Path(__file__).with_name("deepspeed_op_probe.py")
MARK = "# autotp-matrix: prebuilt"


def compiler_identity(env: dict[str, str] | None = None) -> str:
    """The first line of the C++ compiler's `--version` (the one torch's JIT build runs: $CXX, else c++)."""
    compiler = (env or os.environ).get("CXX", "c++")
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.partition("\n")[0]
    except OSError:
        return f"{compiler}: not found"


def op_key(sources: list[Path], include_dirs: list[Path], flags: list[str], torch: str, compiler: str) -> str:
    """A hash of everything the op's build reads: the sources, every file of their folders (headers included
    as "shm.h") and of the include folders, by path relative to its folder (the same files elsewhere hash the
    same), the flags, torch's version and the compiler."""
    digest = hashlib.sha256()
    for label, value in (("torch", torch), ("compiler", compiler), ("flags", " ".join(flags)),
                         ("sources", " ".join(source.name for source in sources))):
        digest.update(f"{label}={value}\n".encode())
    for n, folder in enumerate([*dict.fromkeys(source.parent for source in sources), *include_dirs]):
        for file in sorted(path for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts):
            digest.update(f"{n} {file.relative_to(folder)}\n".encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def install_prebuilt_ops(root: Path, python: Path, site_packages: Path, env: dict[str, str], log=print) -> str:
    """Give the DeepSpeed layer of `python` its CPU comm op, built now unless its key has a build: the key,
    or "" with a line saying why not (the cells then JIT-build it)."""
    env = {**env, "DS_ACCELERATOR": env.get("DS_ACCELERATOR", "cpu")}
    op = json.loads(run_checked([str(python), str(PROBE), "describe"], "describe DeepSpeed's comm op", env).splitlines()[-1])
    if "skip" in op:
        log(f"DeepSpeed's CPU comm op is not prebuilt: {op['skip']}")
        return ""
    key = op_key([Path(p) for p in op["sources"]], [Path(p) for p in op["include_dirs"]], op["flags"], op["torch"],
                 compiler_identity(env))
    leaf = op["module"].rsplit(".", 1)[1]
    store = root / OPS_FOLDER / key
    library = store / f"{leaf}.so"
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store.parent / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():
            log(f"{op['module']}: reusing the build of key {key}")
        else:
            log(f"{op['module']}: building it for key {key} (once for every DeepSpeed whose op hashes the same)")
            with tempfile.TemporaryDirectory(dir=store.parent, prefix=f".{key}-") as scratch:
                built = json.loads(run_checked([str(python), str(PROBE), "build"], f"build {op['module']}",
                                               {**env, "TORCH_EXTENSIONS_DIR": scratch}).splitlines()[-1])
                (Path(scratch) / "out").mkdir()
                shutil.copy2(built["library"], Path(scratch) / "out" / library.name)
                (Path(scratch) / "out" / "built-from.json").write_text(json.dumps(op, indent=1))
                (Path(scratch) / "out").rename(store)
    package = site_packages / Path(*op["module"].split(".")[:-1])
    package.mkdir(parents=True, exist_ok=True)
    (package / library.name).unlink(missing_ok=True)
    (package / library.name).symlink_to(library)
    # What DeepSpeed's setup.py writes for an op built at install: OpBuilder.load imports it when the op is marked
    # installed for this accelerator and torch's major.minor matches torch_info's.
    info = site_packages / "deepspeed" / "git_version_info_installed.py"
    torch_minor = ".".join(op["torch"].split("+")[0].split(".")[:2])
    lines = [line for line in info.read_text().splitlines() if MARK not in line]
    lines += [f"installed_ops = {{**installed_ops, {op['name']!r}: True}}  {MARK} {key}",
              f"torch_info = {{**torch_info, 'version': {torch_minor!r}}}  {MARK} {key}"]
    info.write_text("\n".join(lines) + "\n")
    return key

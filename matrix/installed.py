"""What an installed package says about itself, read from its files without importing it: importing torch,
DeepSpeed or transformers costs a process seconds of a core (~10 s together on the 2-core runners), which the
driver spends beside the fork server's own imports before its first cell."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
from importlib import metadata
from pathlib import Path
from typing import Any

VERSION_CONSTANTS = {
    "torch": ("version.py", "__version__"),
    "deepspeed": ("git_version_info_installed.py", "version"),
    "transformers": ("__init__.py", "__version__"),
}
"""Per package, the file and the literal its `__version__` is set from (DeepSpeed's setup.py, and
sessions/checkouts.py for a commit checkout, write `git_version_info_installed.py`)."""


def module_constants(file: Path) -> dict[str, object]:
    """The module-level `NAME = <literal>` assignments of a python file, read without running it; parsed once per
    process while the file keeps its inode, size and modification time (transformers' `__init__.py` is read for every
    cell's cache keys: docs/findings.md, "Figures from the docstrings")."""
    state = file.stat()
    return dict(_parsed_constants(str(file), state.st_ino, state.st_mtime_ns, state.st_size))


@functools.lru_cache(maxsize=64)
def _parsed_constants(file: str, inode: int, mtime_ns: int, size: int) -> dict[str, object]:
    found: dict[str, object] = {}
    for node in ast.parse(Path(file).read_text()).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    found[target.id] = ast.literal_eval(value)
                except ValueError:
                    pass
    return found


def package_constants(package: str, file: str) -> dict[str, object]:
    """The literals of one of `package`'s files, where an import would find the package; {} when it or the file
    is not there."""
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    source = Path(folders[0]) / file if folders else None
    return module_constants(source) if source is not None and source.is_file() else {}


def imported_version(package: str) -> str:
    """`package.__version__` (one of VERSION_CONSTANTS): the literal its import would set, else (no such file or
    literal) by importing it."""
    file, name = VERSION_CONSTANTS[package]
    constant = package_constants(package, file).get(name)
    # str(): torch.__version__ is a TorchVersion, which pytest-xdist cannot send from a worker.
    return constant if isinstance(constant, str) else str(importlib.import_module(package).__version__)


def direct_url(package: str) -> dict[str, Any] | None:
    """The package's PEP 610 direct_url.json, or None (installed from an index, or not installed); a commit checkout's
    names its commit (sessions/checkouts.py), which its version alone does not (`5.25.0.dev0` for many commits)."""
    try:
        text = metadata.distribution(package).read_text("direct_url.json")
        return json.loads(text) if text else None
    except (metadata.PackageNotFoundError, ValueError):
        return None


def installed_commit(package: str) -> str:
    """The commit a checkout layer installed `package` from (its PEP 610 `vcs_info`), "" for a release. The commit,
    not the clone's path: the same commit gives the same answer on any machine."""
    vcs = (direct_url(package) or {}).get("vcs_info") or {}
    return str(vcs.get("commit_id", ""))


def cache_identity(package: str) -> dict[str, str]:
    """`package` as a key of what the harness caches from its output (tiny checkpoints, references, tiny shapes): its
    version, and its commit when a checkout layer installed it, since commits share a `.dev0` version. A release's
    key holds the version alone, as it always did."""
    commit = installed_commit(package)
    return {package: imported_version(package), **({f"{package}_commit": commit} if commit else {})}

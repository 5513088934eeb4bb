"""What a render writes that a warm run does not change, kept between renders (under the harness cache, AUTOTP_CACHE):
each failing cell's standalone script with its environment file (suites.records.repro.write_repro: most of a warm
render's CPU, torch's import and the redaction of every script included), and the few values of the installed
packages a draft issue needs an import for (transformers' class names, the probes' prompt shape: torch's and
transformers' imports). The next render copies them instead of writing them again.

An entry is found by a key that covers everything its files are made from: the harness's own source (every file of
matrix.HARNESS_PACKAGES), the installed packages (each distribution's name, version and direct_url.json: a checkout
layer's commit), the python, the redaction rules (this environment's secret values, by digest only) and the
arguments (ScriptRequest). So an entry holds the bytes the uncached path writes under the same rules, already
redacted by them, and a changed input is a miss. An entry is written whole (one rename) with the digest of each of
its files; one that is lost or does not match them is written again: losing the cache costs time, nothing else."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

from matrix import HARNESS_PACKAGES, PROJECT_ROOT, cache_root
from matrix.harness_cache import used
from matrix.redaction import secret_values
from reports.store import AXES, CellKey, Run
from suites.records.run_records import RunInfo

CACHE_FOLDER = "render"
"""The render's entries, under the harness cache."""
SCRIPT = "repro-script"
VALUE = "value.json"
MANIFEST = "files.json"
JSONValue = Any
"""A value `remembered` keeps: what json.dumps writes and json.loads reads back equal."""
"""An entry's file names and their sha256, written last: an entry is used only when every file matches."""


@dataclass(frozen=True)
class ScriptRequest:
    """What a failing cell's standalone script is written from: write_repro's arguments, and nothing else."""

    cell: CellKey
    """The cell's coordinates (the registry and the installed transformers rebuild the Cell from them)."""
    run: RunInfo
    """The run as the script's environment file records it: its harness commit, accelerator and backend; the
    session, host and start are left empty (write_repro never reads them: a new warm run must not miss)."""
    versions: tuple[tuple[str, str], ...]
    """The versions the cell ran at (every axis and DeepSpeed's commit), as the script records them."""
    verdict: str
    """The line the script reproduces: "fail <class> <signature>"."""
    name: str | None = None
    """The script's file name (None: the results folder's `repro_<cell>.py`)."""

    @classmethod
    def of(cls, cell: CellKey, run: Run, failure_class: str, signature: str, name: str | None = None) -> ScriptRequest:
        """The request for a failing result of `cell` in `run`."""
        versions = tuple((axis, getattr(run.versions, axis)) for axis in (*AXES, "deepspeed_git"))
        recorded = RunInfo(
            session="",
            started="",
            host="",
            accelerator=run.accelerator,
            backend=run.backend,
            harness_git=run.harness_git,
            dependencies_as_of="",
        )
        return cls(cell, recorded, versions, f"fail {failure_class} {signature}", name)


def _digest(parts: Iterable[bytes]) -> str:
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(len(part).to_bytes(8, "big"))
        hashed.update(part)
    return hashed.hexdigest()


def source_digest(root: Path = PROJECT_ROOT) -> str:
    """Every file of the harness's packages under `root` (compiled files left out), by path and content."""
    files = sorted(
        path
        for package in HARNESS_PACKAGES
        for path in (root / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    return _digest(part for path in files for part in (str(path.relative_to(root)).encode(), path.read_bytes()))


def packages_digest() -> str:
    """Each installed distribution's name, version and direct_url.json (a checkout's commit), and the python."""
    distributions = sorted(
        (str(d.metadata["Name"]), d.version, d.read_text("direct_url.json") or "") for d in metadata.distributions()
    )
    return _digest([sys.version.encode(), *(json.dumps(d).encode() for d in distributions)])


def redaction_digest() -> str:
    """This environment's secret values (matrix.redaction.secret_values), as one digest: the rules' code is the
    source's, detect-secrets' patterns are the packages'. Read for every entry: a secret set since is a miss."""
    return _digest(value.encode() for value in secret_values())


@functools.cache
def installed_fingerprint() -> str:
    """The harness's source and the installed packages, read once per process (~0.1 s)."""
    return _digest([source_digest().encode(), packages_digest().encode()])


def cache_folder() -> Path:
    return cache_root() / CACHE_FOLDER


def entry_folder(kind: str, arguments: object) -> Path:
    key_parts = (installed_fingerprint(), redaction_digest(), kind, json.dumps(arguments, sort_keys=True))
    key = _digest(part.encode() for part in key_parts)
    return cache_folder() / key


def read_entry(kind: str, arguments: object) -> dict[str, bytes] | None:
    """The files of the entry by name, or None: no entry, or one whose files do not match its manifest (removed:
    the caller writes it again)."""
    entry = entry_folder(kind, arguments)
    try:
        digests = json.loads((entry / MANIFEST).read_text())
        files = {str(name): (entry / name).read_bytes() for name in digests} if isinstance(digests, dict) else {}
    except (OSError, ValueError):
        files = {}
    if files and all(hashlib.sha256(files[name]).hexdigest() == digests[name] for name in files):
        used(entry)  # the cache's least-recently-used eviction keeps it longest
        return files
    shutil.rmtree(entry, ignore_errors=True)
    return None


def write_entry(kind: str, arguments: object, files: dict[str, bytes]) -> None:
    """The files kept as the entry: written into a new folder beside it, then renamed into place (a render beside
    this one that kept it first wins: both hold the same bytes). A cache that cannot be written is only slower."""
    entry = entry_folder(kind, arguments)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".writing-", dir=entry.parent))
    except OSError:
        return
    try:
        for name, content in files.items():
            (scratch / name).write_bytes(content)
        manifest = {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}
        (scratch / MANIFEST).write_text(json.dumps(manifest))
        os.rename(scratch, entry)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)


def script_arguments(request: ScriptRequest) -> dict[str, object]:
    """The request as its entry's key reads it."""
    return asdict(request)


def cached_script(request: ScriptRequest, folder: Path) -> Path | None:
    """The request's script (and its environment file) written into `folder` from the cache; None on a miss."""
    files = read_entry(SCRIPT, script_arguments(request))
    if files is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return next(folder / name for name in files if name.endswith(".py"))


def keep_script(request: ScriptRequest, script: Path) -> None:
    """A script write_repro just wrote for the request, with the environment file beside it."""
    environment = script.parent / f"env_{request.cell.id}.txt"
    write_entry(SCRIPT, script_arguments(request), {path.name: path.read_bytes() for path in (script, environment)})


def remembered(name: str, read: Callable[[], JSONValue]) -> JSONValue:
    """What `read` gives (a value of the installed packages and the harness's source that costs an import: the
    installed transformers' class names, the probes' prompt shape), kept as JSON for the same packages and source."""
    files = read_entry(VALUE, {"name": name})
    if files is not None:
        return cast(JSONValue, json.loads(files[VALUE]))
    value = read()
    write_entry(VALUE, {"name": name}, {VALUE: json.dumps(value, sort_keys=True).encode()})
    return value

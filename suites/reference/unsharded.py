"""The unsharded reference a cell is compared against, computed where AutoTP cannot reach it and
where its memory cannot meet the rank group's.

AutoTP leaves state behind in a process (module globals in `tp_shard` in older releases, helpers patched onto model
classes), so a reference computed after any injection can differ from the true unsharded model. References are therefore
computed only in a process of their own that never shards (`refuse_if_sharded`) and holds no process group
(`refuse_if_distributed`): on CPU runs a child forked from the rank groups' fork server after its imports, one per
reference, or one per worker for the tiny references a cold run computes ahead of its cells (suites/reference/cache.py
`ReferenceForker`, suites/run/ahead.py: no second import of torch and transformers on a cold cache); otherwise the
reference process (`python -m suites.reference.unsharded serve`, started by the driver through
suites/reference/cache.py), which serves many small references and, after one whose model is at least
`REFERENCE_PROCESS_REUSE_BELOW`, exits. Either way a large model's memory is back with the OS before the rank group
loads it.

Any size: the memory plan (suites/reference/memory_plan.py) gives the reference accelerate's `max_memory`
(`device_map="auto"`: accelerators, then host RAM, then disk), so a model larger than host RAM still
gets the exact unsharded numbers, computed layer by layer.

Cached content-addressed: the key is the checkpoint's identity (hub commit, or a tiny checkpoint's
content hash, never a path), dtype, probe inputs and code, library versions. `export` writes every
cached reference of a model into one file and `import` puts them into another machine's cache, so the
matrix's runners compute each reference once:

    python -m suites.reference.unsharded export --models llama,qwen2 [--checkpoints hub] --out references/
    python -m suites.reference.unsharded import references/*.autotp-references.pt
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from matrix import cache_root
from matrix.cells import parse_names
from matrix.checkpoints import Checkpoint, resolve_checkpoint
from matrix.disk_space import disk_full_at, disk_full_line
from matrix.harness_cache import used
from matrix.installed import cache_identity
from matrix.json_records import read_record, write_record
from matrix.registry import DType, load_models, pick
from suites.base.atomic import write_atomically, write_text_atomically
from suites.base.elementwise_math import settle_elementwise_math
from suites.checks import inputs
from suites.checks.inputs import ProbeSpec, build_inputs, load_tokenizer, probe_fingerprint
from suites.checks.probes import Observations, observe
from suites.checks.task_probe import AccuracyTask, answer_correctness
from suites.variants.loading import ContaminatedProcessError, load_model, refuse_if_sharded
from suites.variants.quantization import QuantizationUnavailable, apply_post_init, hf_quantization_config
from suites.verdicts.outcome import exception_signature

if TYPE_CHECKING:  # the memory plan's types only: the plan itself is made by the driver (suites/run/driver.py)
    pass

REFERENCE_FORMAT = 6
"""Bump when `Observations` or the cache key changes, so stale cached references are not read.
5: keyed by checkpoint identity (content), not path. 6: each module's output summarised (`module_outputs`)."""
EXPORT_SUFFIX = ".autotp-references.pt"


class ReferenceFailed(RuntimeError):
    """The reference process could not compute a reference; `signature` is its exception's, as if it
    had been raised here (the cell's `setup` failure groups with the same failure anywhere)."""

    def __init__(self, signature: str, message: str):
        super().__init__(message)
        self.signature = signature


def _torchao_version() -> str:
    try:
        # lazily: torchao is optional (the variants group): without it the torchao cells skip with the reason
        import torchao

        return str(torchao.__version__)
    except ImportError:
        return ""


def refuse_if_distributed() -> None:
    """A reference is computed by one process alone: none that is a rank of a process group (a collective inside
    the model's forward would wait for, or sum with, other processes)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise ContaminatedProcessError(
            "refusing to compute an unsharded reference in a process with an initialised torch.distributed "
            "process group: it must be computed by a process of its own"
        )


def checkpoint_identity(checkpoint: Checkpoint) -> dict[str, str]:
    """The checkpoint by what it holds (its hub commit or tiny content hash, resolved with it), never its path."""
    return {"source": checkpoint.source, "revision": checkpoint.revision}


def tokenizer_identity(checkpoint: Checkpoint) -> dict[str, str] | None:
    """A checkpoint's tokenizer is its own folder's (a hub snapshot) or the byte tokenizer (None)."""
    return None if checkpoint.tokenizer is None else checkpoint_identity(checkpoint)


def reference_identity(
    checkpoint: Checkpoint,
    dtype: DType,
    spec: ProbeSpec,
    quantization: str = "",
    quant_group_size: int = 0,
) -> dict[str, Any]:
    """Everything the reference's numbers depend on, and nothing that depends on this machine."""
    quant: dict[str, object] = {}
    if quantization:  # the quantized reference depends on the quantizer's code too, so its versions join the key
        quant = {
            "quantization": quantization,
            "group_size": quant_group_size,
            **cache_identity("deepspeed"),
            "torchao": _torchao_version(),
        }
    return {
        "format": REFERENCE_FORMAT,
        "checkpoint": checkpoint_identity(checkpoint),
        "tokenizer": tokenizer_identity(checkpoint),
        "dtype": dtype,
        "spec": write_record(spec),
        "probes": probe_fingerprint(),
        "torch": str(torch.__version__),
        **cache_identity("transformers"),
        **quant,
    }


def path_for(identity: dict[str, Any], prefix: str = "", suffix: str = ".pt") -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return used(cache_root() / "references" / f"{prefix}{key}{suffix}")


def reference_path(
    checkpoint: Checkpoint,
    dtype: DType,
    spec: ProbeSpec,
    quantization: str = "",
    quant_group_size: int = 0,
) -> Path:
    return path_for(reference_identity(checkpoint, dtype, spec, quantization, quant_group_size))


def _sidecar(path: Path) -> Path:
    """`<key>.json` next to a cached reference: its identity and how it was computed (peak RSS, offload)."""
    return path.with_suffix(".json")


def compute_reference(
    checkpoint: str,
    tokenizer: str | None,
    dtype: DType,
    spec: ProbeSpec,
    *,
    trust_remote_code: bool = False,
    quantization: str = "",
    quant_group_size: int = 0,
    max_memory: dict[str, int] | None = None,
) -> Observations:
    """The unsharded model's observations; with `quantization`, of the unsharded model quantized the
    way the variant quantizes the sharded one (QuantizationUnavailable when that fails); with
    `max_memory`, loaded by accelerate over the devices it names with the rest offloaded to disk."""
    refuse_if_sharded()
    refuse_if_distributed()
    torch.manual_seed(0)
    with big_model_loading(max_memory) as big_model:
        try:
            model = load_model(checkpoint, dtype, trust_remote_code, hf_quantization_config(quantization), big_model)
            model = apply_post_init(model, quantization, quant_group_size)
        except QuantizationUnavailable:
            raise
        except Exception as error:
            if not quantization:
                raise
            raise QuantizationUnavailable(
                f"{quantization} cannot quantize the unsharded {dtype} model: {exception_signature(error)}"
            ) from error
        return observe(model, build_inputs(load_tokenizer(tokenizer, trust_remote_code), spec), spec, "cpu")


@contextmanager
def big_model_loading(max_memory: dict[str, int] | None) -> Iterator[dict[str, Any] | None]:
    """accelerate's big-model keywords for `from_pretrained` (None without a cap), with a scratch folder
    for weights it must write out (safetensors checkpoints are read in place; .bin ones are copied)."""
    if max_memory is None:
        yield None
        return
    cache_root().mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="offload-", dir=cache_root())
    try:
        # The plan names devices by their index as a string (it crosses processes as JSON); accelerate wants ints.
        yield {
            "device_map": "auto",
            "max_memory": {int(key) if key.isdigit() else key: value for key, value in max_memory.items()},
            "offload_folder": folder,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class ObservationsRequest:
    """One unsharded reference's observations to compute, as the driver hands it to the process that computes it
    (a child of the fork server, or the reference process): JSON on the way (`request_to_json`), this module's code
    at both ends."""

    path: str
    """The cache file the observations are written to (`<key>.pt`, its sidecar `<key>.json` beside it)."""
    identity: dict[str, Any]
    """`reference_identity`: the cache key's content, written into the sidecar (export/import read it)."""
    checkpoint: str
    """The checkpoint folder `from_pretrained` loads."""
    tokenizer: str | None
    """Tokenizer source; None: the byte tokenizer of tiny checkpoints."""
    dtype: DType
    spec: ProbeSpec
    trust_remote_code: bool
    quantization: str
    """The variant's quantization applied to the unsharded model too ("" for none)."""
    quant_group_size: int
    max_memory: dict[str, int] | None
    """The memory plan's accelerate `max_memory` (suites/reference/memory_plan.py `ReferencePlan.max_memory`); None: a
    plain load into host RAM."""
    offload: str
    """The plan's offload (`none`, `disk`), recorded in the sidecar."""
    corpus_file: str
    """The corpus the key's probe fingerprint was taken from (the computing process reads the same one)."""
    planned_peak_bytes: int
    """The plan's host peak for this reference, recorded in the sidecar beside the measured one."""
    threads: int | None = None
    """The torch threads it computes with; None: the computing process's own (suites/run/ahead.py computes references
    one per core, each on one thread)."""


@dataclass(frozen=True)
class TaskRequest:
    """The unsharded model's per-item correctness on an accuracy task, to compute like `ObservationsRequest`."""

    path: str
    """The cache file the answers are written to (`task-<key>.json`, a JSON list of bools)."""
    checkpoint: str
    tokenizer: str | None
    dtype: DType
    task: AccuracyTask
    trust_remote_code: bool
    threads: int | None = None
    """As `ObservationsRequest.threads`."""


ReferenceRequest = ObservationsRequest | TaskRequest
"""What the driver asks a reference's process to compute."""


def request_to_json(request: ReferenceRequest) -> dict[str, Any]:
    """The request as the JSON object it crosses processes as (`request_from_json` reads it back)."""
    return {"kind": "task" if isinstance(request, TaskRequest) else "observations", **asdict(request)}


def request_from_json(data: dict[str, Any]) -> ReferenceRequest:
    fields = {key: value for key, value in data.items() if key != "kind"}
    if data["kind"] == "task":
        return read_record(TaskRequest, fields)
    return read_record(ObservationsRequest, fields)


def reference_record(path: str | Path) -> dict[str, Any]:
    """What the reference process wrote about a cached reference (identity, offload, measured peak)."""
    try:
        record: dict[str, Any] = json.loads(_sidecar(Path(path)).read_text())
    except (OSError, ValueError):
        return {}
    return record


def load_reference(path: str | Path) -> Observations:
    return read_record(Observations, torch.load(path, weights_only=False))


ReferenceRead = Callable[[], Observations]
"""A cell's unsharded observations, read from the reference cache when first asked (`read_once`)."""


def read_once(path: str | None) -> ReferenceRead:
    """The reference at `path`, read at most once (a cell's verdict: the checks and, on a failed cell, the search for
    where it diverged both read it; a read is ~3 ms of rank 0's CPU while the verdict waits) and only when asked (never
    where no check runs: a rank raised). Asked without a path, it raises: a harness bug, the cell's `setup`."""

    @functools.cache
    def read() -> Observations:
        if path is None:
            raise ValueError("an inference cell's verdict asked for a reference its job does not name (a harness bug)")
        return load_reference(path)

    return read


Answer = dict[str, Any]
"""What a reference's process answers (JSON): `_serve_one`'s measurements, or `{"error": ...}` (see `answer`)."""


def _reset_peak_rss() -> int:
    """Start a new VmHWM measurement (Linux clear_refs) and return the current RSS."""

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch computes with `threads` threads (None: as it is) while the block runs: the reference process serves
    later requests with its own."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _serve_one(request: ReferenceRequest) -> Answer:
    with _torch_threads(request.threads):
        return _computed(request)


def _computed(request: ReferenceRequest) -> Answer:
    if isinstance(request, TaskRequest):
        model = load_model(request.checkpoint, request.dtype, request.trust_remote_code)
        correct = answer_correctness(
            request.task, model, load_tokenizer(request.tokenizer, request.trust_remote_code), "cpu"
        )
        write_text_atomically(Path(request.path), json.dumps(correct))
        return {"path": request.path}
    inputs.CORPUS_FILE = Path(request.corpus_file)  # the one the key's probe fingerprint was taken from
    started, rss_before = time.perf_counter(), _reset_peak_rss()
    observations = compute_reference(
        request.checkpoint,
        request.tokenizer,
        request.dtype,
        request.spec,
        trust_remote_code=request.trust_remote_code,
        quantization=request.quantization,
        quant_group_size=request.quant_group_size,
        max_memory=request.max_memory,
    )
    path = Path(request.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda staging: torch.save(write_record(observations), staging))
    measured = {
        "identity": request.identity,
        "offload": request.offload,
        "max_memory": request.max_memory,
        "planned_peak_bytes": request.planned_peak_bytes,
        "peak_rss_bytes": _status_bytes("VmHWM"),
        "rss_before_bytes": rss_before,
        "seconds": time.perf_counter() - started,
        "threads": torch.get_num_threads(),
    }
    write_text_atomically(_sidecar(path), json.dumps(measured))
    return {"path": str(path), **measured}


def serve() -> None:
    """The reference process: answer requests from stdin until it closes. Only the protocol writes to
    the real stdout; everything the libraries print goes to stderr (the driver's log file)."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    settle_elementwise_math()  # as the fork server does before it forks a reference's process
    for line in sys.stdin:
        protocol.write(json.dumps(answer(request_from_json(json.loads(line)))) + "\n")


def answer(request: ReferenceRequest) -> Answer:
    """One request's answer, as the reference process writes it (here or in a child of the fork server): what
    `_serve_one` measured, or the error that ended it (the request's failure, never the process's end)."""
    try:
        return _serve_one(request)
    except Exception as error:
        full = disk_full_at(error)
        return {
            "error": {
                "signature": exception_signature(error),
                "quantization_unavailable": isinstance(error, QuantizationUnavailable),
                "message": ("" if full is None else disk_full_line(full, "rerun the cell") + "\n")
                + "computing the unsharded reference failed:\n"
                + "".join(traceback.format_exception(error))[-4000:],
            }
        }


def export_references(checkpoint: Checkpoint, destination: Path) -> tuple[Path, int]:
    """Every cached reference of one checkpoint, written as one file; returns (file, references)."""
    wanted = (checkpoint_identity(checkpoint), tokenizer_identity(checkpoint))
    bundle = []
    # References are the `.pt` files; a task reference (`task-<key>.json`, a list of answers) has no sidecar.
    for path in sorted((cache_root() / "references").glob("*.pt")):
        record = reference_record(path)
        identity = record.get("identity")
        if identity and (identity["checkpoint"], identity["tokenizer"]) == wanted:
            bundle.append({"record": record, "observations": torch.load(path, weights_only=False)})
    write_atomically(
        destination, lambda staging: torch.save({"format": REFERENCE_FORMAT, "references": bundle}, staging)
    )
    return destination, len(bundle)


def import_references(bundle_path: Path) -> int:
    """Put an exported file's references into this machine's cache under their content keys."""
    bundle = torch.load(bundle_path, weights_only=False)
    if bundle.get("format") != REFERENCE_FORMAT:
        raise ValueError(
            f"{bundle_path}: reference format {bundle.get('format')}, this harness reads {REFERENCE_FORMAT}"
        )
    for item in bundle["references"]:
        path = path_for(item["record"]["identity"])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, functools.partial(torch.save, item["observations"]))
        write_text_atomically(_sidecar(path), json.dumps(item["record"]))
    return len(bundle["references"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The unsharded reference process, and reference export/import.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="answer reference requests on stdin (started by the driver)")
    export = commands.add_parser("export", help="one file per model with every cached reference of its checkpoint")
    export.add_argument("--models", required=True, help="comma-separated registry names")
    export.add_argument("--checkpoints", default="tiny", choices=("tiny", "hub"))
    export.add_argument("--out", type=Path, required=True, help="folder for <model>" + EXPORT_SUFFIX)
    imported = commands.add_parser("import", help="put exported references into this machine's cache")
    imported.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve()
        return 0
    if args.command == "import":
        for path in args.files:
            print(f"{path}: {import_references(path)} references imported into {cache_root() / 'references'}")
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    for entry in pick(load_models(), parse_names(args.models), "model"):
        checkpoint = resolve_checkpoint(entry, args.checkpoints)
        path, count = export_references(checkpoint, args.out / f"{entry.name}{EXPORT_SUFFIX}")
        print(f"{entry.name} ({checkpoint.source}@{checkpoint.revision}): {count} references -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

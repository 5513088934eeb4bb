"""Peak memory per process against model size, planned and measured side by side.

    python benchmarks/memory_plan.py [--layers 2,6,12] [--tp 2] [--variants eager,meta]

Three llama-shaped synthetic checkpoints (hidden 1536, 12 heads, 4 kv heads, intermediate 4096,
vocab 16000; the layer count sets the size: 2, 6, 12 layers are 0.40, 0.80, 1.41 GB in fp32), written
by the harness like its tiny checkpoints. For each: the unsharded reference (whole, then with host RAM
capped so that accelerate offloads every layer to disk), and the cells of each variant at tp N
through pytest, as a run would. Peaks are VmHWM of each process from the start of its work (the
reference process's request, a rank's cell), runtime included; the plan's numbers come from the same
records (`plan_*` metrics, the reference's sidecar). Fitted slopes say how a process's peak grows per
byte of model: ≈ 1 for the whole reference, ≈ 0 for the offloaded one (one layer at a time), ≈ 1.2 for
an eager rank (the whole model, then its shard), ≈ 1/tp + 1/files for a meta rank if DeepSpeed's
loader held only its shard and one checkpoint file.

One cell at a time, sizes in order; the memory plan skips what this machine cannot hold (reported,
not OOM-killed). Uses its own cache folder under --work (default /tmp/autotp-memory-benchmark).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from matrix.checkpoints import (
    folder_checkpoint,
    tiny_checkpoint,
)
from matrix.registry import load_models
from matrix.variants import (
    Variant,
    load_variants,
)
from sessions.add_model import toml_value
from suites.checks.inputs import ProbeSpec
from suites.records.run_records import read_records
from suites.reference.cache import cached_reference
from suites.reference.checkpoint_sizes import activation_bytes, checkpoint_size
from suites.reference.memory_plan import (
    HOST_MEMORY_ENV,
    PROCESS_RUNTIME_BYTES,
    SAFETY,
    Runner,
    gib,
    plan_reference,
)
from suites.reference.unsharded import (
    reference_path,
    reference_record,
)
from suites.run.command import suites_command

SHAPE = {
    "hidden_size": 1536,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "intermediate_size": 4096,
    "vocab_size": 16000,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def models_file(folder: Path, layers: list[int]) -> tuple[Path, list[str]]:
    names, tables = [], []
    for count in layers:
        name = f"synthetic_llama_{count}l"
        names.append(name)
        tables.append(
            f'[models.{name}]\nmodel_type = "llama"\ntiny = {toml_value({**SHAPE, "num_hidden_layers": count})}\n'
            f'tiny_why = "memory benchmark: llama-shaped, {count} layers"\n'
        )
    path = folder / "models.toml"
    path.write_text("\n".join(tables))
    return path, names


def forget_reference(folder: str) -> None:
    """Drop the cached reference, so the next run measures its computation."""

    reference_path(folder_checkpoint(folder), "fp32", ProbeSpec()).unlink(missing_ok=True)


def offloaded_reference(folder: str) -> dict[str, Any]:
    """The reference computed again with host RAM capped so that no layer stays resident."""

    size, checkpoint = checkpoint_size(folder), folder_checkpoint(folder)
    path = reference_path(checkpoint, "fp32", ProbeSpec())
    forget_reference(folder)
    cap = (PROCESS_RUNTIME_BYTES + activation_bytes(size, "fp32") + size.layer_bytes("fp32")) / SAFETY
    os.environ[HOST_MEMORY_ENV] = str(int(cap) + (16 << 20))
    try:
        cached_reference(checkpoint, "fp32", ProbeSpec(), plan=plan_reference(size, "fp32", Runner.detect()))
    finally:
        del os.environ[HOST_MEMORY_ENV]
    return reference_record(path)


UNSHARDED_STEPS_CHILD = """
import json, sys
from suites.checks.inputs import ProbeSpec
from suites.variants.training import compute_unsharded_steps

def vm(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

folder, steps, optimizer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
before = vm("VmRSS:")
compute_unsharded_steps(
    checkpoint=folder,
    tokenizer=None,
    dtype="fp32",
    spec=ProbeSpec(),
    trust_remote_code=False,
    steps=steps,
    optimizer_name=optimizer,
)
print(json.dumps({"growth": vm("VmHWM:") - before}))
"""


def unsharded_training_growth(folder: str, variant: Variant) -> int:
    """Peak RSS growth of the driver's unsharded training steps for `variant`, measured in a child process
    that imported the same modules first (the driver computes them in its own, long-lived process)."""
    done = subprocess.run(
        [sys.executable, "-c", UNSHARDED_STEPS_CHILD, folder, str(variant.unsharded_steps), variant.optimizer],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(done.stdout.strip().splitlines()[-1])["growth"])


def fitted_slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of measured peak against model bytes."""
    count = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / count, sum(y for _, y in points) / count
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return slope, mean_y - slope * mean_x


Row = tuple[str, int, int, int, str]
"""(process, model bytes, planned bytes, measured bytes (0: not measured), note)."""


def record_rows(record: dict[str, Any], model_bytes: int, folder: str, first_variant: str) -> list[Row]:
    """One cell record's rows: its ranks (planned against measured, or the outcome where nothing was measured), the
    unsharded reference (once per checkpoint: at the first variant) and the unsharded training steps."""

    rows: list[Row] = []
    metrics, cell = record["metrics"], record["cell"]
    if "rss_peak_max_bytes" in metrics:
        rows.append(
            (
                f"{cell['variant']} rank tp{cell['tp']}",
                model_bytes,
                metrics["plan_rank_host_bytes"],
                metrics["rss_peak_max_bytes"],
                record["outcome"],
            )
        )
    else:
        rows.append(
            (
                f"{cell['variant']} rank tp{cell['tp']}",
                model_bytes,
                metrics.get("plan_rank_host_bytes", 0),
                0,
                f"{record['outcome']}: {record['message'][:120]}",
            )
        )
    if "reference_peak_rss_bytes" in metrics and cell["variant"] == first_variant:
        rows.append(
            (
                "reference",
                model_bytes,
                metrics["plan_reference_host_bytes"],
                metrics["reference_peak_rss_bytes"],
                "",
            )
        )
    if "plan_training_host_bytes" in metrics:
        rows.append(
            (
                f"{cell['variant']} unsharded steps",
                model_bytes,
                metrics["plan_training_host_bytes"],
                unsharded_training_growth(folder, load_variants()[cell["variant"]]),
                "driver side, in a child",
            )
        )
    return rows


def print_tables(rows: list[Row]) -> None:
    """Planned against measured per process and checkpoint, then each process's slopes over the checkpoints."""

    print(f"\n{'process':<24}{'model':>10}{'planned':>11}{'measured':>11}{'planned/measured':>18}  note")
    for process, model_bytes, planned, measured, note in rows:
        ratio = f"{planned / measured:.2f}" if measured else "-"
        print(
            f"{process:<24}{gib(model_bytes):>10}{gib(planned):>11}{gib(measured) if measured else '-':>11}{ratio:>18} "
            f" {note}"
        )
    print(f"\n{'process':<24}{'measured slope':>16}{'planned slope':>15}{'measured at 0':>15}")
    for process in dict.fromkeys(row[0] for row in rows):
        measured_points: list[tuple[float, float]] = [(row[1], row[3]) for row in rows if row[0] == process and row[3]]
        planned_points: list[tuple[float, float]] = [(row[1], row[2]) for row in rows if row[0] == process and row[3]]
        if len(measured_points) >= 2:
            slope, intercept = fitted_slope(measured_points)
            print(f"{process:<24}{slope:>16.3f}{fitted_slope(planned_points)[0]:>15.3f}{gib(intercept):>15}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,6,12", help="layer counts of the three checkpoints")
    parser.add_argument("--tp", default="2")
    parser.add_argument("--variants", default="eager,meta")
    parser.add_argument("--work", type=Path, default=Path("/tmp/autotp-memory-benchmark"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["AUTOTP_CACHE"] = str(args.work / "cache")

    registry, names = models_file(args.work, [int(n) for n in args.layers.split(",")])
    models = load_models(registry)
    rows: list[Row] = []
    for name in names:
        folder = str(tiny_checkpoint(models[name]))
        model_bytes = checkpoint_size(folder).model_bytes("fp32")
        print(f"{name}: {gib(model_bytes)} fp32; running its cells ...", flush=True)
        results = args.work / f"results-{name}"
        shutil.rmtree(results, ignore_errors=True)  # this run's records only
        forget_reference(folder)  # the cells' run computes it whole, measured
        subprocess.run(
            suites_command(
                sys.executable,
                models=name,
                models_file=registry,
                variants=args.variants,
                tp=args.tp,
                results=results,
                cell_timeout=1800,
                extra=["-q"],
            ),
            cwd=PROJECT_ROOT,
            check=False,
        )
        for record in read_records(results):
            rows += record_rows(record, model_bytes, folder, args.variants.split(",")[0])
        offloaded = offloaded_reference(folder)
        rows.append(
            (
                "reference, offloaded",
                model_bytes,
                offloaded["planned_peak_bytes"],
                offloaded["peak_rss_bytes"],
                f"max_memory {offloaded['max_memory']}",
            )
        )

    print_tables(rows)
    (args.work / "memory-benchmark.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""The memory plan: sizes read from checkpoint metadata only, host RAM bounded by the cgroup, a cell
that cannot fit skipped with the short resource, the amount and what would fit, never started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors import safe_open

from matrix import PROJECT_ROOT
from matrix.checkpoints import tiny_checkpoint
from matrix.registry import load_models
from suites.reference.checkpoint_sizes import CheckpointSize, checkpoint_size
from suites.reference.memory_plan import (
    PROCESS_RUNTIME_BYTES,
    GiB,
    MiB,
    Runner,
    TrainingShape,
    gib,
    host_memory,
    parse_bytes,
    plan_cell,
    plan_reference,
)

PYTHON_ENV = {**os.environ, "TMPDIR": os.environ.get("TMPDIR", "/tmp")}


def cpu_runner(host: int) -> Runner:
    return Runner(host, "test", "cpu", ())


# A llama-2-7b-shaped checkpoint: 6.74 G parameters, layers of 202 M, two files of ~10 GB in fp16.
SEVEN_B = CheckpointSize(
    parameters=6_738_415_616,
    largest_layer_parameters=202_383_360,
    largest_file_bytes=9_976_576_152,
    stored_bytes=13_476_839_424,
    vocab_size=32000,
    hidden_size=4096,
)


@pytest.mark.parametrize(
    "text, count", [("64GiB", 64 * GiB), ("512MiB", 512 * MiB), ("1.5 GB", int(1.5 * GiB)), ("1000", 1000)]
)
def test_sizes_are_read_with_units(text, count):
    assert parse_bytes(text, "X") == count


def test_unreadable_size_names_the_variable():
    with pytest.raises(ValueError, match="AUTOTP_HOST_MEMORY='lots' is not a size"):
        parse_bytes("lots", "AUTOTP_HOST_MEMORY")


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_host_ram_is_bounded_by_the_cgroup_limit(tmp_path, monkeypatch, layout):
    monkeypatch.delenv("AUTOTP_HOST_MEMORY", raising=False)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {64 * 1024 * 1024} kB\nMemAvailable: {60 * 1024 * 1024} kB\n")
    membership = tmp_path / "membership"
    group = tmp_path / "cgroup" / ("memory/job/7" if layout == "v1" else "job/7")
    group.mkdir(parents=True)
    limit, usage = (
        ("memory.limit_in_bytes", "memory.usage_in_bytes") if layout == "v1" else ("memory.max", "memory.current")
    )
    (group / limit).write_text(str(16 * GiB))
    (group / usage).write_text(str(4 * GiB))
    membership.write_text("4:memory:/job/7\n" if layout == "v1" else "0::/job/7\n")
    from suites.reference import memory_plan

    monkeypatch.setattr(
        memory_plan,
        "_cgroup_headroom",
        lambda root, membership=membership, real=memory_plan._cgroup_headroom: real(root, membership),
    )
    assert host_memory(meminfo, tmp_path / "cgroup") == (12 * GiB, "cgroup limit")
    (group / limit).write_text("max" if layout == "v2" else str(1 << 62))
    assert host_memory(meminfo, tmp_path / "cgroup") == (60 * GiB, "MemAvailable")
    monkeypatch.setenv("AUTOTP_HOST_MEMORY", "8GiB")
    assert host_memory(meminfo, tmp_path / "cgroup") == (8 * GiB, "AUTOTP_HOST_MEMORY")


def test_checkpoint_size_comes_from_safetensors_headers():
    folder = tiny_checkpoint(load_models()["llama"])
    per_layer, total = {}, 0
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        for name in weights.keys():
            elements = weights.get_slice(name).get_shape()
            count = 1
            for dim in elements:
                count *= dim
            total += count
            key = name.split(".layers.")[1].split(".")[0] if ".layers." in name else name
            per_layer[key] = per_layer.get(key, 0) + count
    size = checkpoint_size(folder)
    assert (size.parameters, size.largest_layer_parameters) == (total, max(per_layer.values()))
    assert (
        size.model_bytes("bf16") == 2 * total
        and size.largest_file_bytes == (folder / "model.safetensors").stat().st_size
    )


def test_checkpoint_size_of_a_hub_snapshot_without_weights_comes_from_its_index(tmp_path):
    """A snapshot whose config and index are cached but whose weights are not: planned all the same."""
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 32,
                "vocab_size": 32000,
                "hidden_size": 4096,
                "torch_dtype": "float16",
            }
        )
    )
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {"total_size": SEVEN_B.stored_bytes},
                "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
            }
        )
    )
    size = checkpoint_size(tmp_path)
    assert size.parameters == SEVEN_B.stored_bytes // 2
    assert size.largest_file_bytes == SEVEN_B.stored_bytes // 2
    assert size.model_bytes("bf16") == SEVEN_B.stored_bytes


def test_a_7b_eager_group_on_a_small_runner_is_refused_with_what_would_fit():
    plan = plan_cell(SEVEN_B, "bf16", tp=4, load="eager", runner=cpu_runner(64 * GiB))
    each = plan.rank_host_bytes
    assert plan.problem == (
        f"needs {gib(4 * each)} host RAM for 4 eager ranks ({gib(each)} each), runner has 64.00 GiB "
        "(test; a plan uses at most 90%): use --variants eager --tp 2 or --variants meta --tp 2"
    )
    assert plan_cell(SEVEN_B, "bf16", tp=2, load="eager", runner=cpu_runner(64 * GiB)).problem == ""


def test_the_reference_offloads_to_disk_when_it_does_not_fit_and_is_refused_only_below_one_layer():
    whole = plan_reference(SEVEN_B, "bf16", cpu_runner(64 * GiB))
    assert (whole.offload, whole.max_memory()) == ("none", None)
    capped = plan_reference(SEVEN_B, "bf16", cpu_runner(8 * GiB))
    assert capped.offload == "disk" and capped.host_bytes <= 8 * GiB * 0.9
    assert capped.max_memory() == {"cpu": capped.cpu_bytes} and 0 < capped.cpu_bytes < SEVEN_B.model_bytes("bf16")
    plan = plan_cell(SEVEN_B, "bf16", tp=2, load="meta", runner=cpu_runner(PROCESS_RUNTIME_BYTES + GiB // 2))
    assert (
        plan.problem.startswith("needs")
        and "host RAM for the reference even with disk offload (runtime + the largest layer" in plan.problem
    )


def test_accelerator_memory_is_planned_per_rank_and_a_larger_tp_suggested():
    runner = Runner(512 * GiB, "test", "cuda", (8 * GiB,) * 8)
    plan = plan_cell(SEVEN_B, "bf16", tp=1, load="meta", runner=runner)
    assert "cuda memory per rank at tp 1, a device has 8.00 GiB free: use --variants eager --tp 2" in plan.problem
    fitting = plan_cell(SEVEN_B, "bf16", tp=2, load="meta", runner=runner)
    assert fitting.problem == "" and fitting.rank_device_bytes < 8 * GiB
    reference = fitting.reference
    assert reference.max_memory() == {**{str(index): int(8 * GiB * 0.9) for index in range(8)}, "cpu": 0}


def test_a_cell_that_cannot_fit_is_skipped_with_the_plan_and_no_rank_group_starts(tmp_path):
    """A runner that holds 2 eager ranks of llama_large but not 4: the tp 4 cell is refused, tp 2 suggested."""
    size = checkpoint_size(tiny_checkpoint(load_models()["llama_large"]))
    eager = plan_cell(size, "fp32", tp=4, load="eager", runner=cpu_runner(1 << 50)).group_host_bytes
    fits = plan_cell(size, "fp32", tp=2, load="eager", runner=cpu_runner(1 << 50)).group_host_bytes
    next_larger = min(
        eager, plan_cell(size, "fp32", tp=2, load="meta", runner=cpu_runner(1 << 50), meta_files=4).group_host_bytes
    )
    runner_bytes = int((fits + next_larger) / 2 / 0.9)
    results = tmp_path / "results"
    env = {**PYTHON_ENV, "AUTOTP_HOST_MEMORY": str(runner_bytes)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "suites",
            "--models",
            "llama_large",
            "--shapes",
            "stress",
            "--tp",
            "4",
            "--results",
            str(results),
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"memory plan: host RAM {gib(runner_bytes)} (AUTOTP_HOST_MEMORY)" in done.stdout  # before the first cell
    assert "llama_large (tiny@sha256:" in done.stdout
    [record] = [json.loads(line) for line in (results / "cells.jsonl").read_text().splitlines()]
    assert record["outcome"] == "skip"
    assert record["message"] == (
        f"memory plan: needs {gib(eager)} host RAM for 4 eager ranks ({gib(eager / 4)} each), runner "
        f"has {gib(runner_bytes)} (AUTOTP_HOST_MEMORY; a plan uses at most 90%): use --variants eager --tp 2"
    )
    assert record["metrics"]["plan_host_available_bytes"] == runner_bytes
    assert record["metrics"]["plan_group_host_bytes"] == eager
    assert record["checkpoint"]["source"] == "tiny" and record["checkpoint"]["revision"].startswith("sha256:")
    assert not (results / "logs").exists()


def test_memory_this_run_already_holds_counts_as_available(monkeypatch):
    """A live rank group serves the next cell with the memory it holds (or frees it before the next group
    starts): a plan that counted it as used would skip cells a full machine can still run."""
    monkeypatch.delenv("AUTOTP_HOST_MEMORY", raising=False)
    held = Runner.detect(group_bytes=GiB)
    assert held.host_source.endswith("+ 1.00 GiB held by this run")
    assert held.host_bytes - Runner.detect().host_bytes > GiB / 2  # MemAvailable moves a little between the calls
    monkeypatch.setenv("AUTOTP_HOST_MEMORY", "4GiB")
    assert Runner.detect(group_bytes=GiB).host_bytes == 4 * GiB  # an explicit runner size is the whole budget


def test_the_live_group_is_not_free_while_the_driver_computes():
    """The driver computes the unsharded training steps (and the reference process the reference) while the live
    rank group still holds its memory: only the next group gets it. Counted free for both, a plan passed a cell
    whose driver-side steps then ran out of memory beside the group."""
    shape = TrainingShape(2, 1, False)
    alone = plan_cell(SEVEN_B, "bf16", tp=2, load="eager", runner=cpu_runner(512 * GiB), training=shape)
    roomy = cpu_runner(int(max(alone.group_host_bytes, alone.training_host_bytes) / 0.9) + GiB)
    assert not plan_cell(SEVEN_B, "bf16", tp=2, load="eager", runner=roomy, training=shape).problem
    group_holds = replace(roomy, live_group_bytes=roomy.host_bytes - int(alone.training_host_bytes / 0.9) + GiB)
    plan = plan_cell(SEVEN_B, "bf16", tp=2, load="eager", runner=group_holds, training=shape)
    assert "for the unsharded training steps in the driver" in plan.problem
    assert "held by the live rank group until it ends" in plan.problem
    reference = plan_reference(SEVEN_B, "fp16", replace(cpu_runner(40 * GiB), live_group_bytes=30 * GiB))
    assert reference.offload == "disk" and plan_reference(SEVEN_B, "fp16", cpu_runner(40 * GiB)).offload == "none"


def test_hub_checkpoints_load_on_the_meta_device_by_default_on_accelerator_runners(monkeypatch):
    from suites.reference import memory_plan

    assert memory_plan.default_variants("tiny") == "eager"
    monkeypatch.setattr(memory_plan, "device_memory", lambda: ("cpu", []))
    assert memory_plan.default_variants("hub") == "eager"  # CPU: the meta loader peaks higher than eager
    monkeypatch.setattr(memory_plan, "device_memory", lambda: ("cuda", [80 << 30] * 8))
    assert memory_plan.default_variants("hub") == "meta"
    assert memory_plan.default_variants("tiny") == "eager"

    def no_deepspeed():
        raise ImportError("No module named 'deepspeed'")

    monkeypatch.setattr(memory_plan, "device_memory", no_deepspeed)
    assert memory_plan.default_variants("hub") == "eager"  # a session whose install failed records what it selected


def test_training_rows_plan_their_gradients_optimizer_state_and_snapshots():
    from matrix.variants import load_variants
    from suites.reference.memory_plan import TrainingShape

    variants = load_variants()
    assert TrainingShape.of(variants["eager"]) is None
    train, universal = TrainingShape.of(variants["train"]), TrainingShape.of(variants["train_universal"])
    # train: 1 SGD step: weights, gradients, momentum, the weights before and after, the step's gradients
    assert (train.steps, train.optimizer_copies, train.unsharded_copies, train.compared_copies) == (1, 1, 6, 3)
    # train_universal: 2 AdamW steps + the resumed one
    assert (universal.steps, universal.optimizer_copies, universal.unsharded_copies, universal.round_trip) == (
        3,
        2,
        11,
        True,
    )
    assert (train.rank_copies(2), universal.rank_copies(2)) == (6.25, 18.25)
    runner = cpu_runner(256 * GiB)
    inference = plan_cell(SEVEN_B, "bf16", tp=2, load="eager", runner=runner)
    trained = plan_cell(SEVEN_B, "bf16", tp=2, load="eager", runner=runner, training=train)
    assert trained.training_host_bytes >= 6 * SEVEN_B.model_bytes("bf16") and inference.training_host_bytes == 0
    assert trained.rank_host_bytes > inference.rank_host_bytes  # the compared steps and the shard's training state
    assert "plan_training_host_bytes" in trained.metrics() and "unsharded training steps" in trained.summary()


def test_a_training_row_that_cannot_fit_says_so_and_suggests_no_meta_load():
    from matrix.variants import load_variants
    from suites.reference.memory_plan import TrainingShape

    train = TrainingShape.of(load_variants()["train"])
    plan = plan_cell(SEVEN_B, "bf16", tp=2, load="eager", runner=cpu_runner(64 * GiB), training=train)
    assert (
        plan.problem.startswith("needs ")
        and "for the unsharded training steps in the driver (6 copies of the model" in plan.problem
    )
    roomy = cpu_runner(int((train.unsharded_copies + 1) * SEVEN_B.model_bytes("bf16") / 0.9))
    group = plan_cell(SEVEN_B, "bf16", tp=8, load="eager", runner=roomy, training=train)
    assert "host RAM for 8 eager ranks" in group.problem and "--variants" not in group.problem


def test_a_training_cell_plans_and_computes_no_inference_reference(tmp_path, monkeypatch):
    """Its reference is the driver's unsharded steps: a 7B training cell must not be refused (or wait) for a
    reference process it never starts."""
    from matrix.cells import expand
    from matrix.variants import load_variants
    from suites.reference.memory_plan import TrainingShape
    from suites.run import driver

    plan = plan_cell(
        SEVEN_B,
        "bf16",
        tp=2,
        load="eager",
        runner=cpu_runner(1 << 50),
        training=TrainingShape.of(load_variants()["train"]),
    )
    assert plan.reference.host_bytes == 0 and "plan_reference_host_bytes" not in plan.metrics()
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    monkeypatch.setattr(driver, "cached", lambda *args, **kwargs: pytest.fail("a training cell asked for a reference"))
    job, _ = driver.prepare_job(expand("llama", "train", tp="2")[0], driver.RunOptions())
    assert job.reference is None and job.trained[0].unsharded_steps


class HubWithIndex:
    """huggingface_hub.snapshot_download's stand-in: a repository of config.json, a safetensors index of a 140 GB
    model and its two weight files, laid out like the HF cache (`snapshots/<commit>`); records what it writes."""

    COMMIT = "2" * 40

    def __init__(self, cache: Path):
        self.cache, self.written = cache, []
        config = {"model_type": "llama", "num_hidden_layers": 80, "vocab_size": 32000, "hidden_size": 8192}
        index = {
            "metadata": {"total_size": 140 * GiB},
            "weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"},
        }
        self.files = {
            "config.json": json.dumps(config),
            "model.safetensors.index.json": json.dumps(index),
            "model-1.safetensors": "w",
            "model-2.safetensors": "w",
        }

    def __call__(
        self, repo_id, *, revision=None, allow_patterns=None, ignore_patterns=(), dry_run=False, local_files_only=False
    ):
        import fnmatch

        folder = self.cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / self.COMMIT
        names = [
            name
            for name in self.files
            if (allow_patterns is None or any(fnmatch.fnmatch(name, p) for p in allow_patterns))
            and not any(fnmatch.fnmatch(name, p) for p in ignore_patterns)
        ]
        if dry_run:
            return [
                types.SimpleNamespace(filename=name, file_size=len(self.files[name]), will_download=True)
                for name in names
            ]
        for name in names:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(self.files[name])
            self.written.append(name)
        return str(folder)


def test_a_hub_cell_the_plan_skips_never_downloads_its_weights(tmp_path, monkeypatch):
    """The plan reads a hub checkpoint's config and weight index; its weights are fetched only for a cell that fits
    (they were fetched first: 140 GB downloaded for a cell then skipped)."""
    import huggingface_hub

    from matrix.cells import Cell
    from matrix.registry import ModelEntry
    from matrix.variants import load_variants
    from suites.run.driver import RunOptions, memory_plan_lines, prepare_job

    hub = HubWithIndex(tmp_path / "hub")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.setenv("AUTOTP_HOST_MEMORY", "64GiB")
    cell = Cell(ModelEntry("big", "llama", {}, hub_ids=("org/big",)), load_variants()["eager"], "bf16", 2)
    options = RunOptions(checkpoints="hub")
    assert "big (org/big@" in "\n".join(memory_plan_lines([cell], options))
    outcome = prepare_job(cell, options)
    assert outcome.outcome == "skip" and outcome.message.startswith("memory plan: needs"), outcome.message
    assert outcome.checkpoint["revision"] == HubWithIndex.COMMIT
    assert not [name for name in hub.written if name.endswith(".safetensors")], hub.written

"""A repro script says what its cell said: a training row's script judges the gradients, updates, shares and the
checkpoint round trip with the cell's comparisons and tolerances (not only each step's loss), and its command starts
under DeepSpeed's own launcher on a CPU-only machine without numactl, at every release the matrix picks."""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from matrix.cells import parse_cell
from suites.checks.training import _comparison_result
from suites.records.repro import write_repro
from suites.records.run_records import RunInfo, launcher_command
from suites.variants.trainee import Comparison

SAVE_SHAPES = "fail numerics save: save_16bit_model: rank 0: model.layers.0.self_attn.q_proj.weight: shape"


def written_script(folder: Path, cell_id: str, verdict: str) -> tuple[Path, ModuleType]:
    script = write_repro(parse_cell(cell_id), "tiny", folder, run=RunInfo("unit"), versions={}, outcome_line=verdict)
    spec = importlib.util.spec_from_file_location(f"written_{cell_id.replace('.', '_').replace('-', '_')}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses read their module's namespace while they are made
    spec.loader.exec_module(module)
    return script, module


def test_a_training_script_judges_each_comparison_as_its_cell_does(tmp_path):
    """The script's judgement of a rank's gradients against the unsharded slices agrees with the harness's at the
    cell's own bound, on both sides of it, and it fails a shard that is no slice of its unsharded weight."""
    _, script = written_script(tmp_path, "llama.faithful-train_ckpt-fp32-tp2", SAVE_SHAPES)
    cell = script.CELL
    assert cell["round_trip"] and cell["cell_failed"] and cell["note"] == ""
    allowed = cell["train_grad_rel"]
    for factor in (0.5, 2.0, math.nan):
        harness_side, script_side = Comparison(largest=1.0), script.Comparison(largest=1.0)
        for comparison in (harness_side, script_side):
            comparison.add("w", torch.tensor([1.0 + factor * allowed, 1.0]), torch.tensor([1.0, 1.0]))
        harness_fails = _comparison_result([harness_side.record()], allowed, "step 1", "gradient") is not None
        ((script_passes, line),) = script.judged("train_grads: step 1 gradient", [script_side.record()], allowed)
        assert script_passes is not harness_fails and script_passes is (factor == 0.5), line
    shapes = script.Comparison(largest=1.0)
    shapes.add("model.layers.0.self_attn.q_proj.weight", torch.zeros(128, 256), torch.zeros(256, 256))
    ((passes, line),) = script.judged("save: save_16bit_model weight", [shapes.record()], cell["train_weight_rel"])
    assert (
        not passes and "rank 0: model.layers.0.self_attn.q_proj.weight: shape (128, 256), unsharded (256, 256)" in line
    )


def test_a_script_that_leaves_part_of_its_row_out_does_not_call_a_failed_cell_a_match(tmp_path):
    _, script = written_script(tmp_path, "llama.faithful-train_two_models-fp32-tp2", "fail numerics second model")
    assert script.CELL["cell_failed"] and "the second model (mistral)" in script.CELL["note"]
    _, passed = written_script(tmp_path, "llama.faithful-train_two_models-fp32-tp2", "pass")
    assert not passed.CELL["cell_failed"]


def test_the_scripts_unsharded_steps_are_the_harness_loop_copied_by_source(tmp_path):
    """One training loop: the driver's unsharded steps and a training script's are taken by one function
    (suites/variants/training.py `take_steps`), copied into the script by its source when the script is written, so a
    change to the loop changes both; the template takes no optimizer step of its own. Run on the cell's tiny
    checkpoint (bf16 AdamW: master weights and Adam's units), the script's unsharded steps, from its CELL's batches,
    optimizer and clipping, are the driver's bit for bit."""
    from matrix.checkpoints import tiny_checkpoint
    from matrix.registry import load_models
    from suites.checks.inputs import ProbeSpec
    from suites.records.repro import TEMPLATE
    from suites.variants import training

    template = TEMPLATE.read_text()
    assert [own for own in (".backward(", "clip_grad_norm_(", "torch.optim") if own in template] == []
    assert "take_steps(" in inspect.getsource(training.compute_unsharded_steps)
    script, module = written_script(tmp_path, "llama-train_universal-bf16-tp2", "pass")
    assert inspect.getsource(training.take_steps) in script.read_text()

    checkpoint = str(tiny_checkpoint(load_models()["llama"]))
    steps = module.CELL["steps"]
    harness = training.compute_unsharded_steps(
        checkpoint=checkpoint,
        tokenizer=None,
        dtype="bf16",
        spec=ProbeSpec(),
        trust_remote_code=False,
        steps=steps,
        optimizer_name="adam",
    )
    repro = module.unsharded_steps(checkpoint, module.step_batches(None, "cpu")[:steps], "cpu")
    assert repro["losses"] == harness["losses"] and len(harness["adam_gradient_units"]) == steps
    for part in ("grads", "weights", "adam_gradient_units"):
        for ours, theirs in zip(repro[part], harness[part], strict=True):
            assert ours.keys() == theirs.keys() and all(torch.equal(ours[n], theirs[n]) for n in ours), part


UNGUARDED_NUMA = """
import subprocess, sys
import deepspeed.utils.numa as numa
def get_numa_cores():  # DeepSpeed 0.14.4 .. 0.18.9: numactl run unguarded
    subprocess.check_output(["numactl", "--hardware"])
    return []
numa.get_numa_cores = get_numa_cores
from deepspeed.launcher.runner import main
sys.argv = ["deepspeed", *sys.argv[1:]]
main()
"""


@pytest.mark.skipif(shutil.which("numactl") is not None, reason="needs a machine without numactl")
def test_the_scripts_command_starts_under_deepspeeds_launcher_without_numactl(tmp_path):
    """DeepSpeed's launcher (0.14.4's CPU accelerator counted its devices with `numactl --hardware`, unguarded)
    run as the script's command says, on this machine, which has no numactl: every rank starts."""
    from suites.engine.rank_group import free_port, launch_environment

    script = tmp_path / "ranks.py"
    script.write_text('import os\nopen(f"rank{os.environ[\'RANK\']}", "w").write(os.environ["WORLD_SIZE"])\n')
    command = launcher_command(2, script.name).split()
    assignments = dict(word.split("=", 1) for word in command if "=" in word)
    launcher_arguments = command[command.index("deepspeed") + 1 : -1]
    env = {name: value for name, value in launch_environment().items() if name != "LOCAL_SIZE"} | assignments
    done = subprocess.run(
        [sys.executable, "-c", UNGUARDED_NUMA, *launcher_arguments, "--master_port", str(free_port()), script.name],
        cwd=tmp_path,
        env=env | {"DS_ACCELERATOR": "cpu", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert [(tmp_path / f"rank{rank}").read_text() for rank in (0, 1)] == ["2", "2"]


@pytest.mark.autotp
def test_the_train_ckpt_script_alone_fails_where_its_cell_failed(tmp_path):
    """Run as a maintainer would: the train_ckpt script of a cell that failed numerics on save_16bit_model (this
    DeepSpeed writes rank 0's shard shapes) prints that FAIL and `RESULT: MISMATCH`, never `MATCH`."""
    from suites.engine.rank_group import free_port, launch_environment

    script, _ = written_script(tmp_path, "llama.faithful-train_ckpt-fp32-tp2", SAVE_SHAPES)
    command = launcher_command(2, script.name).split()
    done = subprocess.run(
        [sys.executable, "-m", "deepspeed.launcher.runner", *command[command.index("deepspeed") + 1 : -1]]
        + ["--master_port", str(free_port()), script.name],
        cwd=tmp_path,
        env=launch_environment() | dict(word.split("=", 1) for word in command if "=" in word),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "RESULT: MISMATCH" in output, output[-3000:]
    assert "FAIL save: save_16bit_model weight: rank 0: model.layers.0.self_attn.q_proj.weight: shape" in output
    assert "ok   train_loss: step 1 loss" in output and "ok   train_grads: step 1 gradient" in output


def test_a_draft_title_keeps_the_cause_and_leaves_its_proof_to_the_body():
    """A cause no mechanism names is titled by its sentence; what proved it, or what was tried, is the body's (seen:
    a train_ckpt draft titled "… shape (mechanism not proven: read at the failing lines …; no remedy run yet)")."""
    from suites.verdicts.cause_titles import cause_title
    from suites.verdicts.statements import Proof, stated

    sentence = "save: save_16bit_model: rank 0: model.layers.0.self_attn.q_proj.weight: shape"
    words = stated(sentence, Proof(tried="read at the failing lines of DeepSpeed's and transformers' source"))
    assert "mechanism not proven" in words
    assert cause_title(f"numerics|{sentence}", words) == sentence

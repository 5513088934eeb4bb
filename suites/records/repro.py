"""Writes `repro_<cell>.py` (standalone, from repro_template.py) and `env_<cell>.txt` for a cell,
so a bug report carries one command to run and the environment it failed in.

Every value the script needs is one Python literal (`CELL`, written with pprint: strings as repr), never text in a
comment line, so nothing a result carries can become code in the script."""

from __future__ import annotations

import inspect
import pprint
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from matrix.cells import Cell
from matrix.checkpoints import INIT, SEED, SPREAD, randomise_constant_parameters
from matrix.redaction import redact
from matrix.shapes import EXPERT_KEYS, HEAD_DIM_KEYS, HEAD_KEYS, HIDDEN_KEYS, KV_KEYS, MLA_KEY, NESTED
from suites.checks import memory, probes
from suites.checks.contracts import ComparisonRecord
from suites.checks.inputs import CORPUS_FILE, ProbeSpec
from suites.checks.memory import RULE_CONSTANTS, RULES
from suites.checks.probes import faithful_counts
from suites.records.run_records import RunInfo, environment_report, launcher_command
from suites.variants import trainee, training
from suites.variants.training import deepspeed_config

if TYPE_CHECKING:
    from suites.records.repro_template import CellSpec, ConfigNames

TEMPLATE = Path(__file__).resolve().parent / "repro_template.py"
PLACEHOLDER = "CELL: CellSpec = {}  # type: ignore[typeddict-item]  # the cell's values, written by autotp-matrix"
FUNCTIONS_PLACEHOLDER = (
    "if TYPE_CHECKING:  # harness functions, written by autotp-matrix (a type checker reads the harness's own)\n"
    """    from matrix.checkpoints import randomise_constant_parameters
    from suites.checks.contracts import ComparisonRecord, UnshardedSteps
    from suites.checks.memory import memory_findings
    from suites.checks.probes import PAIRED_HEADS, Footprint, SplitCounts, bytes_by_name, shapes_by_name, tensor_kinds
    from suites.variants.trainee import (
        CHECKPOINT_TAG,
        ShardedTrainee,
        compare_whole,
        gather_full_weights,
        held_bytes_by_name,
    )
    from suites.variants.training import hide_tp_plan, take_steps
"""
)
CONFIG_NAMES: ConfigNames = {
    "heads": HEAD_KEYS,
    "kv_heads": KV_KEYS,
    "hidden": HIDDEN_KEYS,
    "head_dim": HEAD_DIM_KEYS,
    "experts": EXPERT_KEYS,
    "nested": NESTED,
    "mla": MLA_KEY,
}
"""The config attribute names the harness reads head and expert counts by, so the script's memory rules read the
same counts (of a tiny or a hub checkpoint alike)."""


def repro_cell(
    *, cell: Cell, checkpoints: str, script: str, verdict: str, versions: dict[str, str], loaded_revision: str | None
) -> CellSpec:
    """What the script needs of the cell: its model and weights, its load, quantization or training, the probes'
    inputs and its tolerances; and what it reproduces (the verdict, the versions, what of the variant it leaves out).
    Every value of the harness or the results (the verdict quotes a failure's message) is a Python literal here,
    redacted first: in a comment, a newline in it would end the comment and run the rest as code."""
    tolerance = cell.model.tolerance_for(cell.dtype)
    variant = cell.variant
    hub_id = cell.model.hub_ids[0] if checkpoints == "hub" else None
    spec = ProbeSpec()
    spec_cell: CellSpec = {
        "id": cell.id,
        "verdict": redact(verdict),
        "versions": {name: redact(value) for name, value in versions.items() if value},
        "note": partial_note(cell),
        "model": cell.model.name,
        "model_type": cell.model.model_type,
        "tiny": cell.model.tiny,
        "seed": SEED,
        "init_seed": SEED + INIT,
        "spread": SPREAD,
        "checkpoints": list(cell.model.checkpoints),
        "hub_id": hub_id,
        "revision": (loaded_revision or cell.model.revisions.get(hub_id)) if hub_id else None,
        "dtype": cell.dtype,
        "tp": cell.tp,
        "load": variant.load,
        "checkpoint_format": variant.checkpoint_format,
        "checkpoint_files": variant.checkpoint_files,
        "keep_module_on_host": variant.keep_module_on_host,
        "quantization": variant.quantization,
        "quant_group_size": variant.quant_group_size,
        "training": variant.training,
        "text": CORPUS_FILE.read_text()[: 4 * spec.ppl_tokens],
        "prompt_tokens": spec.prompt_tokens,
        "left_pad": spec.left_pad,
        "new_tokens": spec.new_tokens,
        "loss_tokens": spec.ppl_tokens,
        "loss_skipped": cell.model.probe_skips.get("perplexity", ""),
        "logits_rel": tolerance.logits_rel,
        "loss_rel": tolerance.ppl_rel,
        "config_names": CONFIG_NAMES,
        "real_counts": asdict(real) if (real := faithful_counts(cell.model, cell.tp)) and not hub_id else None,
        "command": launcher_command(cell.tp, script),
        "injection_policy": {block: list(names) for block, names in cell.arguments.injection_policy},
        "model_kwargs": dict(cell.arguments.model_kwargs),
        "forward_mask": cell.arguments.forward_mask,
    }
    if variant.training:
        spec_cell |= {
            "steps": variant.training_steps,
            "partitioning": variant.partitioning,
            "window": spec.ppl_window,
            "train_loss_rel": tolerance.train_loss_rel,
            "train_grad_rel": tolerance.train_grad_rel,
            "train_later_grad_rel": tolerance.train_later_grad_rel,
            "train_update_rel": tolerance.train_update_rel,
            "train_weight_rel": tolerance.train_weight_rel,
            "round_trip": variant.checkpoint_round_trip and not variant.resume_tp,
            "cell_failed": verdict.startswith("fail"),
            "ds_config": deepspeed_config(variant, cell.tp, cell.dtype, cell.model.model_type),
        }
    return spec_cell


def partial_note(cell: Cell) -> str:
    """What of the variant the script leaves out ("" when it reproduces all of it)."""
    variant = cell.variant
    left = [
        what
        for what, present in (
            (
                f"the checkpoint round trip through a universal checkpoint resumed at tp {variant.resume_tp}",
                variant.resume_tp,
            ),
            (f"the second model ({variant.second_model})", variant.second_model),
        )
        if present
    ]
    return f"variant {variant.name}: this script leaves out {'; '.join(left)}" if left else ""


FOOTPRINT_CONSTANTS = ("CONV_MODULES",)
"""The constants the footprint readers below read (torch classes, written as their import paths)."""
FOOTPRINT_READERS = (probes.bytes_by_name, probes.shapes_by_name, probes.tensor_kinds)
"""What the harness reads of the unsharded and the sharded model for the memory check (suites/checks/probes.py)."""
TRAINING_CONSTANTS = ("SCALE_FLOOR_ULPS", "FLOOR_CANDIDATES", "VANISHED_SHARE", "CHECKPOINT_TAG")
"""suites/variants/trainee.py's constants the training code below reads."""
TRAINING_CODE = (
    ComparisonRecord,
    trainee.scale_floor_share,
    trainee.ulp,
    trainee.Comparison,
    trainee._shard_rows,
    trainee.held_bytes_by_name,
    trainee._local_weight,
    trainee._local_grad,
    trainee.ShardedTrainee,
    trainee.gather_full_weights,
    trainee.compare_whole,
    training.StepsTaken,
    training.torch_optimizer,
    training.adam_gradient_units,
    training.take_steps,
    training.hide_tp_plan,
)
"""What a training row's ranks run and compare with (suites/variants/trainee.py, training.py): the script takes the
unsharded steps with the harness's own loop, and finds each shard's slice, reads and compares gradients, updates and
whole weights with the harness's own code."""


def constant_literal(value: object) -> str:
    """A rule constant as Python source: a literal, or a tuple of classes as their import paths."""
    if isinstance(value, tuple) and value and all(isinstance(item, type) for item in value):
        return "(" + ", ".join(f"{item.__module__}.{item.__qualname__}" for item in value) + ",)"
    return repr(value)


@cache
def harness_functions(training: bool) -> str:
    """The harness's own code the script runs, copied in as it is now: the tiny checkpoint's weights are made by it
    (the repro's weights are the cell's), and memory is read and judged by the harness's footprint readers and rules
    (suites/checks/memory.py `RULES`, looked up by name when the script is written), so the script and the harness
    cannot judge a split differently."""
    constants = [f"{name} = {constant_literal(getattr(memory, name))}" for name in RULE_CONSTANTS]
    constants += [f"{name} = {constant_literal(getattr(probes, name))}" for name in FOOTPRINT_CONSTANTS]
    rules = [getattr(memory, name) for name in RULES]
    code = [randomise_constant_parameters, *FOOTPRINT_READERS, *rules]
    if training:
        constants += [f"{name} = {constant_literal(getattr(trainee, name))}" for name in TRAINING_CONSTANTS]
        code += TRAINING_CODE
    return "\n".join(constants) + "\n\n\n" + "\n\n".join(inspect.getsource(item) for item in code)


def write_repro(
    cell: Cell,
    checkpoints: str,
    folder: Path,
    *,
    run: RunInfo,
    versions: dict[str, str],
    outcome_line: str,
    loaded_revision: str | None = None,
    name: str | None = None,
    ran_here: bool = False,
) -> Path:
    """The repro loads the model the way the cell's variant does (eager, meta device + checkpoint files, quantized)
    in the cell's dtype; a training row runs its optimizer steps. A hub checkpoint is fetched at the commit the cell
    loaded (`loaded_revision`, from its record), else at the registry's pinned revision, so a later upload cannot
    change the repro. `ran_here`: written by the cell's own run, whose machine the environment file may describe."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / (name or f"repro_{cell.id}.py")
    spec = repro_cell(
        cell=cell,
        checkpoints=checkpoints,
        script=script.name,
        verdict=outcome_line,
        versions=versions,
        loaded_revision=loaded_revision,
    )
    source = TEMPLATE.read_text()
    for placeholder in (PLACEHOLDER, FUNCTIONS_PLACEHOLDER):
        if placeholder not in source:
            raise RuntimeError(f"{TEMPLATE} lost its placeholder line {placeholder!r}")
    source = source.replace(FUNCTIONS_PLACEHOLDER, harness_functions(cell.variant.training), 1)
    header = (
        "# autotp-matrix repro script: the verdict it reproduces, the versions it ran at and the command that runs it\n"
        '# are CELL["verdict"], CELL["versions"] and CELL["command"] below.\n'
    )
    cell_line = f"CELL: CellSpec = {pprint.pformat(spec, sort_dicts=False, width=116)}  # written by autotp-matrix"
    script.write_text(redact(header + source.replace(PLACEHOLDER, cell_line, 1)))
    (folder / f"env_{cell.id}.txt").write_text(redact(environment_report(run, versions, ran_here) + "\n"))
    return script

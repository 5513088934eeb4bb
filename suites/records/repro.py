"""Writes `repro_<cell>.py` (standalone, from repro_template.py) and `env_<cell>.txt` for a cell,
so a bug report carries one command to run and the environment it failed in."""

from __future__ import annotations

import inspect
import pprint
from pathlib import Path

from matrix.cells import Cell
from matrix.checkpoints import INIT, SEED, SPREAD, randomise_constant_parameters
from matrix.redaction import redact
from suites.records.run_records import RunInfo, environment_report

TEMPLATE = Path(__file__).resolve().parent / "repro_template.py"
PLACEHOLDER = "CELL: dict = {}  # written by autotp-matrix"
FUNCTIONS_PLACEHOLDER = "# harness functions, written by autotp-matrix\n"


def launcher_command(cell: Cell, script: str) -> str:
    return f"deepspeed --num_gpus {cell.tp} {script}"


def write_repro(
    cell: Cell,
    checkpoints: str,
    folder: Path,
    run: RunInfo,
    versions: dict[str, str],
    outcome_line: str,
    loaded_revision: str | None = None,
) -> Path:
    """The repro loads the model the way the cell's variant does (eager, or meta device + checkpoint
    files) in the cell's dtype; quantization and training variants are reproduced as their eager load,
    which CELL["note"] says. A hub checkpoint is fetched at the commit the cell loaded (`loaded_revision`,
    from its record), else at the registry's pinned revision, so a later upload cannot change the repro."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"repro_{cell.id}.py"
    tolerance = cell.model.tolerance_for(cell.dtype)
    hub_id = cell.model.hub_ids[0] if checkpoints == "hub" else None
    partial = cell.variant.quantization or cell.variant.training
    # Every value of the harness or the results (the verdict quotes a failure's message) goes into CELL as a Python
    # literal, redacted first: in a comment, a newline in it would end the comment and run the rest as code.
    spec = {
        "id": cell.id,
        "model": cell.model.name,
        "model_type": cell.model.model_type,
        "tiny": cell.model.tiny,
        "seed": SEED,
        "init_seed": SEED + INIT,
        "spread": SPREAD,
        "hub_id": hub_id,
        "revision": (loaded_revision or cell.model.revisions.get(hub_id)) if hub_id else None,
        "dtype": cell.dtype,
        "tp": cell.tp,
        "logits_rel": tolerance.logits_rel,
        "load": cell.variant.load,
        "checkpoint_format": cell.variant.checkpoint_format,
        "checkpoint_files": cell.variant.checkpoint_files,
        "keep_module_on_host": cell.variant.keep_module_on_host,
        "command": launcher_command(cell, script.name),
        "verdict": redact(outcome_line),
        "versions": {name: redact(value) for name, value in versions.items() if value},
        "note": (
            f"reproduces the {cell.variant.load} load of variant {cell.variant.name}; its quantization/training step "
            "is not part of this script"
            if partial
            else ""
        ),
    }
    source = TEMPLATE.read_text()
    for placeholder in (PLACEHOLDER, FUNCTIONS_PLACEHOLDER):
        if placeholder not in source:
            raise RuntimeError(f"{TEMPLATE} lost its placeholder line {placeholder!r}")
    # The tiny checkpoint is made by the harness's own code, copied in: the repro's weights are the cell's.
    source = source.replace(FUNCTIONS_PLACEHOLDER, inspect.getsource(randomise_constant_parameters), 1)
    header = (
        "# autotp-matrix repro script: the verdict it reproduces, the versions it ran at and the command that runs it\n"
        '# are CELL["verdict"], CELL["versions"] and CELL["command"] below.\n'
    )
    cell_line = f"CELL: dict = {pprint.pformat(spec, sort_dicts=False)}  # written by autotp-matrix"
    script.write_text(redact(header + source.replace(PLACEHOLDER, cell_line, 1)))
    (folder / f"env_{cell.id}.txt").write_text(redact(environment_report(run, versions) + "\n"))
    return script

"""How cells are asked for: the suites' options (conftest.py adds them to pytest, the nox sessions parse
the same ones before pytest runs) and the one command line that runs cells, `python -m pytest suites`
with a selection, which whatever runs cells from outside pytest builds here (nox sessions, add-model,
bisection and triage steps, the benchmarks)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matrix.cells import DEFAULT_DTYPES, DEFAULT_MODELS, DEFAULT_TP_SIZES, MODEL_SELECTIONS
from matrix.registry import MODELS_FILE
from matrix.shapes import DEFAULT_SHAPES, SHAPES

CELL_TIMEOUT_S = 180.0
"""Seconds a cell may take before its rank group is killed (a tiny cell takes well under one)."""

SUITE_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (
        ("--models", "--model"),
        dict(
            default=DEFAULT_MODELS,
            help="comma-separated model names, or one of: "
            + "; ".join(f"'{name}': {meaning}" for name, meaning in MODEL_SELECTIONS.items()),
        ),
    ),
    (("--models-file",), dict(default=str(MODELS_FILE), help="model registry to read (default: matrix/models.toml)")),
    (
        ("--variants",),
        dict(
            default=None,
            help="comma-separated variants from matrix/variants.toml, tags of them ('train-all': "
            "every training row), or 'all' (default: eager; with --checkpoints hub on an "
            "accelerator runner: meta, see suites/reference/memory_plan.py default_variants)",
        ),
    ),
    (("--dtypes",), dict(default=",".join(DEFAULT_DTYPES), help="comma-separated dtypes: fp32, bf16, fp16")),
    (
        ("--shapes",),
        dict(
            default=",".join(DEFAULT_SHAPES),
            help=f"comma-separated tiny shapes ({', '.join(SHAPES)}): "
            "'faithful' splits like the entry's real checkpoint at tp 2, 3, 4 and the cell's tp, "
            "'stress' is the registry's tiny config as written (odd splits on purpose); "
            "see matrix/shapes.py",
        ),
    ),
    (("--tp",), dict(default=",".join(map(str, DEFAULT_TP_SIZES)), help="comma-separated tensor-parallel sizes")),
    (
        ("--checkpoints",),
        dict(
            default="tiny",
            choices=("tiny", "hub"),
            help="tiny random checkpoints (any CPU) or the registry's real hub ids (GPU runners)",
        ),
    ),
    (("--allow-remote-code",), dict(action="store_true", help="allow models that need trust_remote_code")),
    (
        ("--cell-timeout",),
        dict(type=float, default=CELL_TIMEOUT_S, help="seconds a cell may take before its rank group is killed"),
    ),
    (("--results",), dict(default="results", help="folder for cells.jsonl, junit/ and repro scripts")),
    (
        ("--session-name",),
        dict(default=os.environ.get("NOX_SESSION_NAME", "local"), help="name recorded with every cell"),
    ),
    (
        ("--no-resume",),
        dict(
            action="store_true",
            help="start afresh even when the results folder holds an interrupted run of this session",
        ),
    ),
    (
        ("--repro",),
        dict(action="store_true", help="also write a standalone repro_<cell>.py per cell into the results folder"),
    ),
    (
        ("--accuracy-task",),
        dict(
            default=None,
            metavar="TASK",
            help="also gate each cell on task accuracy vs the unsharded model (exact McNemar): a shipped "
            "task (world-facts, small-sums), a task .jsonl file, or lm_eval:<task name or YAML> "
            "(needs the accuracy extra)",
        ),
    ),
    (
        ("--remedy",),
        dict(
            default=None,
            metavar="NAME",
            help="run every cell with this remedy of matrix/remedies.toml (its workaround's arguments; nox -s remedy "
            "pins a patch's DeepSpeed itself): a run with a remedy is never a baseline",
        ),
    ),
    (
        ("--inject-fault",),
        dict(
            action="append",
            default=[],
            metavar="MODULE:FUNCTION",
            help="harness self-test only: call this fault hook on every rank at each stage",
        ),
    ),
]


def parse_suite_options(pytest_args: Sequence[str]) -> argparse.Namespace:
    """The suites' options among a pytest command line (anything else is left to pytest), with pytest's defaults."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for names, settings in SUITE_OPTIONS:
        parser.add_argument(*names, **settings)
    return parser.parse_known_args(list(pytest_args))[0]


def suites_command(
    python: str | Path,
    *,
    models: str | None = None,
    models_file: str | Path | None = None,
    variants: str | None = None,
    dtypes: str | None = None,
    tp: str | None = None,
    shapes: str | None = None,
    results: str | Path | None = None,
    session_name: str | None = None,
    cell_timeout: float | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """An option left None takes conftest.py's default; `extra` goes last (pytest's own options, -q, -n)."""
    options = {
        "--models": models,
        "--models-file": models_file,
        "--variants": variants,
        "--dtypes": dtypes,
        "--tp": tp,
        "--shapes": shapes,
        "--results": results,
        "--session-name": session_name,
        "--cell-timeout": cell_timeout,
    }
    selected = [part for name, value in options.items() if value is not None for part in (name, str(value))]
    return [str(python), "-m", "pytest", "suites", *selected, *extra]

"""Cells of a session whose environment could not be installed: each one is recorded as an
`install` failure (JSONL and JUnit, same format as real cells) with the installer's message.

Runs in nox's own Python, so it uses the standard library only."""

from __future__ import annotations

import argparse
import platform
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from matrix.cells import expand
from matrix.redaction import redact
from matrix.version_axes import Combo
from suites.records.run_records import CellRecorder, RunInfo, junit_properties, platform_of_run
from suites.reference.memory_plan import default_variants
from suites.verdicts.outcome import failed


def record_install_failure(session: str, combo: Combo, message: str, selection: argparse.Namespace) -> int:
    """`selection`: the suites' options (suites.run.command.parse_suite_options). The combination's pins stand in for
    the versions never installed (a git ref or local clone has no version before it is built, so its label stands
    there: pr/1234, master, local-DeepSpeed; reports order such labels after the releases)."""
    results = Path(selection.results)
    variants = selection.variants or default_variants(selection.checkpoints)
    try:
        cells = expand(
            selection.models,
            variants,
            selection.dtypes,
            selection.tp,
            models_file=Path(selection.models_file),
            shapes=selection.shapes,
        )
    except ImportError:
        # `all` and `derived` read their architectures from transformers, which was never installed: the
        # registry's entries stand for the combination (what this Python can name)
        cells = expand(
            "registry",
            variants,
            selection.dtypes,
            selection.tp,
            models_file=Path(selection.models_file),
            shapes=selection.shapes,
        )
    requirements = combo.requirements
    try:
        accelerator, backend = platform_of_run()
    except Exception:  # nox's own Python need not have DeepSpeed (or torch) installed, or a working one
        accelerator, backend = "", ""
    versions = {pin.package: pin.label for pin in combo.pins}
    versions.update(python=platform.python_version(), deepspeed_git="")
    recorder = CellRecorder(results, RunInfo(session, accelerator=accelerator, backend=backend), versions)
    suite = ElementTree.Element("testsuite", name="pytest", tests=str(len(cells)), failures=str(len(cells)))
    outcome = failed("install", f"environment could not be installed: {' '.join(requirements)}", message[-4000:])
    for cell in cells:
        record = recorder.record(cell, outcome)
        case = ElementTree.SubElement(suite, "testcase", classname="suites.test_autotp", name=f"test_cell[{cell.id}]")
        properties = ElementTree.SubElement(case, "properties")
        for key, value in junit_properties(record).items():
            ElementTree.SubElement(properties, "property", name=key, value=value)
        failure = ElementTree.SubElement(case, "failure", message=f"install: {record['signature']}")
        failure.text = redact(message)
    junit = results / "junit" / f"{session}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    ElementTree.ElementTree(suite).write(junit, encoding="utf-8", xml_declaration=True)
    return len(cells)

"""Every output of `python -m reports render` over four fixture histories, byte for byte against golden copies in
tests/reports/golden/: a refactor that changes one byte a reader gets (the report, report.json, the HTML page, the step
summary, supported-models.md, the checkpoint pages, the draft issues, the repro scripts) fails here. Only the moment
of rendering is masked (`generated_at`); versions and harness commits are the fixtures' own.

- `since_when`: a real `nox -s since-when` run (a pass, two failures, "works at X; fails from Y");
- `pr_pair`: two real runs, the pull request's head merged untrusted (phi3 fixed on it, bloom and gemma failing);
- `triaged`: issue #18's history (a transition between nightlies, bisection answers confirmed on 43 cells);
- `default_matrix`: the default matrix's real failures (tests/suites/data/default_matrix_failures.json) and passes, as
  the suites' recorder writes them, with a real `nox -s remedy`'s proofs merged (its results folder) and
  DeepSpeed's supported-models page (the docs diff).

The drafts and repro scripts are written from the installed transformers' config classes: the golden copies are the
tests environment's (`nox -s tests`). After a change that means to change an output: `AUTOTP_UPDATE_GOLDEN=1 pytest
tests/reports/test_golden_outputs.py`, then read `git diff tests/reports/golden` before committing it."""

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from reports_testkit import issue_18_store
from test_default_matrix_outputs import DOCS, FAILURES, REMEDY_RESULTS, VERSIONS, real_outcome
from test_pr_check import REAL_PAIR
from test_reports_checkpoints import run_cells
from test_since_when_run import merged

from matrix.cells import DEFAULT_MODELS
from reports.__main__ import main

GOLDEN = Path(__file__).parent / "golden"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
UPDATE = os.environ.get("AUTOTP_UPDATE_GOLDEN") == "1"
KEPT_WHOLE = ("report.md", "step-summary.md", "supported-models.md")
"""Outputs the golden folder keeps whole, so `git diff` shows how a change reads; every output (these included) is
in its `outputs.sha256` (`sha256sum`'s format), which a changed byte anywhere breaks."""
MANIFEST = "outputs.sha256"


def _since_when(tmp_path: Path) -> tuple[Path, list[str]]:
    return merged(tmp_path), []


def _pr_pair(tmp_path: Path) -> tuple[Path, list[str]]:
    store = tmp_path / "history.sqlite"
    for side, untrusted in (("base", []), ("head", ["--untrusted"])):
        (tmp_path / side).mkdir()
        (tmp_path / side / "matrix.xml").write_bytes((REAL_PAIR / f"{side}.xml").read_bytes())
        assert main(["merge", *untrusted, str(tmp_path / side), "--store", str(store)]) == 0
    return store, []


def _triaged(tmp_path: Path) -> tuple[Path, list[str]]:
    return issue_18_store(tmp_path), []


def _default_matrix(tmp_path: Path) -> tuple[Path, list[str]]:
    store = tmp_path / "history.sqlite"
    remedy_results = shutil.copytree(REMEDY_RESULTS, tmp_path / "remedy-results")
    assert main(["merge", str(remedy_results), "--store", str(store)]) == 0
    shutil.rmtree(remedy_results)
    outcome = real_outcome(json.loads(FAILURES.read_text()))
    junit = run_cells(tmp_path, DEFAULT_MODELS, "2,3,4", "faithful", outcome=outcome, versions=VERSIONS)
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    return store, ["--docs", str(DOCS)]


HISTORIES: dict[str, Callable[[Path], tuple[Path, list[str]]]] = {
    "since_when": _since_when,
    "pr_pair": _pr_pair,
    "triaged": _triaged,
    "default_matrix": _default_matrix,
}


def rendered(history: str, tmp_path: Path) -> dict[str, bytes]:
    """relative path -> bytes of every file render writes for `history`, its moment of rendering masked."""
    (store, extra), out = HISTORIES[history](tmp_path), tmp_path / "out"
    assert main(["render", "--store", str(store), "--out", str(out), *extra]) == 0
    generated_at = json.loads((out / "report.json").read_text())["generated_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", generated_at)
    return {
        path.relative_to(out).as_posix(): path.read_bytes().replace(generated_at.encode(), b"<generated_at>")
        for path in sorted(out.rglob("*"))
        if path.is_file() and path.name != "remedies.json"
    }


def kept(outputs: dict[str, bytes]) -> dict[str, bytes]:
    """What the golden folder holds for these outputs: the manifest of every output's digest, and KEPT_WHOLE whole."""
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(outputs.items()))
    return {MANIFEST: manifest.encode(), **{name: outputs[name] for name in KEPT_WHOLE}}


def golden(history: str) -> dict[str, bytes]:
    folder = GOLDEN / history
    return {
        path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()
    }


@pytest.fixture(autouse=True)
def no_actions_run(monkeypatch):
    """Outside Actions: the links and the step summary do not depend on the machine the test runs on."""
    for name in ("GITHUB_STEP_SUMMARY", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("history", HISTORIES)
def test_every_output_of_a_fixture_history_is_its_golden_copy_byte_for_byte(history, tmp_path):
    every_output = rendered(history, tmp_path)
    host_folders = [str(folder).encode() for folder in (tmp_path, PROJECT_ROOT, sys.prefix)]  # nor on this host
    assert [name for name, data in every_output.items() if any(folder in data for folder in host_folders)] == []
    outputs = kept(every_output)
    if UPDATE:
        for name, data in outputs.items():
            (GOLDEN / history / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / history / name).write_bytes(data)
    expected = golden(history)
    assert sorted(expected) == sorted(outputs)
    changed = [name for name in outputs if outputs[name] != expected[name]]
    if MANIFEST in changed:  # name the outputs whose bytes moved, not only the manifest
        old, new = (set(files[MANIFEST].decode().splitlines()) for files in (expected, outputs))
        changed += sorted({line.split("  ", 1)[1] for line in old ^ new})
    assert changed == [], (
        f"outputs changed (AUTOTP_UPDATE_GOLDEN=1 rewrites the golden copies; read the diff): {changed}"
    )


def test_the_golden_histories_cover_passes_failures_since_when_and_remedies():
    """The four histories reach what a refactor most easily breaks unseen: each kind of line appears in a golden
    report, so a history that stopped producing it (a fixture changed) is seen here, not by a smaller test."""
    reports = {history: (GOLDEN / history / "report.md").read_text() for history in HISTORIES}
    assert "works at transformers 4.57.6; fails from transformers" in reports["since_when"]
    assert "**fixed**" in reports["pr_pair"]  # phi3, fixed on the pull request's head
    assert "0.19.6" in reports["triaged"]  # the fix release the bisections answered
    assert "cells pass with this proposed DeepSpeed change" in reports["default_matrix"]  # remedies verified
    assert all(" pass" in report or "works" in report for report in reports.values())

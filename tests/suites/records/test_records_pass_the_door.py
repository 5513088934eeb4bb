"""Everything the harness writes passes its own door (issue #57): every check's result, in every variant the harness
has, recorded by the suites' recorder, written as JUnit, merged into the store and the archive and rendered — the
checks and variants taken from the harness's own lists (suites/verdicts/check_names.py, matrix/variants.toml), the
metrics
from the checks themselves, each comparison a real one. And one real training cell through merge, render and a store
rebuilt from the archive."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from junitparser import Failure
from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

from matrix.cells import Cell, expand
from matrix.registry import DEFAULT_TOLERANCES, load_models
from matrix.variants import load_variants
from reports.__main__ import main
from reports.store.history_store import HistoryStore
from suites.checks import training
from suites.checks.contracts import ComparisonRecord
from suites.checks.result import CheckResult
from suites.records.run_records import CellRecorder, RunInfo
from suites.run.driver import RunOptions, run_cell
from suites.variants.trainee import FLOOR_CANDIDATES, Comparison
from suites.verdicts.check_names import CHECK_NAMES, at_floor, current_metric_name
from suites.verdicts.outcome import CellOutcome
from tests.suites.checks.test_check_units import _failing_signatures, _training_reports

VERSIONS = {"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0", "python": "3.11.7", "deepspeed_git": ""}


def _real(comparison: ComparisonRecord) -> ComparisonRecord:
    """A hand-made comparison record replaced by a real Comparison's (its errors at every candidate floor)."""
    real = Comparison(largest=1.0, floor_share=2.0**-20)
    reference = torch.linspace(-1.0, 1.0, 16)
    real.add(comparison.worst_parameter, reference * (1 + comparison.max_rel_error), reference)
    return replace(real.record(), problems=comparison.problems)


def _training_results() -> list[CheckResult]:
    """The training checks of a cell with a second model and a checkpoint round trip, its output head judged."""
    unsharded, reports = _training_reports(trip={})
    unsharded["lm_head_weight"] = next(iter(unsharded["bytes_by_name"]))
    for report in reports:
        report["steps"] = [_real(step) for step in report["steps"]]
        report["update"] = _real(report["update"])
        trip = report["round_trip"]
        for part in ("gathered", "loaded", "resumed_grads", "resumed_update"):
            trip[part] = _real(trip[part])
        trip["saved"] = _real(trip["saved"])
    return training.check([unsharded, unsharded], [{"models": [r, r]} for r in reports], DEFAULT_TOLERANCES["fp32"])


def every_check_result() -> list[CheckResult]:
    """A result of every check the harness has: each failing (tests/suites/checks/test_check_units.py builds them)
    and the training checks as a passing cell computes them."""
    results = [*_failing_signatures().values(), *_training_results()]
    assert {result.name for result in results} == set(CHECK_NAMES)
    return results


def write_junit(folder, outcomes: list[tuple[Cell, CellOutcome]], started: str):
    """The cells recorded by the suites' recorder and written as JUnit with its properties, as a session writes them."""
    run = RunInfo(session="matrix", started=started, host="vm", accelerator="cpu", backend="gloo", harness_git="")
    recorder = CellRecorder(folder / "results" / started, run, VERSIONS)
    suite = TestSuite("pytest")
    for cell, outcome in outcomes:
        case = TestCase(f"test_cell[{cell.id}]", classname="suites.test_autotp")
        recorder.record(cell, outcome, record_property=case.add_property)
        if outcome.outcome == "fail":
            case.result = [Failure(f"{outcome.failure_class}: {outcome.signature}")]
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    junit = folder / "junit" / f"matrix-{started}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    xml.write(str(junit), pretty=True)
    return junit


def test_every_check_of_every_variant_passes_the_door(tmp_path, capsys):
    """Every variant's cell failing each check (the check's place in the list as its tp), and passing with every
    metric the checks record, in one session's file."""
    results = every_check_result()
    metrics = {name: value for result in results for name, value in result.metrics.items()}
    assert {at_floor("grad_first_step_max_rel_error", k) for k in FLOOR_CANDIDATES} <= set(metrics)
    llama, qwen2 = load_models()["llama"], load_models()["qwen2"]
    outcomes = []
    for variant in load_variants().values():
        outcomes.append((Cell(qwen2, variant, "fp32", 2), CellOutcome("pass", metrics=metrics)))
        for tp, result in enumerate(results, start=2):
            failing = CellOutcome("fail", result.failure_class, result.cell_signature, result.reason, result.metrics)
            outcomes.append((Cell(llama, variant, "fp32", tp), failing))
    write_junit(tmp_path, outcomes, "2026-12-07T00:00:00Z")
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    assert "skipped" not in capsys.readouterr().err
    with HistoryStore(store, create=False, read_only=True) as history:
        stored = [o.result for o in history.observations()]
    assert len(stored) == len(outcomes)
    assert {r.cell.variant for r in stored} == set(load_variants())
    assert {r.signature for r in stored if r.outcome == "fail"} == {r.cell_signature for r in results}
    written = {name: float(f"{value:.6g}") for name, value in metrics.items() if math.isfinite(value)}  # NaN left out
    assert all(r.metrics == written for r in stored if r.outcome == "pass")
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0


def test_an_older_files_floor_metrics_are_read_under_their_names(tmp_path):
    """A file an older harness wrote (`<metric>_floor2^-<k>`, refused at the door before) merges, its metrics under
    this harness's names."""
    old = {f"grad_first_step_max_rel_error_floor2^-{k}": 0.5**k for k in FLOOR_CANDIDATES}
    assert {current_metric_name(name) for name in old} == {
        at_floor("grad_first_step_max_rel_error", k) for k in FLOOR_CANDIDATES
    }
    write_junit(
        tmp_path, [(expand("llama", "train", "fp32", "2")[0], CellOutcome("pass", metrics=old))], "2026-12-01T00:00:00Z"
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    with HistoryStore(store, create=False, read_only=True) as history:
        (stored,) = history.observations()
    assert stored.result.metrics == pytest.approx(
        {at_floor("grad_first_step_max_rel_error", k): 0.5**k for k in FLOOR_CANDIDATES}, rel=1e-5
    )


@pytest.mark.autotp
def test_a_real_training_cell_reaches_the_store_the_report_and_the_archive(rank_pool, tmp_path, capsys):
    cell = Cell(load_models()["llama"], load_variants()["train"], "fp32", 2)
    outcome = run_cell(cell, rank_pool, RunOptions(cell_timeout=600))
    assert outcome.outcome == "pass", outcome.message
    write_junit(tmp_path, [(cell, outcome)], "2026-12-07T01:00:00Z")
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store), "--archive", str(archive)]) == 0
    assert "skipped" not in capsys.readouterr().err
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    assert "llama" in (tmp_path / "out" / "report.md").read_text()
    rebuilt = tmp_path / "rebuilt.sqlite"
    assert main(["rebuild", "--archive", str(archive), "--store", str(rebuilt)]) == 0
    for path in (store, rebuilt):
        with HistoryStore(path, create=False, read_only=True) as history:
            (stored,) = history.observations()
        assert (stored.result.cell.id, stored.result.outcome) == (cell.id, "pass")
        assert stored.result.metrics == pytest.approx(outcome.metrics, rel=1e-5)

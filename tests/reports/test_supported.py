"""DeepSpeed's refusal of what a cell asks for (a dtype its accelerator does not list) as its own state, `unsupported`:
through the door, the store and the report (never a plain skip, never a failure), and bisected by `--mode supported`
(the first release or commit that runs the cell)."""

from __future__ import annotations

import sqlite3
import textwrap

from reports_testkit import Cell, render

from reports.__main__ import main as reports_main
from reports.outputs.model import read_report
from reports.search.cell_runs import CellRun, classify
from reports.search.steps import BAD, GOOD, SKIP
from reports.store.history_store import HistoryStore
from reports.store.records import CellKey
from sessions.environments import EnvironmentSpec
from tests.fake_packages import make_repo, pyproject

REFUSAL = "DeepSpeed 0.16.7 does not support fp16 on its cpu accelerator here (supported_dtypes: float32, bfloat16)"


def test_unsupported_goes_through_the_door_into_the_store_and_the_report(session, tmp_path):
    cells = [
        Cell("llama", dtype="fp16", outcome="unsupported", message=REFUSAL),
        Cell("llama", metrics={"logits_max_abs": 1e-6}),
        Cell("opt", outcome="skip"),
    ]
    session(cells, deepspeed="0.16.7")
    out = render(tmp_path / "junit", tmp_path)
    with sqlite3.connect(tmp_path / "history.sqlite") as conn:
        stored = dict(
            conn.execute("SELECT c.dtype || ' ' || c.model, r.outcome FROM results r JOIN cells c ON c.id = r.cell")
        )
    assert stored == {"fp16 llama": "unsupported", "fp32 llama": "pass", "fp32 opt": "skip"}
    with HistoryStore(tmp_path / "history.sqlite", create=False, read_only=True) as history:
        (refused,) = [o.result for o in history.observations() if o.result.outcome == "unsupported"]
    assert refused.message == REFUSAL and refused.failure_class == ""
    report = (out / "report.md").read_text()
    assert "| llama | 🚫 | ✅" in report, report
    statuses = {
        entry.cell: entry.verdict.status for row in read_report(out).matrix.rows for entry in row.cells.values()
    }
    assert statuses == {
        "llama-eager-fp16-tp2": "unsupported",
        "llama-eager-fp32-tp2": "pass",
        "opt-eager-fp32-tp2": "skip",
    }


def test_supported_mode_judges_a_refusal_bad_and_any_run_good():
    refused = CellRun("unsupported", "", "", REFUSAL)
    assert classify(refused, None, False, runs_are_good=True).kind == BAD
    assert classify(CellRun("pass", "", "", ""), None, False, runs_are_good=True).kind == GOOD
    assert classify(CellRun("fail", "numerics", "x", ""), None, False, runs_are_good=True).kind == GOOD
    for untried in (
        CellRun("fail", "setup", "x", ""),
        CellRun("fail", "install", "x", ""),
        CellRun("skip", "", "", ""),
    ):
        assert classify(untried, None, False, runs_are_good=True).kind == SKIP
    # every other mode: a cell DeepSpeed refused was not run, so it says nothing of the failure searched for
    assert classify(refused, ("numerics", "x"), True).kind == SKIP


NO_FP16 = "DTYPES = ('float32', 'bfloat16')\n"
FP16 = "DTYPES = ('float32', 'bfloat16', 'float16')\n"
SUPPORT_HISTORY = [
    (
        "Initial fake DeepSpeed",
        {"fakeds/__init__.py": "", "deepspeed/__init__.py": "", "fakeds/dtypes.py": NO_FP16},
        "v0.1.0",
    ),
    ("Docs (#7001)", {"README.md": "fake\n"}, ""),
    ("Launcher (#7002)", {"fakeds/launcher.py": "RANKS = 2\n"}, ""),
    ("Add cpu accelerator fp16 dtype support (#7207)", {"fakeds/dtypes.py": FP16}, ""),
    ("Unrelated (#7008)", {"README.md": "fake 2\n"}, "v0.2.0"),
]
# The cell as the harness runs it: refused where the fake DeepSpeed lists no float16, else run (and failing: a cell
# that runs is supported whatever AutoTP then does).
SUPPORT_CELL = textwrap.dedent("""\
    import json, sys
    from pathlib import Path
    from fakeds.dtypes import DTYPES
    cell_ids, results = sys.argv[1].split(","), Path(sys.argv[2])
    record = {"cell": {"id": cell_ids[0]}, "outcome": "fail", "failure_class": "numerics",
              "signature": "logits differ", "message": ""}
    if "float16" not in DTYPES:
        record.update(outcome="unsupported", failure_class="", signature="",
                      message="DeepSpeed does not support fp16 on its cpu accelerator here "
                              f"(supported_dtypes: {DTYPES})")
    results.mkdir(parents=True, exist_ok=True)
    (results / "cells.jsonl").write_text(json.dumps(record) + "\\n")
""")


def test_mode_supported_finds_the_first_commit_that_runs_the_cell(tmp_path, monkeypatch, capsys):
    import reports.search.bisect as bisect_module
    import reports.search.cell_runs as cell_runs_module

    repo, root = tmp_path / "fakeds", tmp_path / "envs"
    shas = make_repo(repo, pyproject("fakeds", include="fakeds*"), SUPPORT_HISTORY)
    script = tmp_path / "cell.py"
    script.write_text(SUPPORT_CELL)
    real_run_cells = cell_runs_module.run_cells
    monkeypatch.setattr(
        bisect_module,
        "commit_environment",
        lambda env_root, clone, sha, pins: EnvironmentSpec(
            key=sha[:12],
            installs=(("setuptools", "wheel"), ("--no-build-isolation", "--no-deps", str(root / sha[:12] / "src"))),
            source=(clone, sha),
        ),
    )
    monkeypatch.setattr(
        cell_runs_module,
        "run_cells",
        lambda python, cells, timeout, command: real_run_cells(
            python,
            cells,
            timeout,
            lambda python, cells, results, _: [str(python), str(script), cells[0].id, str(results)],
        ),
    )
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp16", 2)
    argv = ["--cell", cell.id, "--bad", "v0.1.0", "--good", "v0.2.0", "--deepspeed-repo", str(repo)]
    argv += ["--store", str(store), "--env-root", str(root), "--pin", "transformers=5.24.0", "--pin", "torch=2.13.0"]

    # As the issue saw it: --mode fixed cannot ask since when, a refused end is no failure to see fixed.
    assert reports_main(["bisect", *argv, "--mode", "fixed"]) == 2
    assert f"{shas[0]} should be bad but is skip (the cell was not run (unsupported)" in capsys.readouterr().err

    assert reports_main(["bisect", *argv, "--mode", "supported"]) == 0
    printed = capsys.readouterr().out
    assert f"last refusing it commit {shas[2]}, first running it commit {shas[3]}" in printed, printed
    assert "PR: #7207" in printed
    with HistoryStore(store, create=False) as history:
        (answer,) = history.bisections()
    assert (answer.kind, answer.mode, answer.failure_class, answer.commit, answer.pr) == (
        "supported",
        "fixed",
        "",
        shas[3],
        7207,
    )
    assert answer.signature.startswith("unsupported: DeepSpeed does not support fp16"), answer.signature

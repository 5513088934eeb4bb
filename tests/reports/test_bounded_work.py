"""Bounded work (#53 "Bounded work"): merge holds one testcase of a file's tree at a time and never imports torch,
a run that gives a cell two verdicts is refused at the door, render resolves a model's failing cells once, and every
output of a render (repro scripts and drafts included) moves into place together or not at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

import matrix.derive
from matrix import PROJECT_ROOT
from matrix.cells import Cell as BuiltCell
from reports.__main__ import main
from reports.analysis import analyse_aggregates
from reports.outputs.cell_files import write_repro_scripts
from reports.store.history_store import HistoryStore

pytestmark = pytest.mark.usefixtures("no_github")

LATEST = {"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0+cpu"}  # the tests' installed transformers


def night(path: Path, cells: list[Cell], n: int, **versions: str) -> Path:
    return write_junit(
        path,
        cells,
        run_id=f"nightly@2026-12-{n:02d}T00:00:00Z@runner-1",
        started=f"2026-12-{n:02d}T00:00:00Z",
        **{**LATEST, **versions},
    )


def files_in(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- one run, one verdict per cell ----------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["pass", "fail"])
def test_a_run_that_lists_a_cell_twice_is_refused_naming_the_cell_and_the_file(tmp_path, capsys, first):
    junit = tmp_path / "results" / "junit"
    night(junit / "good.xml", [Cell("qwen2")], 1)
    verdicts = [Cell("llama"), fail("llama", "forward")]
    twice = night(junit / "twice.xml", [Cell("mistral"), *(verdicts if first == "pass" else verdicts[::-1])], 2)
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {twice}: testcase 'test_cell[llama-eager-fp32-tp2]': run " in err
    assert "lists cell 'llama-eager-fp32-tp2' twice" in err
    with HistoryStore(store, create=False) as history:  # nothing of the run: not its first verdict, not its other cells
        assert [run.run_id for run in history.runs()] == ["nightly@2026-12-01T00:00:00Z@runner-1"]
    archived = [p.name for p in (tmp_path / "results" / "archive").rglob("*.tar.gz")]
    assert archived == ["nightly@2026-12-01T00%3A00%3A00Z@runner-1.1.tar.gz"]


# ---- merge's memory --------------------------------------------------------------------------------------------------


def peak_rss_mb(code: str) -> float:
    """The peak resident memory of a Python child running `code` from the project root: its own address space's
    high-water mark (the rusage of a child Python starts by vfork counts this process's memory too)."""
    hwm = "print(next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')).split()[1])"
    child = subprocess.run([sys.executable, "-c", f"{code}\n{hwm}"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    return int(child.stdout.split()[-1]) / 1024


def test_reading_a_junit_file_holds_one_testcase_of_its_tree_at_a_time(tmp_path):
    """60 MB of testcase output no record keeps (<system-out>): a reader that parses the whole tree holds all of it,
    one that drops each testcase once read holds one testcase's 300 KB."""
    many = night(tmp_path / "many.xml", [Cell(f"m{n}") for n in range(200)], 1)
    few = night(tmp_path / "few.xml", [Cell("m0")], 1)
    for path in (many, few):
        text = path.read_text()
        path.write_text(text.replace("</testcase>", f"<system-out>{'x' * 300_000}</system-out></testcase>"))
    assert many.stat().st_size > 60e6
    read = "from pathlib import Path\nfrom reports.store.junit import read_junit\nread_junit(Path({!r}))"
    assert peak_rss_mb(read.format(str(many))) - peak_rss_mb(read.format(str(few))) < 20


def test_merge_imports_no_torch():
    """torch alone is 220 MB of resident memory: merge's peak (#53: 300 MB for 100k testcases) has no room for it."""
    code = "import sys, reports.__main__; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, check=True)


# ---- render: per-model work once, every output together ----------------------------------------------------------


def test_the_failing_cells_of_a_model_the_registry_lacks_derive_the_architectures_once(tmp_path, monkeypatch):
    cells = [fail("bamba", "forward", tp=tp) for tp in (2, 3, 4)]  # an architecture no registry entry covers
    junit = night(tmp_path / "junit" / "1.xml", cells, 1)
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    derivations = []
    derive = matrix.derive.derived_entries
    monkeypatch.setattr(matrix.derive, "derived_entries", lambda *a, **k: derivations.append(1) or derive(*a, **k))
    with HistoryStore(store, create=False, read_only=True) as history_store:
        aggregates = history_store.aggregates()
    history = analyse_aggregates(aggregates, None, [], [])
    logged: list[str] = []
    written = write_repro_scripts(history, aggregates, tmp_path / "out", logged.append)
    assert len(derivations) == 1
    assert written == {cell.id for cell in cells}, logged
    assert sorted(p.name for p in (tmp_path / "out" / "repro").glob("repro_*.py")) == [
        f"repro_{cell.id}.py" for cell in cells
    ]


def test_a_render_that_cannot_move_its_outputs_leaves_no_new_script_or_draft_beside_the_old_report(tmp_path, capsys):
    junit = tmp_path / "results" / "junit"
    night(junit / "1.xml", [fail("llama", "forward"), Cell("opt")], 1)
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    out = tmp_path / "out"
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    assert (out / "repro" / "repro_llama-eager-fp32-tp2.py").is_file()
    night(
        junit / "2.xml",
        [fail("llama", "forward"), fail("opt", "shard", "ValueError: opt split")],
        2,
        deepspeed="0.19.9",
    )
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    (out / "report.html").unlink()
    (out / "report.html").mkdir()  # in the way of one output
    before = files_in(out)
    capsys.readouterr()
    assert main(["render", "--store", str(store), "--out", str(out)]) == 2
    assert f"cannot write {out / 'report.html'}" in capsys.readouterr().err
    assert files_in(out) == before  # opt's new script and draft are not there, nor anything else new
    assert not [name for name in os.listdir(out) if name.startswith(".staging")]
    (out / "report.html").rmdir()
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    assert (out / "repro" / "repro_opt-eager-fp32-tp2.py").is_file()
    assert "repro/repro_opt-eager-fp32-tp2.py" in (out / "report.md").read_text()  # linked: it was in the stage


def test_resolved_cells_are_the_cells_a_run_builds():
    from reports.outputs.cell_files import resolve_cells
    from reports.store.records import CellKey

    keys = [
        CellKey("llama", "eager", "fp32", 2),
        CellKey("llama", "meta", "bf16", 3),
        CellKey("nosuch", "eager", "fp32", 2),
    ]
    resolved = resolve_cells(keys)
    assert [cell.id for cell in resolved.values() if isinstance(cell, BuiltCell)] == [key.id for key in keys[:2]]
    assert "nosuch" in str(resolved[keys[2].id])

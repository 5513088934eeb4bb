"""What `pytest suites` prints where a cell fails: the failure is read as a cause where the run ends (render), its
traceback kept under results/logs/<cell>/, so pytest's own failure block and its short-summary line per failed cell
are left out; a user who asks for them (`--tb=...`, `-r...`) gets them. A real driver and rank group, one cell that
raises in its forward (an injected fault)."""

import re
import subprocess
import sys

import pytest

from matrix import PROJECT_ROOT

pytestmark = pytest.mark.autotp


@pytest.fixture(autouse=True)
def free_cores(rank_pool):
    rank_pool.close()  # the drivers below start rank groups of their own


def run_failing_cell(results, *extra: str) -> str:
    command = [
        *(sys.executable, "-m", "pytest", "suites", "--models", "llama", "--shapes", "stress", "--tp", "2"),
        *("--results", str(results), "--session-name", "console", "-p", "no:cacheprovider"),
        *("--inject-fault", "tests.faults:raise_in_forward", *extra),
    ]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr  # the cell failed
    return done.stdout


def test_a_failed_cell_prints_no_traceback_and_no_summary_line_unless_asked(tmp_path):
    quiet = run_failing_cell(tmp_path / "quiet")
    assert "= FAILURES =" not in quiet and "Traceback" not in quiet, quiet
    assert "FAILED suites/" not in quiet and "short test summary" not in quiet, quiet
    assert re.search(r"llama\W+eager\W+fp32\W+forward", quiet), quiet  # the table says it failed, and how
    assert any((tmp_path / "quiet" / "logs" / "llama-eager-fp32-tp2").iterdir())  # the traceback is kept there
    asked = run_failing_cell(tmp_path / "asked", "--tb=short", "-rf")
    assert "= FAILURES =" in asked and "FAILED suites/" in asked, asked

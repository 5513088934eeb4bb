"""`nox -s repro -- --standalone` (sessions/standalone.py): which script a target names, how many ranks it runs on, and
a real run with the test environment's own launcher (its ranks import transformers: the DeepSpeed layer's launcher
ran a python without it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sessions.standalone import StandaloneError, ranks_of, run_standalone, script_of

CELL_SCRIPT = 'import sys\nCELL: dict = {"id": "llama-eager-fp32-tp3", "tp": 3}\nprint("ran")\n'


def test_a_target_is_a_file_or_a_cell_whose_repro_script_render_wrote(tmp_path):
    (tmp_path / "repro").mkdir()
    written = tmp_path / "repro" / "repro_llama-eager-fp32-tp3.py"
    written.write_text(CELL_SCRIPT)
    assert script_of(str(written), tmp_path) == written
    assert script_of("llama-eager-fp32-tp3", tmp_path) == written
    with pytest.raises(StandaloneError, match=r"qwen2-eager-fp32-tp2: neither a file nor a cell.*nox -s repro"):
        script_of("qwen2-eager-fp32-tp2", tmp_path)
    with pytest.raises(StandaloneError, match="missing.py: no such file"):
        script_of(str(tmp_path / "missing.py"), tmp_path)


def test_ranks_come_from_the_cells_tp_else_the_file_name(tmp_path):
    script = tmp_path / "anything.py"
    script.write_text(CELL_SCRIPT)
    assert ranks_of(script) == 3
    minimal = tmp_path / "bug-tp4.py"
    minimal.write_text("import deepspeed\n")
    assert ranks_of(minimal) == 4
    unnamed = tmp_path / "bug.py"
    unnamed.write_text("CELL = {'tp': 'three'}\n")
    with pytest.raises(StandaloneError, match="pass --ranks N"):
        ranks_of(unnamed)
    broken = tmp_path / "broken-tp2.py"
    broken.write_text("def (:\n")
    with pytest.raises(StandaloneError, match="not a Python script"):
        ranks_of(broken)


def test_a_standalone_script_runs_alone_with_the_environments_own_launcher(tmp_path, capfd):
    launcher = Path(sys.executable).parent / "deepspeed"
    assert launcher.read_text().startswith(f"#!{sys.executable}\n"), "the environment's launcher runs another python"
    script = tmp_path / "imports-tp2.py"
    script.write_text(
        "import importlib.util, os, sys\nimport transformers\n"
        "print('rank', os.environ['RANK'], 'harness on path:', importlib.util.find_spec('suites') is not None)\n"
        "sys.exit(3 if os.environ['RANK'] == '1' else 0)\n"
    )
    status = run_standalone(script, ranks_of(script), launcher)
    printed = capfd.readouterr().out
    assert "rank 0 harness on path: False" in printed and "rank 1 harness on path: False" in printed
    assert status != 0  # a rank's failure is the run's

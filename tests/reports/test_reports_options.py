"""Options that could not mean what they say get a clear error (issue #25): a triage budget of 0 or less, a
clone option pointing at a folder inside another repository."""

from __future__ import annotations

import subprocess

import pytest

from reports.__main__ import main as reports_main
from reports.triage import main as triage_main


@pytest.mark.parametrize(
    "option, value", [("--max-cells", "-5"), ("--max-cells", "0"), ("--max-minutes", "0"), ("--max-minutes", "-1.5")]
)
def test_a_triage_budget_that_allows_no_cell_run_is_refused(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_:
        triage_main([option, value, "--store", str(tmp_path / "absent.sqlite")])
    assert exit_.value.code == 2
    assert (
        f"argument {option}: {value} leaves no budget for a single cell run; give a number above 0"
        in capsys.readouterr().err
    )


def test_a_clone_option_must_name_the_root_of_a_clone(tmp_path, capsys):
    other = tmp_path / "harness"
    (other / "docs").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    inside = other / "docs"
    assert triage_main(["--deepspeed-repo", str(inside), "--store", str(tmp_path / "absent.sqlite")]) == 2
    assert (
        f"error: --deepspeed-repo {inside}: a folder inside the git repository {other}, not the root of a clone"
        in capsys.readouterr().err
    )
    assert triage_main(["--transformers-repo", str(inside), "--store", str(tmp_path / "absent.sqlite")]) == 2
    assert "--transformers-repo" in capsys.readouterr().err
    assert reports_main(["render", "--deepspeed-repo", str(inside), "--store", str(tmp_path / "absent.sqlite")]) == 2
    assert "not the root of a clone" in capsys.readouterr().err

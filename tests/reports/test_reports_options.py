"""Options that could not mean what they say get a clear error (issue #25): a triage budget of 0 or less, a
clone option pointing at a folder inside another repository."""

from __future__ import annotations

import subprocess

import pytest

from reports.__main__ import main as reports_main


@pytest.mark.parametrize(
    "option, value", [("--max-cells", "-5"), ("--max-cells", "0"), ("--max-minutes", "0"), ("--max-minutes", "-1.5")]
)
def test_a_triage_budget_that_allows_no_cell_run_is_refused(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_:
        reports_main(["triage", option, value, "--store", str(tmp_path / "absent.sqlite")])
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
    assert reports_main(["triage", "--deepspeed-repo", str(inside), "--store", str(tmp_path / "absent.sqlite")]) == 2
    assert (
        f"error: --deepspeed-repo {inside}: a folder inside the git repository {other}, not the root of a clone"
        in capsys.readouterr().err
    )
    assert reports_main(["triage", "--transformers-repo", str(inside), "--store", str(tmp_path / "absent.sqlite")]) == 2
    assert "--transformers-repo" in capsys.readouterr().err
    assert reports_main(["render", "--deepspeed-repo", str(inside), "--store", str(tmp_path / "absent.sqlite")]) == 2
    assert "not the root of a clone" in capsys.readouterr().err


def _clone_of_another_project(path):
    """The root of a real git clone, of a project that is not DeepSpeed (nor transformers)."""
    path.mkdir()
    (path / "README.md").write_text("another project\n")
    for args in (["init", "-q"], ["add", "README.md"]):
        subprocess.run(["git", "-C", str(path), *args], check=True)
    subprocess.run(
        ["git", "-C", str(path), "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "x"],
        check=True,
    )
    return path


def test_a_clone_option_must_name_a_clone_of_that_project(tmp_path, capsys):
    other = _clone_of_another_project(tmp_path / "harness")
    absent = str(tmp_path / "absent.sqlite")
    for run in (
        lambda: reports_main(["render", "--deepspeed-repo", str(other), "--store", absent]),
        lambda: reports_main(["publish", "--deepspeed-repo", str(other), "--store", absent]),
        lambda: reports_main(
            ["draft-issue", "--cell", "llama-eager-fp32-tp2", "--deepspeed-repo", str(other), "--store", absent]
        ),
        lambda: reports_main(["triage", "--deepspeed-repo", str(other), "--store", absent]),
        lambda: reports_main(
            [
                "bisect",
                "--cell",
                "llama-eager-fp32-tp2",
                "--good",
                "v0.1.0",
                "--bad",
                "v0.2.0",
                "--deepspeed-repo",
                str(other),
                "--store",
                absent,
            ]
        ),
    ):
        assert run() == 2
        assert (
            f"error: --deepspeed-repo {other}: not a DeepSpeed clone (no deepspeed/__init__.py at HEAD); "
            "pass the root folder of a local DeepSpeed clone"
        ) in capsys.readouterr().err
    assert reports_main(["triage", "--transformers-repo", str(other), "--store", absent]) == 2
    assert (
        f"error: --transformers-repo {other}: not a transformers clone (no src/transformers/__init__.py at HEAD)"
        in capsys.readouterr().err
    )
    # The check reads HEAD's tree, not the working folder: a file the clone has at HEAD is enough.
    (other / "deepspeed").mkdir()
    (other / "deepspeed" / "__init__.py").write_text("")
    assert reports_main(["render", "--deepspeed-repo", str(other), "--store", absent]) == 2
    assert "not a DeepSpeed clone" in capsys.readouterr().err
    subprocess.run(["git", "-C", str(other), "add", "deepspeed"], check=True)
    subprocess.run(
        ["git", "-C", str(other), "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "ds"],
        check=True,
    )
    assert reports_main(["render", "--deepspeed-repo", str(other), "--store", absent]) == 2
    assert "no history store here" in capsys.readouterr().err

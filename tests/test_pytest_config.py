"""pytest is strict about its own configuration (pytest.ini `--strict-markers --strict-config`): a marker nobody
registered (a typo that would silently select or skip nothing) and an unknown ini key fail the run."""

import subprocess
import sys

from matrix import PROJECT_ROOT


def run_pytest(folder, source: str) -> subprocess.CompletedProcess:
    (folder / "test_probe.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(PROJECT_ROOT / "pytest.ini"), "--rootdir", str(folder), str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
    )


def test_a_misspelled_marker_fails_the_run(tmp_path):
    done = run_pytest(tmp_path, "import pytest\n\n\n@pytest.mark.slwo\ndef test_probe():\n    pass\n")
    assert done.returncode != 0 and "'slwo' not found in `markers`" in done.stdout + done.stderr


def test_a_registered_marker_runs(tmp_path):
    assert run_pytest(tmp_path, "import pytest\n\n\n@pytest.mark.slow\ndef test_probe():\n    pass\n").returncode == 0

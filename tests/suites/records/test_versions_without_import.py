"""The run's versions and platform are read without importing torch, DeepSpeed or transformers (the driver's
~10 CPU s beside the fork server's imports), and say what the imports say."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from matrix import PROJECT_ROOT

HEAVY = ("torch", "deepspeed", "transformers")


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_run_s_versions_and_platform_import_nothing_heavy_and_equal_the_imported_ones():
    read = _run(
        "import json, sys\n"
        "from suites.records.run_records import installed_versions, platform_of_run\n"
        "versions, platform = installed_versions(), platform_of_run()\n"
        f"print(json.dumps({{'versions': versions, 'platform': platform, 'imported': [m for m in {HEAVY!r} "
        "if m in sys.modules]}))"
    )
    assert read["imported"] == []
    imported = _run(
        "import json, importlib\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "from deepspeed.git_version_info import git_hash\n"
        f"print(json.dumps({{'versions': {{m: str(importlib.import_module(m).__version__) for m in {HEAVY!r}}}, "
        "'git_hash': git_hash, 'accelerator': get_accelerator().device_name()}))"
    )
    assert {axis: read["versions"][axis] for axis in HEAVY} == imported["versions"]
    assert read["platform"][0] == imported["accelerator"]


def test_a_version_is_the_literal_the_package_s_import_would_set(tmp_path, monkeypatch):
    """A package whose import fails (it would raise) still has its version read, from the file the import reads."""
    from matrix.installed import imported_version, package_constants

    package = tmp_path / "deepspeed"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('importing this package is not allowed here')\n")
    (package / "git_version_info_installed.py").write_text("version='0.99.1+abc1234'\ngit_hash='abc1234'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)  # an earlier test's import would be found first
    assert imported_version("deepspeed") == "0.99.1+abc1234"
    assert package_constants("deepspeed", "git_version_info_installed.py")["git_hash"] == "abc1234"


def test_a_file_s_constants_are_read_again_when_it_changes(tmp_path):
    """module_constants parses a file once per process (it is asked for every cell's cache keys), but a file
    rewritten in place (a checkout moved to another commit) is parsed again, even at the same size."""
    from matrix.installed import module_constants

    version_file = tmp_path / "git_version_info_installed.py"
    version_file.write_text("version = '0.19.8'\ngit_hash = 'aaaaaaa'\n")
    assert module_constants(version_file) == {"version": "0.19.8", "git_hash": "aaaaaaa"}
    module_constants(version_file)["version"] = "changed by a caller"  # each caller gets its own copy
    assert module_constants(version_file)["version"] == "0.19.8"

    stamp = version_file.stat().st_mtime_ns
    version_file.write_text("version = '0.19.9'\ngit_hash = 'bbbbbbb'\n")
    os.utime(version_file, ns=(stamp + 1_000_000, stamp + 1_000_000))  # a coarse clock could repeat the time
    assert module_constants(version_file) == {"version": "0.19.9", "git_hash": "bbbbbbb"}

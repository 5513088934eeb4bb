"""`--as-of release-date`: a combination's transformers dependencies resolved as of the day of its newer
pinned DeepSpeed/transformers release (uv's --exclude-newer), the harness's own requirements exempt.
The resolution test asks PyPI (uv, as the environments do)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from matrix.versions import combinations
from sessions.environments import combination_environment
from sessions.nox_sessions import release_date, split_as_of

FIXTURES = Path(__file__).resolve().parent.parent / "matrix" / "fixtures"


def test_the_option_is_taken_from_the_pytest_options_and_checked():
    assert split_as_of(["--models", "llama", "--as-of", "release-date", "-q"]) == (
        "release-date",
        ["--models", "llama", "-q"],
    )
    assert split_as_of(["--tp", "2"]) == ("", ["--tp", "2"])
    with pytest.raises(SystemExit):
        split_as_of(["--as-of", "yesterday"])


def test_the_date_is_the_newer_pinned_release_s_day_and_names_its_own_environment():
    (combo,) = combinations("latest", overrides={"deepspeed": "0.14.4", "transformers": "4.41.2"}, cache_dir=FIXTURES)
    # transformers 4.41.2: 2024-05-30, DeepSpeed 0.14.4: 2024-06-21 (torch 2.13.0, pinned for all, not counted)
    assert release_date(combo, cache_dir=FIXTURES) == "2024-06-21"
    spec = combination_environment(
        "ds0.14.4", "deepspeed==0.14.4", [("tf4.41.2", "transformers==4.41.2")], "2.13.0", as_of="2024-06-21"
    )
    assert spec.key == "ds0.14.4-tf4.41.2-pt2.13.0-asof2024-06-21" and spec.as_of == "2024-06-21"
    assert spec.installs[0][0] == "transformers==4.41.2"  # the subject of the as-of resolution comes first
    assert spec.base.key == "base-ds0.14.4-pt2.13.0"  # the DeepSpeed layer is shared with the newest-deps sibling


def pins(lines: list[str]) -> dict[str, Version]:
    return {name: Version(version) for name, _, version in (line.partition("==") for line in lines)}


def test_an_old_transformers_gets_the_dependencies_of_its_day_and_the_harness_its_own(uv, tmp_path):
    subprocess.run([str(uv.uv), "venv", "--quiet", "--python", sys.executable, str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    wanted = ("transformers==4.41.2", "pytest==9.2.0", "torch==2.13.0")
    as_of = pins(uv.resolve_missing(python, wanted, [], dict(os.environ), as_of="2024-06-21"))
    newest = pins(uv.resolve_missing(python, wanted, [], dict(os.environ)))
    assert "torch" not in as_of  # never resolved above the torch layer
    assert as_of["huggingface-hub"] < Version("0.24") <= newest["huggingface-hub"]  # 0.23.x was current in June 2024
    assert as_of["safetensors"] < Version("0.4.4") <= newest["safetensors"]  # 0.4.3: May 2024
    # pytest 9.2 needs a pluggy newer than the day: the harness's own requirements are exempt
    assert as_of["pytest"] == Version("9.2.0") and as_of["pluggy"] >= Version("1.6")

"""nox's own interpreter (README installs only nox there) gets detect-secrets before it redacts anything:
`nox -s remedy` wrote a not-applied remedy's problem, and an install failure is recorded, in that process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from sessions import installers
from sessions.installers import InstallError, redaction_library

TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == "detect_secrets" else real(name, *rest)
    )


def test_a_missing_library_is_installed_once_under_the_tools_folder_and_put_last_on_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_library: None
) -> None:
    installed: list[str] = []

    def pip(argv: list[str], what: str, env: object = None, cwd: object = None) -> str:
        installed.append(argv[-1])
        Path(argv[argv.index("--target") + 1], "detect_secrets").mkdir(parents=True)
        return ""

    monkeypatch.setattr(installers, "run_checked", pip)
    monkeypatch.setattr(sys, "path", list(sys.path))
    redaction_library(tmp_path)
    redaction_library(tmp_path)
    assert installed == ["detect-secrets==1.5.0"]  # the project's pin, installed once
    assert sys.path[-1] == str(tmp_path / ".tools" / "detect-secrets-1.5.0")
    assert (tmp_path / ".tools" / "detect-secrets-1.5.0" / "detect_secrets").is_dir()


def test_a_failed_install_says_what_to_run_and_quotes_nothing_of_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_library: None
) -> None:
    def pip(argv: list[str], what: str, env: object = None, cwd: object = None) -> str:
        raise InstallError(f"could not {what}: Looking in indexes: https://user:{TOKEN}@pypi.example/simple")

    monkeypatch.setattr(installers, "run_checked", pip)
    with pytest.raises(InstallError) as raised:
        redaction_library(tmp_path)
    assert TOKEN not in str(raised.value) and "pypi.example" not in str(raised.value)
    assert "python3 -m pip install detect-secrets==1.5.0" in str(raised.value)
    assert not (tmp_path / ".tools" / "detect-secrets-1.5.0").exists()


def test_an_importable_library_installs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(installers, "run_checked", lambda *args, **kwargs: pytest.fail("nothing to install"))
    redaction_library(tmp_path)
    assert not (tmp_path / ".tools").exists()

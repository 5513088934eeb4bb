"""Fixtures shared by the environment tests."""

from __future__ import annotations

import pytest

from sessions.environments import env_root
from sessions.installers import Installer, installer


@pytest.fixture(scope="module")
def uv() -> Installer:
    """uv from the pin in pyproject.toml, as the harness installed it for this session's environments (`nox -s
    tests` did, before pytest): a venv uv built has no pip to install it with again."""
    chosen = installer(env_root())
    assert chosen.uv is not None, "uv could not be installed from the pin in pyproject.toml"
    return chosen

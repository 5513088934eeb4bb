"""The work every nox session shares: pick the combination, install its pins, print what was
really installed, run the suites, and record an environment that cannot be installed as an
`install` failure of every cell instead of losing them."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

import nox

from matrix.versions import Combo, ReleaseDataUnavailable, combinations

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROJECT_DEPENDENCIES = nox.project.load_toml(PROJECT_ROOT / "pyproject.toml")["project"]["dependencies"]
TORCH_INDEX_ENV = "AUTOTP_TORCH_INDEX"
"""Extra pip options for torch only, e.g. `--index-url https://download.pytorch.org/whl/cu124` on GPU runners."""
TESTS_PINS = {"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0"}
"""The harness's own tests run on fixed releases: their known-answer cells (which architectures pass or
fail, and how) are facts about these versions, and a new upstream release must not turn CI red."""
PINS_ENV = "AUTOTP_PINS"
"""Axis overrides for `nox -s matrix`, e.g. `deepspeed=deepspeed@pr/1234,transformers=4.57.6`."""


def pin_overrides() -> dict[str, str]:
    text = os.environ.get(PINS_ENV, "")
    pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
    for pair in pairs:
        if len(pair) != 2:
            raise SystemExit(f"{PINS_ENV}={text!r}: each entry must be AXIS=VALUE, e.g. deepspeed=0.19.7")
    return {axis.strip(): value.strip() for axis, value in pairs}


def session_combos(tag: str | None = None, overrides: dict[str, str] | None = None) -> list[Combo]:
    """The combinations for session parametrization; none (with a warning) when there is no release
    data at all, so `nox -l` and the other sessions still work offline."""
    try:
        return combinations(tag, overrides=pin_overrides() if overrides is None else overrides)
    except ReleaseDataUnavailable as error:
        print(f"nox: no release data, version-matrix sessions unavailable: {error}")
        return []


def dependency_group(name: str) -> list[str]:
    return nox.project.dependency_groups(nox.project.load_toml(PROJECT_ROOT / "pyproject.toml"), name)


def install_harness(session: nox.Session, combo: Combo, *extra: str) -> None:
    # torch first, on its own: on CPU machines the pinned version comes from a local wheel, and
    # nothing installed later may pull another (multi-GB) torch build.
    _pip_install(session, combo.torch.requirement, *shlex.split(os.environ.get(TORCH_INDEX_ENV, "")))
    _pip_install(session, combo.deepspeed.requirement, combo.transformers.requirement, combo.torch.requirement,
                 *PROJECT_DEPENDENCIES, *extra)
    session.run("python", "-m", "suites.records", "--versions")


def _pip_install(session: nox.Session, *args: str) -> None:
    """session.install that keeps pip's output: nox's own CommandFailed says only "Returned code 1",
    and a recorded install failure must carry the resolver's message."""
    with (Path(session.create_tmp()) / "pip-install.log").open("w+") as log:
        try:
            session.install(*args, silent=False, stdout=log)  # a custom stdout needs silent=False
        except nox.command.CommandFailed as error:
            log.seek(0)
            output = log.read()
            session.log(output)
            raise nox.command.CommandFailed(f"{error}\n{output}", return_code=error.return_code) from error


def _selection(pytest_args: list[str]) -> argparse.Namespace:
    """The options of conftest.py this module needs, before pytest runs."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--models", "--model", default="registry")
    for name, default in (("--variants", "eager"), ("--dtypes", "fp32"), ("--tp", "2,3,4"), ("--results", "results"),
                          ("--accuracy-task", "")):
        parser.add_argument(name, default=default)
    return parser.parse_known_args(pytest_args)[0]


def run_matrix(session: nox.Session, combo: Combo, pytest_args: list[str]) -> None:
    """Install `combo`, run the AutoTP suites on the selected cells, and render the report."""
    if combo.skip_reason:
        session.skip(f"{combo.id}: {combo.skip_reason}")
    selection = _selection(pytest_args)
    # lm-eval tasks need lm-evaluation-harness (the `accuracy` dependency group), the built-in ones nothing.
    extra = dependency_group("accuracy") if selection.accuracy_task.startswith("lm_eval:") else []
    try:
        install_harness(session, combo, *extra)
    except nox.command.CommandFailed as error:
        from suites.install_failure import record_install_failure

        written = record_install_failure(session.name, combo, str(error), selection)
        session.error(f"could not install {' '.join(combo.requirements)}; {written} cells recorded as 'install' "
                      f"failures in {selection.results}")
    results = selection.results
    session.run("python", "-m", "pytest", "suites", "--session-name", session.name, *pytest_args,
                success_codes=[0, 1], env={"NOX_SESSION_NAME": session.name})
    session.run("python", "-m", "reports", "merge", f"{results}/junit", "--store", f"{results}/history.sqlite")
    session.run("python", "-m", "reports", "render", "--store", f"{results}/history.sqlite", "--out", results)

"""`nox -s backfill` on a recording session: every combination's results are merged into the store once,
triaged once and rendered once, and a combination that cannot be installed queues no report session.

Environments are built ahead (sessions/nox_sessions.py EnvironmentsAhead): later combinations build while
earlier ones' cells run, in builder threads. Each combination's cells still run in its own environment and
results folder, in the order of the releases, exactly as when every environment is built just before its cells;
a combination that cannot be installed (failing while later ones are still building) is recorded as `install`
failures of its own cells, and the others run."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sessions import history_sessions, install_failure, nox_sessions
from sessions.environments import EnvironmentBuildError

RELEASES = ["0.16.9", "0.17.7", "0.18.9", "0.19.8"]
BROKEN = "ds0.17.7"  # the combination whose environment cannot be installed
BUILD_SECONDS = {"ds0.16.9": 0.3, "ds0.17.7": 0.0, "ds0.18.9": 0.6, "ds0.19.8": 0.1}
"""Uneven build times: the broken build fails while a later one is still building, and builds end out of order."""


class RecordingSession:
    name = "backfill"

    def __init__(self):
        self.commands: list[tuple[str, ...]] = []
        self.environments: list[dict[str, str]] = []
        self.notified: list[str] = []
        self.warnings: list[str] = []
        self.logged: list[str] = []

    def run(self, *args, env=None, **kwargs) -> None:
        self.commands.append(args)
        self.environments.append(env or {})

    def notify(self, target, posargs=None) -> None:
        self.notified.append(target)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def log(self, message: str) -> None:
        self.logged.append(message)

    def error(self, message: str) -> None:
        raise SystemExit(message)


def combo(deepspeed: str) -> SimpleNamespace:
    return SimpleNamespace(
        id=f"ds{deepspeed}",
        skip_reason=None,
        requirements=[f"deepspeed=={deepspeed}"],
        pins=(SimpleNamespace(package="deepspeed", label=deepspeed),),
    )


class FakeBuilds:
    """prepare_harness without installing: each build takes BUILD_SECONDS, BROKEN's raises as an installer would;
    `started` is the order the builds began in, `running` the most that ran at once."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.started: list[str] = []
        self.lock = threading.Lock()
        self.now = 0
        self.running = 0

    def __call__(self, chosen, extras_name="", as_of_mode="", log=print):
        with self.lock:
            self.started.append(chosen.id)
            self.now += 1
            self.running = max(self.running, self.now)
        try:
            log(f"building environment {chosen.id}")
            time.sleep(BUILD_SECONDS.get(chosen.id, 0.0))
            if chosen.id == BROKEN:
                raise EnvironmentBuildError(f"could not install deepspeed: {chosen.requirements[0]} has no wheel")
            return nox_sessions.HarnessEnvironment(
                self.tmp_path / chosen.id / "bin" / "python", "", f"deepspeed: {chosen.id}"
            )
        finally:
            with self.lock:
                self.now -= 1


@pytest.fixture()
def builds(monkeypatch, tmp_path) -> FakeBuilds:
    fake = FakeBuilds(tmp_path)
    monkeypatch.setattr(history_sessions, "backfill_versions", lambda axis, since, until: RELEASES)
    monkeypatch.setattr(history_sessions, "combinations", lambda tag, overrides: [combo(overrides["deepspeed"])])
    monkeypatch.setattr(nox_sessions, "session_combos", lambda tag: [combo("0.19.8")])
    monkeypatch.setattr(nox_sessions, "prepare_harness", fake)
    return fake


def backfill(tmp_path: Path, name: str) -> tuple[RecordingSession, Path]:
    session = RecordingSession()
    results = tmp_path / name
    history_sessions.backfill(
        session,
        [
            "--axis",
            "deepspeed",
            "--since",
            "0.16.0",
            "--results",
            str(results),
            "--store",
            str(tmp_path / f"{name}.sqlite"),
            "--models",
            "bloom",
            "--tp",
            "2",
        ],
    )
    return session, results


def pytest_runs(session: RecordingSession) -> list[tuple[str, str]]:
    """(environment, results folder) of every pytest run, in the order they ran."""
    return [
        (Path(command[0]).parent.parent.name, Path(command[command.index("--results") + 1]).name)
        for command in session.commands
        if command[1:4] == ("-m", "pytest", "suites")
    ]


def install_failures(results: Path) -> dict[str, set[tuple[str, str]]]:
    """{combination: {(cell, failure class)}} of the records install failures wrote."""
    return {
        folder.name: {
            (record["cell"]["id"], record["failure_class"])
            for record in map(json.loads, (folder / "cells.jsonl").read_text().splitlines())
        }
        for folder in sorted(results.iterdir())
        if (folder / "cells.jsonl").exists()
    }


def test_backfill_merges_each_combination_once_and_renders_once(builds, monkeypatch, tmp_path):
    monkeypatch.setattr(install_failure, "record_install_failure", lambda session, chosen, message, selection: 2)
    session, results = backfill(tmp_path, "backfill")

    reports_commands = [command[2:] for command in session.commands if command[1:3] == ("-m", "reports")]
    assert [command[:2] for command in reports_commands] == [
        ("reports", "merge"),
        ("reports", "triage"),
        ("reports", "render"),
    ]
    merged = reports_commands[0][2 : 2 + len(RELEASES)]
    assert merged == tuple(
        f"{results}/ds{release}/junit" for release in RELEASES
    )  # the broken one's install failures too
    assert session.notified == []  # no stray report session
    assert len(session.warnings) == 1 and BROKEN in session.warnings[0] and "'install' failures" in session.warnings[0]
    assert pytest_runs(session) == [
        (f"ds{release}", f"ds{release}") for release in RELEASES if f"ds{release}" != BROKEN
    ]


def test_building_ahead_runs_every_combination_as_building_each_in_turn_would(builds, tmp_path):
    ahead_session, ahead = backfill(tmp_path, "ahead")
    assert builds.running == nox_sessions.AHEAD_WORKERS > 1, "the builds were not made ahead"
    # the same combinations, each built just before its cells, as before building ahead
    in_turn_session, in_turn = RecordingSession(), tmp_path / "in-turn"
    for release in RELEASES:
        arguments = ["--models", "bloom", "--tp", "2", "--results", str(in_turn / f"ds{release}")]
        nox_sessions.run_suites(in_turn_session, combo(release), arguments)

    expected = [(f"ds{release}", f"ds{release}") for release in RELEASES if f"ds{release}" != BROKEN]
    assert pytest_runs(ahead_session) == pytest_runs(in_turn_session) == expected
    pytests = [  # every pytest run had its own environment's variables
        [
            Path(env["VIRTUAL_ENV"]).name
            for command, env in zip(session.commands, session.environments)
            if "pytest" in command
        ]
        for session in (ahead_session, in_turn_session)
    ]
    assert pytests[0] == pytests[1] == [name for name, _ in expected]
    # the broken combination's cells are install failures, in both runs, and only its own
    assert (
        install_failures(ahead) == install_failures(in_turn) == {BROKEN: {("bloom.faithful-eager-fp32-tp2", "install")}}
    )
    # every line a build logged names its combination
    building = [line for line in ahead_session.logged if "building environment" in line]
    assert set(building) == {f"ds{release}: building environment ds{release}" for release in RELEASES}


def test_an_install_failure_while_later_combinations_build_loses_none_of_them(builds, tmp_path):
    session, results = backfill(tmp_path, "backfill")
    assert builds.started[: len(RELEASES)] == [f"ds{release}" for release in RELEASES]  # built in release order
    assert pytest_runs(session) == [("ds0.16.9", "ds0.16.9"), ("ds0.18.9", "ds0.18.9"), ("ds0.19.8", "ds0.19.8")]
    assert install_failures(results) == {BROKEN: {("bloom.faithful-eager-fp32-tp2", "install")}}
    (broken_log,) = [line for line in session.logged if "has no wheel" in line]
    assert broken_log.startswith(f"{BROKEN}: ")

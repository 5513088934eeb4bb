"""`nox -s backfill` on a recording session: every combination's results are merged into the store once,
triaged once and rendered once, and a combination that cannot be installed queues no report session."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sessions import install_failure, nox_sessions
from sessions.environments import EnvironmentBuildError

RELEASES = ["0.16.9", "0.17.7", "0.18.9"]
BROKEN = "ds0.17.7"  # the combination whose environment cannot be installed


class RecordingSession:
    name = "backfill"

    def __init__(self):
        self.commands: list[tuple[str, ...]] = []
        self.notified: list[str] = []
        self.warnings: list[str] = []

    def run(self, *args, **kwargs) -> None:
        self.commands.append(args)

    def notify(self, target, posargs=None) -> None:
        self.notified.append(target)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def log(self, message: str) -> None:
        pass

    def error(self, message: str) -> None:
        raise SystemExit(message)


def combo(deepspeed: str) -> SimpleNamespace:
    return SimpleNamespace(id=f"ds{deepspeed}", skip_reason=None, requirements=[f"deepspeed=={deepspeed}"])


def test_backfill_merges_each_combination_once_and_renders_once(monkeypatch, tmp_path):
    def install_harness(session, chosen, extras_name="", as_of=""):
        if chosen.id == BROKEN:
            raise EnvironmentBuildError(f"could not install deepspeed: {chosen.requirements[0]} has no wheel")
        return tmp_path / chosen.id / "bin" / "python"

    monkeypatch.setattr(nox_sessions, "backfill_versions", lambda axis, since, until: RELEASES)
    monkeypatch.setattr(nox_sessions, "combinations", lambda tag, overrides: [combo(overrides["deepspeed"])])
    monkeypatch.setattr(nox_sessions, "session_combos", lambda tag: [combo("0.19.8")])
    monkeypatch.setattr(nox_sessions, "install_harness", install_harness)
    monkeypatch.setattr(install_failure, "record_install_failure", lambda session, chosen, message, selection: 2)
    session = RecordingSession()
    results = tmp_path / "backfill"
    nox_sessions.backfill(
        session,
        [
            "--axis",
            "deepspeed",
            "--since",
            "0.16.0",
            "--results",
            str(results),
            "--store",
            str(tmp_path / "history.sqlite"),
            "--tp",
            "2",
        ],
    )

    reports_commands = [
        command[2:] for command in session.commands if command[1:3] in (("-m", "reports"), ("-m", "reports.triage"))
    ]
    assert [command[:2] for command in reports_commands] == [
        ("reports", "merge"),
        ("reports.triage", "--store"),
        ("reports", "render"),
    ]
    merged = reports_commands[0][2 : 2 + len(RELEASES)]
    assert merged == tuple(
        f"{results}/ds{release}/junit" for release in RELEASES
    )  # the broken one's install failures too
    assert session.notified == []  # no stray report session
    assert len(session.warnings) == 1 and BROKEN in session.warnings[0] and "'install' failures" in session.warnings[0]
    suites = [command for command in session.commands if command[1:4] == ("-m", "pytest", "suites")]
    assert [Path(command[0]).parent.parent.name for command in suites] == ["ds0.16.9", "ds0.18.9"]

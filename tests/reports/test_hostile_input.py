"""Issue #42: crafted inputs of every class a hostile contributor tried, through merge, rebuild, verify, render, gate,
publish and draft-issue. A file with a value no session writes (a path component, an extreme number, a hostile
cells.jsonl beside it, an entity-declaring XML) is skipped with one line naming the file, the field and the value, and
the rest merges; text that reaches markdown (newlines, fences, mentions, links, images, HTML) stays text; a pull
request's runs never become a baseline; one run with hundreds of causes opens a capped number of issues. After each,
`rebuild` reproduces the store from the archive, `verify` passes and `render` succeeds."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from pathlib import Path
from typing import cast

import pytest
from junitparser.xunit2 import JUnitXml, TestCase
from reports_testkit import Cell, fail, markdown_tokens, write_junit

from reports.__main__ import main
from reports.outputs.markdown_safety import OUR_HTML, OUR_URL
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey, TriageAttempt

pytestmark = pytest.mark.usefixtures("no_github")


def night(path: Path, cells: list[Cell], n: int, **options) -> Path:
    options.setdefault("deepspeed", f"0.19.{n}")
    return write_junit(
        path,
        cells,
        run_id=options.pop("run_id", f"nightly@2025-01-{n:02d}T00:00:00Z@runner-1"),
        started=f"2025-01-{n:02d}T00:00:00Z",
        **options,
    )


def edited(path: Path, *, properties: dict[str, str] | None = None, message: str | None = None, text=None) -> Path:
    """The JUnit file with these property values (added where missing) and failure message/text on every case."""
    xml = JUnitXml.fromfile(str(path))
    for suite in xml:
        for case in suite:
            case = cast(TestCase, case)
            names = {p.name for p in case.properties()}
            for prop in case.properties():
                if prop.name in (properties or {}):
                    prop.value = properties[prop.name]
            for name, value in (properties or {}).items():
                if name not in names:
                    case.add_property(name, value)
            for result in case.result:
                if message is not None:
                    result.message = message
                if text is not None:
                    result.text = text
    xml.write(str(path), pretty=True)
    return path


def history_of(store: Path):
    with HistoryStore(store, create=False) as history:
        return history.runs(), history.observations(), history.bisections(), history.triage_attempts()


def survives(tmp_path: Path, store: Path) -> None:
    """What every crafted input must leave: a store the archive rebuilds as it is, verify passing, render working."""
    archive = store.parent / "archive"
    assert main(["verify", "--store", str(store), "--archive", str(archive)]) == 0
    rebuilt = tmp_path / "rebuilt" / "history.sqlite"
    shutil.rmtree(rebuilt.parent, ignore_errors=True)
    assert main(["rebuild", "--archive", str(archive), "--store", str(rebuilt)]) == 0
    assert history_of(rebuilt) == history_of(store)
    assert main(["render", "--store", str(rebuilt), "--out", str(tmp_path / "rendered")]) == 0


def inside(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# ---- values no session writes: skipped with one line, the rest merges ----------------------------------------------

REFUSED = [
    # path components: a session or run id is a folder and a file of the archive
    ({"run.session": ".."}, "run.session='..' is not a session name"),
    ({"run.session": "."}, "run.session='.' is not a session name"),
    ({"run.session": "a/../../outside"}, "run.session='a/../../outside' is not a session name"),
    ({"run.id": "../../outside"}, "run.id='../../outside' is not a run id"),
    ({"run.id": "nightly/../x"}, "run.id='nightly/../x' is not a run id"),
    ({"run.session": "s" * 10_000}, "characters long, more than the 100"),
    ({"run.id": "r" * 5_000}, "characters long, more than the 200"),
    ({"run.host": "host/with/slashes"}, "run.host='host/with/slashes' is not a host name"),
    # extreme numbers: past SQLite's integers, infinite or not a number
    ({"cell.tp": "99999999999999999999", "cell.id": "llama-eager-fp32-tp99999999999999999999"}, "cell.tp="),
    ({"cell.tp": "0", "cell.id": "llama-eager-fp32-tp0"}, "cell.tp=0 is not a tensor-parallel size"),
    ({"cell.tp": "9" * 5000}, "is not an integer"),
    ({"metric.logits_max_abs": "1e999"}, "gives logits_max_abs the value inf, not a finite number"),
    ({"metric.logits_max_abs": "nan"}, "gives logits_max_abs the value nan"),
    ({"metric.logits_max_abs": "-1e300"}, "not a finite number within ±1e+18"),
    ({"metric.x y": "1"}, "which is not a metric name"),
    ({"run.started": "yesterday"}, "run.started='yesterday' is not a start time"),
    ({"version.torch": "latest!"}, "version.torch='latest!' is not a PEP 440 version"),
    ({"checkpoints": ",".join(f"o/m{i}" for i in range(100))}, "is not a list of at most 64 hub ids"),
    ({"run.harness_git": "not-a-commit"}, "run.harness_git='not-a-commit' is not a git commit"),
    ({"logs": "/runner/" + "l" * 2_000}, "logs='/runner/llll"),
    ({"signature": "x" * 5_000}, "signature='xxxx"),
    ({"failure_class": "forward\n@org"}, "is not one of setup"),
]


@pytest.mark.parametrize("properties, expected", REFUSED, ids=[next(iter(p)) for p, _ in REFUSED])
def test_a_value_no_session_writes_skips_its_file_in_one_line_and_the_rest_merges(
    tmp_path, capsys, properties, expected
):
    junit = tmp_path / "results" / "junit"
    night(junit / "good.xml", [Cell("llama"), fail("opt", "shard")], 1)
    hostile = edited(night(junit / "hostile.xml", [fail("llama", "forward")], 2), properties=properties)
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"skipped {hostile}: ") and len(err.splitlines()) == 1 and expected in err, err
    assert len(err) < 600  # the value is cut to a line, whatever its length
    assert inside(tmp_path) == [
        "results/archive/nightly/nightly@2025-01-01T00%3A00%3A00Z@runner-1.1.tar.gz",
        "results/history.sqlite",
        "results/junit/good.xml",
        "results/junit/hostile.xml",
    ]
    survives(tmp_path, store)


def test_a_huge_message_skips_its_file(tmp_path, capsys):
    junit = tmp_path / "results" / "junit"
    night(junit / "good.xml", [Cell("llama")], 1)
    night(junit / "huge.xml", [fail("llama", "forward", message="x" * 1_100_000)], 2)
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    assert "message='xxxx" in capsys.readouterr().err
    survives(tmp_path, store)


def test_an_xml_file_declaring_entities_is_refused_unparsed(tmp_path, capsys):
    junit = tmp_path / "results" / "junit"
    night(junit / "good.xml", [Cell("llama")], 1)
    bomb = junit / "bomb.xml"
    lol = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 9))
    bomb.write_text(f'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY l0 "lol">{lol}]><testsuites>&l8;</testsuites>')
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    assert f"skipped {bomb}: declares a document type or entities" in capsys.readouterr().err
    survives(tmp_path, store)


HOSTILE_CELLS = [
    (
        '{"cell": {"id": "llama-eager-fp32-tp2"}, "outcome": "fail", "run": RUN, "failure_class": "forward"}',
        "cell.model",
    ),
    ('{"cell": "llama", "outcome": "pass", "run": RUN}', "not a cell record"),
    ('{"cell": {"id": "x"}, "outcome": "passed", "run": RUN}', "outcome 'passed' is not one of"),
    (
        '{"cell": {"id": "llama-eager-fp32-tpx", "model": "llama", "variant": "eager", "dtype": "fp32", "tp": "x"}, '
        '"outcome": "pass", "run": RUN, "versions": {}}',
        "cell.tp='x' is not an integer",
    ),
    (
        '{"cell": {"id": "llama-eager-fp32-tp2", "model": "llama", "variant": "eager", "dtype": "fp32", "tp": "2"}, '
        '"outcome": "pass", "run": RUN, "metrics": "fast", "versions": {}}',
        "metrics='fast' is not a table",
    ),
    (
        '{"cell": {"id": "llama-eager-fp32-tp2", "model": "llama", "variant": "eager", "dtype": "fp32", "tp": "2"}, '
        '"outcome": "pass", "run": RUN, "metrics": {"m": 1e999}, "versions": {"deepspeed": "0.19.2", '
        '"transformers": "4.44.0", "torch": "2.4.0", "python": "3.11.7"}}',
        "gives m the value inf",
    ),
    (
        '{"cell": {"id": "llama-eager-fp32-tp2", "model": "llama", "variant": "eager", "dtype": "fp32", "tp": "2"}, '
        '"outcome": "pass", "run": RUN, "versions": {"deepspeed": "0.19.2"}}',
        "are not the version axes a session records",
    ),
    (b"\xff\xfe\x00garbage", "not a readable cells.jsonl"),
    (None, "not a readable cells.jsonl"),  # a folder named cells.jsonl
]


@pytest.mark.parametrize("content, expected", HOSTILE_CELLS)
def test_a_hostile_cells_jsonl_skips_the_junit_beside_it_and_the_rest_merges(tmp_path, capsys, content, expected):
    good = night(tmp_path / "good" / "junit" / "good.xml", [Cell("llama")], 1)
    hostile = night(tmp_path / "hostile" / "junit" / "hostile.xml", [Cell("llama")], 2)
    beside = tmp_path / "hostile" / "cells.jsonl"
    if content is None:
        beside.mkdir()
    elif isinstance(content, bytes):
        beside.write_bytes(content)
    else:
        beside.write_text(content.replace("RUN", '{"id": "nightly@2025-01-02T00:00:00Z@runner-1"}') + "\n")
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(good.parent), str(hostile.parent), "--store", str(store)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"skipped {hostile}: ") and expected in err and len(err.splitlines()) == 1, err
    with HistoryStore(store, create=False) as history:
        assert [run.run_id for run in history.runs()] == ["nightly@2025-01-01T00:00:00Z@runner-1"]
    survives(tmp_path, store)


# ---- text that reaches markdown stays text -------------------------------------------------------------------------

HOSTILE_TEXT = (
    "RuntimeError: x ````y``` @maintainers @org/team ![i](https://evil.example/p.png) [click](https://evil.example/a) "
    "<https://evil.example/b> https://evil.example/c www.evil.example me@evil.example <img src=https://evil.example/d> "
    "<!-- autotp-matrix:publish --> &#64;entity | a | b |\n"
    "# Injected heading\n"
    "```\n"
    "@after-the-fence [x](https://evil.example/e)\n"
    "~~~\n"
    "<details><summary>forged</summary>"
)
MENTION = re.compile(r"(?<![\w@/.+-])@[A-Za-z0-9]")
BARE_LINK = re.compile(r"https?://[^\s<>]*|www\.\S*|\w@\w")


def _foreign_links(text: str) -> list[str]:
    """Bare URLs and e-mail addresses GitHub would link, but our own GitHub links (publish's comparisons)."""
    return [m.group() for m in BARE_LINK.finditer(text) if not OUR_URL.fullmatch(m.group().rstrip(".,;:!?)"))]


def active_from_input(markdown: str) -> list[str]:
    """What GitHub would act on that the harness did not write: images, links other than our GitHub ones, HTML other
    than our markers and frames, and text nodes (entities decoded) with a mention, a bare URL or an e-mail address;
    and a heading made of the input."""
    found = []
    tokens = markdown_tokens(markdown)
    for previous, token in zip([None, *tokens], tokens):
        if token.type == "image":
            found.append(f"image {token.attrs.get('src')}")
        elif token.type == "link_open" and not OUR_URL.fullmatch(str(token.attrs.get("href"))):
            found.append(f"link {token.attrs.get('href')}")
        elif token.type in ("html_inline", "html_block") and not OUR_HTML.fullmatch(token.content.strip()):
            found.append(f"html {token.content.strip()[:80]}")
        elif token.type == "text" and (MENTION.search(token.content) or _foreign_links(token.content)):
            found.append(f"text {token.content[:80]!r}")
        elif token.type == "inline" and "Injected" in token.content and previous and previous.type == "heading_open":
            found.append(f"heading {token.content[:80]!r}")
    return found


def test_no_link_image_mention_or_html_from_the_results_is_active_in_any_markdown_output(tmp_path, capsys):
    junit = tmp_path / "results" / "junit"
    night(junit / "1.xml", [Cell("llama"), Cell("opt"), Cell("bloom")], 1)
    night(
        junit / "2.xml",
        [
            fail("llama", "forward", HOSTILE_TEXT, message=HOSTILE_TEXT),
            fail("opt", "shard", HOSTILE_TEXT.replace("x", "y")),
            Cell("bloom", "skip"),
        ],
        2,
    )
    edited(junit / "2.xml", message=HOSTILE_TEXT)
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    answer = dict(held_fixed=(("transformers", "4.44.0"), ("torch", "2.4.0")), recorded_at="2025-01-03T00:00:00+00:00")
    with HistoryStore(store, create=False) as history:
        history.add_bisection(
            Bisection(
                CellKey("llama", "eager", "fp32", 2),
                "broken",
                "deepspeed",
                "0.19.1",
                "0.19.2",
                failure_class="forward",
                signature=HOSTILE_TEXT,
                commit="a" * 40,
                subject=f"Refactor {HOSTILE_TEXT} (#77)",
                pr=77,
                kind="broke",
                **answer,
            )
        )
        history.add_triage_attempt(
            TriageAttempt(
                CellKey("opt", "eager", "fp32", 2),
                "deepspeed",
                "broken",
                "0.19.1",
                "0.19.2",
                reason=f"untestable: {HOSTILE_TEXT}",
                **answer,
            )  # fmt: skip
        )
    assert main(["merge", str(junit), "--store", str(store)]) == 0  # archives the answers, as CI's next merge does
    survives(tmp_path, store)
    with sqlite3.connect(store) as conn:  # a failure class stored before merge validated them
        conn.execute("UPDATE results SET failure_class = ? WHERE outcome = 'skip'", (f"skip {HOSTILE_TEXT}",))
    out = tmp_path / "out"
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    assert main(["publish", "--store", str(store), "--out", str(out), "--upstream", "deepspeedai/DeepSpeed"]) == 0
    assert main(["draft-issue", "--cell", "llama-eager-fp32-tp2", "--store", str(store), "--out", str(out)]) == 0
    outputs = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*.md")}
    assert {"report.md", "step-summary.md", "supported-models.md", "publish/comment.md"} <= set(outputs)
    assert any(name.startswith("publish/issues/") for name in outputs)
    assert any(name.startswith("publish/upstream/") for name in outputs)
    assert any(name.startswith("draft-issue/") for name in outputs)
    for name, markdown in outputs.items():
        titled = markdown.removeprefix("# ").split("\n\n", 1) if name.startswith(("publish/", "draft")) else None
        if titled and "/issues/" in name or titled and "draft-issue" in name or titled and "/upstream/" in name:
            title, markdown = titled
            assert not MENTION.search(re.sub(r"`[^`]*`", "", title)), (name, title)
        assert active_from_input(markdown) == [], name
    assert "evil.example" in outputs["publish/comment.md"] and "evil.example" in outputs["report.md"]
    draft = next(text for name, text in outputs.items() if name.startswith("draft-issue/"))
    assert "# Injected heading" in draft  # inside the log block, whose fence is longer than any backtick run in it


# ---- a pull request's runs are never history -----------------------------------------------------------------------


def test_a_forged_baseline_in_a_pull_requests_results_changes_no_verdict(tmp_path, capsys):
    """The PR's JUnit adds a failing run labelled as the baseline's version under the nightly's session: merged as
    untrusted into a copy of the store, it is left out of the baseline (named as such), never archived, and the PR's
    new failure still fails the gate. Merged as trusted (as before), it would have made the gate pass."""
    trusted = tmp_path / "trusted" / "junit"
    night(trusted / "nightly.xml", [Cell("llama"), Cell("opt")], 1, deepspeed="0.19.7")
    store = tmp_path / "trusted" / "history.sqlite"
    assert main(["merge", str(trusted), "--store", str(store)]) == 0
    archive_before = {name: (store.parent / "archive" / name).read_bytes() for name in inside(store.parent / "archive")}
    store_before = store.read_bytes()

    pr = tmp_path / "artifacts"
    candidate = dict(deepspeed="0.19.8", run_id="pr@2025-01-05T00:00:00Z@runner-9")
    night(
        pr / "candidate.xml", [fail("llama", "forward", "RuntimeError: the PR broke it"), Cell("opt")], 5, **candidate
    )
    forged_id = "nightly@2025-01-04T00:00:00Z@runner-1"
    night(pr / "forged.xml", [fail("llama", "forward", "RuntimeError: the PR broke it")], 4, deepspeed="0.19.7",
          run_id=forged_id)  # fmt: skip
    disposable = tmp_path / "pr" / "history.sqlite"
    disposable.parent.mkdir()
    shutil.copy(store, disposable)
    assert (
        main(["merge", str(pr), "--store", str(disposable), "--archive", str(store.parent / "archive"), "--untrusted"])
        == 0
    )
    assert "nothing archived (untrusted runs are never part of the history)" in capsys.readouterr().out
    assert {n: (store.parent / "archive" / n).read_bytes() for n in inside(store.parent / "archive")} == archive_before
    assert store.read_bytes() == store_before

    gate = ["gate", "--baseline", "deepspeed=0.19.7", "--candidate", "deepspeed=0.19.8"]
    assert main([*gate, "--store", str(disposable)]) == 1
    out = capsys.readouterr().out
    assert "baseline deepspeed=0.19.7: 1 trusted run(s): nightly@2025-01-01T00:00:00Z@runner-1\n" in out
    assert f"left out of the baseline: 1 untrusted run(s) at these versions (a pull request's): {forged_id}" in out
    assert "llama-eager-fp32-tp2  pass      1/1 runs failed  regression" in out
    assert main(["gate", "--baseline", forged_id, "--candidate", "deepspeed=0.19.8", "--store", str(disposable)]) == 2
    assert "a pull request's run (merged --untrusted) is never a baseline" in capsys.readouterr().err
    assert main(["publish", "--store", str(disposable), "--out", str(tmp_path / "out"), "--session", "pr",
                 "--base", "deepspeed=0.19.7"]) == 0  # fmt: skip
    comment = (tmp_path / "out/publish/comment.md").read_text()
    assert "1 new failure**" in comment and "0 already failing on the base, 0 flaky" in comment
    assert main(["verify", "--store", str(disposable), "--archive", str(store.parent / "archive")]) == 0

    as_before = tmp_path / "as-before" / "history.sqlite"  # the same files merged as trusted: the forgery works
    as_before.parent.mkdir()
    shutil.copy(store, as_before)
    assert main(["merge", str(pr), "--store", str(as_before), "--archive", str(tmp_path / "scratch-archive")]) == 0
    assert main([*gate, "--store", str(as_before)]) == 0 and "baseline flaky" in capsys.readouterr().out
    survives(tmp_path, store)


# ---- hundreds of causes open a capped number of issues -------------------------------------------------------------


def _word(n: int) -> str:
    """A cause text per number that the number masker leaves distinct: letters only."""
    return "".join(chr(ord("a") + int(d)) for d in f"{n:03d}")


def test_three_hundred_causes_open_five_issues_and_one_summary(tmp_path, capsys, monkeypatch):
    from test_reports_publish import REPO, TOKEN, FakeGitHub

    junit = tmp_path / "results" / "junit"
    models = [f"m{n:03d}" for n in range(300)]
    night(junit / "1.xml", [Cell(m) for m in models], 1)
    night(junit / "2.xml", [fail(m, "forward", f"RuntimeError: cause {_word(n)}") for n, m in enumerate(models)], 2)
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    fake = FakeGitHub()
    serving = __import__("threading").Thread(target=fake.serve_forever, daemon=True)
    serving.start()
    import reports.outputs.github as github_module

    monkeypatch.setattr(github_module, "WRITE_SPACING_S", None)
    monkeypatch.setenv("GITHUB_API_URL", fake.url)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    try:
        assert main(["publish", "--store", str(store), "--out", str(tmp_path / "out"), "--repo", REPO]) == 0
    finally:
        fake.shutdown()
        monkeypatch.delenv("GITHUB_TOKEN")
    opened = [path for method, path in fake.requests if method == "POST" and path.endswith("/issues")]
    assert len(opened) == 6  # five causes and one summary of the other 295
    issues = sorted((tmp_path / "out" / "publish" / "issues").iterdir())
    assert len(issues) == 6 and issues[-1].name == "summary.md"
    summary = issues[-1].read_text()
    assert summary.startswith("# AutoTP matrix: 295 more causes of new regressions than one run opens issues for")
    assert summary.count("\n- AutoTP regression: forward: ") == 295
    assert main(["publish", "--store", str(store), "--out", str(tmp_path / "zero"), "--max-issues", "0"]) == 0
    assert [p.name for p in (tmp_path / "zero" / "publish" / "issues").iterdir()] == ["summary.md"]
    survives(tmp_path, store)


# ---- one command's outputs land together --------------------------------------------------------------------------


def test_an_output_that_cannot_be_written_leaves_every_earlier_output_as_it_was(tmp_path, capsys):
    junit = tmp_path / "results" / "junit"
    night(junit / "1.xml", [Cell("llama")], 1)
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    out = tmp_path / "out"
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    before = {name: (out / name).read_bytes() for name in inside(out) if name != "step-summary.md"}
    night(junit / "2.xml", [fail("llama", "forward")], 2)
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    (out / "report.html").unlink()
    (out / "report.html").mkdir()  # in the way of one output
    capsys.readouterr()
    assert main(["render", "--store", str(store), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {out / 'report.html'}" in err and len(err.splitlines()) == 1
    assert {name: (out / name).read_bytes() for name in before if name != "report.html"} == {
        name: data for name, data in before.items() if name != "report.html"
    }
    assert not [name for name in os.listdir(out) if name.startswith(".staging")]


def test_a_move_that_fails_midway_puts_back_what_the_others_replaced(tmp_path, monkeypatch):
    from reports.outputs.staging import staged

    out = tmp_path / "out"
    out.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (out / name).write_text(f"old {name}")
    real = os.replace
    calls = []

    def fails_on_the_third(source, target):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(target))
        return real(source, target)

    monkeypatch.setattr(os, "replace", fails_on_the_third)
    with pytest.raises(Exception, match="No space left on device"):
        with staged(out) as stage:
            for name in ("a.md", "b.md", "c.md", "d.md"):
                (stage / name).write_text(f"new {name}")
    monkeypatch.setattr(os, "replace", real)
    assert {name: (out / name).read_text() for name in sorted(os.listdir(out))} == {
        "a.md": "old a.md",
        "b.md": "old b.md",
        "c.md": "old c.md",
    }

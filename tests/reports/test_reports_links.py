"""What a maintainer clicks (issue #44): every path report.md/html/json print exists; every link of report.html and
the checkpoint pages resolves (a file or folder beside it, an anchor in the page) or is a well-formed URL; a
one-run history draws no timeline or trend; and, in headless Chromium, the first screen, a checkpoint page and the PR
comment as GitHub renders it (screenshots kept under $AUTOTP_TEST_ARTIFACTS)."""

import html
import json
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from reports_testkit import Cell, fail, write_junit
from test_reports_html import artifacts, chromium, needs_chromium

from reports.__main__ import main

PHI3 = "microsoft/Phi-3-mini-4k-instruct"
MAT1 = (
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (48x768 and 384x768) @ "
    "deepspeed/module_inject/layers.py:forward"
)
EXPERTS = "memory: experts left whole: model.layers.*.mlp.experts.{gate_up_proj,down_proj}"
KEPT_LOGS = ("phi3.faithful-eager-fp32-tp2", "mixtral.faithful-eager-fp32-tp3")
REAL_RESULTS = os.environ.get("AUTOTP_RESULTS")


def first_night(tmp_path: Path) -> Path:
    """A default-matrix-like first run at the tests' transformers (so render writes each failing cell's repro script):
    faithful cells standing for real checkpoints, failing with a forward and a memory cause, one passing; the run kept
    the logs of two of its failing cells."""
    cells = [
        *(fail("phi3.faithful", "forward", MAT1, tp=tp, checkpoints=(PHI3,)) for tp in (2, 3, 4)),
        *(fail("ctrl.faithful", "forward", MAT1, tp=tp, checkpoints=("Salesforce/ctrl",)) for tp in (2, 3)),
        *(
            fail("mixtral.faithful", "memory", EXPERTS, tp=tp, checkpoints=("mistralai/Mixtral-8x7B-v0.1",))
            for tp in (2, 3)
        ),
        *(Cell("llama.faithful", tp=tp, checkpoints=("meta-llama/Llama-2-7b-hf",)) for tp in (2, 3)),
    ]
    write_junit(
        tmp_path / "junit" / "matrix.xml",
        cells,
        run_id="matrix@2026-12-06T07:26:44Z@vm",
        started="2026-12-06T07:26:44Z",
        deepspeed="0.19.8",
        transformers="5.24.0",
        torch="2.13.0+cpu",
    )
    out = tmp_path / "results"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(out / "history.sqlite")]) == 0
    for cell in KEPT_LOGS:
        (out / "logs" / cell).mkdir(parents=True)
        (out / "logs" / cell / "rank0.log").write_text("the end of rank 0's log\n")
    assert main(["render", "--store", str(out / "history.sqlite"), "--out", str(out)]) == 0
    return out


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return first_night(tmp_path)


def markdown_paths(text: str) -> list[str]:
    """The relative link targets of a Markdown text (URLs left out)."""
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target]


def printed_paths(results: Path) -> list[str]:
    """Every relative path report.md links, report.json names for a failing cause or cell, report.html links."""
    failing = json.loads((results / "report.json").read_text())["failing_now"]
    printed = [
        path
        for cause in failing["causes"]
        for path in (
            cause["repro"]["logs"],
            cause["repro"]["script"],
            cause["draft"],
            *(p for member in cause["members"] for p in (member["logs"], member["script"])),
        )
        if path
    ]
    hrefs = [unquote(h) for h in re.findall(r'href="([^"#:]+)"', (results / "report.html").read_text())]
    return [*markdown_paths((results / "report.md").read_text()), *printed, *hrefs]


def test_every_path_a_report_prints_exists(results):
    paths = printed_paths(results)
    assert {"logs/phi3.faithful-eager-fp32-tp2/", "repro/repro_phi3.faithful-eager-fp32-tp2.py"} <= set(paths)
    assert {path for path in paths if path.startswith("logs/")} == {
        f"logs/{cell}/" for cell in KEPT_LOGS
    }  # a log folder is named only where the run kept one
    assert [path for path in paths if not (results / path).exists()] == []
    # The example cell of the forward cause stands for Phi-3-mini, the checkpoint users run most of the three
    failing = json.loads((results / "report.json").read_text())["failing_now"]
    forward = next(c for c in failing["causes"] if c["failure_class"] == "forward")
    assert forward["repro"]["cell"] == "phi3.faithful-eager-fp32-tp2" and forward["repro"]["checkpoints"] == [PHI3]


def page_links(page: Path) -> list[str]:
    return [html.unescape(link) for link in re.findall(r'<a [^>]*href="([^"]*)"', page.read_text())]


def link_kinds(results: Path) -> set[str]:
    """What report.html and the checkpoint pages link to (a folder, a host, "anchor"), asserting each link resolves:
    a file or folder beside the page, an element of the page, or a well-formed https URL."""
    kinds = set()
    for page in [results / "report.html", *sorted((results / "checkpoints").glob("*.html"))]:
        ids = set(re.findall(r'id="([^"]+)"', page.read_text()))
        for link in page_links(page):
            parts = urlsplit(link)
            if parts.scheme:
                assert parts.scheme == "https" and parts.netloc and " " not in link, f"{page.name}: {link}"
                kinds.add(parts.netloc)
            elif link.startswith("#"):
                assert link[1:] in ids, f"{page.name}: {link} names no element of the page"
                kinds.add("anchor")
            else:
                assert (page.parent / unquote(parts.path)).exists(), f"{page.name}: {link} does not exist"
                kinds.add(Path(parts.path).parts[0] if "/" in parts.path else parts.path)
    return kinds


def test_every_link_in_report_html_resolves_or_is_a_well_formed_url(results):
    assert len(list((results / "checkpoints").glob("*.html"))) == 4  # Phi-3-mini, CTRL, Mixtral, Llama-2
    # logs, repro scripts, draft issues, checkpoint pages, model cards, the cause anchors and the way back
    assert {"logs", "repro", "draft-issue", "checkpoints", "huggingface.co", "anchor", ".."} <= link_kinds(results)


@pytest.mark.skipif(
    not REAL_RESULTS, reason="AUTOTP_RESULTS (the results/ folder of a real `nox -s matrix`) is not set"
)
def test_every_printed_path_and_link_of_a_real_run_resolves():
    """The same checks on what a real run rendered (after `nox -s matrix`: AUTOTP_RESULTS=results)."""
    results = Path(REAL_RESULTS or "")
    assert [path for path in printed_paths(results) if not (results / path).exists()] == []
    assert {"repro", "draft-issue", "huggingface.co", "anchor"} <= link_kinds(results)


def test_a_one_run_history_draws_no_timeline_or_trend_and_says_so_once(results):
    page = (results / "report.html").read_text()
    assert "metric trend" not in page and "never changed" not in page and 'aria-label="per-cell timeline"' not in page
    assert "One version set so far" in page
    report = (results / "report.md").read_text()
    assert report.count("This is the first run in this history") == 1 and "since the first run" not in report
    assert "`nox -s backfill -- --axis deepspeed --since 0.14.4 --models ctrl,llama,mixtral,phi3 --tp 2,3,4`" in report


@needs_chromium
def test_the_first_screen_a_checkpoint_page_and_the_pr_comment_in_a_browser(results, tmp_path, monkeypatch):
    """What a maintainer looks at, rendered by Chromium: the report's first screen opens on what fails with links
    and words beside the icons; a checkpoint page; the PR comment as GitHub renders its Markdown."""
    from PIL import Image

    kept = artifacts(tmp_path)
    page = results / "report.html"
    dom = chromium(page, tmp_path / "profile", "--dump-dom").stdout
    assert re.findall(r"<h2[^>]*>([^<]*)</h2>", dom)[0] == "Failing now, by cause"
    assert "first run in this history" in dom
    first = kept / "report-first-screen.png"
    chromium(page, tmp_path / "profile", f"--screenshot={first}", "--window-size=1400,1000")
    assert len(Image.open(first).convert("RGB").getcolors(maxcolors=1 << 20)) > 20, "screenshot looks blank"

    checkpoint = results / "checkpoints" / "microsoft--Phi-3-mini-4k-instruct.html"
    dom = chromium(checkpoint, tmp_path / "profile", "--dump-dom").stdout
    assert re.search(r'<h1 id="checkpoint">microsoft/Phi-3-mini-4k-instruct</h1>', dom)
    assert dom.count('<span class="verdict fail"><span aria-hidden="true">❌</span> forward</span>') >= 3
    shot = kept / "checkpoint-page.png"
    chromium(checkpoint, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,800")
    assert len(Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)) > 20

    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    assert main(["publish", "--store", str(results / "history.sqlite"), "--out", str(tmp_path / "pub")]) == 0
    comment = (tmp_path / "pub" / "publish" / "comment.md").read_text()
    assert comment.splitlines()[1].startswith("**AutoTP matrix: no baseline, nothing compared** at deepspeed 0.19.8")
    rendered = tmp_path / "comment.html"
    rendered.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{font:14px system-ui;margin:24px;max-width:'
        "900px}</style></head><body>" + MarkdownIt("commonmark", {"html": True}).render(comment) + "</body></html>"
    )
    shot = kept / "pr-comment-first-run.png"
    chromium(rendered, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1000,300")
    assert len(Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)) > 10

    # The next night llama breaks at DeepSpeed's master: one new failure, expanded with its model card; the rest folded
    write_junit(
        tmp_path / "junit2" / "matrix.xml",
        [
            *(
                fail(
                    "llama.faithful",
                    "shard",
                    "AssertionError: heads % tp @ deepspeed/module_inject/auto_tp.py:f",
                    tp=tp,
                    checkpoints=("meta-llama/Llama-2-7b-hf",),
                )
                for tp in (2, 3)
            ),
            *(fail("phi3.faithful", "forward", MAT1, tp=tp, checkpoints=(PHI3,)) for tp in (2, 3, 4)),
        ],
        run_id="matrix@2026-12-07T07:26:44Z@vm",
        started="2026-12-07T07:26:44Z",
        deepspeed="0.19.9",
        deepspeed_git="abcdef1234",
        transformers="5.24.0",
        torch="2.13.0+cpu",
    )
    assert main(["merge", str(tmp_path / "junit2"), "--store", str(results / "history.sqlite")]) == 0
    assert main(["publish", "--store", str(results / "history.sqlite"), "--out", str(tmp_path / "pub")]) == 0
    comment = (tmp_path / "pub" / "publish" / "comment.md").read_text()
    assert comment.splitlines()[1].startswith("**AutoTP matrix: 2 new failures** at deepspeed 0.19.9@abcdef1234")
    assert "[meta-llama/Llama-2-7b-hf](https://huggingface.co/meta-llama/Llama-2-7b-hf)" in comment
    rendered.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{font:14px system-ui;margin:24px;max-width:'
        "900px}</style></head><body>" + MarkdownIt("commonmark", {"html": True}).render(comment) + "</body></html>"
    )
    shot = kept / "pr-comment.png"
    chromium(rendered, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1000,500")
    assert len(Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)) > 10

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from reports_testkit import issue_18_store, render

from reports.__main__ import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")


def test_html_is_self_contained(scenario, tmp_path):
    html_text = (render(scenario, tmp_path) / "report.html").read_text()
    # Links to GitHub are fine (a click), anything the page would fetch by itself is not.
    assert not re.search(r"""\bsrc\s*=\s*["']?(https?:)?//""", html_text), "report.html must not load anything"
    assert "<link" not in html_text and "<script" not in html_text
    assert "@import" not in html_text and "url(" not in html_text
    for part in ("support matrix heatmap", "per-cell timeline", "metric trend", "<polyline"):
        assert part in html_text


def chromium(page: Path, profile: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *options,
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


def artifacts(tmp_path: Path) -> Path:
    """Where screenshots are kept for a person to look at: $AUTOTP_TEST_ARTIFACTS (CI uploads it), else tmp_path."""
    folder = Path(os.environ.get("AUTOTP_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@needs_chromium
def test_html_renders_in_headless_chromium(scenario, tmp_path):
    from PIL import Image  # only needed here, to look at the screenshot

    page = render(scenario, tmp_path) / "report.html"
    screenshot = tmp_path / "report.png"
    chromium(page, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1200,900")
    image = Image.open(screenshot).convert("RGB")
    assert image.size == (1200, 900)
    assert len(image.getcolors(maxcolors=1 << 20)) > 20, "screenshot looks blank"


def text_of(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', dom, re.S)
    assert match, f"no element #{element_id} in the DOM"
    return html.unescape(match[1]).strip()


@needs_chromium
def test_multi_version_report_as_a_person_sees_it(tmp_path):
    """Issue #18's history in a real browser: version labels on the timeline's columns, the root-cause count, the
    first screen; the screenshot is kept as an artifact."""
    from PIL import Image

    store = issue_18_store(tmp_path)
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    page = tmp_path / "out" / "report.html"
    dom = chromium(page, tmp_path / "profile", "--dump-dom").stdout

    assert text_of(dom, "root-cause-count") == "2 root causes"  # 45 fixes and 3 regressions
    assert text_of(dom, "since-previous-run") == "3 new failures in 1 cause"
    timeline = dom.split('aria-label="per-cell timeline"', 1)[1].split("</thead>", 1)[0]
    groups = re.findall(r'<th colspan="(\d+)">([^<]*)</th>', timeline)
    assert groups == [("1", "transformers 5.23.0"), ("3", "transformers 5.24.0")]
    columns = re.findall(r'<th class="version" title="([^"]*)">([^<]*)</th>', timeline)
    assert [label for _, label in columns] == ["0.19.8", "0.17.6", "0.18.9", "0.19.8"]  # by version within a group
    assert columns[1][0] == "deepspeed 0.17.6, transformers 5.24.0, torch 2.13.0+cpu, python 3.11.7"
    hover = html.unescape(
        re.search(r'<td class="fail" title="(llama-eager-fp32-tp3 at deepspeed 0.18.9[^"]*)"', dom)[1]
    )
    assert hover == (
        "llama-eager-fp32-tp3 at deepspeed 0.18.9, transformers 5.24.0, torch 2.13.0+cpu, python 3.11.7: "
        "fail — shard: RuntimeError: split_with_sizes expects split_sizes to sum exactly to N (input "
        "tensor's size at dimension N), but got split_sizes=[N, N, N] @ "
        "deepspeed/module_inject/layers.py:uneven_partition — run "
        "autotp(ds0.18.9-tf5.24.0-pt2.13.0)@2026-12-02T00:00:00Z@vm"
    )
    assert len(re.findall(r"<details class=\"matrix\"", dom)) == 4  # a matrix per version combination

    screenshot = artifacts(tmp_path) / "report-issue-18.png"
    chromium(page, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1400,2000")
    image = Image.open(screenshot).convert("RGB")
    present = {colour for _, colour in image.getcolors(maxcolors=1 << 20)}
    assert (0x2D, 0xA4, 0x4E) in present and (0xCF, 0x22, 0x2E) in present  # pass and fail on screen


def test_answer_links_are_anchors_and_everything_else_is_escaped():
    from markupsafe import Markup

    from reports.outputs.links import linked_html

    lines = linked_html(lambda link: [f"<b>{link('#1 <x>', 'https://github.com/o/r/pull/1?a=1&b=2')}</b>"])
    assert lines == [Markup('&lt;b&gt;<a href="https://github.com/o/r/pull/1?a=1&amp;b=2">#1 &lt;x&gt;</a>&lt;/b&gt;')]


@needs_chromium
def test_failing_now_is_the_first_section_a_person_sees(tmp_path):
    """Issue #26's nightly (94 failures, 27 causes) after a release where llama failed a known way: in a real
    browser the page opens on "Failing now, by cause", one item per cause, new and known marked, the fixed known
    failure with its close link; the screenshot is kept as an artifact."""
    from PIL import Image
    from reports_testkit import fail, nightly_94, write_junit

    upstream = "https://github.com/example/upstream/issues/7"  # a stand-in, as in test_failing_now.py
    split = (
        "RuntimeError: split_with_sizes expects split_sizes to sum exactly to N @ deepspeed/module_inject/layers.py:f"
    )
    junit = nightly_94(tmp_path / "junit").parent
    write_junit(
        junit / "older.xml",
        [fail("llama", "shard", split, tp=tp) for tp in (2, 3, 4)],
        run_id="nightly@2026-12-01T00:00:00Z@vm",
        started="2026-12-01T00:00:00Z",
        deepspeed="0.19.7",
        transformers="5.24.0",
        torch="2.13.0+cpu",
    )
    registry = tmp_path / "known_failures.toml"
    registry.write_text(
        f'[known_failures.split]\nfailure_class = "shard"\nsignature = "split_with_sizes"\n'
        f'upstream = "{upstream}"\n\n[known_failures.experts]\nfailure_class = "memory"\n'
        f'signature = "experts not sharded"\nupstream = "{upstream.replace("7", "8")}"\n'
    )
    page = render(junit, tmp_path, "--known-failures", str(registry)) / "report.html"
    dom = chromium(page, tmp_path / "profile", "--dump-dom").stdout

    assert text_of(dom, "failing-now-summary") == (
        "94 cells fail in 27 causes at the latest versions: 26 new, 1 known; 1 known failure fixed: close upstream"
    )
    headings = re.findall(r"<h2[^>]*>([^<]*)</h2>", dom)
    assert headings[:2] == ["Failing now, by cause", "Since the previous run of each session"]
    items = re.findall(r'<li id="failing-[0-9a-f]{12}"><strong class="status-(\w+)">', dom)
    assert len(items) == 27 and items.count("known") == 1 and items[-1] == "known"  # new ones first
    assert '<code class="repro">nox -s repro -- --models opt.stress --variants eager --dtypes fp32 --tp 2</code>' in dom
    fixed = re.search(r'<ul id="fixed-known"><li>(.*?)</li>', dom, re.S)[1]
    assert fixed.startswith(f'fixed at deepspeed 0.19.8: close <a href="{upstream}">example/upstream#7</a>')

    screenshot = artifacts(tmp_path) / "report-failing-now.png"
    chromium(page, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1400,1000")
    image = Image.open(screenshot).convert("RGB")
    present = {colour for _, colour in image.getcolors(maxcolors=1 << 20)}
    assert (0xCF, 0x22, 0x2E) in present  # "new" in red on the first screen
    top = image.crop((0, 0, 1400, 120))  # the heading and the summary are on screen, not below it
    assert len(top.getcolors(maxcolors=1 << 20)) > 10


def test_html_draws_the_newest_matrices_and_version_sets_and_names_the_details_file(tmp_path, monkeypatch):
    """report.html is paged like report.json: past HTML_MATRICES combinations and HTML_TIMELINE_SETS version sets it
    draws the newest and says where the rest is; report-details.json keeps every one."""
    import reports.outputs.html

    store = issue_18_store(tmp_path)
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "whole")]) == 0
    whole = (tmp_path / "whole" / "report.html").read_text()
    assert "older-matrices" not in whole and "older-version-sets" not in whole  # 4 of each: all drawn

    monkeypatch.setattr(reports.outputs.html, "HTML_MATRICES", 1)
    monkeypatch.setattr(reports.outputs.html, "HTML_TIMELINE_SETS", 2)
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "paged")]) == 0
    paged = (tmp_path / "paged" / "report.html").read_text()
    details = json.loads((tmp_path / "paged" / "report-details.json").read_text())
    assert len(details["matrices"]) == 4 and len(details["timeline"]["columns"]) == 4
    assert len(re.findall(r'<details class="matrix"', paged)) == 1
    assert "3 older version combinations not drawn here: every combination's matrix is in" in paged
    assert "The newest 2 of 4 version sets; every one is in" in paged
    timeline = paged.split('aria-label="per-cell timeline"', 1)[1].split("</thead>", 1)[0]
    titles = re.findall(r'<th class="version" title="([^"]*)">', timeline)
    assert sorted(html.unescape(title) for title in titles) == sorted(details["timeline"]["version_sets"][-2:])

    # the page before the support matrix is the same (generated_at aside)
    def first_part(page: str) -> str:
        return re.sub(r"generated [^<]*", "", page.split("<h2>Support matrix</h2>")[0])

    assert first_part(paged) == first_part(whole)

"""Issue #41 ("the house"): text from the results shaped like the harness's own links and HTML — a relative file link
(`[logs](logs/x/)`), a DeepSpeed source or pull-request link, a model card, `<a href>` inside such a link's text, the
harness's markers and frames — stays text in every output, while the links the harness writes itself stay links.
Crafted through the real path: a run's JUnit (signature, message, a cause's words and break point) and an answer's
commit subject, merged into the store, then render, publish and draft-issue. (A model name cannot carry them: merge
refuses one that is no name, test_hostile_input.)"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, markdown_tokens, write_junit

from reports.__main__ import main
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey

# Every target and tag the results carry says "forged": a live link or tag saying it came from the results.
FORGED = (
    "see [logs](logs/forged/) [source](https://github.com/deepspeedai/DeepSpeed/blob/v0.19.8/deepspeed/forged.py) "
    "[#77](https://github.com/deepspeedai/DeepSpeed/pull/77#forged) "
    "https://github.com/deepspeedai/DeepSpeed/issues/1#forged [card](https://huggingface.co/forged/model) "
    "[draft](draft-issue/forged.md) [script](repro/forged.py) [page](checkpoints/forged) "
    "[<a href=logs/forged/>x</a>](logs/x/) [<img src=https://huggingface.co/forged/i>](logs/y/) "
    "<!-- autotp-matrix:publish --> <details><summary>forged</summary> </details>"
)
CELL = "qwen2.faithful-eager-fp32-tp2"
CAUSE = {
    "cause.key": "left whole|norm",
    "cause.words": f"`self_attn.q_norm.weight` left whole {FORGED}",
    "cause.whose": "autotp",
    "broke_at.path": f"model.layers.0.self_attn.q_norm {FORGED}",
    "broke_at.module_class": "Qwen2RMSNorm",
    "broke_at.layer_class": "",
    "broke_at.how": "raised",
    "broke_at.origin": "model.layers.0.self_attn.q_norm",
    "broke_at.origin_class": "Qwen2RMSNorm",
    "broke_at.detail": "",
}
BARE_FORGED_URL = re.compile(r"https?://\S*forged")


pytestmark = pytest.mark.usefixtures("no_github")


def forged_markdown(markdown: str) -> list[str]:
    """What GitHub would act on that came from the results: a link to or an image of a forged target, HTML that
    says forged, a bare forged URL in text (GitHub links bare URLs)."""
    found = []
    for token in markdown_tokens(markdown):
        if token.type == "link_open" and "forged" in str(token.attrs.get("href")):
            found.append(f"link {token.attrs.get('href')}")
        elif token.type == "image":
            found.append(f"image {token.attrs.get('src')}")
        elif token.type in ("html_inline", "html_block") and "forged" in token.content:
            found.append(f"html {token.content.strip()[:80]}")
        elif token.type == "text" and (bare := BARE_FORGED_URL.search(token.content)):
            found.append(f"bare link {bare.group()}")
    return found


def links(markdown: str) -> set[str]:
    """The targets of the live links."""
    return {str(token.attrs.get("href")) for token in markdown_tokens(markdown) if token.type == "link_open"}


class Tags(HTMLParser):
    """The start tags of an HTML page, with their attributes."""

    def __init__(self, page: str):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {name: value or "" for name, value in attrs}))


@pytest.fixture
def published(tmp_path) -> Path:
    """A history whose failing cell's texts and whose answer's commit subject carry FORGED, rendered, published and
    drafted into one folder."""
    junit = tmp_path / "results" / "junit"
    versions = dict(transformers="5.24.0")  # the installed one: render writes the repro scripts and draft issues
    cells = [Cell("qwen2.faithful"), Cell("llama"), Cell("opt")]
    write_junit(junit / "1.xml", cells, run_id="nightly@2025-01-01T00:00:00Z@runner-1", started="2025-01-01T00:00:00Z",
                deepspeed="0.19.1", **versions)  # fmt: skip
    broken = [
        fail("qwen2.faithful", "forward", f"RuntimeError: {FORGED}", properties=CAUSE),
        Cell("llama"),
        Cell("opt"),
    ]
    write_junit(junit / "2.xml", broken, run_id="nightly@2025-01-02T00:00:00Z@runner-1", started="2025-01-02T00:00:00Z",
                deepspeed="0.19.2", **versions)  # fmt: skip
    newly = fail("opt", "shard", f"RuntimeError: new {FORGED}", message=f"Traceback\n{FORGED}\n{FORGED}")
    again = [fail("qwen2.faithful", "forward", f"RuntimeError: {FORGED}", message=f"Traceback\n{FORGED}",
                  properties=CAUSE), Cell("llama"), newly]  # fmt: skip
    write_junit(junit / "3.xml", again, run_id="nightly@2025-01-03T00:00:00Z@runner-1", started="2025-01-03T00:00:00Z",
                deepspeed="0.19.3", **versions)  # fmt: skip
    flaky = [fail("llama", "forward", f"RuntimeError: flaky {FORGED}")]  # passed in the nightly at these versions
    write_junit(junit / "4.xml", flaky, run_id="other@2025-01-03T01:00:00Z@runner-2", started="2025-01-03T01:00:00Z",
                deepspeed="0.19.3", host="runner-2", **versions)  # fmt: skip
    store = tmp_path / "results" / "history.sqlite"
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    with HistoryStore(store, create=False) as history:
        history.add_bisection(
            Bisection(
                CellKey("qwen2.faithful", "eager", "fp32", 2),
                "broken",
                "deepspeed",
                "0.19.1",
                "0.19.2",
                (("transformers", "5.24.0"), ("torch", "2.4.0")),
                "forward",
                f"RuntimeError: {FORGED}",
                "a" * 40,
                f"Refactor {FORGED} (#77)",
                77,
                kind="broke",
                recorded_at="2025-01-04T00:00:00+00:00",
            )
        )
    out = tmp_path / "out"
    (out / "logs" / CELL).mkdir(parents=True)
    (out / "logs" / CELL / "rank0.log").write_text("rank 0\n")
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    assert main(["publish", "--store", str(store), "--out", str(out), "--upstream", "deepspeedai/DeepSpeed"]) == 0
    assert main(["draft-issue", "--cell", CELL, "--store", str(store), "--out", str(out / "cli")]) == 0
    return out


def test_harness_shaped_links_and_html_from_the_results_are_text_in_every_markdown_output(published):
    outputs = {str(p.relative_to(published)): p.read_text() for p in published.rglob("*.md")}
    assert {"report.md", "step-summary.md", "supported-models.md", "publish/comment.md"} <= set(outputs)
    assert any(name.startswith("publish/issues/") for name in outputs)
    assert any(name.startswith("publish/upstream/") for name in outputs)
    assert any(name.startswith("draft-issue/") for name in outputs)
    assert any(name.startswith("cli/draft-issue/") for name in outputs)
    # An issue's title (the file's first line) is no markdown on GitHub: its text is shown as it is.
    titled = ("publish/issues/", "publish/upstream/", "draft-issue/", "cli/draft-issue/")
    bodies = {name: text.split("\n\n", 1)[1] if name.startswith(titled) else text for name, text in outputs.items()}
    assert {name: forged_markdown(text) for name, text in bodies.items()} == {name: [] for name in outputs}
    assert "forged" in outputs["report.md"]  # the results' text is there, as text
    assert not [name for name, text in outputs.items() if "\x1f" in text]  # no mark of the harness's is left


def test_the_harness_links_stay_links(published):
    report = links((published / "report.md").read_text())
    assert {
        f"logs/{CELL}/",
        f"repro/repro_{CELL}.py",
        "https://github.com/deepspeedai/DeepSpeed/commit/" + "a" * 40,
        "https://github.com/deepspeedai/DeepSpeed/pull/77",
    } <= report
    assert any(href.startswith("draft-issue/forward-") for href in report)
    summary = links((published / "step-summary.md").read_text())  # read in the Actions UI: absolute links only
    assert all(href.startswith("https://") for href in summary)  # none of report.md's relative ones
    (draft,) = (published / "draft-issue").glob("forward-*.md")  # the qwen2 cause's
    assert "https://huggingface.co/Qwen/Qwen2-7B" in links(draft.read_text())
    assert "\n```python\n# [BUG] AutoTP: " in draft.read_text()  # the minimal script, a fence of its own
    (issue,) = (published / "publish" / "issues").glob("shard-*.md")  # opt's new failure
    compare = "https://github.com/deepspeedai/DeepSpeed/compare/v0.19.2...v0.19.3"
    assert f"({compare})" in issue.read_text()  # a bare link GitHub links, not in a code span


def test_nothing_from_the_results_is_a_tag_in_the_html_pages(published):
    pages = {str(p.relative_to(published)): p.read_text() for p in published.rglob("*.html")}
    tags = {name: Tags(page).tags for name, page in pages.items()}
    targets = {name: [t for t in found if any("forged" in t[1].get(a, "") for a in ("href", "src"))]
               for name, found in tags.items()}  # fmt: skip
    assert targets == {name: [] for name in pages}
    crafted = ("<a href=logs/forged/>", "<img src=https://huggingface.co/forged/i>", "<summary>forged")
    assert {name: [tag for tag in crafted if tag in page] for name, page in pages.items()} == {n: [] for n in pages}
    assert ("a", {"href": f"logs/{CELL}/"}) in tags["report.html"]

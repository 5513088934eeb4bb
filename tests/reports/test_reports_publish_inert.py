"""Publish is inert text (issue #25): what GitHub would act on — @mentions, images, raw HTML, and (issue #53) issue
references and the bidirectional and zero-width characters that change how text reads — never comes through from the
results. JUnit fields are validated at merge (failure classes from the known set, names, commits) or put
in code spans; a final pass neutralises whatever another source (a commit subject, an old store) brings. Checked
with a CommonMark parser (markdown-it-py), independently of how publish finds code spans."""

from __future__ import annotations

import re
import sqlite3

import pytest
from reports_testkit import Cell, fail, markdown_tokens, write_junit

from reports.__main__ import main
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey

HOSTILE = (
    "@deepspeedai/maintainers ![x](https://tracker.example/p.png) <img src=https://tracker.example/q.png> cc @someone"
    " é@octocat a.@octocat see owner/repo#12, #34 and GH-5 \u202eevil\u200b"
)
# GitHub's rules: a mention after anything but an ASCII letter, digit or `_`; a reference `#N`, `owner/repo#N`, `GH-N`.
MENTION = re.compile(r"(?<![A-Za-z0-9_])@[A-Za-z0-9]")
REFERENCE = re.compile(r"(?<![A-Za-z0-9_&])(?:[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+)?#[0-9]+|(?i:\bgh-[0-9]+)")
INVISIBLE = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


pytestmark = pytest.mark.usefixtures("no_github")


def active_parts(markdown: str) -> list[str]:
    """What GitHub would act on: text (outside code) with a mention, images, and HTML other than our markers."""
    found, in_link = [], False
    for token in markdown_tokens(markdown):
        if token.type == "image":
            found.append(f"image {token.attrs.get('src')}")
        elif token.type in ("html_inline", "html_block") and not token.content.startswith("<!-- autotp-matrix:"):
            found.append(f"html {token.content.strip()}")
        elif token.type == "text" and MENTION.search(token.content):
            found.append(f"mention in {token.content!r}")
        elif token.type == "text" and REFERENCE.search(token.content) and not in_link:  # none in a link's text
            found.append(f"reference in {token.content!r}")
        in_link = token.type == "link_open" or in_link and token.type != "link_close"
    found += [f"invisible {character!r}" for character in INVISIBLE.findall(markdown)]
    return found


def nightlies(tmp_path, signature: str):
    for n, cells in enumerate(
        ([Cell("llama"), Cell("opt")], [fail("llama", "forward", signature), fail("opt", "shard")]), 1
    ):
        write_junit(
            tmp_path / "junit" / f"nightly{n}.xml",
            cells,
            run_id=f"nightly@2025-01-0{n}T00:00:00Z@runner-1",
            started=f"2025-01-0{n}T00:00:00Z",
            deepspeed=f"0.19.{n}",
        )


def test_mentions_images_and_html_from_the_results_are_inert(tmp_path):
    nightlies(tmp_path, f"RuntimeError: {HOSTILE}")
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    with HistoryStore(store, create=False) as history:  # an answer whose commit subject mentions people
        history.add_bisection(
            Bisection(
                CellKey("llama", "eager", "fp32", 2),
                "broken",
                "deepspeed",
                "0.19.1",
                "0.19.2",
                (("transformers", "4.44.0"), ("torch", "2.4.0")),
                "forward",
                f"RuntimeError: {HOSTILE}",
                "a" * 40,
                f"Refactor attention {HOSTILE} (#77)",
                77,
                recorded_at="2025-01-03T00:00:00+00:00",
                kind="broke",
            )
        )
    with sqlite3.connect(store) as conn:  # a class stored before merge validated them
        conn.execute(
            "UPDATE results SET failure_class = ? WHERE cell IN (SELECT id FROM cells WHERE model = 'opt')",
            (f"shard {HOSTILE}",),
        )
    assert main(["publish", "--store", str(store), "--out", str(out), "--upstream", "deepspeedai/DeepSpeed"]) == 0

    comment = (out / "publish" / "comment.md").read_text()
    issues = [path.read_text().removeprefix("# ").split("\n\n", 1) for path in (out / "publish" / "issues").iterdir()]
    assert len(issues) == 2 and "tracker.example" in comment  # the hostile text is there, inert
    assert active_parts(comment) == []
    for title, body in issues:
        assert active_parts(body) == []
        assert MENTION.findall(re.sub(r"`[^`]*`", "", title)) == []  # titles render code spans, nothing else
        assert REFERENCE.findall(re.sub(r"`[^`]*`", "", title)) == [] and INVISIBLE.findall(title) == []
    llama = next(body for _, body in issues if "llama-eager-fp32-tp2" in body)
    assert "Refactor attention `@deepspeedai/maintainers`" in llama  # the subject's mention, put in a code span
    assert "é`@octocat` a.`@octocat` see `owner/repo#12`, `#34` and `GH-5` ⟨U+202E⟩evil⟨U+200B⟩" in llama
    # The report for DeepSpeed's tracker (draft-issue's text): inert too, all of it.
    ((title, body),) = [
        path.read_text().removeprefix("# ").split("\n\n", 1) for path in (out / "publish" / "upstream").glob("*.md")
    ]
    assert "tracker.example" in body
    assert active_parts(body) == []
    assert MENTION.findall(re.sub(r"`[^`]*`", "", title)) == []
    assert "Refactor attention `@deepspeedai/maintainers`" in body


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("failure_class", "forward @org/team", "failure_class='forward @org/team' is not one of setup, shard"),
        ("cell.model", "llama![x](u)", "cell.model='llama![x](u)' is not a name"),
        ("version.deepspeed_git", "@org", "version.deepspeed_git='@org' is not a git commit"),
    ],
)
def test_merge_rejects_fields_that_are_not_what_the_harness_writes(tmp_path, capsys, field, value, error):
    path = write_junit(
        tmp_path / "junit" / "s.xml",
        [fail("llama", "forward")],
        run_id="s@2025-01-01T00:00:00Z@r",
        started="2025-01-01T00:00:00Z",
        deepspeed="0.18.1+abc1234",
        harness_git=None,
    )
    text = path.read_text()
    old = {
        "failure_class": 'name="failure_class" value="forward"',
        "cell.model": 'name="cell.model" value="llama"',
        "version.deepspeed_git": 'name="version.deepspeed_git" value=""',
    }[field]
    assert old in text
    replaced = old.rsplit('value="', 1)[0] + f'value="{value}"'
    if field == "cell.model":  # the id must still match its parts
        text = text.replace('value="llama-eager-fp32-tp2"', f'value="{value}-eager-fp32-tp2"')
    path.write_text(text.replace(old, replaced))
    assert main(["merge", str(path), "--store", str(tmp_path / "history.sqlite")]) == 2
    assert error in capsys.readouterr().err


def test_render_shows_bidirectional_and_zero_width_characters_by_name_in_every_output(tmp_path, capsys):
    """report.md, report.html, the checkpoint pages and the step summary: the characters a result brings are shown
    by name (in HTML, through every value the templates write), never as they are."""
    nightlies(tmp_path, f"RuntimeError: {HOSTILE}")
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    outputs = {path.name: path.read_text() for path in out.rglob("*") if path.suffix in (".md", ".html")}
    assert {name: INVISIBLE.findall(text) for name, text in outputs.items() if INVISIBLE.search(text)} == {}
    for name in ("report.md", "report.html"):
        assert "⟨U+202E⟩evil⟨U+200B⟩" in outputs[name], name
    assert [part for part in active_parts(outputs["report.md"]) if "details" not in part] == []
    assert INVISIBLE.findall(capsys.readouterr().out) == []  # the failing-now section render prints

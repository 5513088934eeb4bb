"""One name per cause in everything that leaves the harness, over a cut of a real default matrix run
(fixtures/fresh_default/matrix.xml: ten cells of main's default matrix at DeepSpeed 0.19.8 and transformers 5.25.0,
as its JUnit recorded them). The cut holds five causes and a pass: falcon-7b and starcoder's kv-unit crash (two
architectures, one cause, its error text `split_with_sizes …`), gemma's idle ranks (the same kv-unit split, another
cause), jamba's mamba mixer (the same `split_with_sizes` error text at tp 2, another one at tp 3: one cause),
diffllama's head pairs (one cause of two classes: numerics at tp 2, forward at tp 3) and gpt2's refusal
(no mechanism located: named by its reason).

Every consumer is rendered from the store: report.md/.json/.html, the step summary, supported-models.md, the PR
comment and the draft issues; each cause must be named by the same words in all of them (its classes too: the PR
comment names a cause of two classes as the report does), and a failing cell's verdict line must name its cause, never
stand for it with its error text."""

import html
import json
import shutil
from pathlib import Path

import pytest

from reports.__main__ import main
from reports.analysis import shortened

CUT = Path(__file__).parent / "fixtures" / "fresh_default"
KV_CRASH = "fewer kv heads than ranks crashes attention that hard-codes its kv split"
KV_IDLE = "fewer kv heads than ranks leaves ranks idle, without query heads"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The cut merged into a store, rendered, and published (a first run: its comment folds what fails)."""
    tmp_path = tmp_path_factory.mktemp("cause-names")
    shutil.copytree(CUT, tmp_path / "junit")
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    assert main(["publish", "--store", str(store), "--out", str(tmp_path / "published")]) == 0
    return tmp_path


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_every_consumer_names_each_cause_alike(rendered):
    out = rendered / "out"
    causes = json.loads(_read(out / "report.json"))["failing_now"]["causes"]
    titles = {cause["id"]: cause["title"] for cause in causes}
    assert KV_CRASH in titles.values() and KV_IDLE in titles.values()
    assert "numerics, forward" in {cause["failure_class"] for cause in causes}
    assert len(set(titles.values())) == len(titles), "two causes share one name"
    report, summary = _read(out / "report.md"), _read(out / "step-summary.md")
    page = html.unescape(_read(out / "report.html"))
    comment = _read(rendered / "published" / "publish" / "comment.md")
    for cause in causes:
        name = f"{cause['failure_class']}: {cause['title']}"
        for output, text in (("report.md", report), ("step summary", summary), ("PR comment", comment)):
            assert name in text, f"{output} does not name cause {cause['id']} {name!r}"
        assert cause["title"] in page, f"report.html does not name cause {cause['id']}"
        assert f"**cause {cause['id']}** {name}" in comment


def test_a_draft_issue_is_titled_by_the_same_name(rendered, capsys):
    causes = json.loads(_read(rendered / "out" / "report.json"))["failing_now"]["causes"]
    drafted = [cause for cause in causes if cause["status"] == "new"]
    assert len(drafted) == 4  # gpt2's refusal is unsupported upstream: no bug report
    for cause in drafted:
        store = str(rendered / "history.sqlite")
        assert main(["draft-issue", "--cause", cause["id"], "--store", store, "--out", str(rendered / "drafts")]) == 0
        title = capsys.readouterr().out.splitlines()[0]
        assert title.startswith(f"# [BUG] AutoTP: {cause['title']} ("), title


def test_a_failing_verdict_names_its_cause_not_its_error_text(rendered):
    out = rendered / "out"
    report, docs = _read(out / "report.md"), _read(out / "supported-models.md")
    falcon = next(line for line in report.splitlines() if line.startswith("- `tiiuae/falcon-7b`"))
    numbers = {
        line.split(". ", 1)[0]: line
        for line in report.split("## Failing now, by cause")[1].splitlines()
        if ". **" in line
    }
    crash = next(number for number, line in numbers.items() if KV_CRASH in line)
    assert f"tp 2: ❌ forward: {KV_CRASH} (cause {crash})" in falcon
    assert "split_with_sizes" not in falcon
    jamba = next(line for line in report.splitlines() if line.startswith("- jamba architecture"))
    assert "split_with_sizes" not in jamba and jamba.count("(cause ") == 2
    docs_falcon = next(line for line in docs.splitlines() if line.startswith("- `tiiuae/falcon-7b`"))
    assert f"tp 2: ❌ forward: {KV_CRASH}" in docs_falcon and "(cause " not in docs_falcon
    assert f"falcon-7b fails at tp 2, 3: {KV_CRASH}" in docs


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("RuntimeError: split_with_sizes expects split_sizes to sum", 31, "RuntimeError: split_with_sizes…"),
        ("a `code span that is long` after", 20, "a…"),
        ("short", 10, "short"),
        ("unbroken_word_far_too_long", 10, "…"),
    ],
)
def test_shortened_cuts_at_a_word_boundary(text, limit, expected):
    cut = shortened(text, limit)
    assert cut == expected and len(cut) <= limit

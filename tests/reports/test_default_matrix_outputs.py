"""What leaves the harness, read over the default matrix's real results: every failing cell of a real `nox -s matrix`
run (DeepSpeed 0.19.8, transformers 5.25.0: tests/suites/data/default_matrix_failures.json, its class, signature, AutoTP
record and break point) and every other cell of the default matrix passing, recorded by the suites' recorder with the
cause suites/verdicts/mechanism.py gives it, merged and rendered as `nox -s matrix` does.

- each checkpoint page shows its own cells: their own symptom and the command that runs that very cell;
- the step summary fits a screen (≤ 40 lines) and links only absolutely (the Actions UI resolves no relative link);
- a cause's sentence holds for every cell of it, the class said once;
- the supported-models page lists no family as working whose checkpoints fail at any tp, and its diff applies to
  DeepSpeed's page."""

import ast
import html
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from reports_testkit import render
from test_reports_checkpoints import run_cells

from matrix.cells import DEFAULT_MODELS
from matrix.json_records import read_record
from reports.__main__ import main
from reports.analysis import console_lines
from reports.outputs.draft_issue import installed_transformers
from reports.outputs.model import read_report
from reports.store import CellKey
from suites.verdicts.mechanism import AutoTPRecord, BreakPoint, Failure, cause_of
from suites.verdicts.outcome import CellOutcome

FAILURES = Path(__file__).parents[1] / "suites" / "data" / "default_matrix_failures.json"
DOCS = Path(__file__).parent / "fixtures" / "automatic-tensor-parallelism.md"
# a real `nox -s remedy` results folder: its remedies.json and its runs without a remedy (fixtures/README.md)
REMEDY_RESULTS = Path(__file__).parent / "fixtures" / "remedy-results"
# At the installed transformers (the run's was 5.25.0), so render writes the repro scripts and draft issues too.
VERSIONS = {
    "deepspeed": "0.19.8",
    "transformers": installed_transformers(),
    "torch": "2.13.0",
    "python": "3.11.7",
    "deepspeed_git": "",
}
RUN = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "example/autotp", "GITHUB_RUN_ID": "4242"}


def real_outcome(failures: dict) -> Callable[[str], CellOutcome]:
    """The recorded outcome of each default-matrix cell: its real failure, with the cause the driver gives it."""

    def outcome_of(cell_id: str) -> CellOutcome:
        model, tp = re.fullmatch(r"(.+)-eager-fp32-tp(\d)", cell_id).groups()
        failure = failures.get(f"{model}-tp{tp}")
        if failure is None:
            return CellOutcome("pass", metrics={"logits_max_abs": 1e-7})
        autotp = read_record(AutoTPRecord, failure["autotp"]) if failure["autotp"] else None
        broke_at = read_record(BreakPoint, failure["broke_at"]) if failure["broke_at"] else None
        found = Failure(failure["failure_class"], failure["signature"], autotp, broke_at)
        return CellOutcome(
            "fail",
            failure["failure_class"],
            failure["signature"],
            message=failure["signature"],
            autotp=autotp,
            broke_at=broke_at,
            cause=cause_of(found),
        )

    return outcome_of


@pytest.fixture(scope="module")
def default_matrix(tmp_path_factory):
    """The default matrix's real results rendered in Actions (the run's variables set), and its docs diff, with the
    proofs of a real `nox -s remedy` (four patches verified) merged into the store and their results folder deleted
    before the render: the report reads them from the history alone."""
    tmp_path = tmp_path_factory.mktemp("default-matrix")
    (tmp_path / "out").mkdir()
    remedy_results = shutil.copytree(REMEDY_RESULTS, tmp_path / "remedy-results")
    assert main(["merge", str(remedy_results), "--store", str(tmp_path / "history.sqlite")]) == 0
    shutil.rmtree(remedy_results)
    failures = json.loads(FAILURES.read_text())
    junit = run_cells(
        tmp_path,
        models=DEFAULT_MODELS,
        tp="2,3,4",
        shapes="faithful",
        outcome=real_outcome(failures),
        versions=VERSIONS,
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in RUN.items():
            patch.setenv(name, value)
        patch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        out = render(junit, tmp_path, "--docs", str(DOCS))
    return out, failures


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_every_checkpoint_page_shows_its_own_cells_with_their_own_symptom_and_command(default_matrix):
    out, failures = default_matrix
    pages = sorted((out / "checkpoints").glob("*.html"))
    assert len(pages) > 20
    report = json.loads((out / "report.json").read_text())
    cause_of_cell = {cell: cause for cause in report["failing_now"]["causes"] for cell in cause["cells"]}
    checked = 0
    for page in pages:
        source = page.read_text()
        own = re.search(r"\(cells ([^)]*)\)</div>", source)[1].split(", ")
        failing_own = {cell for cell in own if cell in cause_of_cell}
        listed = re.findall(r"<li>([^<:]+): (.*?) — runs alone: <code>([^<]+)</code>", source)
        assert {cell for cell, _, _ in listed} == failing_own, page.name  # each failing cell of its own, no other
        for cell, symptom, command in listed:
            model, variant, dtype, tp = re.fullmatch(
                r"nox -s repro -- --models (\S+) --variants (\S+) --dtypes (\S+) --tp (\d)", html.unescape(command)
            ).groups()
            assert CellKey(model, variant, dtype, int(tp)).id == cell, (page.name, command)  # runs this very cell
            failure = failures[f"{model}-tp{tp}"]
            assert text_of(symptom).startswith(f"{failure['failure_class']}: "), (page.name, symptom)  # its own class
            assert f"{failure['failure_class']}: {failure['failure_class']}:" not in text_of(symptom)  # said once
            checked += 1
    assert checked >= 20
    # falcon-7b fails at tp 2, 3, 4 with `forward` in a cause whose example is another model's memory finding
    falcon = text_of((out / "checkpoints" / "tiiuae--falcon-7b.html").read_text())
    assert "--models gemma" not in falcon and "--models falcon.faithful" in falcon
    assert "falcon.faithful-eager-fp32-tp3: forward: " in falcon and "1 kv head < tp 3, so ranks 1..2 hold" in falcon


DRAFT_TITLE = re.compile(r"# \[BUG\] AutoTP: [^\n…]+ \(\w+, tp [\d/]+, DeepSpeed [\d.]+, transformers [\d.]+\)")
HARNESS_WORDS = re.compile(
    r"\.faithful|\.stress|nox -s|autotp-matrix|\bsuites/|\breports/|\bsessions/|\bmatrix/|conftest|cell_runner|"
    r"RESULT: MISMATCH \(|\bharness\b"
)
ABSOLUTE_PATH = re.compile(r"(?<![\w.\-])/[\w.+-]+/[\w./+-]*")


def draft_problems(draft: str, saved: dict[str, str]) -> list[str]:
    """What stops a triager filing a draft issue as is: a cut or harness-made title, a minimal script over 40 lines,
    not Python or not the one saved beside it, an absolute path or a harness name anywhere (a log excerpt's frames
    included)."""
    problems = []
    title = draft.splitlines()[0]
    if not DRAFT_TITLE.fullmatch(title):
        problems.append(f"title {title!r}")
    name = re.search(r"Save as `([^`]+)`", draft)
    script = re.search(r"\*\*To Reproduce\*\*.*?```python\n(.*?)```", draft, re.S)
    if not name or not script:
        return [*problems, "no minimal script"]
    lines = script[1].splitlines()
    if len(lines) > 40:
        problems.append(f"minimal script of {len(lines)} lines")
    try:
        ast.parse(script[1])
    except SyntaxError as error:
        problems.append(f"minimal script is not Python: {error}")
    if saved.get(name[1]) != script[1]:
        problems.append(f"{name[1]} is not the script the draft shows")
    without_links = re.sub(r"https?://\S+", "", draft)
    problems += [f"absolute path {path!r}" for path in ABSOLUTE_PATH.findall(without_links)]
    problems += [f"harness name {word!r}" for word in HARNESS_WORDS.findall(draft)]
    return problems


def test_every_draft_issue_can_be_filed_as_is(default_matrix):
    out, _ = default_matrix
    report = json.loads((out / "report.json").read_text())
    drafted = [c for c in report["failing_now"]["causes"] if c["status"] == "new"]
    drafts = sorted((out / "draft-issue").glob("*.md"))
    assert len(drafts) == len(drafted) >= 15
    saved = {path.name: path.read_text() for path in (out / "draft-issue").glob("*.py")}
    problems = {path.name: draft_problems(path.read_text(), saved) for path in drafts}
    assert not any(problems.values()), {name: found for name, found in problems.items() if found}
    # the check can fail: a cut title, a long script, a host path and a harness frame are each found
    title, rest = drafts[0].read_text().split("\n", 1)
    planted = f"{title[:60]}…\n" + rest.replace("import torch\n", "import torch\n" + "pass\n" * 40, 1)
    planted += '\n  File "/work/wt/x/suites/checks/sharding.py", line 75, in tp_parser\n'
    found = " ".join(draft_problems(planted, saved))
    assert all(word in found for word in ("title", "lines", "absolute path", "harness name 'suites/'")), found


def test_a_causes_sentence_holds_for_every_cell_of_it(default_matrix):
    out, _ = default_matrix
    causes = json.loads((out / "report.json").read_text())["failing_now"]["causes"]
    starved = next(c for c in causes if "kv-head units" in c["mechanism"] and "idle" in c["mechanism"])
    assert {cell.split(".", 1)[0] for cell in starved["cells"]} >= {"gemma", "glm"}
    # glm has 2 kv heads: no count of one model is said of all
    assert "kv head <" not in starved["mechanism"] and "ranks past the kv-head count" in starved["mechanism"]
    for cause in causes:  # one model's mechanism in one model's words; the class once
        models = {cell.split(".", 1)[0] for cell in cause["cells"]}
        if len(models) > 1 and cause["mechanism"]:
            assert not re.search(r"\b\d+ (kv )?heads?\b|ranks \d", cause["mechanism"]), cause["mechanism"]
    printed = (out / "report.md").read_text()
    assert "memory: memory:" not in printed and "forward: forward:" not in printed
    # severity first: no memory-only cause above a wrong output or a crash
    order = [set(c["failure_class"].split(", ")) for c in causes]
    memory_only = [i for i, classes in enumerate(order) if classes == {"memory"}]
    assert memory_only and all(i > j for i in memory_only for j, c in enumerate(order) if c & {"forward", "numerics"})


def test_every_verified_remedy_states_its_cause_everywhere_from_the_store_alone(default_matrix):
    """Four patches verified by a real `nox -s remedy`, merged into the store and their results folder deleted: each
    proves its cause, stated with the change in words a maintainer reads (never the remedy's slug) and the DeepSpeed
    and transformers it was taken at, in report.json, report.md, report.html, the step summary and the console; the
    report's line names the harness revision; the fused-experts draft carries the proposed fix with its diff (no
    harness name, no host path); every other cause says its mechanism is not proven."""
    out, _ = default_matrix
    results = {result["remedy"]: result for result in json.loads((REMEDY_RESULTS / "remedies.json").read_text())}
    causes = json.loads((out / "report.json").read_text())["failing_now"]["causes"]
    proven = {r["remedy"]: c for c in causes for r in c["proven_by"]}
    assert sorted(proven) == sorted(results)  # every proof of the file, read from the store alone
    taken = "at DeepSpeed 0.19.8, transformers 5.25.0)"
    for name, cause in proven.items():
        change = results[name]["summary"].rstrip(".")
        cells = len(results[name]["cause_cells"])
        proof = f"(verified: {cells} of {cells} cells pass with this proposed DeepSpeed change: {change}; {taken}"
        assert cause["mechanism"] == f"{results[name]['mechanism'].rstrip('.')} {proof}", name
        assert name not in cause["mechanism"]  # the change in words, not the harness's slug
        assert cause["proven_by"][0]["taken_at"]["harness_git"] == "45708c69c0500dd72107c18789bcc38c09fefa27"
        for page in ("report.md", "report.html", "step-summary.md"):
            shown = text_of((out / page).read_text()).replace("`", "").replace("\\[", "[").replace("\\]", "]")
            assert proof.replace("`", "") in shown, (page, name)  # markdown's escapes undone
    experts = proven["fused-experts-split"]
    assert "proof taken by the harness at 45708c69c050 on 2026-12-07" in (out / "report.md").read_text()
    others = [c for c in causes if not c["proven_by"] and c["mechanism"] and c["status"] != "unsupported"]
    assert others and all("(mechanism not proven: " in c["mechanism"] for c in others)
    assert not any("(verified:" in c["mechanism"] for c in others)
    console = [line.replace("`", "") for line in console_lines(read_report(out).failing_now) if "(verified: " in line]
    assert len(console) == len(results) and any(experts["mechanism"].replace("`", "") in line for line in console)
    draft = (out / experts["draft"]).read_text()
    assert "**Proposed fix (verified: 21 of 21 cells pass)**" in draft and "Workaround" not in draft
    assert "```diff\n" in draft and "deepspeed/module_inject" in draft
    assert "/work/" not in draft and ".faithful" not in draft.split("**Proposed fix", 1)[1]
    assert not HARNESS_WORDS.search(draft.split("**Proposed fix", 1)[1].split("```diff", 1)[0])
    other_draft = next(c["draft"] for c in others if c["draft"])
    assert "(verified" not in (out / other_draft).read_text()


def test_the_step_summary_fits_a_screen_and_links_only_absolutely(default_matrix):
    out, _ = default_matrix
    summary = (out / "step-summary.md").read_text()
    report = json.loads((out / "report.json").read_text())["failing_now"]
    assert len(summary.splitlines()) <= 40, summary
    targets = re.findall(r"\]\(([^)]*)\)", summary)
    assert targets and all(t.startswith("https://") for t in targets), targets
    assert "https://github.com/example/autotp/actions/runs/4242" in summary
    rows = [line for line in summary.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == len(report["causes"])  # one row per cause (18)
    assert "No session has a previous trusted run" in summary or "Since the previous trusted run" in summary


def test_the_step_summary_outside_actions_names_no_run(default_matrix, tmp_path):
    out, _ = default_matrix
    store = out.parent / "history.sqlite"
    from reports.__main__ import main

    with pytest.MonkeyPatch.context() as patch:
        for name in RUN:
            patch.delenv(name, raising=False)
        patch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    summary = (tmp_path / "out" / "step-summary.md").read_text()
    assert "actions/runs" not in summary
    assert all(t.startswith("https://") for t in re.findall(r"\]\(([^)]*)\)", summary))


def test_no_family_with_a_failing_checkpoint_or_tp_is_listed_as_working_and_the_diff_applies(default_matrix, tmp_path):
    out, failures = default_matrix
    supported = json.loads((out / "report.json").read_text())["supported_models"]
    failing_entries = {cell.split(".", 1)[0] for cell in failures}
    for family in supported["families"]:
        entries = {model.split(".", 1)[0] for model in family["models"]}
        if family["level"] == "works":
            assert not entries & failing_entries, family["family"]
    levels = {family["family"]: family["level"] for family in supported["families"]}
    assert levels["falcon"] == "fails" and levels["codegen"] == "fails"  # falcon-7b at tp 2-4, codegen at tp 3
    page = (out / "supported-models.md").read_text()
    works = page.split("# Supported Models", 1)[1].split("## Supported Without Memory Savings", 1)[0]
    assert "- falcon —" not in works and "- codegen —" not in works
    falcon = next(line for line in page.splitlines() if line.startswith("- falcon —"))
    assert "falcon-7b fails at tp 2, 3, 4" in falcon
    assert (
        f"seen at DeepSpeed 0.19.8, transformers {VERSIONS['transformers']}, torch 2.13.0 on cpu (gloo), eager fp32"
        in falcon
    )
    # falcon-7b's own cause (its forward crashes on the starved ranks), its draft named by a slug: no ", " anywhere
    assert re.search(r"draft issue: \[draft-issue/forward-[0-9a-f]{12}\.md\]", falcon)
    assert all(", " not in path.name for path in (out / "draft-issue").iterdir())
    assert page.count("Not tested here: GPUs, fp16, bf16, real-size weights.") == 1
    # The diff applies to DeepSpeed's page and lists none of them under "Supported Models"
    clone = tmp_path / "DeepSpeed"
    (clone / "docs" / "_tutorials").mkdir(parents=True)
    (clone / "docs" / "_tutorials" / "automatic-tensor-parallelism.md").write_text(DOCS.read_text())
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    diff = out / "supported-models.diff"
    subprocess.run(["git", "apply", str(diff)], cwd=clone, check=True)
    applied = (clone / "docs" / "_tutorials" / "automatic-tensor-parallelism.md").read_text()
    listed = applied.split("# Supported Models", 1)[1].split("# Unsupported Models", 1)[0]
    for name in ("falcon", "codegen"):
        assert not re.search(rf"^- {name}\b(?! —.*fails)", listed, re.M), name
    assert re.search(r"^- falcon — .*fails at tp 2, 3, 4", applied.split("# Unsupported Models", 1)[1], re.M)


def test_the_step_summary_says_what_is_new_and_fixed_since_the_previous_trusted_run(tmp_path):
    """Two nightlies of one session, DeepSpeed 0.19.7 then 0.19.8: qwen2 breaks at tp 3, llama's tp 3 is fixed."""
    for started, deepspeed, broken in (
        ("2026-12-01T00:00:00Z", "0.19.7", "llama.faithful-eager-fp32-tp3"),
        ("2026-12-02T00:00:00Z", "0.19.8", "qwen2.faithful-eager-fp32-tp3"),
    ):

        def outcome_of(cell_id: str, broken: str = broken) -> CellOutcome:
            if cell_id == broken:
                return CellOutcome("fail", "forward", "RuntimeError: boom", message="RuntimeError: boom")
            return CellOutcome("pass", metrics={"logits_max_abs": 1e-7})

        versions = {**VERSIONS, "deepspeed": deepspeed}
        junit = run_cells(
            tmp_path,
            models="llama,qwen2",
            tp="2,3",
            shapes="faithful",
            started=started,
            outcome=outcome_of,
            versions=versions,
        )
    summary = (render(junit, tmp_path) / "step-summary.md").read_text()
    assert "- Since the previous trusted run: 1 new failure in 1 cause, 1 fix in 1 cause." in summary, summary

"""A PR run classified against its base like Dr.CI: new, broken trunk, flaky, known (reports/outputs/pr_failures.py)."""

import pytest
from reports_testkit import Cell, fail, write_junit

from reports.__main__ import main

SIZE = (
    "RuntimeError: The size of tensor a ({a}) must match the size of tensor b ({b}) @ transformers/models/x.py:forward"
)
UNEVEN = (
    "RuntimeError: split_with_sizes expects split_sizes to sum exactly to {n} @ deepspeed/module_inject/layers.py:x"
)
KNOWN = """[known_failures.uneven]
failure_class = "shard"
signature = 'split_with_sizes expects'
upstream = "https://github.com/deepspeedai/DeepSpeed/pull/8185"
"""


@pytest.fixture
def pair(tmp_path):
    """Two runs of the base (DeepSpeed 0.19.8; bloom passes in one, fails in the other: flaky there) and one of a
    PR (deepspeed pr/1234) that breaks llama and mistral (with a known cause), changes opt's failure, and leaves
    falcon and gpt2 failing as on the base."""
    base = [
        Cell("qwen2"),
        Cell("llama"),
        Cell("mistral"),
        fail("opt", "shard", "AssertionError: heads"),
        fail("falcon", "forward", SIZE.format(a=64, b=32)),
        fail("falcon", "forward", SIZE.format(a=96, b=32), tp=3),
        fail("gpt2", "shard", UNEVEN.format(n=96)),
    ]
    runs = {
        "nightly@2026-12-01T00:00:00Z@vm": [*base, Cell("bloom")],
        "nightly@2026-12-02T00:00:00Z@vm": [*base, fail("bloom", "forward", "RuntimeError: NCCL timeout")],
        "pr@2026-12-03T00:00:00Z@vm": [
            Cell("qwen2"),
            fail("llama", "forward", "IndexError: index 7 is out of bounds"),
            fail("mistral", "shard", UNEVEN.format(n=64)),
            fail("opt", "numerics", "logits_max_rel 0.3 > 0.01"),
            fail("falcon", "forward", SIZE.format(a=64, b=32)),
            fail("falcon", "forward", SIZE.format(a=96, b=32), tp=3),
            fail("gpt2", "shard", UNEVEN.format(n=96)),
            fail("bloom", "forward", "RuntimeError: NCCL timeout"),
        ],
    }
    for run_id, cells in runs.items():
        write_junit(
            tmp_path / "junit" / f"{run_id[:18]}.xml",
            cells,
            run_id=run_id,
            started=run_id.split("@")[1],
            deepspeed="pr/1234" if run_id.startswith("pr") else "0.19.8",
        )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    (tmp_path / "known.toml").write_text(KNOWN)
    return store


COUNT = "3 new failures, 2 already failing on the base, 1 flaky, 1 known; 0 fixed, 0 missing"
# A cause is named as the report names it (reports.analysis.cause_names), then said in its sentence.
RAISES = "the sharded model raises {kind} — The sharded model raises in its forward pass."
SHARD = (
    "shard: init_inference fails to shard it in layers.py — init_inference raises RuntimeError in layers.py while "
    "sharding the model: no sharded model to run."
)
CAUSES = [
    "- new cause 0a3409902e38: numerics: logits differ from the unsharded model — "
    "The sharded model runs, but its outputs differ from the unsharded model's "
    "beyond rounding: a weight, bias or per-head tensor is split or joined the wrong way. — 1 cell: eager fp32: opt "
    "tp2 (the base fails another way: shard `AssertionError: heads`)",
    "  - opt-eager-fp32-tp2: logits_max_rel 0.3 > 0.01",
    # A known cause the PR brought back to a cell passing on the base is the PR's.
    f"- new cause 6650031b36c7: {SHARD} — 1 cell: eager fp32: mistral tp2 (pass on the base; known: {{link}})",
    "  - mistral-eager-fp32-tp2: " + UNEVEN.format(n=64),
    f"- new cause e4b683bff952: forward: {RAISES.format(kind='IndexError')} — 1 cell: eager fp32: llama tp2 "
    "(pass on the base)",
    "  - llama-eager-fp32-tp2: IndexError: index 7 is out of bounds",
    "- broken trunk cause 299159f73ad0: forward: its forward fails on a tensor whose size the split changed — "
    "The model's own forward meets a tensor whose size AutoTP's split "
    "changed (a per-rank head count or width it did not update, or a tensor left whole next to a split one); the "
    "unsharded model runs. — 2 cells: eager fp32: falcon tp2/3",
    f"- flaky cause 9b4818410e14: forward: {RAISES.format(kind='RuntimeError')} — 1 cell: eager fp32: bloom tp2",
    f"- known cause 6650031b36c7: {SHARD} — 1 cell: eager fp32: gpt2 tp2 (known: {{link}})",
]


def test_gate_says_first_what_the_candidate_did(pair, tmp_path, capsys):
    code = main(
        [
            "gate",
            "--store",
            str(pair),
            "--baseline",
            "deepspeed=0.19.8",
            "--candidate",
            "deepspeed=pr/1234",
            "--known-failures",
            str(tmp_path / "known.toml"),
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 1  # llama and mistral pass on the base: the gate blocks as before
    link = "deepspeedai/DeepSpeed#8185"
    assert out[0] == COUNT
    assert (
        out[1] == "baseline deepspeed=0.19.8: 2 trusted run(s): nightly@2026-12-01T00:00:00Z@vm, "
        "nightly@2026-12-02T00:00:00Z@vm"
    )
    assert out[2:11] == [line.format(link=link) for line in CAUSES]


def test_without_the_registry_a_known_failure_is_broken_trunk(pair, tmp_path, capsys):
    (tmp_path / "none.toml").write_text(KNOWN.replace("split_with_sizes expects", "another failure"))
    main(
        [
            "gate",
            "--store",
            str(pair),
            "--baseline",
            "deepspeed=0.19.8",
            "--candidate",
            "deepspeed=pr/1234",
            "--known-failures",
            str(tmp_path / "none.toml"),
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "3 new failures, 3 already failing on the base, 1 flaky, 0 known; 0 fixed, 0 missing"
    assert f"- broken trunk cause 6650031b36c7: {SHARD} — 1 cell: eager fp32: gpt2 tp2" in out


def test_the_pr_comment_starts_with_the_count_and_lists_new_failures_first(pair, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = tmp_path / "out"
    assert (
        main(
            [
                "publish",
                "--store",
                str(pair),
                "--out",
                str(out),
                "--session",
                "pr",
                "--base",
                "deepspeed=0.19.8",
                "--known-failures",
                str(tmp_path / "known.toml"),
            ]
        )
        == 0
    )
    comment = (out / "publish" / "comment.md").read_text().splitlines()
    link = "[deepspeedai/DeepSpeed#8185](https://github.com/deepspeedai/DeepSpeed/pull/8185)"
    # Dr.CI's shape: the count of new failures with the head and the base first, new ones expanded, the rest folded
    assert comment[:2] == [
        "<!-- autotp-matrix:publish -->",
        "**AutoTP matrix: 3 new failures** at deepspeed pr/1234 (run `pr@2026-12-03T00:00:00Z@vm`; base: "
        "`deepspeed=0.19.8`): 2 already failing on the base, 1 flaky, 1 known; 0 fixed, 0 missing",
    ]
    new = comment[
        comment.index("### 3 new failure causes") + 2 : comment.index(
            "<details><summary>2 already failing on the base, 1 flaky, 1 known</summary>"
        )
    ]
    # The report's cause id and words, each cell with its numbers (the cause masks them).
    assert new[:4] == [
        f"- **cause e4b683bff952** forward: {RAISES.format(kind='IndexError')} — 1 cell: eager fp32: llama tp2",
        "  - `llama-eager-fp32-tp2`: `IndexError: index 7 is out of bounds`",
        "  - pass on the base",
        "  - reproduce: `nox -s repro -- --models llama.stress --variants eager --dtypes fp32 --tp 2`",
    ]
    # A known cause the PR brought back to a cell passing on the base is the PR's, with its upstream link.
    assert f"  - known upstream, brought back here: {link}" in new
    assert "  - the base fails another way: shard `AssertionError: heads`" in new
    assert "  - `opt-eager-fp32-tp2`: `logits_max_rel 0.3 > 0.01`" in new
    folded = comment[comment.index("<details><summary>2 already failing on the base, 1 flaky, 1 known</summary>") :]
    assert folded[2:5] == [
        "- **broken trunk** cause 299159f73ad0 forward: its forward fails on a tensor whose size the split changed — "
        "The model's own forward meets a tensor whose size AutoTP's "
        "split changed (a per-rank head count or width it did not update, or a tensor left whole next to a split "
        "one); the unsharded model runs. — 2 cells: `falcon-eager-fp32-tp2`, `falcon-eager-fp32-tp3`",
        f"- **flaky** cause 9b4818410e14 forward: {RAISES.format(kind='RuntimeError')} — 1 cell: "
        "`bloom-eager-fp32-tp2`",
        f"- **known** cause 6650031b36c7 {SHARD} — 1 cell: `gpt2-eager-fp32-tp2` ({link})",
    ]
    assert folded[-1] == "</details>"
    # Without a base: the session's previous run; this PR session ran once, so nothing is compared.
    assert main(["publish", "--store", str(pair), "--out", str(out), "--session", "pr"]) == 0
    comment = (out / "publish" / "comment.md").read_text().splitlines()
    assert comment[1].startswith("**AutoTP matrix: no baseline, nothing compared** at deepspeed pr/1234")
    assert comment[3] == "<details><summary>7 cells fail in 5 causes (no earlier run to say which are new)</summary>"


def test_a_base_that_is_the_candidate_itself_says_nothing_is_compared(pair, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = tmp_path / "out"
    args = [
        "publish",
        "--store",
        str(pair),
        "--out",
        str(out),
        "--session",
        "pr",
        "--base",
        "pr@2026-12-03T00:00:00Z@vm",
    ]
    assert main(args) == 0
    assert "--base pr@2026-12-03T00:00:00Z@vm: selects the candidate's own run, so nothing is compared" in (
        capsys.readouterr().out
    )
    assert (out / "publish" / "comment.md").read_text().splitlines()[1] == (
        "**AutoTP matrix: no baseline, nothing compared** at deepspeed pr/1234 (run `pr@2026-12-03T00:00:00Z@vm`; "
        "base: `pr@2026-12-03T00:00:00Z@vm`): the base selects this run itself; pass the PR's base (its merge base's "
        "run or release)"
    )


def test_a_base_that_matches_no_run_is_one_line(pair, tmp_path, capsys):
    code = main(
        [
            "publish",
            "--store",
            str(pair),
            "--out",
            str(tmp_path / "out"),
            "--session",
            "pr",
            "--base",
            "deepspeed=9.9.9",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err.startswith(
        "error: --base 'deepspeed=9.9.9' matches no stored run; stored version sets:"
    )


def test_the_gate_and_the_comment_state_a_cause_as_the_report_does_proven_only_by_a_verified_remedy():
    """The words the gate and the PR comment give a cause are the report's one sentence (reports.analysis
    `cause_statement`): its mechanism "(mechanism not proven: …)" until `nox -s remedy` verified a remedy on every one
    of its failing cells, then that remedy's mechanism "(verified: N of N cells pass with <the change in words>; at
    <versions>)"."""
    from matrix.remedies import RemedyResult, TakenAt
    from reports.analysis.statuses import CellStatus
    from reports.outputs.pr_failures import cause_words
    from reports.store.records import CellKey
    from suites.verdicts.cause import Cause

    key = "column-parallel|multi_head_attention.dense"
    words = "the parser left `multi_head_attention.dense` column-parallel (LinearLayer)"
    cells = {
        CellKey("ctrl.faithful", "eager", "fp32", tp): CellStatus(
            "fail", 0, 1, 0, "forward", "RuntimeError: size @ x.py:f", cause=Cause(key, words, "autotp")
        )
        for tp in (2, 3)
    }
    ids = tuple(cell.id for cell in cells)
    remedy = RemedyResult(
        remedy="ctrl-row-parallel-policy", kind="workaround", cause_models=("ctrl.faithful",),
        summary="pass injection_policy to deepspeed.init_inference", mechanism="CTRL registers its layernorms after "
                                                                               "`ffn`.",
        how="", status="verified", cause_cells=ids, fixed=ids, changed=(), others_compared=0, seconds=1.0,
        taken_at=TakenAt("0.19.8", "", "5.25.0", "45708c6", "2026-12-07T09:30:48Z"),
    )  # fmt: skip
    title = "the parser leaves `multi_head_attention.dense` column-parallel where it must be row-parallel"
    assert cause_words(cells).startswith(f"{title} — {words} (mechanism not proven: ")
    proven = (
        f"{title} — CTRL registers its layernorms after `ffn` (verified: 2 of 2 cells pass with this workaround: Pass "
        "injection_policy to deepspeed.init_inference; at DeepSpeed 0.19.8, transformers 5.25.0)"
    )
    assert cause_words(cells, (remedy,)) == proven
    half = RemedyResult(**{**remedy.__dict__, "fixed": ids[:1], "status": "unverified"})
    assert cause_words(cells, (half,)) == (
        f"{title} — {words} (mechanism not proven: workaround (Pass injection_policy to deepspeed.init_inference): "
        "1 of 2 cells "
        "pass)"
    )


def test_the_head_of_several_sessions_closes_each_sessions_parenthesis():
    """A comment over several sessions (a run of each variant family) said "deepspeed 0.19.8 (run `a`; deepspeed
    0.14.4 (run `b`": every session's parenthesis but the last, which the line closes, is closed."""
    from types import SimpleNamespace

    from reports.outputs.pr_comment import head_text

    def session(label, run_id):
        return SimpleNamespace(
            newest=SimpleNamespace(versions=SimpleNamespace(label=lambda axis: label), run_id=run_id)
        )

    text = head_text([session("0.19.8", "meta@t@vm"), session("0.14.4", "oldest@t@vm")])
    assert text == "deepspeed 0.19.8 (run `meta@t@vm`); deepspeed 0.14.4 (run `oldest@t@vm`"
    assert (text + ")").count("(") == (text + ")").count(")")

"""A pull request's check (reports/outputs/pr_check.py): the gate and the PR comment made from one pair of runs — the
trusted nightly of the merge base and the pull request's (untrusted) run of its head — say the same counts and the
same cause ids, and the comment links the run, its report and every failing cell's logs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from reports_testkit import Cell, fail

from reports.__main__ import main

MERGE_BASE, HEAD = "ab" * 20, "cd" * 20
RUN = "https://github.com/octo/autotp/actions/runs/4242"
REPORT = f"{RUN}/artifacts/77"
SIZE = (
    "RuntimeError: The size of tensor a ({a}) must match the size of tensor b ({b}) @ transformers/models/x.py:forward"
)
SPLIT = "RuntimeError: split_with_sizes expects split_sizes to sum exactly to {n} @ deepspeed/module_inject/layers.py:x"


@pytest.fixture
def pr_store(session, tmp_path, capsys, monkeypatch) -> Path:
    """The merge base's nightly: llama, qwen2, mistral pass; falcon fails at tp 2 and 3 with one cause, gpt2 with
    another, phi with a third. The head breaks llama and mistral, fixes gpt2, keeps falcon and phi failing and
    skips qwen2."""
    for name in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "octo/autotp")
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    falcon = [
        fail("falcon", "forward", SIZE.format(a=64, b=32)),
        fail("falcon", "forward", SIZE.format(a=96, b=32), tp=3),
    ]
    session(
        [
            Cell("llama"),
            Cell("qwen2"),
            Cell("mistral"),
            *falcon,
            fail("gpt2", "shard", SPLIT.format(n=96)),
            fail("phi", "numerics", "logits_max_rel 0.3 > 0.01"),
        ],
        "nightly",
        deepspeed="0.19.8",
        deepspeed_git=MERGE_BASE[:7],
        session="nightly",
    )
    session(
        [
            fail("llama", "forward", "IndexError: index 7 is out of bounds"),
            Cell("qwen2", "skip"),
            fail("mistral", "shard", SPLIT.format(n=64)),
            *falcon,
            Cell("gpt2"),
            fail("phi", "numerics", "logits_max_rel 0.5 > 0.01"),
        ],
        "pr",
        deepspeed="0.19.8",
        deepspeed_git=HEAD[:7],
        session="latest",
    )
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "nightly"), "--store", str(store)]) == 0
    assert main(["merge", "--untrusted", str(tmp_path / "pr"), "--store", str(store)]) == 0
    capsys.readouterr()
    return store


COUNTS = re.compile(
    r"(\d+) new failures?.*?(\d+) already failing on the base, (\d+) flaky, (\d+) known; (\d+) fixed, (\d+) missing"
)


def causes(text: str) -> dict[str, set[str]]:
    """The cause ids a text names per kind (new, broken trunk, flaky, known, fixed)."""
    found: dict[str, set[str]] = {}
    for kind, cause_id in re.findall(
        r"^- (?:\*\*)?(new|broken trunk|flaky|known|fixed)?(?:\*\*)? ?(?:\*\*)?cause "
        r"([0-9a-f]{12})",
        text,
        re.M,
    ):
        found.setdefault(kind or "?", set()).add(cause_id)
    return found


def test_the_gate_and_the_comment_agree_on_every_count_and_cause(pr_store, tmp_path, capsys):
    assert main(["gate", "--store", str(pr_store), "--head", HEAD, "--merge-base", MERGE_BASE]) == 1
    gate = capsys.readouterr().out
    out = tmp_path / "out"
    args = ["publish", "--store", str(pr_store), "--out", str(out), "--session", "latest"]
    assert main([*args, "--head", HEAD, "--merge-base", MERGE_BASE, "--report-url", REPORT]) == 0
    capsys.readouterr()
    comment = (out / "publish" / "comment.md").read_text()
    lines = comment.splitlines()

    assert gate.splitlines()[0] == (
        f"As of {HEAD} with merge base {MERGE_BASE}: 2 new failures, 3 already failing on the base, 0 flaky, "
        "0 known; 1 fixed, 1 missing"
    )
    assert lines[1].startswith(f"**AutoTP matrix: 2 new failures** as of `{HEAD}` with merge base `{MERGE_BASE}`")
    # One base: the merge base's nightly, named the same in both.
    assert gate.splitlines()[1] == "base: DeepSpeed abababa: 1 trusted run(s): session1@2025-01-01T00:00:00Z@runner-1"
    assert f"({gate.splitlines()[1]}):" in lines[1]
    gate_counts, comment_counts = COUNTS.search(gate.splitlines()[0]), COUNTS.search(lines[1])
    assert gate_counts and comment_counts and gate_counts.groups() == comment_counts.groups()

    # Every cause id by kind: phi fails another way (its numbers changed, its cause did not): broken trunk in both.
    gate_causes, comment_causes = causes(gate), causes(comment)
    comment_causes["new"] = comment_causes.pop("?")  # the new causes are the expanded ones, with no kind word
    fixed = re.findall(r"^### Fixed by this PR.*\n\n- \*\*cause ([0-9a-f]{12})\*\*", comment, re.M)
    comment_causes["fixed"] = set(fixed)
    assert gate_causes == comment_causes
    assert set(gate_causes) == {"new", "broken trunk", "fixed"} and len(gate_causes["new"]) == 2

    # Links: the run and its report, and every failing cell's logs, with its numbers unmasked.
    assert f"[The run and its jobs' logs]({RUN})" in comment and f"]({REPORT})" in comment
    failing = re.findall(r"^(\S+-eager-fp32-tp\d)\s+\S+\s+1/1 runs failed", gate, re.M)
    assert len(failing) == 5
    for cell in failing:
        assert f"`{cell}` ([logs]({REPORT}): `logs/{cell}/`)" in comment
    llama = f"  - `llama-eager-fp32-tp2` ([logs]({REPORT}): `logs/llama-eager-fp32-tp2/`): "
    assert llama + "`IndexError: index 7 is out of bounds`" in lines
    assert "### 1 cell not run here" in lines


def test_run_links_come_from_validated_github_variables(pr_store, tmp_path, capsys, monkeypatch):
    args = ["publish", "--store", str(pr_store), "--out", str(tmp_path / "out"), "--session", "latest"]
    args += ["--head", HEAD, "--merge-base", MERGE_BASE]
    assert main([*args, "--report-url", "https://github.com/octo/autotp/actions/runs/1/artifacts/77"]) == 2
    assert "not an artifact of this run" in capsys.readouterr().err
    monkeypatch.setenv("GITHUB_SERVER_URL", "javascript:alert(1)//")
    assert main(args) == 2
    assert "GITHUB_SERVER_URL='javascript:alert(1)//': not what GitHub Actions sets" in capsys.readouterr().err
    monkeypatch.delenv("GITHUB_RUN_ID")
    assert main(args) == 0
    assert "actions/runs" not in (tmp_path / "out" / "publish" / "comment.md").read_text()


REAL_PAIR = Path(__file__).parent / "fixtures" / "pr_pair"
REAL_MERGE_BASE, REAL_HEAD = "34a53378610db315562f388c40d798801d0c932f", "f406d943ff7ef4a742a1aec3835689a6ec5536d3"
PHI3_CAUSE = "106576ed1b33"  # the default matrix's phi3 cause, by the same id in its report and draft


def test_a_real_pair_of_runs_gives_one_check_in_the_gate_and_the_comment(tmp_path, capsys, monkeypatch):
    """The JUnit of two real `nox -s matrix -- --models phi3,llama,bloom,gemma --tp 2` runs (2026-12-07, this CPU
    machine): DeepSpeed 0.19.8 as a git checkout (the merge base, its nightly: trusted) and the same checkout with
    matrix/remedy_patches/phi3-config-head-counts.diff committed on top (the pull request's head, merged --untrusted).
    phi3 is fixed by it; bloom and gemma fail on both; llama's two shapes pass on both."""
    for name in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "octo/autotp")
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    for side, untrusted in (("base", []), ("head", ["--untrusted"])):
        (tmp_path / side).mkdir()
        (tmp_path / side / "matrix.xml").write_bytes((REAL_PAIR / f"{side}.xml").read_bytes())
        assert main(["merge", *untrusted, str(tmp_path / side), "--store", str(store)]) == 0
    capsys.readouterr()
    commits = ["--head", REAL_HEAD, "--merge-base", REAL_MERGE_BASE]
    assert main(["gate", "--store", str(store), *commits]) == 0
    gate = capsys.readouterr().out
    args = ["publish", "--store", str(store), "--out", str(out), "--session", "matrix", "--pr", "1234"]
    assert main([*args, *commits, "--report-url", REPORT]) == 0
    assert "the comment only, no issues opened or edited" in capsys.readouterr().out
    comment = (out / "publish" / "comment.md").read_text()
    lines = comment.splitlines()

    assert gate.splitlines()[0] == (
        f"As of {REAL_HEAD} with merge base {REAL_MERGE_BASE}: 0 new failures, 2 already failing on the base, "
        "0 flaky, 0 known; 1 fixed, 0 missing"
    )
    assert lines[1].startswith(f"**AutoTP matrix: 0 new failures** as of `{REAL_HEAD}` with merge base")
    assert f"({gate.splitlines()[1]}):" in lines[1]  # one base, named the same
    gate_counts, comment_counts = COUNTS.search(gate.splitlines()[0]), COUNTS.search(lines[1])
    assert gate_counts and comment_counts and gate_counts.groups() == comment_counts.groups()

    gate_causes, comment_causes = causes(gate), causes(comment)
    comment_causes.pop("?")  # the fixed cause's line has no kind word: it is read from its section below
    comment_causes["fixed"] = set(
        re.findall(r"^### Fixed by this PR.*\n\n- \*\*cause ([0-9a-f]{12})\*\*", comment, re.M)
    )
    assert gate_causes == comment_causes
    assert gate_causes["fixed"] == {PHI3_CAUSE} and len(gate_causes["broken trunk"]) == 2

    assert f"[The run and its jobs' logs]({RUN})" in comment and f"]({REPORT})" in comment
    failing = re.findall(r"^(\S+-eager-fp32-tp\d)\s+\S+\s+1/1 runs failed", gate, re.M)
    assert sorted(failing) == ["bloom.faithful-eager-fp32-tp2", "gemma.faithful-eager-fp32-tp2"]
    for cell in failing:
        assert f"`{cell}` ([logs]({REPORT}): `logs/{cell}/`)" in comment
    assert not (out / "publish" / "issues").exists()

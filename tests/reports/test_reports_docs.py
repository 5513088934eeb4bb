import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, render, write_junit

from reports import ReportsError
from reports.outputs.docs import check_drift, docs_page, normalise_model_name, read_docs_supported

DOCS = Path(__file__).parent / "fixtures" / "automatic-tensor-parallelism.md"


def test_drift_against_docs_list(scenario, tmp_path, capsys):
    # Here: bloom, falcon, gpt-neox pass everywhere at the latest versions; llama, opt fail; qwen2 fails in setup (the
    # harness failed: no verdict on AutoTP). DeepSpeed's page lists all six as supported, and not the gemma added here.
    session = tmp_path / "junit" / "gemma.xml"
    write_junit(
        session,
        [Cell("gemma")],
        run_id="x@2025-02-01T00:00:00Z@r",
        started="2025-02-01T00:00:00Z",
        deepspeed="0.11.0",
        transformers="4.45.0",
    )
    out = render(scenario, tmp_path, "--docs", str(DOCS))
    report = (out / "report.md").read_text()
    assert report.endswith(
        f"## Docs drift ({DOCS.name})\n\n"
        "- listed as supported but failing here: llama\n"
        "- listed as supported but failing here: opt\n"
        "- passing here but not listed: gemma\n"
    )
    assert "docs drift: 2 listed but failing, 1 passing but unlisted" in capsys.readouterr().out
    supported = (out / "supported-models.md").read_text()
    assert "# Supported Models\n\nThe following model families" in supported
    assert supported.split("\n\n")[4] == (
        "- bloom — works at tp 2\n- falcon — works at tp 2\n- gemma — works at tp 2\n- gpt-neox — works at tp 2"
    )
    unsupported = supported.split("# Unsupported Models\n\n", 1)[1].split("\n\n")[1]
    seen = "(seen at DeepSpeed 0.11.0, transformers 4.45.0, torch 2.4.0 on cpu (gloo), eager fp32)"
    assert unsupported == (
        f"- llama — fails at tp 2: init_inference fails to shard it {seen}\n"
        f"- opt — fails at tp 2: logits differ from the unsharded model {seen}"
    )
    assert supported.endswith("\n\n- qwen2\n") and "# Not Tested" in supported


def test_docs_table_format_and_tolerant_names(tmp_path):
    table = tmp_path / "docs.md"
    table.write_text(
        "## Supported Models\n\n| Model | Notes |\n|---|---|\n| [GPT-NeoX](https://x) | ok |\n"
        "| `Qwen2.5` | |\n\n## Other\n- not a model\n"
    )
    assert read_docs_supported(table) == ["GPT-NeoX", "Qwen2.5"]
    assert normalise_model_name("EleutherAI/GPT_NeoX") == normalise_model_name("gpt-neox")
    assert normalise_model_name("qwen2-moe") == normalise_model_name("Qwen2_MoE")


def test_docs_without_supported_section_is_rejected(tmp_path):
    other = tmp_path / "README.md"
    other.write_text("# DeepSpeed\n\n- bloom\n")
    with pytest.raises(ReportsError, match="no '# Supported Models' heading found"):
        read_docs_supported(other)


def test_models_skipped_everywhere_are_listed_as_not_tested(tmp_path):
    cells = [Cell("llama"), fail("gpt2", "shard"), Cell("remote_only", "skip"), Cell("remote_only", "skip", tp=3)]
    write_junit(
        tmp_path / "junit" / "run.xml",
        cells,
        run_id="matrix@2026-12-02T10:00:00Z@runner-1",
        started="2026-12-02T10:00:00Z",
    )
    supported = (render(tmp_path / "junit", tmp_path) / "supported-models.md").read_text()
    assert (
        ": 1 works, 0 no memory saved, 1 fails, 1 not tested (report.md has every cell) -->"
        in supported.splitlines()[0]
    )
    assert supported.endswith(
        "# Not Tested\n\nNo cell of these models has a verdict here: each was skipped or the "
        "harness failed (setup, install); each cell's reason (e.g. remote code only) is in "
        "results/cells.jsonl.\n\n- remote_only\n"
    )


LONG = (
    "RuntimeError: The size of tensor a (N) must match the size of tensor b (N) at non-singleton dimension N @ "
    "transformers/integrations/sdpa_attention.py:sdpa_attention_forward"
)
KNOWN = """[known_failures.falcon_40b_heads]
failure_class = "shard"
signature = 'heads % tp'
upstream = "https://github.com/deepspeedai/DeepSpeed/issues/4242"
"""


def nightly(tmp_path, docs: Path = DOCS):
    """Registry entries of one family fold into it: llama_large under llama, falcon_40b under falcon."""
    runs = [
        [
            Cell("llama", tp=2),
            Cell("llama", tp=3),
            Cell("llama_large", tp=2),
            fail("llama_large", "forward", LONG, tp=3),
            Cell("falcon", tp=2),
            fail("falcon_40b", "shard", "AssertionError: heads % tp != 0", tp=2),
            Cell("bloom"),
            Cell("gpt2"),
        ],
        [fail("bloom", "forward", "RuntimeError: NCCL timeout"), Cell("gpt2")],
    ]
    for n, cells in enumerate(runs, start=1):
        write_junit(
            tmp_path / "junit" / f"run{n}.xml",
            cells,
            run_id=f"nightly@2026-12-0{n}T00:00:00Z@vm",
            started=f"2026-12-0{n}T00:00:00Z",
            deepspeed="0.19.8",
        )
    (tmp_path / "known.toml").write_text(KNOWN)
    return render(tmp_path / "junit", tmp_path, "--docs", str(docs), "--known-failures", str(tmp_path / "known.toml"))


SEEN = "seen at DeepSpeed 0.19.8, transformers 4.44.0, torch 2.4.0 on cpu (gloo), eager fp32"
FALCON = (
    f"- falcon — falcon works at tp 2; falcon_40b fails at tp 2: init_inference fails to shard it ({SEEN}; tracked: "
    "[deepspeedai/DeepSpeed#4242](https://github.com/deepspeedai/DeepSpeed/issues/4242))"
)
LLAMA = (
    "- llama — llama works at tp 2, 3; llama_large works at tp 2, fails at tp 3: its forward fails on a tensor whose "
    f"size the split changed ({SEEN})"
)
NOT_TESTED = " Not tested here: GPUs, fp16, bf16, real-size weights."


def test_families_with_working_tp_sizes_and_a_reason_in_words_per_failure(tmp_path):
    out = nightly(tmp_path)
    page = (out / "supported-models.md").read_text()
    supported = page.split("# Supported Models\n\n", 1)[1].split("\n\n## ", 1)[0].split("\n\n")
    assert supported[1] == (
        "Tested with DeepSpeed 0.19.8, transformers 4.44.0 and torch 2.4.0 on cpu (gloo), fp32, at tp 2 and 3 "
        "(2026-12-02, by autotp-matrix: tiny random models that split like each family's real checkpoints): the "
        "families with a note below. The others are listed from earlier tests." + NOT_TESTED
    )
    # Only a family whose every entry works at every tp is supported; one failing somewhere says where it works and
    # where it fails, the entries named where they differ, each demotion where it was seen and its issue
    assert supported[2].splitlines() == ["- gpt2 — works at tp 2"]
    unsupported = page.split("# Unsupported Models")[1]
    assert FALCON in unsupported and LLAMA in unsupported
    assert f"- bloom — is flaky at tp 2 ({SEEN})" in unsupported
    assert "Error" not in page and "@ " not in page  # reasons in words, never an error string
    families = json.loads((out / "report.json").read_text())["supported_models"]
    assert (families["works"], families["no memory saved"], families["fails"]) == (
        ["gpt2"],
        [],
        ["bloom", "falcon", "llama"],
    )
    assert [e["models"] for e in families["families"]] == [
        ["bloom"],
        ["falcon", "falcon_40b"],
        ["gpt2"],
        ["llama", "llama_large"],
    ]


def test_three_levels_and_deepspeeds_family_names(tmp_path):
    """Memory-only failures (logits right) are their own level; codegen failing only at tp 3 is unsupported, saying
    it works at 2 and 4;
    families carry DeepSpeed's names (gpt_neox → gpt-neox, qwen2_moe → qwen2-moe, openai_gpt → openai)."""
    experts = "memory: experts left whole: model.layers.*.mlp.experts.{gate_up_proj,down_proj}"
    cells = [
        *(fail("mixtral", "memory", experts, tp=tp) for tp in (2, 3, 4)),
        *(fail("qwen2_moe", "memory", experts, tp=tp) for tp in (2, 3)),
        Cell("codegen"),
        fail(
            "codegen",
            "shard",
            "AssertionError: codgen autoTP requires @ deepspeed/module_inject/fusedqkv_utils.py:f",
            tp=3,
        ),
        Cell("codegen", tp=4),
        Cell("gpt_neox"),
        fail(
            "openai_gpt",
            "shard",
            "AssertionError: Not able to determine model policy @ deepspeed/module_inject/auto_tp.py:f",
        ),
    ]
    write_junit(tmp_path / "junit" / "a.xml", cells, run_id="m@2026-12-06T00:00:00Z@vm", started="2026-12-06T00:00:00Z")
    out = render(tmp_path / "junit", tmp_path, "--docs", str(DOCS))
    page = (out / "supported-models.md").read_text()
    seen = "(seen at DeepSpeed 0.14.2, transformers 4.44.0, torch 2.4.0 on cpu (gloo), eager fp32)"
    assert (
        f"- codegen — works at tp 2, 4, fails at tp 3: the fused qkv split rejects its head counts {seen}"
        in page.split("# Unsupported Models")[1]
    )
    memory = page.split("## Supported Without Memory Savings\n\n", 1)[1].split("\n\n# ", 1)[0].split("\n\n")[1]
    assert memory.splitlines() == [
        f"- mixtral — runs correctly at tp 2, 3, 4, but the MoE experts are not split {seen}",
        f"- qwen2-moe — runs correctly at tp 2, 3, but the MoE experts are not split {seen}",
    ]
    assert f"- openai — fails at tp 2: AutoTP finds no policy for the model {seen}" in page.split("# Unsupported")[1]
    assert "- gpt-neox — works at tp 2" in page
    patched = apply_to_a_copy(out / "supported-models.diff", DOCS, tmp_path / "clone")
    assert_no_entry_contradicts_another(patched)
    # DeepSpeed listed mixtral, qwen2-moe, openai and codegen as supported: moved, each once
    assert patched.count("- openai") == 1 and patched.count("- mixtral") == 1 and patched.count("- codegen") == 1


def apply_to_a_copy(diff: Path, page: Path, clone: Path) -> str:
    """The page after `git apply` of the diff in a clone-like folder (checked first: it applies cleanly)."""
    target = clone / "docs" / "_tutorials" / "automatic-tensor-parallelism.md"
    target.parent.mkdir(parents=True)
    shutil.copy(page, target)
    subprocess.run(["git", "init", "-q"], cwd=clone, check=True)
    subprocess.run(["git", "apply", "--check", str(diff)], cwd=clone, check=True)
    subprocess.run(["git", "apply", str(diff)], cwd=clone, check=True)
    return target.read_text()


def assert_no_entry_contradicts_another(page: str) -> None:
    """Each family once across the lists, in the list its words put it in: a supported one works at every tp (it
    fails nowhere), one without memory savings runs correctly everywhere, an unsupported one fails or is flaky
    somewhere."""
    from reports.outputs.docs import MEMORY_HEADING

    sections = {"supported models": [], MEMORY_HEADING.lower(): [], "unsupported models": []}
    current = None
    for line in page.splitlines():
        if line.startswith("#"):
            current = line.lstrip("#").strip().lower()
        elif line.startswith("- ") and current in sections:
            sections[current].append(line)
    names = [normalise_model_name(line[2:].split(" — ")[0]) for bullets in sections.values() for line in bullets]
    assert len(names) == len(set(names)), f"a family listed twice: {sorted(n for n in names if names.count(n) > 1)}"
    for line in sections["supported models"]:
        assert " — " not in line or ("works at" in line and not re.search("fails|flaky|runs correctly", line)), line
    for line in sections[MEMORY_HEADING.lower()]:
        assert "runs correctly at" in line and not re.search("fails|flaky", line), line
    for line in sections["unsupported models"]:
        assert " — " not in line or re.search(r"fails at|is flaky at", line), line


def test_the_diff_applies_to_deepspeeds_page_states_what_it_was_tested_at_and_quotes_no_error(tmp_path):
    out = nightly(tmp_path)
    diff = (out / "supported-models.diff").read_text()
    assert diff.startswith(
        "--- a/docs/_tutorials/automatic-tensor-parallelism.md\n+++ b/docs/_tutorials/automatic-tensor-parallelism.md\n"
    )
    changed = [line for line in diff.splitlines()[2:] if line[:1] in "+-"]
    # A family that changes list moves (bloom, falcon and llama fail somewhere, gpt2 works everywhere); the
    # tested-at line goes before the supported list; what the page lists untested here stays as it is.
    assert changed == [
        "+Tested with DeepSpeed 0.19.8, transformers 4.44.0 and torch 2.4.0 on cpu (gloo), fp32, at tp 2 and 3 "
        "(2026-12-02, by autotp-matrix: tiny random models that split like each family's real checkpoints): the "
        "families with a note below. The others are listed from earlier tests." + NOT_TESTED,
        "+",
        "-- bloom",
        "-- falcon",
        "+- gpt2 — works at tp 2",
        "-- llama",
        f"+- bloom — is flaky at tp 2 ({SEEN})",
        f"+{FALCON}",
        "-- gpt2",
        f"+{LLAMA}",
    ]
    added = "\n".join(line for line in changed if line.startswith("+"))
    assert "Error" not in added and "`" not in added and " @ " not in added  # no error string reaches the tutorial
    patched = apply_to_a_copy(out / "supported-models.diff", DOCS, tmp_path / "clone")
    assert_no_entry_contradicts_another(patched)
    assert patched.count("- llama") == 2  # llama (noted in place) and llama2 (untested here, kept)
    drift = check_drift(
        {"gpt2": True, "bloom": False, "falcon": False, "llama": False},
        tmp_path / "clone" / "docs" / "_tutorials" / "automatic-tensor-parallelism.md",
    )
    assert (drift.listed_but_failing, drift.passing_but_unlisted) == ([], [])
    # Rendered again on the patched page (its own tested-at line replaced, not added): no diff at all
    patched_page = tmp_path / "clone" / "docs" / "_tutorials" / "automatic-tensor-parallelism.md"
    known = str(tmp_path / "known.toml")
    again = render(tmp_path / "junit", tmp_path / "again", "--docs", str(patched_page), "--known-failures", known)
    assert (again / "supported-models.diff").read_text() == ""


@pytest.mark.skipif(
    not os.environ.get("AUTOTP_DEEPSPEED_REPO"), reason="AUTOTP_DEEPSPEED_REPO (a DeepSpeed clone) is not set"
)
def test_the_diff_applies_to_the_page_in_a_deepspeed_clone(tmp_path):
    """DeepSpeed's own page as its clone has it (CI's triage job sets AUTOTP_DEEPSPEED_REPO), not the fixture."""
    clone = Path(os.environ["AUTOTP_DEEPSPEED_REPO"])
    page = tmp_path / "page.md"
    page.write_text(
        subprocess.run(
            ["git", "-C", str(clone), "show", "HEAD:docs/_tutorials/automatic-tensor-parallelism.md"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    out = nightly(tmp_path, docs=page)
    assert_no_entry_contradicts_another(apply_to_a_copy(out / "supported-models.diff", page, tmp_path / "clone"))


def test_a_docs_copy_without_the_two_lists_is_refused(tmp_path):
    table = tmp_path / "docs.md"
    table.write_text("# Supported Models\n\n| Model |\n|---|\n| llama |\n\n# Unsupported Models\n\n- gpt2\n")
    with pytest.raises(ReportsError, match=r"docs\.md:1: '# Supported Models' has no bullet list under it"):
        docs_page({"supported_models": {"families": []}}, table)

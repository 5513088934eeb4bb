import json
import shutil
import subprocess
from pathlib import Path

import pytest

from reports import ReportsError
from reports.outputs.docs import check_drift, docs_page, normalise_model_name, read_docs_supported, tp_text
from reports.store.records import CellKey
from reports_testkit import Cell, fail, render, write_junit

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
        f"## Docs drift ({DOCS})\n\n"
        "- listed as supported but failing here: llama\n"
        "- listed as supported but failing here: opt\n"
        "- passing here but not listed: gemma\n"
    )
    assert "docs drift: 2 listed but failing, 1 passing but unlisted" in capsys.readouterr().out
    supported = (out / "supported-models.md").read_text()
    assert "# Supported Models\n\nThe following model families" in supported
    assert supported.split("\n\n")[3] == (
        "- bloom — passes tp 2 (eager fp32)\n- falcon — passes tp 2 (eager fp32)\n"
        "- gemma — passes tp 2 (eager fp32)\n- gpt-neox — passes tp 2 (eager fp32)"
    )
    assert supported.split("\n\n")[6] == (
        "- llama — fails tp 2 (eager fp32): shard `AssertionError: heads % tp != N`\n"
        "- opt — fails tp 2 (eager fp32): numerics `logits_max_rel N > N`"
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
    assert ": 1 supported, 1 unsupported, 1 not tested (report.md has every cell) -->" in supported.splitlines()[0]
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


def nightly(tmp_path):
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
    return render(tmp_path / "junit", tmp_path, "--docs", str(DOCS), "--known-failures", str(tmp_path / "known.toml"))


def test_families_with_passing_tp_sizes_and_a_reason_per_failure(tmp_path):
    out = nightly(tmp_path)
    page = (out / "supported-models.md").read_text()
    assert page.split("\n\n")[3] == "- gpt2 — passes tp 2 (eager fp32)"
    assert page.split("\n\n")[6].splitlines() == [
        "- bloom — flaky tp 2 (eager fp32)",
        "- falcon — fails falcon_40b tp 2 (eager fp32): shard `AssertionError: heads % tp != N` (known: "
        "[deepspeedai/DeepSpeed#4242](https://github.com/deepspeedai/DeepSpeed/issues/4242)); passes tp 2 (eager fp32)",
        # The message is cut, its location kept; the registry entry llama_large is named, the family is llama.
        "- llama — fails llama_large tp 3 (eager fp32): forward `RuntimeError: The size of tensor a (N) must match the "
        "size of tensor b (N) at n… @ transformers/integrations/sdpa_attention.py:sdpa_attention_forward`; "
        "passes tp 2, 3 (eager fp32) and llama_large tp 2 (eager fp32)",
    ]
    families = json.loads((out / "report.json").read_text())["supported_models"]
    assert (families["supported"], families["unsupported"]) == (["gpt2"], ["bloom", "falcon", "llama"])
    assert [e["models"] for e in families["families"]] == [
        ["bloom"],
        ["falcon", "falcon_40b"],
        ["gpt2"],
        ["llama", "llama_large"],
    ]


def test_the_diff_turns_deepspeeds_page_into_the_generated_one(tmp_path):
    out = nightly(tmp_path)
    diff = (out / "supported-models.diff").read_text()
    assert diff.startswith(
        "--- a/docs/_tutorials/automatic-tensor-parallelism.md\n+++ b/docs/_tutorials/automatic-tensor-parallelism.md\n"
    )
    changed = [line for line in diff.splitlines()[2:] if line[:1] in "+-"]
    # DeepSpeed lists bloom, falcon, llama and gpt2 the other way round; what it lists untested here stays as it is.
    falcon = (
        "falcon — fails falcon_40b tp 2 (eager fp32): shard `AssertionError: heads % tp != N` (known: "
        "[deepspeedai/DeepSpeed#4242](https://github.com/deepspeedai/DeepSpeed/issues/4242)); passes tp 2 (eager fp32)"
    )
    llama = (
        "llama — fails llama_large tp 3 (eager fp32): forward `RuntimeError: The size of tensor a (N) must match the "
        "size of tensor b (N) at n… @ transformers/integrations/sdpa_attention.py:sdpa_attention_forward`; "
        "passes tp 2, 3 (eager fp32) and llama_large tp 2 (eager fp32)"
    )
    assert changed == [
        "-- bloom",
        "-- falcon",
        "+- gpt2 — passes tp 2 (eager fp32)",
        "-- llama",
        "+- bloom — flaky tp 2 (eager fp32)",
        f"+- {falcon}",
        "-- gpt2",
        f"+- {llama}",
    ]
    # A docs PR is one command: the diff applies to DeepSpeed's file, and the page it gives agrees with the matrix.
    clone = tmp_path / "DeepSpeed"
    page = clone / "docs" / "_tutorials" / "automatic-tensor-parallelism.md"
    page.parent.mkdir(parents=True)
    shutil.copy(DOCS, page)
    subprocess.run(["git", "apply", str(out / "supported-models.diff")], cwd=clone, check=True)
    assert "- gpt2 — passes tp 2 (eager fp32)" in page.read_text().split("# Unsupported Models")[0]
    assert page.read_text().count("- llama") == 2  # llama (moved) and llama2 (untested here, kept)
    drift = check_drift({"gpt2": True, "bloom": False, "falcon": False, "llama": False}, page)
    assert (drift.listed_but_failing, drift.passing_but_unlisted) == ([], [])


def test_a_docs_copy_without_the_two_lists_is_refused(tmp_path):
    table = tmp_path / "docs.md"
    table.write_text("# Supported Models\n\n| Model |\n|---|\n| llama |\n\n# Unsupported Models\n\n- gpt2\n")
    with pytest.raises(ReportsError, match=r"docs\.md:1: '# Supported Models' has no bullet list under it"):
        docs_page({"supported_models": {"families": []}}, table)


def test_tp_sizes_name_an_entry_only_where_the_entries_differ():
    falcon, falcon_40b = (CellKey(m, "eager", "fp32", tp) for m, tp in (("falcon", 2), ("falcon_40b", 2)))
    assert (
        tp_text([falcon, falcon_40b, CellKey("falcon", "meta", "fp32", 2)], "falcon")
        == "tp 2 (eager fp32, meta fp32) and falcon_40b tp 2 (eager fp32)"
    )
    assert tp_text([falcon, CellKey("falcon", "meta", "fp32", 3)], "falcon") == "tp 2 (eager fp32), tp 3 (meta fp32)"
    assert tp_text([falcon, falcon_40b], "falcon") == "tp 2 (eager fp32)"  # alike: the family's result
    assert tp_text([falcon_40b], "falcon") == "falcon_40b tp 2 (eager fp32)"
    assert tp_text([falcon, CellKey("falcon", "eager", "fp32", 4)], "falcon") == "tp 2, 4 (eager fp32)"

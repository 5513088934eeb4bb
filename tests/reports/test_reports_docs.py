from pathlib import Path

import pytest

from reports import ReportsError
from reports.docs import normalise_model_name, read_docs_supported
from reports_testkit import Cell, fail, render, write_junit

DOCS = Path(__file__).parent / "fixtures" / "automatic-tensor-parallelism.md"


def test_drift_against_docs_list(scenario, tmp_path, capsys):
    # Here: bloom, falcon, gpt-neox pass everywhere at the latest versions; llama, opt, qwen2 fail.
    out = render(scenario, tmp_path, "--docs", str(DOCS))
    report = (out / "report.md").read_text()
    assert report.endswith(
        f"## Docs drift ({DOCS})\n\n"
        "- listed as supported but failing here: llama\n"
        "- listed as supported but failing here: qwen2\n"
        "- passing here but not listed: falcon\n"
    )
    assert "docs drift: 2 listed but failing, 1 passing but unlisted" in capsys.readouterr().out
    supported = (out / "supported-models.md").read_text()
    assert "# Supported Models\n\nThe following model families" in supported
    assert supported.split("\n\n")[3] == "- bloom\n- falcon\n- gpt-neox"
    assert supported.rstrip().endswith("- llama\n- opt\n- qwen2")


def test_docs_table_format_and_tolerant_names(tmp_path):
    table = tmp_path / "docs.md"
    table.write_text("## Supported Models\n\n| Model | Notes |\n|---|---|\n| [GPT-NeoX](https://x) | ok |\n"
                     "| `Qwen2.5` | |\n\n## Other\n- not a model\n")
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
    write_junit(tmp_path / "junit" / "run.xml", cells, run_id="matrix@2026-12-02T10:00:00Z@runner-1",
                started="2026-12-02T10:00:00Z")
    supported = (render(tmp_path / "junit", tmp_path) / "supported-models.md").read_text()
    assert ": 1 supported, 1 unsupported, 1 not tested (report.md has every cell) -->" in supported.splitlines()[0]
    assert supported.endswith("# Not Tested\n\nEvery cell of these models was skipped here; each cell's reason "
                              "(e.g. remote code only) is in results/cells.jsonl.\n\n- remote_only\n")

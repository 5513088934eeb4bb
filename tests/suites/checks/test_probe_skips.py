"""A probe an architecture cannot run is skipped alone, with its reason (issue #57): git (GitForCausalLM, image to
text) cannot run the text-only `labels=` loss, so its cells run every other probe and the perplexity check passes
naming why; before, the whole architecture was a skip at every version."""

from __future__ import annotations

import dataclasses

import pytest

from matrix.cells import expand
from matrix.derive import DERIVED_FILE, load_derived_data
from matrix.registry import RegistryError
from suites.run.driver import RunOptions, run_cell, skip_reason


def test_git_is_derived_with_its_perplexity_probe_skipped():
    (cell,) = expand("git", "eager", "fp32", "2")
    assert cell.model.skip_reason is None
    assert cell.model.probe_skips["perplexity"].startswith("image-to-text model")
    assert "git" not in load_derived_data().skips


def test_git_training_is_a_named_skip():
    """A training step's loss is the `labels=` path the model cannot run: its training cells skip with the reason
    (they failed as `setup` in the unsharded steps before)."""
    (cell,) = expand("git", "train", "fp32", "2")
    assert skip_reason(cell, RunOptions()) == (
        f"training steps on the labels= loss, which {cell.model.name} cannot run: "
        f"{cell.model.probe_skips['perplexity']}"
    )


@pytest.mark.parametrize(
    "table, problem",
    [('[probe_skip.llama]\nlogits = "no"\n', "probe_skip.llama"), ("[probe_skips.git]\n", "unknown table")],
)
def test_a_probe_skip_that_names_no_skippable_probe_is_refused(tmp_path, table, problem):
    path = tmp_path / "derived.toml"
    path.write_text(DERIVED_FILE.read_text() + "\n" + table)
    with pytest.raises(RegistryError, match=problem):
        load_derived_data(path)


@pytest.mark.autotp
def test_git_runs_its_text_probes(rank_pool):
    """The unsharded model answers every text probe (the reference is computed: no `setup` failure) and the sharded
    one is judged by them; only perplexity is not probed, and the cell says why."""
    (cell,) = expand("git", "eager", "fp32", "2")
    outcome = run_cell(cell, rank_pool, RunOptions(cell_timeout=600))
    assert outcome.outcome != "skip", outcome.message
    assert outcome.failure_class != "setup", outcome.message
    if outcome.outcome == "pass":
        assert "perplexity not probed: image-to-text model" in outcome.message
        assert "logits_max_abs" in outcome.metrics and "ppl_ref" not in outcome.metrics
    unskipped = dataclasses.replace(cell, model=dataclasses.replace(cell.model, probe_skips={}))
    assert run_cell(unskipped, rank_pool, RunOptions(cell_timeout=600)).failure_class == "setup"  # the probe's failure

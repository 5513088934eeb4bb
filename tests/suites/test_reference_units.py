"""The unsharded reference's guards: never computed in a process that sharded, recomputed when its inputs change."""

import pytest
import torch

from matrix.cells import expand


def test_reference_is_refused_in_a_process_that_sharded(monkeypatch):
    from suites import reference
    from suites.variants import loading

    monkeypatch.setattr(loading, "_process_sharded", False)
    loading.mark_process_sharded()
    with pytest.raises(loading.ContaminatedProcessError):
        reference.compute_reference("unused", None, "fp32", reference.ProbeSpec())


def test_editing_the_corpus_gives_a_new_reference(tmp_path, monkeypatch):
    """A cached reference keyed without the probe inputs would be read back after the corpus changed and
    turn every cell into a false `numerics`; the key holds the corpus and the probe code."""
    from matrix.checkpoints import tiny_checkpoint
    from suites.checks import inputs
    from suites.reference import cached_reference, reference_path

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(inputs.CORPUS_FILE.read_text())
    monkeypatch.setattr(inputs, "CORPUS_FILE", corpus)
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    checkpoint = str(tiny_checkpoint(expand("llama", tp="2")[0].model))
    spec = inputs.ProbeSpec()
    before = cached_reference(checkpoint, None, "fp32", spec)
    corpus.write_text("Another opening sentence. " + corpus.read_text())
    after = reference_path(checkpoint, None, "fp32", spec)
    assert after != before and not after.exists()
    assert not torch.equal(torch.load(cached_reference(checkpoint, None, "fp32", spec))["logits_plain"],
                           torch.load(before)["logits_plain"])

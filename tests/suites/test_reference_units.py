"""The unsharded reference's guards: never computed in a process that sharded, recomputed when its inputs change."""

import pytest
import torch

from matrix.cells import expand


def test_reference_is_refused_in_a_process_that_sharded(monkeypatch):
    from suites.reference import unsharded
    from suites.variants import loading

    monkeypatch.setattr(loading, "_process_sharded", False)
    loading.mark_process_sharded()
    with pytest.raises(loading.ContaminatedProcessError):
        unsharded.compute_reference("unused", None, "fp32", unsharded.ProbeSpec())


def test_editing_the_corpus_gives_a_new_reference(tmp_path, monkeypatch):
    """A cached reference keyed without the probe inputs would be read back after the corpus changed and
    turn every cell into a false `numerics`; the key holds the corpus and the probe code."""
    from matrix.checkpoints import resolve_checkpoint
    from suites.checks import inputs
    from suites.reference.cache import cached_reference
    from suites.reference.checkpoint_sizes import checkpoint_size
    from suites.reference.memory_plan import Runner, plan_reference
    from suites.reference.unsharded import reference_path

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(inputs.CORPUS_FILE.read_text())
    monkeypatch.setattr(inputs, "CORPUS_FILE", corpus)
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    checkpoint = resolve_checkpoint(expand("llama", tp="2")[0].model, "tiny")
    spec = inputs.ProbeSpec()
    plan = plan_reference(checkpoint_size(checkpoint.folder), "fp32", Runner.detect())
    before = cached_reference(checkpoint, "fp32", spec, plan=plan)
    corpus.write_text("Another opening sentence. " + corpus.read_text())
    after = reference_path(checkpoint, "fp32", spec)
    assert after != before and not after.exists()
    assert not torch.equal(
        torch.load(cached_reference(checkpoint, "fp32", spec, plan=plan))["logits_plain"],
        torch.load(before)["logits_plain"],
    )


def test_export_skips_cached_task_references(tmp_path, monkeypatch):
    """A task reference (`task-<key>.json`, a JSON list of answers) sits next to the references' sidecars; export
    read it as a sidecar and raised on the list."""
    import json

    from matrix.checkpoints import Checkpoint
    from suites.reference.unsharded import export_references, import_references, path_for

    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    checkpoint = Checkpoint("unused", None, "org/model", "1" * 40)
    identity = {"checkpoint": {"source": "org/model", "revision": "1" * 40}, "tokenizer": None, "dtype": "fp32"}
    reference = path_for(identity)
    reference.parent.mkdir(parents=True)
    torch.save({"logits_plain": torch.zeros(1)}, reference)
    reference.with_suffix(".json").write_text(json.dumps({"identity": identity}))
    path_for({"task": "world-facts"}, prefix="task-", suffix=".json").write_text(json.dumps([True, False]))
    bundle, count = export_references(checkpoint, tmp_path / "model.autotp-references.pt")
    assert count == 1
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "elsewhere"))
    assert import_references(bundle) == 1 and path_for(identity).exists()


def test_a_transformers_commit_gets_its_own_tiny_checkpoint_and_reference(monkeypatch):
    """Commit checkouts share a `.dev0` version: keyed by the version alone, a bisection step would read the tiny
    checkpoint and the unsharded reference another commit's transformers computed. A release keeps its keys."""
    from matrix import installed
    from matrix.checkpoints import Checkpoint, tiny_key
    from suites.checks.inputs import ProbeSpec
    from suites.reference.unsharded import reference_identity

    entry = expand("llama", tp="2")[0].model

    def keys_at(commit: str) -> tuple[str, dict]:
        def checkout(package: str) -> dict | None:
            if package != "transformers" or not commit:
                return None
            return {"url": "file:///clones/transformers", "vcs_info": {"vcs": "git", "commit_id": commit}}

        monkeypatch.setattr(installed, "direct_url", checkout)
        return tiny_key(entry), reference_identity(
            Checkpoint("unused", None, "org/model", "1" * 40), "fp32", ProbeSpec()
        )

    release, first, second = keys_at(""), keys_at("a" * 40), keys_at("b" * 40)
    assert len({release[0], first[0], second[0]}) == 3
    assert release[1] != first[1] != second[1] != release[1]
    assert "transformers_commit" not in release[1] and first[1]["transformers_commit"] == "a" * 40

"""`python -m sessions.add_model`: real config folders of several architectures become registry
entries that keep their sharding structure; duplicates and broken sources are refused; one entry
runs for real at tp 2 and 3 and the checklist reports the cells."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from matrix.checkpoints import tiny_config
from matrix.registry import MODELS_FILE, ModelEntry, RegistryError, load_models
from sessions import add_model

# Trimmed real configs (the fields that describe the architecture) of well-known checkpoints.
CONFIGS = {
    "llama3": (
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 32,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
            "tie_word_embeddings": False,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "torch_dtype": "bfloat16",
        },
        {"num_attention_heads": 8, "num_key_value_heads": 2, "tie_word_embeddings": False},
    ),
    "falcon_7b": (
        {
            "model_type": "falcon",
            "hidden_size": 4544,
            "num_attention_heads": 71,
            "num_hidden_layers": 32,
            "multi_query": True,
            "parallel_attn": True,
            "bias": False,
            "alibi": False,
            "new_decoder_architecture": False,
            "vocab_size": 65024,
            "bos_token_id": 11,
            "eos_token_id": 11,
        },
        {"multi_query": True, "parallel_attn": True, "alibi": False, "new_decoder_architecture": False},
    ),
    "bloom_560m": (
        {
            "model_type": "bloom",
            "hidden_size": 1024,
            "n_head": 16,
            "n_layer": 24,
            "vocab_size": 250880,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 3,
        },
        {"n_head": 8, "hidden_size": 128, "pad_token_id": 3},
    ),
    "mixtral_8x7b": (
        {
            "model_type": "mixtral",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 32,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "vocab_size": 32000,
            "sliding_window": None,
            "rope_theta": 1000000.0,
        },
        {"num_local_experts": 4, "num_experts_per_tok": 2, "num_key_value_heads": 2},
    ),
    "gemma2_2b": (
        {
            "model_type": "gemma2",
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "num_hidden_layers": 26,
            "vocab_size": 256000,
            "sliding_window": 4096,
            "query_pre_attn_scalar": 256,
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        {
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "sliding_window": 16,
            "head_dim": 32,
            "final_logit_softcapping": 30.0,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "gpt2_small": (
        {
            "model_type": "gpt2",
            "n_embd": 768,
            "n_head": 12,
            "n_layer": 12,
            "n_positions": 1024,
            "vocab_size": 50257,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
        },
        {"n_head": 8, "n_positions": 512, "tie_word_embeddings": True},
    ),
}


@pytest.fixture
def models_file(tmp_path) -> Path:
    path = tmp_path / "models.toml"
    shutil.copy(MODELS_FILE, path)
    return path


def checkpoint_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS[name][0]))
    return folder


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_local_config_becomes_an_entry_that_keeps_its_structure(tmp_path, models_file, name, capsys):
    before = load_models(models_file)
    assert add_model.main([str(checkpoint_folder(tmp_path, name)), "--models-file", str(models_file), "--no-run"]) == 0
    after = load_models(models_file)
    assert list(after) == [*before, name], "exactly one table appended, the rest untouched"
    entry = after[name]
    config = tiny_config(entry).to_dict()
    expected = CONFIGS[name][1]
    assert {k: config[k] for k in expected} == expected
    assert entry.tiny_why.startswith("derived:")
    assert "Checklist for the DeepSpeed PR" in capsys.readouterr().out


def test_duplicate_name_and_hub_id_are_refused(tmp_path, models_file, capsys):
    folder = checkpoint_folder(tmp_path, "gpt2_small")
    assert add_model.main([str(folder), "--models-file", str(models_file), "--no-run"]) == 0
    text = models_file.read_text()
    assert add_model.main([str(folder), "--models-file", str(models_file), "--no-run"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert add_model.main(["gpt2", "--name", "llama", "--models-file", str(models_file), "--no-run"]) == 2
    assert models_file.read_text() == text, "a refused entry writes nothing"
    duplicate_hub = ModelEntry("other", "llama", {}, hub_ids=("meta-llama/Llama-2-7b-hf",))
    with pytest.raises(RegistryError, match="already registered as \\[models.llama\\]"):
        add_model.append_entry(duplicate_hub, models_file)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no config.json"),
        ({"model_type": "no_such_architecture"}, "not in the installed transformers"),
    ],
)
def test_unusable_sources_are_refused(tmp_path, models_file, content, message, capsys):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    if content is not None:
        (folder / "config.json").write_text(json.dumps(content))
    assert add_model.main([str(folder), "--models-file", str(models_file), "--no-run"]) == 2
    assert message in capsys.readouterr().err


def test_model_type_source_uses_class_defaults(models_file):
    assert add_model.main(["cwm", "--models-file", str(models_file), "--no-run"]) == 0
    assert load_models(models_file)["cwm"].model_type == "cwm"


def test_model_type_source_gets_the_derived_toml_fix(models_file):
    """dbrx's class defaults do not build (no rope_theta in the attention sub-config); derived.toml's fix does."""
    assert add_model.main(["dbrx", "--name", "dbrx_added", "--models-file", str(models_file), "--no-run"]) == 0
    assert load_models(models_file)["dbrx_added"].tiny["attn_config"]["rope_theta"] == 10000.0


def test_toml_values_round_trip():
    import tomllib

    value = {"a": [1, 2.5, True, 'x"y'], "nested": {"rope_type": "llama3", "factor": 8.0}, "inf": float("inf")}
    assert tomllib.loads(f"v = {add_model.toml_value(value)}")["v"] == value


@pytest.mark.autotp
def test_added_model_runs_at_tp_2_and_3_and_the_checklist_reports_it(tmp_path, models_file, capsys):
    folder = checkpoint_folder(tmp_path, "llama3")
    assert add_model.main([str(folder), "--models-file", str(models_file), "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "results" / "cells.jsonl").read_text().splitlines()]
    assert sorted(r["cell"]["tp"] for r in records) == ["2", "3"]
    assert all(r["outcome"] == "pass" for r in records), [r["signature"] for r in records]
    assert "[x] AutoTP cells on the tiny checkpoint: tp2 pass, tp3 pass" in out


def test_a_tiny_config_that_does_not_build_is_refused_and_nothing_written(tmp_path, models_file, monkeypatch, capsys):
    from matrix.shrink import Derivation

    derive = add_model.derive_for_model_type

    def broken(model_type, data):  # inject a real inconsistency: rotary dims beyond head_dim
        derivation = derive(model_type, data)
        return Derivation({**derivation.tiny, "rotary_dim": 64}, derivation.why)

    monkeypatch.setattr(add_model, "derive_for_model_type", broken)
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    text = models_file.read_text()
    assert add_model.main(["gptj", "--name", "gptj_broken", "--models-file", str(models_file), "--no-run"]) == 2
    assert "does not build" in capsys.readouterr().err
    assert models_file.read_text() == text

"""Derived tiny configs (matrix/derive.py): every rule keeps the structure that matters for sharding
and every derived value consistent; every causal-LM architecture is derived or a named skip; the
selection syntax reaches them; a sample runs for real under AutoTP at tp 2 and 3."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from matrix.cells import expand
from matrix.checkpoints import tiny_config
from matrix.config_keys import MAX_PARAMS
from matrix.derive import (
    DerivedData,
    VersionSkip,
    causal_lm_model_types,
    derive_for_model_type,
    derived_entries,
    load_derived_data,
)
from matrix.registry import ModelEntry, RegistryError, load_models
from matrix.shrink import NotDerivable, derive_tiny
from suites.run.driver import RunOptions, run_cell, skip_reason

# Families with different attribute names and structure: GQA/MQA/MHA, fused qkv, ALiBi, MoE (plain,
# grouped routing, shared experts), MLA, sliding/local windows and layer-type lists, hybrids
# (mamba/linear attention/conv), per-layer widths, encoder-decoder decoders, sub-config tables.
FAMILIES = [
    "llama",
    "mistral",
    "mixtral",
    "qwen2_moe",
    "qwen3_next",
    "deepseek_v3",
    "falcon",
    "bloom",
    "gpt2",
    "gptj",
    "codegen",
    "gpt_neo",
    "gemma2",
    "gemma3_text",
    "gemma3n_text",
    "jamba",
    "phi3",
    "mpt",
    "dbrx",
    "opt",
    "llama4_text",
    "lfm2",
    "bamba",
    "zamba2",
    "recurrent_gemma",
    "dots3_note_text",
    "bart",
    "xlm",
    "roc_bert",
    "afmoe",
    "longcat_flash",
    "granitemoehybrid",
    "minimax",
    "falcon_h1",
]


def _values(model_type: str):
    derivation = derive_for_model_type(model_type, load_derived_data())
    entry = ModelEntry(model_type.replace("-", "_"), model_type, derivation.tiny, derivation.why)
    config = tiny_config(entry)
    return AutoConfig.for_model(model_type).to_dict(), config.to_dict(), config, entry


@pytest.fixture(scope="module")
def data() -> DerivedData:
    return load_derived_data()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_derived_config_is_tiny_and_consistent(model_type):
    source, tiny, config, entry = _values(model_type)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(entry))
    params = sum(p.numel() for p in model.parameters())
    assert params <= MAX_PARAMS, f"{model_type}: {params} parameters"
    vocab = tiny["vocab_size"]
    for key, value in tiny.items():
        if key.endswith(("_token_id", "_token_index")):
            for token in value if isinstance(value, list) else [value]:
                assert token is None or token < vocab, f"{model_type}.{key}={token} >= vocab {vocab}"
    if tiny.get("rotary_dim"):
        head_dim = tiny.get("head_dim") or config.hidden_size // config.num_attention_heads
        assert tiny["rotary_dim"] <= head_dim
    layers = next(
        tiny[k] for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers") if tiny.get(k)
    )
    source_layers = next(
        source[k] for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers") if source.get(k)
    )
    for key in ("layer_types", "mlp_layer_types", "layers_block_type", "no_rope_layers"):
        if isinstance(source.get(key), list) and len(source[key]) == source_layers:
            assert len(tiny[key]) == layers, f"{model_type}.{key} has {len(tiny[key])} entries for {layers} layers"
            assert set(source[key]) <= set(tiny[key]), f"{model_type}.{key} lost a layer kind"


@pytest.mark.parametrize(
    "model_type, real, expected",
    [
        (
            "llama",
            {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8},
            {"num_attention_heads": 8, "num_key_value_heads": 2},
        ),  # GQA 4:1 kept
        (
            "qwen2",
            {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4},
            {"num_attention_heads": 8, "num_key_value_heads": 2},
        ),  # GQA 7:1 capped at 4:1
        (
            "falcon",
            {
                "hidden_size": 4544,
                "num_attention_heads": 71,
                "multi_query": True,
                "bias": True,
                "parallel_attn": True,
                "new_decoder_architecture": False,
            },
            {
                "num_attention_heads": 8,
                "multi_query": True,
                "bias": True,
                "parallel_attn": True,
                "new_decoder_architecture": False,
            },
        ),
        (
            "gpt2",
            {"n_embd": 768, "n_head": 12, "tie_word_embeddings": False},
            {"n_head": 8, "tie_word_embeddings": False},
        ),
        (
            "mixtral",
            {"num_local_experts": 8, "num_experts_per_tok": 2},
            {"num_local_experts": 4, "num_experts_per_tok": 2},
        ),
        ("bloom", {"n_head": 32, "hidden_size": 4096}, {"n_head": 8, "hidden_size": 128}),  # ALiBi per head
    ],
)
def test_real_config_keeps_what_matters_for_sharding(model_type, real, expected):
    config = AutoConfig.for_model(model_type, **real)
    tiny = tiny_config(ModelEntry("x", model_type, derive_tiny(config, real=True).tiny)).to_dict()
    assert {k: tiny[k] for k in expected} == expected


def test_layer_plan_keeps_one_layer_per_kind_and_remaps_indices():
    config = AutoConfig.for_model(
        "qwen2_moe",
        num_hidden_layers=24,
        mlp_only_layers=[0, 12],
        layer_types=["sliding_attention"] * 6 + ["full_attention"] * 18,
        use_sliding_window=True,
    )
    tiny = derive_tiny(config, real=True).tiny
    assert tiny["num_hidden_layers"] == 4  # (sliding, dense) (sliding, moe) (full, moe) (full, dense)
    assert tiny["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention", "full_attention"]
    assert tiny["mlp_only_layers"] == [0, 3]


def test_token_ids_move_into_the_vocab_and_equal_ids_stay_equal():
    config = AutoConfig.for_model("gpt2", pad_token_id=50256, bos_token_id=50256, eos_token_id=50256)
    tiny = derive_tiny(config, real=True).tiny
    assert tiny["pad_token_id"] == tiny["bos_token_id"] == tiny["eos_token_id"] < tiny["vocab_size"]


def test_every_causal_lm_architecture_is_registered_derived_or_a_named_skip():
    registry = load_models()
    derived = derived_entries(registry)
    covered = {e.model_type for e in registry.values()} | {e.model_type for e in derived.values()}
    assert covered == set(causal_lm_model_types())
    skipped = [e for e in derived.values() if e.skip_reason]
    assert all(len(e.skip_reason) > len(e.model_type) + 20 for e in skipped), "a skip needs a real reason"
    assert all(e.tiny for e in derived.values() if not e.skip_reason)
    assert not set(derived) & set(registry), "derived names must not shadow registry names"


def test_skip_reason_reaches_the_cell_outcome():
    """An unbuildable architecture must surface as a skip with its reason, never vanish."""
    registry = load_models()
    data = load_derived_data()
    entry = next(e for e in derived_entries(registry, data).values() if e.skip_reason)
    cell = next(c for c in expand(entry.name, tp="2"))
    assert skip_reason(cell, RunOptions()) == entry.skip_reason
    outcome = run_cell(cell, pool=None, options=RunOptions())  # a skip never touches the pool
    assert (outcome.outcome, outcome.message) == ("skip", entry.skip_reason)


def test_skip_list_entry_overrides_derivation(data):
    with pytest.raises(NotDerivable, match="injected reason"):
        derive_for_model_type("llama", DerivedData(fixes={}, skips={"llama": "injected reason"}))


def test_fix_merges_into_sub_config_tables():
    tiny = derive_for_model_type("dbrx", DerivedData(fixes={"dbrx": {"ffn_config": {"moe_top_k": 1}}}, skips={})).tiny
    assert tiny["ffn_config"]["moe_top_k"] == 1 and tiny["ffn_config"]["moe_num_experts"] == 4


@pytest.mark.parametrize(
    "text, message, entry",
    [
        ("[skip]\nllama = ''\n", "non-empty reason", ""),
        ("[skips]\n", "unknown table", ""),
        ("[skip\n", "not valid TOML", ""),
        (
            '[[skip_at.llama]]\ntransformers = "4.46"\nreason = "r"\n',
            "field 'transformers' must be a version range",
            "[[skip_at.llama]]",
        ),
        (
            '[[skip_at.llama]]\ntransformers = ""\nreason = "r"\n',
            "field 'transformers' must be a version range",
            "[[skip_at.llama]]",
        ),
        (
            '[[skip_at.llama]]\ntransformers = 4.46\nreason = "r"\n',
            "field 'transformers' must be a string, got 4.46",
            "[[skip_at.llama]]",
        ),
        (
            '[[skip_at.llama]]\ntransformers = "<4.46"\nreason = " "\n',
            "field 'reason' needs a non-empty string",
            "[[skip_at.llama]]",
        ),
        (
            '[[skip_at.llama]]\ntransformers = "<4.46"\n',
            "is missing required field 'reason'",
            "[[skip_at.llama]]",
        ),
        (
            '[[skip_at.llama]]\ntransformers = "<4.46"\nreason = "r"\nwhy = "w"\n',
            r"unknown field\(s\) \['why'\]",
            "[[skip_at.llama]]",
        ),
        (
            '[skip]\nllama = "every release"\n[[skip_at.llama]]\ntransformers = "<4.46"\nreason = "r"\n',
            "already skipped at every release",
            "[[skip_at.llama]]",
        ),
        ('[skip_at]\nllama = "r"\n', "must be tables", "[[skip_at.llama]]"),
    ],
)
def test_bad_derived_data_is_refused_naming_the_file_and_entry(tmp_path, text, message, entry):
    path = tmp_path / "derived.toml"
    path.write_text(text)
    with pytest.raises(RegistryError, match=message) as error:
        load_derived_data(path)
    assert str(path) in str(error.value) and entry in str(error.value)


SKIP_AT = """
[[skip_at.llama]]
transformers = ">=4.46, <4.54"
reason = "a generate() bug"

[[skip_at.llama]]
transformers = "==5.0.*"
reason = "another bug"

[skip_at.gpt2]
transformers = "<4.53"
reason = "one range"
"""


def test_version_bounded_skips_are_parsed(tmp_path):
    path = tmp_path / "derived.toml"
    path.write_text(SKIP_AT)
    data = load_derived_data(path)
    assert data.version_skips == {
        "llama": (VersionSkip(">=4.46, <4.54", "a generate() bug"), VersionSkip("==5.0.*", "another bug")),
        "gpt2": (VersionSkip("<4.53", "one range"),),
    }
    assert data.skips == {} and data.fixes == {}


@pytest.mark.parametrize(
    "version, skipped", [("4.52.4", True), ("4.53.0", False), ("4.53.1", False), ("5.24.0", False)]
)
def test_version_bounded_skip_applies_below_its_bound_only(tmp_path, version, skipped):
    path = tmp_path / "derived.toml"
    path.write_text(SKIP_AT)
    data = load_derived_data(path)
    if skipped:
        with pytest.raises(NotDerivable, match=rf"one range \(transformers {version}; skipped at <4.53\)"):
            derive_for_model_type("gpt2", data, version)
    else:
        assert derive_for_model_type("gpt2", data, version).tiny["n_head"] == 8


@pytest.mark.parametrize(
    "version, reason",
    [
        ("4.45.2", None),
        ("4.46.0", "a generate() bug"),
        ("4.53.3", "a generate() bug"),
        ("4.54.0", None),
        ("5.0.0", "another bug"),
        ("5.1.0", None),
    ],
)
def test_version_bounded_skip_ranges(tmp_path, version, reason):
    path = tmp_path / "derived.toml"
    path.write_text(SKIP_AT)
    found = load_derived_data(path).skip_reason("llama", version)
    assert (found and found.split(" (transformers")[0]) == reason


def test_version_bounded_skip_reaches_the_derived_entry():
    """At the installed release: a range that holds there skips the entry with its reason, one that ends there does
    not."""
    import transformers

    version, registry = transformers.__version__, load_models()
    name, entry = next((n, e) for n, e in derived_entries(registry).items() if not e.skip_reason)
    data = DerivedData(
        fixes={}, skips={}, version_skips={entry.model_type: (VersionSkip(f"<={version}", "injected bug"),)}
    )
    assert (
        derived_entries(registry, data)[name].skip_reason
        == f"{entry.model_type}: injected bug (transformers {version}; skipped at <={version})"
    )
    data = DerivedData(
        fixes={}, skips={}, version_skips={entry.model_type: (VersionSkip(f"<{version}", "injected bug"),)}
    )
    assert derived_entries(registry, data)[name].skip_reason is None


def test_selection_syntax():
    registry = load_models()
    assert len(expand("registry", tp="2")) == len(registry)
    derived = expand("derived", tp="2")
    every = expand("all", tp="2")
    assert len(every) == len(registry) + len(derived)
    assert {c.model.model_type for c in every} == set(causal_lm_model_types())
    assert [c.model.name for c in expand("llama,afmoe", tp="2")] == ["llama", "afmoe"]
    with pytest.raises(RegistryError, match="did you mean"):
        expand("afmoee", tp="2")


# A sample of derived architectures of different kinds (MoE with grouped routing, hybrid, plain),
# run for real: one rank group per tp size. AutoTP may fail them (that is a finding); the harness
# must not: no `setup` failure, and an outcome with a failure class when it fails.
SAMPLE = "axk1,cwm,ministral3"


@pytest.mark.autotp
@pytest.mark.parametrize("tp", ["2", "3"])
def test_sample_of_derived_architectures_runs_under_autotp(tp, rank_pool):
    outcomes = {
        cell.model.name: run_cell(cell, rank_pool, RunOptions(cell_timeout=60.0)) for cell in expand(SAMPLE, tp=tp)
    }
    for name, outcome in outcomes.items():
        assert outcome.outcome in ("pass", "fail"), f"{name}: {outcome.message}"
        assert outcome.failure_class != "setup", f"{name} tp{tp}: {outcome.signature}"

"""Faithful means the layer pattern too (matrix/shapes/layer_kinds.py): a faithful tiny config keeps one layer of every
kind its checkpoint has (dense/sparse MLP, attention and mixer kinds), in the order they first appear, and no other;
real_shapes.toml records each checkpoint's pattern and `python -m matrix.shapes --check` fails on a tiny config whose
pattern differs."""

import re
from pathlib import Path

import pytest
from transformers import AutoConfig

from matrix.registry import MODELS_FILE, RegistryError, load_models
from matrix.shapes import REAL_SHAPES_FILE, load_real_shapes, main, shaped_entry
from matrix.shapes.layer_kinds import first_appearance, layer_kinds, tiny_layer_fields


def _kinds(model_type: str, tiny: dict) -> tuple[str, ...]:
    return layer_kinds(AutoConfig.for_model(model_type, **tiny))


@pytest.fixture(scope="module")
def registry():
    return load_models()


@pytest.fixture(scope="module")
def shapes(registry):
    return load_real_shapes(registry=registry)


def test_qwen2_moe_faithful_is_all_sparse_like_qwen1_5_moe(registry, shapes):
    entry = registry["qwen2_moe"]
    assert shapes["qwen2_moe"]["Qwen/Qwen1.5-MoE-A2.7B"].layer_pattern == ("full_attention/sparse",)
    faithful = shaped_entry(entry, "faithful", 2, shapes)
    assert set(_kinds(entry.model_type, faithful.tiny)) == {"full_attention/sparse"}
    # the stress shape keeps its deliberate dense first layer: a kind no Qwen1.5-MoE layer has
    assert _kinds(entry.model_type, entry.tiny)[0] == "full_attention/dense"


def test_jamba_faithful_keeps_its_three_layer_kinds_in_their_real_order(registry, shapes):
    entry = registry["jamba"]
    faithful = shaped_entry(entry, "faithful", 3, shapes)
    # Jamba-v0.1: attention every 8th layer from layer 4, experts every 2nd from layer 1: layer 0 mamba + dense MLP,
    # layer 1 mamba + experts, layer 4 attention + dense MLP; no attention layer has experts
    expected = ("mamba/dense", "mamba/sparse", "attention/dense")
    assert shapes["jamba"]["defaults"].layer_pattern == expected
    assert _kinds(entry.model_type, faithful.tiny) == expected
    assert "layers mamba/dense | mamba/sparse | attention/dense" in faithful.tiny_why


def test_the_reader_names_each_familys_layer_kinds():
    deepseek = {"num_hidden_layers": 5, "first_k_dense_replace": 2}
    assert _kinds("deepseek_v3", deepseek) == ("attention/dense",) * 2 + ("attention/sparse",) * 3
    neo = {"num_layers": 4, "attention_types": [[["global", "local"], 2]]}
    assert _kinds("gpt_neo", neo) == ("global/dense", "local/dense", "global/dense", "local/dense")
    smollm3 = {"num_hidden_layers": 4, "no_rope_layer_interval": 2}
    assert first_appearance(_kinds("smollm3", smollm3)) == ("full_attention/dense", "full_attention/dense/no_rope")
    qwen3_next = {"num_hidden_layers": 4, "full_attention_interval": 2, "decoder_sparse_step": 2}
    assert _kinds("qwen3_next", qwen3_next) == (
        "linear_attention/dense",
        "full_attention/sparse",
        "linear_attention/dense",
        "full_attention/sparse",
    )


def _registry_of(tmp_path, names: tuple[str, ...], plant: str = "") -> Path:
    """A models.toml and real_shapes.toml of only `names` (the real ones' tables), `plant` added to the first's tiny."""
    text = MODELS_FILE.read_text()
    tables = [re.search(rf"^\[models\.{name}\]\n(?:.+\n)+", text, re.M) for name in names]
    models = "\n".join(table.group(0) for table in tables if table)
    if plant:
        models = models.replace("tiny = { ", f"tiny = {{ {plant}, ", 1)
    (tmp_path / "models.toml").write_text(models)
    shapes = REAL_SHAPES_FILE.read_text()
    header = shapes.split("\n[", 1)[0]
    blocks = [re.search(rf"^\[{name}\]\n(?:.+\n)+", shapes, re.M) for name in names]
    (tmp_path / "real_shapes.toml").write_text(header + "\n" + "\n".join(b.group(0) for b in blocks if b))
    return tmp_path / "models.toml"


def test_check_fails_on_a_tiny_config_whose_layer_pattern_differs_from_its_checkpoints(tmp_path, capsys):
    models = _registry_of(tmp_path, ("qwen2", "qwen2_moe"))
    assert main(["--check", "--models-file", str(models)]) == 0
    # a field no record cites that still decides the kinds: qwen2 makes every layer from max_window_layers on sliding
    models = _registry_of(
        tmp_path, ("qwen2", "qwen2_moe"), plant="use_sliding_window = true, sliding_window = 16, max_window_layers = 1"
    )
    assert main(["--check", "--models-file", str(models)]) == 1
    said = capsys.readouterr().err
    assert "qwen2.faithful: its tiny config's layers are full_attention/dense | sliding_attention/dense" in said
    assert "but hub config Qwen/Qwen2-7B's are full_attention/dense" in said
    assert "[models.qwen2] tiny" in said and "`layers`" in said  # what to change
    assert "qwen2_moe" not in said  # the other entry is faithful


def test_a_record_citing_a_field_that_decides_no_layer_kind_is_refused(tmp_path):
    models = _registry_of(tmp_path, ("qwen2_moe",))
    records = tmp_path / "real_shapes.toml"
    records.write_text(records.read_text().replace("mlp_only_layers = []", "mlp_only_layer = []"))
    with pytest.raises(RegistryError, match=r"\[qwen2_moe\].*layers.*mlp_only_layer\b"):
        load_real_shapes(records, load_models(models))


PER_LAYER_LISTS = ("beam", "ergo", "hy_v4", "kimi_linear", "mimo_v2_flash", "zamba", "dots3_note_text", "gemma3n_text")
"""Derived architectures whose config lists more per layer than its mixers (mlp_layer_types, zamba's
layers_block_type, gemma3n's activation_sparsity_pattern, hy_v4's indexer_types): keeping one layer of each kind must
cut those lists alike, else the class refuses the faithful config and the architecture is skipped (#57: 8 of them at
transformers 5.25.0 once faithful shapes kept the layer pattern)."""


@pytest.mark.parametrize("model_type", PER_LAYER_LISTS)
def test_a_config_with_other_per_layer_lists_gets_a_faithful_tiny_config_with_its_real_pattern(model_type):
    from transformers import CONFIG_MAPPING

    from matrix.derive import derived_entry, load_derived_data
    from matrix.shapes import MATRIX_TP, faithful_groups, tiny_shape

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type}: not in this transformers")
    entry = derived_entry(model_type, {}, load_derived_data())
    assert not entry.skip_reason, entry.skip_reason
    shaped = shaped_entry(entry, "faithful", 2, {})
    assert shaped.skip_reason is None, shaped.skip_reason
    real = faithful_groups(entry, {}, MATRIX_TP)[0].record  # its config class defaults
    assert tiny_shape(model_type, shaped.tiny).layer_pattern == real.layer_pattern


def test_mlp_layer_types_decide_dense_and_sparse_layers():
    from transformers import CONFIG_MAPPING

    if "mimo_v2_flash" not in CONFIG_MAPPING:
        pytest.skip("mimo_v2_flash: not in this transformers")
    # MiMo-V2-Flash's class defaults: layer 0 full attention with a dense MLP, then experts on every layer
    kinds = layer_kinds(AutoConfig.for_model("mimo_v2_flash"))
    assert first_appearance(kinds) == ("full_attention/dense", "sliding_attention/sparse", "full_attention/sparse")


def test_a_refused_faithful_config_names_the_classs_reason_not_only_its_validator():
    from transformers import CONFIG_MAPPING

    from matrix.shapes.real_shape import checked_tiny_shape

    if "kimi_linear" not in CONFIG_MAPPING:
        pytest.skip("kimi_linear: not in this transformers")
    tiny = {"num_hidden_layers": 2, "mlp_layer_types": ["dense", "sparse", "sparse"]}
    refused = checked_tiny_shape("kimi_linear", tiny)
    assert isinstance(refused, str)
    # transformers' validator error says which validator on its first line and why on the next
    assert "must be equal to the number of `mlp_layer_types` (3)" in refused


def test_ministral_faithful_is_full_attention_then_sliding_like_ministral_8b(registry, shapes):
    """Ministral-8B-Instruct-2410 interleaves one full attention layer and three sliding ones, full first (its model
    card's Ragged (128k, 32k, 32k, 32k)); the class defaults (every layer sliding) stood for it before."""
    entry = registry["ministral"]
    expected = ("full_attention/dense", "sliding_attention/dense")
    assert shapes["ministral"]["mistralai/Ministral-8B-Instruct-2410"].layer_pattern == expected
    assert _kinds(entry.model_type, shaped_entry(entry, "faithful", 2, shapes).tiny) == expected


def test_exaone4_faithful_cells_are_the_global_1_2b_and_the_hybrid_32b(registry, shapes):
    """EXAONE-4.0-1.2B has global attention only and 8 kv heads; the 32B is hybrid (3 sliding : 1 full). The class
    defaults (the 32B's pattern, 32 kv heads) stood for both before."""
    entry = registry["exaone4"]
    small = shaped_entry(entry, "faithful", 2, shapes)
    assert small.checkpoints == ("LGAI-EXAONE/EXAONE-4.0-1.2B",)
    assert set(_kinds(entry.model_type, small.tiny)) == {"full_attention/dense"}
    assert small.tiny["tie_word_embeddings"] is True
    large = shaped_entry(entry, "faithful-exaone-4-0-32b", 2, shapes)
    assert large.checkpoints == ("LGAI-EXAONE/EXAONE-4.0-32B",)
    # the 32B's full layers skip rope (its config has a window); the 1.2B has none, so its every layer ropes
    assert _kinds(entry.model_type, large.tiny) == ("sliding_attention/dense", "full_attention/dense/no_rope")
    assert small.tiny["sliding_window"] is None


def _faithful_derived(model_type: str):
    from transformers import CONFIG_MAPPING

    from matrix.derive import derived_entry, load_derived_data

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type}: not in this transformers")
    entry = derived_entry(model_type, {}, load_derived_data())
    assert not entry.skip_reason, entry.skip_reason
    return shaped_entry(entry, "faithful", 2, {})


def _builds_on_meta(model_type: str, tiny: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **tiny))


def test_a_model_transformers_cannot_build_is_a_named_skip_when_the_config_is_derived():
    """The config class accepts a Zamba with one hybrid layer; the model class refuses it (its shared transformer is
    tied across hybrid layers, and one has nothing to tie into). That is the harness's shape, decided when the config
    is derived with transformers' reason, never a cell's `setup` failure."""
    from transformers import CONFIG_MAPPING

    from matrix.shapes.real_shape import UNBUILDABLE, checked_tiny_shape

    if "zamba" not in CONFIG_MAPPING:
        pytest.skip("zamba: not in this transformers")
    tiny = {"num_hidden_layers": 2, "layers_block_type": ["mamba", "hybrid"], "use_mamba_kernels": False}
    AutoConfig.for_model("zamba", **tiny)  # the config class accepts it
    refused = checked_tiny_shape("zamba", tiny)
    assert isinstance(refused, str)
    assert refused.startswith(f"{UNBUILDABLE}: ValueError: ") and "tie_weights_keys" in refused


def test_gemma3n_faithful_keeps_kv_shared_layers_of_each_attention_kind():
    """Gemma 3n's last `num_kv_shared_layers` reuse the keys and values of the last earlier layer of their attention
    kind: kinds of their own, each after a layer of its kind that stores them (the class refuses it otherwise)."""
    faithful = _faithful_derived("gemma3n_text")
    expected = (
        "sliding_attention/dense",
        "full_attention/dense",
        "sliding_attention/dense/kv_shared",
        "full_attention/dense/kv_shared",
    )
    assert first_appearance(layer_kinds(AutoConfig.for_model("gemma3n_text"))) == expected
    assert faithful.skip_reason is None, faithful.skip_reason
    assert _kinds("gemma3n_text", faithful.tiny) == expected
    _builds_on_meta("gemma3n_text", faithful.tiny)


def test_zamba_faithful_keeps_two_hybrid_layers_sharing_one_transformer():
    faithful = _faithful_derived("zamba")
    assert faithful.skip_reason is None, faithful.skip_reason
    assert _kinds("zamba", faithful.tiny) == ("linear_attention/dense", "hybrid/dense", "hybrid/dense")
    _builds_on_meta("zamba", faithful.tiny)


def test_a_layer_field_the_class_leaves_none_keeps_the_tiny_configs_value():
    """lfm2_moe's class defaults have no layer_types (None); derived.toml gives the tiny config LFM2-8B-A1B's kinds in
    their order (two dense conv layers, then attention with experts, then conv with experts), which the faithful
    config keeps instead of None (with which the model cannot be built)."""
    faithful = _faithful_derived("lfm2_moe")
    assert faithful.skip_reason is None, faithful.skip_reason
    assert faithful.tiny["layer_types"] == ["conv", "full_attention", "conv"]
    assert _kinds("lfm2_moe", faithful.tiny) == ("conv/dense", "full_attention/sparse", "conv/sparse")
    assert "NOT the checkpoint's" not in faithful.tiny_why
    _builds_on_meta("lfm2_moe", faithful.tiny)


BAMBA_9B_LAYERS = {"num_hidden_layers": 32, "attn_layer_indices": [9, 18, 27]}
"""ibm-ai-platform/Bamba-9B's config.json fields that decide its layer kinds: attention at 9, 18, 27, the rest mamba."""


def test_bamba_attention_layers_are_read_from_attn_layer_indices_and_renumbered():
    """Bamba names its attention layers by index (`attn_layer_indices`; `layers_block_type` is computed from it): the
    faithful rule keeps the first mamba and the first attention layer and renumbers the index list to them."""
    from transformers import CONFIG_MAPPING

    if "bamba" not in CONFIG_MAPPING:
        pytest.skip("bamba: not in this transformers")
    assert first_appearance(_kinds("bamba", BAMBA_9B_LAYERS)) == ("linear_attention/dense", "full_attention/dense")
    tiny = {"num_hidden_layers": 2, "attn_layer_indices": [1], "hidden_size": 64, "num_attention_heads": 4}
    fields = tiny_layer_fields("bamba", BAMBA_9B_LAYERS, tiny)
    assert fields["num_hidden_layers"] == 2
    assert fields["attn_layer_indices"] == [1]
    assert _kinds("bamba", {**tiny, **fields}) == ("linear_attention/dense", "full_attention/dense")


def test_bamba_faithful_keeps_the_attention_layer_derived_toml_gives_it():
    """derived.toml gives bamba's tiny config the attention layer its class defaults lack (Bamba-9B's order: mamba,
    then attention); the faithful record reads the defaults with that field, so the pattern is the checkpoint's."""
    faithful = _faithful_derived("bamba")
    assert faithful.skip_reason is None, faithful.skip_reason
    assert "with derived.toml's num_hidden_layers, attn_layer_indices" in faithful.tiny_why
    assert "NOT the checkpoint's" not in faithful.tiny_why
    assert _kinds("bamba", faithful.tiny) == ("linear_attention/dense", "full_attention/dense")
    _builds_on_meta("bamba", faithful.tiny)


def test_check_reads_a_file_written_under_another_transformers_as_up_to_date_when_its_shapes_agree(tmp_path, capsys):
    """`--write` names the transformers whose config defaults it read; `--check` under another release with the same
    shapes passes, and a changed shape still fails."""
    models = _registry_of(tmp_path, ("starcoder2",))
    records = tmp_path / "real_shapes.toml"
    written = records.read_text()
    assert "config-defaults transformers " in written
    records.write_text(re.sub(r'(config-defaults transformers )[^"]*"', r'\g<1>0.0.1"', written))
    assert main(["--check", "--models-file", str(models)]) == 0
    records.write_text(records.read_text().replace("heads = 24", "heads = 12", 1))
    assert main(["--check", "--models-file", str(models)]) == 1
    assert "is stale" in capsys.readouterr().err

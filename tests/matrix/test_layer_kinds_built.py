"""The layer kinds read from a config (matrix/shapes/layer_kinds.py) are the ones transformers builds: a layer read as
sparse has experts in the model built from that config, one read as dense has none, and a layer read without rope
computes no rotary positions. Each family names its dense-first MoE layers its own way (#57: lfm2_moe's and afmoe's
`num_dense_layers`, ernie4_5_moe's `moe_layer_start_index`, doge's `is_moe` were read as all sparse), and EXAONE 4's
sliding window decides which layers rope."""

from __future__ import annotations

import pytest
import torch
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM

from matrix.config_keys import LAYER_BOUNDARY_KEYS, LAYER_KEYS
from matrix.derive import derive_for_model_type, load_derived_data
from matrix.registry import RegistryError, load_models
from matrix.shapes import load_real_shapes
from matrix.shapes.layer_kinds import first_appearance, layer_kinds

# model_type: the dense/sparse MLP of each layer of its class defaults' layer fields
DEFAULT_MLPS = {
    "lfm2_moe": "dd" + "s" * 30,  # num_dense_layers = 2
    "afmoe": "d" + "s" * 31,  # num_dense_layers = 1
    "ernie4_5_moe": "d" + "s" * 27,  # moe_layer_start_index = 1, every layer to the last
    "doge": "d" * 32,  # is_moe = False: num_experts is set, the layers are dense
    "deepseek_v4": "hhh" + "s" * 40,  # mlp_layer_types: 3 hash-routed MoE layers, then top-k MoE layers
    "deepseek_v3": "ddd" + "s" * 58,  # first_k_dense_replace = 3
    "qwen2_moe": "s" * 24,
}
KIND_LETTERS = {"dense": "d", "sparse": "s", "hash_moe": "h"}


def _small(model_type: str) -> dict:
    """The derived tiny config's widths with the class defaults' layer fields (every layer, as the checkpoint has)."""
    tiny = derive_for_model_type(model_type, load_derived_data()).tiny
    defaults = AutoConfig.for_model(model_type)
    layers = defaults.num_hidden_layers
    keep = {}
    for key, value in tiny.items():
        default = getattr(defaults, key, None)
        if isinstance(value, list) and isinstance(default, list | tuple) and len(default) == layers:
            continue  # a per-layer list: the class defaults' own
        if key in (*LAYER_KEYS, *LAYER_BOUNDARY_KEYS):  # counted in layers: the class defaults' own
            continue
        keep[key] = value
    if defaults.to_dict().get("layer_types") is None and "layer_types" in tiny:  # lfm2_moe's defaults have none
        keep["layer_types"] = [tiny["layer_types"][index % len(tiny["layer_types"])] for index in range(layers)]
    return keep


def _built_mlps(model_type: str, config) -> str:
    """Per decoder layer, whether the model transformers builds has experts there (`s`) or not (`d`)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = model.model.layers
    return "".join("s" if any("expert" in name for name, _ in layer.named_parameters()) else "d" for layer in layers)


@pytest.mark.parametrize("model_type", sorted(DEFAULT_MLPS))
def test_dense_and_sparse_layers_are_read_as_transformers_builds_them(model_type):
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type}: not in this transformers")
    config = AutoConfig.for_model(model_type, **_small(model_type))
    read = "".join(KIND_LETTERS[kind.split("/")[1]] for kind in layer_kinds(config))
    assert read == DEFAULT_MLPS[model_type]
    assert _built_mlps(model_type, config) == read.replace("h", "s")  # hash-routed layers have experts too


def test_exaone4_layers_rope_where_the_config_has_no_window_or_the_layer_is_sliding():
    """Exaone4Attention ropes `if self.sliding_window is None or self.is_sliding`: with a window its full layers have
    no rotary positions (EXAONE-4.0-32B's NoPE global layers); without one every layer ropes (the 1.2B)."""
    full = ["full_attention", "full_attention"]
    windowed = layer_kinds(AutoConfig.for_model("exaone4", num_hidden_layers=2, layer_types=full, sliding_window=16))
    assert windowed == ("full_attention/dense/no_rope",) * 2
    plain = layer_kinds(AutoConfig.for_model("exaone4", num_hidden_layers=2, layer_types=full, sliding_window=None))
    assert plain == ("full_attention/dense",) * 2
    hybrid = AutoConfig.for_model("exaone4", num_hidden_layers=4, sliding_window=16, sliding_window_pattern=4)
    assert first_appearance(layer_kinds(hybrid)) == ("sliding_attention/dense", "full_attention/dense/no_rope")


def test_a_record_cites_a_window_only_as_configs_null(tmp_path):
    """real_shapes.toml spells config.json's null "null" (TOML has none); a window size there would be copied into
    the tiny config as the checkpoint's, so the loader refuses it."""
    from matrix.shapes import REAL_SHAPES_FILE

    text = REAL_SHAPES_FILE.read_text()
    assert 'sliding_window = "null"' in text  # EXAONE-4.0-1.2B's
    bad = tmp_path / "real_shapes.toml"
    bad.write_text(text.replace('sliding_window = "null"', "sliding_window = 4096"))
    with pytest.raises(RegistryError, match=r"exaone4.*sliding_window.*null"):
        load_real_shapes(bad, load_models())

"""One architecture never stops the expansion of the matrix (matrix/config_values.py): a config a reader cannot read is
that architecture's named skip, naming the reader (file and function) and the key; a harness exception for one
architecture in a step before its cells fails its cells as `setup`, naming where it raised; every other cell is
expanded as before. A synthetic config loses each key the readers use in turn."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from matrix import derive
from matrix.cells import expand
from matrix.config_values import UNREADABLE_CONFIG, ConfigValues, UnreadableConfig
from matrix.shapes import faithful_rule, read_shape, real_shape
from suites.checks.probes import split_counts
from suites.records.summary import unreadable_config_lines
from suites.run.driver import RunOptions, memory_plan_lines, run_cell

SYNTHETIC = "autotp_synthetic"
SYNTHETIC_VALUES = {
    "num_hidden_layers": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "hidden_size": 1024,
    "head_dim": 64,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 32,
    "v_head_dim": 64,
    "intermediate_size": 2816,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 1024,
    "n_shared_experts": 1,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
"""A latent-attention MoE config holding one name of every size group the readers use (matrix/shapes/ HEAD_KEYS,
KV_KEYS, ..., the latent value head dim, the vocabulary)."""
REQUIRED = {
    "num_attention_heads": "RegistryError",
    "hidden_size": "RegistryError",
    "vocab_size": "UnreadableConfig",
    "v_head_dim+head_dim": "UnreadableConfig",
}
"""Keys without which no faithful tiny config exists: heads and hidden (no split count applies: the skip names
the names it looked for), the vocabulary and the latent value head dim (an unreadable config)."""


def synthetic_class(missing: tuple[str, ...]) -> type:
    values = {key: value for key, value in SYNTHETIC_VALUES.items() if key not in missing}

    class SyntheticConfig(PretrainedConfig):
        model_type = SYNTHETIC

        def __init__(self, **kwargs):
            super().__init__(**{**values, **kwargs})

    return SyntheticConfig


@pytest.fixture
def synthetic(monkeypatch, tmp_path):
    """Registers `autotp_synthetic` as a causal-LM architecture of transformers lacking the keys it is given; an empty
    harness cache of its own (tiny shapes are remembered per model type and tiny config)."""
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    monkeypatch.setattr(derive, "causal_lm_model_types", lambda: [SYNTHETIC])
    # a config class with no model class: the build on the meta device (tested in test_layer_pattern.py) would refuse
    # every one, and this test is about the keys the readers use
    monkeypatch.setattr(real_shape, "_build_on_meta", lambda model_type, tiny: None)

    def register(missing: tuple[str, ...]) -> None:
        monkeypatch.setitem(CONFIG_MAPPING._extra_content, SYNTHETIC, synthetic_class(missing))

    return register


@pytest.mark.parametrize("missing", [*SYNTHETIC_VALUES, "v_head_dim+head_dim"])
def test_a_config_missing_any_key_the_readers_use_expands_into_cells_or_a_named_skip(synthetic, missing):
    keys = tuple(missing.split("+"))
    synthetic(keys)
    cells = expand(SYNTHETIC, tp="2,3,4", shapes="faithful,stress")  # raises nothing
    assert [cell.id for cell in cells] == [
        f"{SYNTHETIC}{shape}-eager-fp32-tp{tp}" for tp in (2, 3, 4) for shape in (".faithful", "")
    ]
    faithful = [cell.model for cell in cells if cell.model.name.endswith(".faithful")]
    if missing not in REQUIRED:
        assert all(entry.skip_reason is None and entry.expansion_error is None for entry in faithful)
        return
    for entry in faithful:
        assert entry.expansion_error is None
        assert "matrix/shapes/real_shape.py:read_shape" in entry.skip_reason and repr(keys[0]) in entry.skip_reason
        assert REQUIRED[missing] == "RegistryError" or entry.skip_reason.startswith(
            f"{UNREADABLE_CONFIG}: SyntheticConfig has no {keys[0]!r} (read by matrix/shapes/real_shape.py:read_shape)"
        )


@pytest.mark.parametrize("missing", ["vocab_size", "v_head_dim+head_dim"])
def test_split_counts_of_an_unreadable_config_raise_naming_the_key_never_count_zero(missing):
    """The memory check's counts (suites/checks/probes.py): an UnreadableConfig, which fails the cell as `setup`
    naming the reader and the key; counts of 0 would judge every weight as if nothing split."""
    keys = tuple(missing.split("+"))
    model = type("Model", (), {"config": synthetic_class(keys)()})()
    with pytest.raises(
        UnreadableConfig, match=f"has no {keys[0]!r} \\(read by matrix/shapes/real_shape.py:read_shape\\)"
    ):
        split_counts(model)
    no_heads = type("Model", (), {"config": synthetic_class(("num_attention_heads",))()})()
    assert split_counts(no_heads).heads == 0  # no attention heads (a state-space model): no count applies


def test_a_value_that_is_not_an_integer_is_unreadable_naming_the_key():
    config = synthetic_class(())(vocab_size=None)
    with pytest.raises(
        UnreadableConfig, match="'vocab_size' is None, not an integer \\(read by matrix/shapes/real_shape.py"
    ):
        read_shape(config, "test")


def test_config_values_name_the_function_that_indexed_them():
    def reader_of_the_test(values):
        return values["absent"]

    with pytest.raises(UnreadableConfig) as raised:
        reader_of_the_test(ConfigValues({"present": 1}, "SomeConfig"))
    # outside the harness's packages a reader is named by its file name alone
    assert str(raised.value) == "SomeConfig has no 'absent' (read by test_config_values.py:reader_of_the_test)"
    assert (raised.value.key, raised.value.config) == ("absent", "SomeConfig")


def test_deepseek_v4_reads_its_value_head_dim_from_head_dim():
    """deepseek_v4 has qk_rope_head_dim (latent attention) and no v_head_dim: its output projection reads heads x
    head_dim (one shared key-value head of head_dim, rope on part of it), and its faithful cells get a config."""
    if "deepseek_v4" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no deepseek_v4")
    config = AutoConfig.for_model("deepseek_v4")
    assert "v_head_dim" not in config.to_dict() and "qk_rope_head_dim" in config.to_dict()
    shape = read_shape(config, "test")
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (config.num_attention_heads, 1, config.head_dim)
    for cell in expand("deepseek_v4", tp="2,3,4", shapes="faithful"):
        assert (cell.model.skip_reason, cell.model.expansion_error) == (None, None)
        assert cell.model.tiny["head_dim"] * cell.model.tiny["num_attention_heads"] % 64 == (
            shape.heads * shape.head_dim % 64
        )


def test_a_harness_bug_deriving_one_architecture_fails_its_cells_as_setup_and_the_rest_expand(monkeypatch):
    real_derive_tiny = derive.derive_tiny

    def derive_tiny(config, real=False):
        if config.model_type == "afmoe":
            raise ZeroDivisionError("division by zero in a rule")  # stands for a bug in a rule of matrix/shrink.py
        return real_derive_tiny(config, real)

    monkeypatch.setattr(derive, "derive_tiny", derive_tiny)
    cells = {cell.id: cell for cell in expand("afmoe,deepseek_v4,qwen3_next", tp="2", shapes="faithful,stress")}
    assert set(cells) == {
        f"{name}{shape}-eager-fp32-tp2"
        for name in ("afmoe", "deepseek_v4", "qwen3_next")
        for shape in ("", ".faithful")
    }
    for shape in ("", ".faithful"):
        broken = cells[f"afmoe{shape}-eager-fp32-tp2"]
        assert broken.model.expansion_error.step == "derive"
        assert broken.model.expansion_error.where == "matrix/derive.py:derive_for_model_type"
        outcome = run_cell(broken, pool=None, options=RunOptions())  # never touches the pool
        assert (outcome.outcome, outcome.failure_class) == ("fail", "setup")
        assert (
            outcome.signature
            == "ZeroDivisionError: division by zero in a rule @ matrix/derive.py:derive_for_model_type"
        )
        assert outcome.message.startswith("expanding the matrix (derive) raised ZeroDivisionError")
    others = [cell for cell in cells.values() if not cell.id.startswith("afmoe")]
    assert all(cell.model.expansion_error is None and cell.model.tiny for cell in others)
    planned = "\n".join(memory_plan_lines(list(cells.values()), RunOptions()))
    assert "afmoe" not in planned and "deepseek_v4" in planned


def test_a_harness_bug_shaping_one_architecture_fails_its_cells_as_setup_and_the_rest_expand(monkeypatch):
    real_faithful_sizes = faithful_rule.faithful_sizes

    def faithful_sizes(real, tps, *args, **kwargs):
        if real.experts:
            raise AttributeError("'NoneType' object has no attribute 'experts'")  # stands for a bug in the rule
        return real_faithful_sizes(real, tps, *args, **kwargs)

    monkeypatch.setattr(faithful_rule, "faithful_sizes", faithful_sizes)
    cells = {cell.id: cell for cell in expand("mixtral,llama", tp="2,3", shapes="faithful,stress")}
    for tp in (2, 3):
        broken = cells[f"mixtral.faithful-eager-fp32-tp{tp}"]
        assert broken.model.expansion_error.step == "shapes"
        assert broken.model.expansion_error.where == "matrix/shapes/faithful_rule.py:faithful_tiny"
        outcome = run_cell(broken, pool=None, options=RunOptions())
        assert (outcome.failure_class, outcome.signature) == (
            "setup",
            "AttributeError: 'NoneType' object has no attribute 'experts' @ "
            "matrix/shapes/faithful_rule.py:faithful_tiny",
        )
        assert cells[f"mixtral-eager-fp32-tp{tp}"].model.expansion_error is None  # its stress cell runs
        assert cells[f"llama.faithful-eager-fp32-tp{tp}"].model.expansion_error is None


def test_a_wrong_selection_is_still_a_usage_error():
    from matrix.registry import RegistryError

    with pytest.raises(RegistryError, match="no checkpoint of llama splits apart under that name"):
        expand("llama.faithful-no-such-checkpoint", tp="2")


def test_the_summary_lists_each_model_skipped_for_an_unreadable_config():
    reason = (
        f"{UNREADABLE_CONFIG}: DeepseekV4Config has no 'v_head_dim' (read by matrix/shapes/real_shape.py:read_shape)"
    )
    records = [
        {"outcome": "skip", "message": reason, "cell": {"model": "deepseek_v4.faithful", "tp": str(tp)}}
        for tp in (2, 3, 4)
    ] + [
        {"outcome": "skip", "message": "memory plan: too large", "cell": {"model": "llama", "tp": "2"}},
        {"outcome": "pass", "message": "", "cell": {"model": "opt", "tp": "2"}},
    ]
    assert unreadable_config_lines(records) == [f"skip deepseek_v4.faithful (tp2, tp3, tp4): {reason}"]


def test_writing_real_shapes_for_an_unreadable_registry_entry_names_the_reader_and_the_key(synthetic, tmp_path, capsys):
    from matrix.shapes import main

    synthetic(("vocab_size",))
    models = tmp_path / "models.toml"
    models.write_text(f'[models.synthetic]\nmodel_type = "{SYNTHETIC}"\ntiny = {{ num_hidden_layers = 2 }}\n')
    assert main(["--write", "--models-file", str(models)]) == 2
    assert capsys.readouterr().err == (
        "shapes: SyntheticConfig has no 'vocab_size' (read by matrix/shapes/real_shape.py:read_shape)\n"
    )
    assert not (tmp_path / "real_shapes.toml").exists()

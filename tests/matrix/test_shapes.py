"""Cell shapes (matrix/shapes.py): the recorded real sizes, the one rule that makes a faithful tiny config from
them, and the shape axis of cells (faithful by default on the command line, stress as the registry writes it)."""

import ast
import shutil
import warnings
from dataclasses import replace

import pytest

from matrix import PROJECT_ROOT, config_keys
from matrix.cells import expand, parse_cell_id, replay_name
from matrix.registry import MODELS_FILE, RegistryError, SplitRule, load_models, read_toml
from matrix.shapes import (
    HEAD_KEYS,
    MATRIX_TP,
    REAL_SHAPES_FILE,
    RealShape,
    faithful_count,
    faithful_dim,
    faithful_groups,
    faithful_record,
    faithful_sizes,
    load_real_shapes,
    main,
    read_shape,
    shaped_entry,
    split_differences,
    split_pattern,
    tiny_shape,
)
from matrix.variants import load_variants

QWEN2_7B = RealShape(
    source="hub config Qwen/Qwen2-7B",
    heads=28,
    kv_heads=4,
    head_dim=128,
    hidden=3584,
    intermediate=18944,
    vocab=152064,
    tied_embeddings=False,
    layers={"num_hidden_layers": 28},
    layer_pattern=("full_attention/dense",),
)


@pytest.fixture(scope="module")
def registry():
    return load_models()


@pytest.fixture(scope="module")
def faithful(registry):
    """Every registry entry's faithful entry at tp 2 (tp 2, 3 and 4 share one: the rule covers MATRIX_TP)."""
    shapes = load_real_shapes(registry=registry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            name: (shaped_entry(entry, "faithful", 2, shapes), faithful_record(entry, shapes))
            for name, entry in registry.items()
            if not entry.skip_reason
        }


def test_every_registry_entry_has_a_faithful_tiny_config_that_splits_like_its_real_checkpoint(faithful):
    """The tiny config's sizes are read back from the built config (like a real one): a key the rule set on the
    wrong name, or a size the class computes otherwise, shows as a difference."""
    differences = {}
    for name, (entry, real) in faithful.items():
        assert entry.skip_reason is None, f"{name}: {entry.skip_reason}"
        found = split_differences(tiny_shape(entry.model_type, entry.tiny), real, MATRIX_TP, entry.split_rules)
        if found:
            differences[name] = found
    assert differences == {}


def test_the_stress_shapes_do_not_split_like_the_checkpoints(registry, faithful):
    """The check can fail: today's configs (the stress shape) differ from their checkpoints, e.g. qwen2's 13
    intermediate grains split 7/6 at tp 2 where Qwen2-7B's 296 split evenly."""
    qwen2 = registry["qwen2"]
    differences = split_differences(tiny_shape(qwen2.model_type, qwen2.tiny), faithful["qwen2"][1], MATRIX_TP)
    assert "intermediate at tp 2: tiny ('grains', True, 1, 0) vs real ('grains', True, 0, 0)" in differences
    assert any(line.startswith("kv_heads at tp 3") for line in differences)  # 6 kv heads even, Qwen2-7B's 4: 2/1/1
    unfaithful = [
        name
        for name, (_, real) in faithful.items()
        if split_differences(tiny_shape(registry[name].model_type, registry[name].tiny), real, MATRIX_TP)
    ]
    assert len(unfaithful) > len(faithful) // 2


@pytest.mark.parametrize(
    "real, tps, expected",
    [
        (296, (2, 3, 4), 8),  # Qwen2-7B's intermediate grains: 296 = 24 x 12 + 8
        (4, (2, 3, 4), 4),  # fewer kv heads than tp 3 ... stays
        (2, (2, 3, 4), 2),  # fewer than tp 3 and 4
        (71, (2, 3, 4), 11),  # falcon-7b's heads
        (2376, (2, 3, 4), 12),  # Qwen2-7B's vocab grains: 0 mod 12, and >= every tp
        (28, (2, 3, 4, 8), 28),  # any tp asked joins the period (lcm 24)
    ],
)
def test_faithful_count_is_the_smallest_count_that_splits_alike(real, tps, expected):
    assert faithful_count(real, tps) == expected
    assert all(divmod(expected, tp)[1] == divmod(real, tp)[1] and (expected >= tp) == (real >= tp) for tp in tps)


def test_codegen_splits_like_codegen_350m_under_deepspeeds_four_group_rule(registry, faithful):
    """DeepSpeed cuts codegen's fused qkv in 4 groups and asserts kv heads % (4 x tp) == 0: codegen-350M-mono's 16
    heads pass at tp 2 and 4 and are refused at tp 3; the faithful config must be refused exactly there too."""
    entry, real = faithful["codegen"]
    tiny = tiny_shape(entry.model_type, entry.tiny)
    rules = registry["codegen"].split_rules
    assert [split_pattern(tiny, tp, rules)["kv_heads % 4tp"] for tp in MATRIX_TP] == [True, False, True]
    assert [split_pattern(real, tp, rules)["kv_heads % 4tp"] for tp in MATRIX_TP] == [True, False, True]
    # residues mod 2, 3, 4 alone (the rule without the entry's split_rules) give 4 heads: refused at tp 2 too
    residues_only = faithful_sizes(real, MATRIX_TP, head_dim_free=False)
    assert residues_only.kv_heads == 4
    assert "kv_heads % 4tp at tp 2: tiny False vs real True" in split_differences(
        replace(real, heads=4, kv_heads=4, head_dim=64, hidden=256), real, MATRIX_TP, rules
    )


def test_a_count_rule_joins_the_residues_and_the_thresholds():
    at_least = (SplitRule(size="kv_heads", why="shared-qk: world_size <= kv heads // 2", at_least_tp_times=2),)
    assert faithful_count(32, (2, 3, 4, 8)) == 8  # 8 and 32 split alike at tp 8 (one head each, none left over) ...
    assert faithful_count(32, (2, 3, 4, 8), rules=at_least) == 32  # ... but only 32 >= 2 x 8
    multiple = (SplitRule(size="kv_heads", why="codegen", multiple_of_tp_times=4),)
    assert faithful_count(32, MATRIX_TP, rules=multiple) == 32 and faithful_count(16, MATRIX_TP, rules=multiple) == 16


@pytest.mark.parametrize(
    "rule, message",
    [
        ('{ size = "layers", multiple_of_tp_times = 4, why = "x" }', "'split_rules[0].size' must be one of"),
        ('{ size = "kv_heads", why = "x" }', "'split_rules[0]' states no condition"),
        ('{ size = "kv_heads", multiple_of_tp_times = 4 }', "'split_rules[0]' is missing required field 'why'"),
        (
            '{ size = "heads", equals = "hidden", why = "x" }',
            "'split_rules[0].equals' must be 'hidden', for size 'attention_out'",
        ),
        (
            '{ size = "kv_heads", multiple_of_tp_times = -4, why = "x" }',
            "'split_rules[0].multiple_of_tp_times' must be an integer >= 0",
        ),
    ],
)
def test_bad_split_rule_is_refused_naming_the_entry_and_field(tmp_path, rule, message):
    models = tmp_path / "models.toml"
    models.write_text(
        MODELS_FILE.read_text() + f'\n[models.codegen_copy]\nmodel_type = "codegen"\ntiny = {{ n_head = 4 }}\n'
        f"split_rules = [{rule}]\n"
    )
    with pytest.raises(RegistryError, match=r"entry \[models.codegen_copy\] field ") as error:
        load_models(models)
    assert message in str(error.value)


def test_faithful_dim_keeps_the_grain_residues_and_the_rest():
    assert faithful_dim(18944, MATRIX_TP) == 512
    assert faithful_dim(50257, MATRIX_TP) == 5 * 64 + 17  # gpt2's vocab: 785 grains + 17
    assert faithful_dim(50257, MATRIX_TP, least=512) == 17 * 64 + 17


def test_qwen2_faithful_splits_heads_and_mlp_like_qwen2_7b(faithful):
    entry, real = faithful["qwen2"]
    tiny = tiny_shape(entry.model_type, entry.tiny)
    assert (tiny.kv_heads, tiny.heads % 12, tiny.intermediate // 64 % 12) == (4, 28 % 12, 296 % 12)
    assert tiny.heads > tiny.kv_heads  # grouped-query attention stays grouped
    assert entry.tiny["pad_token_id"] == 0 and entry.tiny["num_hidden_layers"] == 2  # the rest of the overrides stay


def test_an_entry_that_stands_for_no_checkpoint_runs_its_config_as_written(registry, faithful):
    entry, real = faithful["llama_large"]
    assert entry.tiny == registry["llama_large"].tiny and entry.name == "llama_large.faithful"
    assert real.source.startswith("as written: ") and entry.tiny_why.startswith(real.source)


def test_a_tp_outside_the_matrix_joins_the_rule(registry):
    entry = shaped_entry(registry["qwen2"], "faithful", 8)
    assert split_differences(tiny_shape(entry.model_type, entry.tiny), QWEN2_7B, (2, 3, 4, 8)) == []
    assert "at tp 2, 3, 4, 8" in entry.tiny_why


def test_every_faithful_tiny_model_builds_forwards_and_generates(faithful):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from matrix.checkpoints import tiny_config

    hf_logging.set_verbosity_error()
    broken = {}
    ids = torch.tensor([list(b"Tensor parallelism splits"), [0] * 7 + list(b"parallelism splits")])
    mask = torch.tensor([[1] * 25, [0] * 7 + [1] * 18])
    for name, (entry, _) in faithful.items():
        try:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(tiny_config(entry)).eval()
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask).logits
                model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
            assert logits.shape[-1] >= entry.tiny["vocab_size"] and torch.isfinite(logits).all()
        except Exception as error:
            broken[name] = f"{type(error).__name__}: {str(error)[:200]}"
    assert broken == {}


def test_real_shapes_file_is_what_the_script_writes():
    assert main(["--check"]) == 0


def test_stale_real_shapes_file_fails_the_check(tmp_path):
    models = tmp_path / "models.toml"
    shutil.copy(MODELS_FILE, models)
    text = REAL_SHAPES_FILE.read_text()
    (tmp_path / "real_shapes.toml").write_text(text.replace("hidden = 3584", "hidden = 3648", 1))
    assert main(["--check", "--models-file", str(models)]) == 0  # a hub config is kept as written
    defaults = 'defaults = { source = "config-defaults transformers '  # what this transformers' classes give
    start = text.index(defaults)
    end = text.index("\n", start)
    changed = text[start:end].replace("hidden = ", "hidden = 1", 1)  # a class default that is not what --write saw
    (tmp_path / "real_shapes.toml").write_text(text[:start] + changed + text[end:])
    assert main(["--check", "--models-file", str(models)]) == 1


@pytest.mark.parametrize(
    "record, message",
    [
        (
            '[qwen2]\n"Qwen/Qwen2-7B" = '
            '{ source = "hub config Qwen/Qwen2-7B", heads = 28, kv_heads = 4, head_dim = 128, '
            'hidden = 3584, intermediate = 18944, vocab = 152064, tied_embeddings = "no" }',
            "entry [qwen2] checkpoint 'Qwen/Qwen2-7B' field 'tied_embeddings' must be true or false",
        ),
        (
            '[qwen2]\n"Qwen/Qwen2-7B" = '
            '{ source = "hub config Qwen/Qwen2-7B", heads = 28, kv_heads = 3, head_dim = 128, '
            "hidden = 3584, intermediate = 18944, vocab = 152064, tied_embeddings = false }",
            "field 'kv_heads' must divide heads 28, got 3",
        ),
        (
            '[qwen2]\n"Qwen/Qwen2-7B" = { source = "from memory", heads = 28, kv_heads = 4, head_dim = 128, '
            "hidden = 3584, intermediate = 18944, vocab = 152064, tied_embeddings = false }",
            "field 'source' must start with 'hub config Qwen/Qwen2-7B'",
        ),
        (
            '[qwen2]\n"Qwen/Qwen2-7B" = '
            '{ source = "hub config Qwen/Qwen2-7B", heads = 28, kv_heads = 4, head_dim = 128, '
            "hidden = 3584, vocab = 152064, tied_embeddings = false }",
            "is missing required field 'intermediate'",
        ),
        (
            '[qwen2]\n"Qwen/Qwen2-7B" = '
            '{ source = "hub config Qwen/Qwen2-7B", heads = 28, kv_heads = 4, head_dim = 128, '
            "hidden = 3584, intermediate = 18944, vocab = 152064, tied_embeddings = false, num_layers = 28 }",
            "has unknown field(s) ['num_layers']",
        ),
        (
            "[qwen9]\ndefaults = "
            '{ source = "config-defaults transformers 5.24.0", heads = 28, kv_heads = 4, head_dim = 128, '
            "hidden = 3584, intermediate = 18944, vocab = 152064, tied_embeddings = false }",
            "entry [qwen9] is not in the model registry",
        ),
        (
            '[qwen2]\n"Qwen/Qwen3-8B" = '
            '{ source = "hub config Qwen/Qwen3-8B", heads = 28, kv_heads = 4, head_dim = 128, '
            "hidden = 3584, intermediate = 18944, vocab = 152064, tied_embeddings = false }",
            "that are not in its hub_ids",
        ),
    ],
)
def test_bad_record_is_refused_naming_the_file_entry_and_field(tmp_path, registry, record, message):
    path = tmp_path / "real_shapes.toml"
    path.write_text(record + "\n")
    with pytest.raises(RegistryError) as error:
        load_real_shapes(path, registry)
    assert str(error.value).startswith(f"{path}: entry [") and message in str(error.value)


def test_an_entry_without_its_record_is_refused(tmp_path, registry):
    path = tmp_path / "real_shapes.toml"
    text = REAL_SHAPES_FILE.read_text()
    start = text.index("[mpt]\n")
    path.write_text(text[:start] + text[text.index("\n\n", start) + 2 :])
    with pytest.raises(RegistryError, match=r"entry \[mpt\] has no record for 'mosaicml/mpt-7b' nor 'defaults'"):
        load_real_shapes(path, registry)


def test_real_shapes_are_parsed_once_per_file_version_and_each_caller_gets_dicts_of_its_own(tmp_path, monkeypatch):
    from matrix.shapes import records

    reads = []
    monkeypatch.setattr(records, "read_toml", lambda *args: reads.append(args) or read_toml(*args))
    path = tmp_path / "real_shapes.toml"
    text = REAL_SHAPES_FILE.read_text()
    path.write_text(text)
    first = load_real_shapes(path)
    first["llama"].clear()
    assert load_real_shapes(path)["llama"]  # the caller's clear reached no other caller
    assert len(reads) == 1  # the driver asks at every faithful cell: parsed once
    start = text.index("[mpt]\n")
    path.write_text(text[:start] + text[text.index("\n\n", start) + 2 :])
    assert "mpt" in first and "mpt" not in load_real_shapes(path) and len(reads) == 2


# ---- the shape axis of cells -------------------------------------------------------------------------------------


def test_stress_cells_keep_the_ids_of_existing_history_and_faithful_cells_carry_their_shape():
    cells = expand("qwen2", tp="2", shapes="faithful,stress")
    assert [cell.id for cell in cells] == ["qwen2.faithful-eager-fp32-tp2", "qwen2-eager-fp32-tp2"]
    faithful, stress = cells
    assert stress.model.tiny == load_models()["qwen2"].tiny
    assert faithful.model.tiny != stress.model.tiny
    assert [cell.id for cell in expand("qwen2", tp="2")] == ["qwen2-eager-fp32-tp2"]  # the library default: as written


def test_a_model_named_with_its_shape_runs_that_shape_whatever_shapes_says():
    assert [cell.id for cell in expand("qwen2.faithful,llama.stress", tp="3", shapes="stress")] == [
        "qwen2.faithful-eager-fp32-tp3",
        "llama-eager-fp32-tp3",
    ]
    with pytest.raises(RegistryError, match="unknown shape 'tiny'"):
        expand("qwen2.tiny", tp="2")
    with pytest.raises(RegistryError, match="unknown shape 'faithfull'"):
        expand("qwen2", tp="2", shapes="faithfull")


def test_cell_ids_with_a_shape_parse_and_replay_as_the_same_cell():
    models, variants = load_models(), load_variants()
    assert parse_cell_id("qwen2.faithful-eager-fp32-tp2", models, variants) == ("qwen2.faithful", "eager", "fp32", 2)
    assert parse_cell_id("qwen2-eager-fp32-tp2", models, variants) == ("qwen2", "eager", "fp32", 2)
    for model in ("qwen2", "qwen2.faithful"):
        replayed = expand(replay_name(model), tp="2", shapes="faithful")  # a replay ignores the run's --shapes
        assert [cell.model.name for cell in replayed] == [model]


def test_the_command_line_default_is_faithful():
    from suites.run.command import parse_suite_options

    assert parse_suite_options([]).shapes == "faithful"


def test_add_model_records_the_checkpoints_sizes_next_to_its_registry(tmp_path, registry):
    """add-model appends the new entry's record (its hub config's sizes) so --check and faithful cells see it."""
    from matrix.shapes import add_record

    models = tmp_path / "models.toml"
    models.write_text(
        MODELS_FILE.read_text() + '\n[models.qwen2_copy]\nmodel_type = "qwen2"\nhub_ids = ["Qwen/Qwen2-7B-copy"]\n'
        "tiny = { hidden_size = 96, num_attention_heads = 6, num_key_value_heads = 6, vocab_size = 512 }\n"
    )
    shutil.copy(REAL_SHAPES_FILE, tmp_path / "real_shapes.toml")
    entry = load_models(models)["qwen2_copy"]
    written = add_record(
        models,
        entry,
        "Qwen/Qwen2-7B-copy",
        QWEN2_7B.__class__(**{**QWEN2_7B.__dict__, "source": "hub config Qwen/Qwen2-7B-copy"}),
    )
    shapes = load_real_shapes(written, load_models(models))
    assert faithful_record(entry, shapes).hidden == 3584
    assert main(["--check", "--models-file", str(models)]) == 0
    with pytest.raises(RegistryError, match=r"entry \[qwen2_copy\] already has records"):
        add_record(models, entry, None, None)


# ---- one faithful cell per split pattern of an entry's checkpoints (bounded cost) -------------------------------


def test_checkpoints_that_split_alike_share_one_faithful_cell_and_others_get_their_own():
    cells = {cell.id: cell.model for cell in expand("llama,qwen2,qwen3", tp="2", shapes="faithful")}
    assert {cell_id: model.checkpoints for cell_id, model in cells.items()} == {
        "llama.faithful-eager-fp32-tp2": ("meta-llama/Llama-2-7b-hf",),
        "llama.faithful-meta-llama-3-8b-eager-fp32-tp2": ("meta-llama/Meta-Llama-3-8B",),  # 8 kv heads: splits apart
        "qwen2.faithful-eager-fp32-tp2": ("Qwen/Qwen2-7B", "Qwen/Qwen2.5-7B-Instruct"),  # identical at every tp: once
        "qwen3.faithful-eager-fp32-tp2": ("Qwen/Qwen3-8B",),
        "qwen3.faithful-qwen3-0-6b-eager-fp32-tp2": ("Qwen/Qwen3-0.6B",),
    }
    shapes = load_real_shapes()
    llama3 = cells["llama.faithful-meta-llama-3-8b-eager-fp32-tp2"]
    assert (
        split_differences(
            tiny_shape(llama3.model_type, llama3.tiny), shapes["llama"]["meta-llama/Meta-Llama-3-8B"], MATRIX_TP
        )
        == []
    )
    assert (
        tiny_shape("llama", llama3.tiny).heads,
        tiny_shape("llama", cells["llama.faithful-eager-fp32-tp2"].tiny).heads,
    ) == (32, 8)
    assert [cell.model.checkpoints for cell in expand("qwen2", tp="2", shapes="stress")] == [
        ()
    ]  # stress: per architecture


def test_a_checkpoint_whose_split_pattern_changes_gets_its_own_cell(tmp_path):
    """The grouping can fail: Qwen2.5-7B-Instruct with 2 kv heads (not Qwen2-7B's 4) is no longer covered by qwen2's
    cell."""
    models = tmp_path / "models.toml"
    shutil.copy(MODELS_FILE, models)
    text = REAL_SHAPES_FILE.read_text()
    start = text.index('"Qwen/Qwen2.5-7B-Instruct"')
    (tmp_path / "real_shapes.toml").write_text(text[:start] + text[start:].replace("kv_heads = 4", "kv_heads = 2", 1))
    cells = expand("qwen2", tp="3", shapes="faithful", models_file=models)
    assert [(cell.id, cell.model.checkpoints) for cell in cells] == [
        ("qwen2.faithful-eager-fp32-tp3", ("Qwen/Qwen2-7B",)),
        ("qwen2.faithful-qwen2-5-7b-instruct-eager-fp32-tp3", ("Qwen/Qwen2.5-7B-Instruct",)),
    ]


def test_a_checkpoint_cell_id_parses_and_replays_as_the_same_cell():
    models, variants = load_models(), load_variants()
    cell_id = "llama.faithful-meta-llama-3-8b-meta-fp32-tp3"
    model, variant, dtype, tp = parse_cell_id(cell_id, models, variants)
    assert (model, variant, dtype, tp) == ("llama.faithful-meta-llama-3-8b", "meta", "fp32", 3)
    replayed = expand(replay_name(model), variants=variant, tp=str(tp), shapes="stress")
    assert [(cell.id, cell.model.checkpoints) for cell in replayed] == [(cell_id, ("meta-llama/Meta-Llama-3-8B",))]
    with pytest.raises(
        RegistryError,
        match=r"llama.faithful-gpt2: no checkpoint of llama splits apart under that name "
        r"at tp 2; its faithful cells: llama.faithful, llama.faithful-meta-llama-3-8b",
    ):
        expand("llama.faithful-gpt2", tp="2")


class _Config:
    """A transformers config as read_shape sees it: its dict."""

    def __init__(self, **values: object) -> None:
        self.values = values

    def to_dict(self) -> dict[str, object]:
        return self.values


@pytest.mark.parametrize(
    ("values", "head_dim"),
    [
        ({"qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 192}, 128),  # DeepSeek V3: the value dim
        ({"qk_rope_head_dim": 64, "head_dim": 512}, 512),  # DeepSeek V4 (transformers 5.25): no v_head_dim
        ({}, 64),  # neither: hidden / heads
    ],
)
def test_latent_attention_head_dim_is_the_value_dim_else_the_plain_one(values, head_dim):
    config = _Config(num_attention_heads=16, hidden_size=1024, vocab_size=1000, **values)
    assert read_shape(config, "test").head_dim == head_dim


def test_a_vocabulary_kept_only_in_the_text_config_is_read_there():
    """fuyu's config from transformers 4.43: vocab_size in text_config alone."""
    config = _Config(num_attention_heads=16, hidden_size=1024, text_config={"vocab_size": 262144})
    assert read_shape(config, "test").vocab == 262144


@pytest.mark.parametrize(
    "values",
    [
        {"text_config": {"num_attention_heads": 16, "num_key_value_heads": 4, "hidden_size": 1024}},  # llama4, gemma4
        {"decoder_attention_heads": 16, "encoder_attention_heads": 8, "d_model": 1024},  # marian, whisper, trocr
        {"n_heads": 16, "emb_dim": 1024},  # xlm
    ],
)
def test_heads_and_widths_are_read_where_the_config_keeps_them(values):
    shape = read_shape(_Config(vocab_size=1000, **values), "test")
    assert (shape.heads, shape.hidden, shape.head_dim) == (16, 1024, 64)


def test_an_attention_free_mixer_is_read_as_one_head_and_a_config_without_sizes_still_refused():
    mamba = read_shape(_Config(hidden_size=768, intermediate_size=1536, state_size=16, vocab_size=1000), "test")
    assert (mamba.heads, mamba.kv_heads, mamba.hidden, mamba.intermediate) == (1, 1, 768, 1536)
    with pytest.raises(RegistryError, match="no attention head count under the names"):
        read_shape(_Config(hidden_size=768, vocab_size=1000), "test")


def test_the_real_and_the_tiny_config_read_heads_from_one_list_of_names():
    """Two lists of head-count names once stood in different orders (config_keys.py for the shrinker, real_shape.py
    for the real checkpoint): a config holding two of the names could be read as one count and shrunk as the other.
    One list now, assigned in one module, and its decoder-first order is what real encoder-decoders need."""
    assigned = [
        f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}"
        for path in sorted((PROJECT_ROOT / "matrix").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "HEAD_KEYS" for target in node.targets)
    ]
    assert assigned == ["matrix/config_keys.py:31"] and HEAD_KEYS is config_keys.HEAD_KEYS
    prophetnet = _Config(vocab_size=1000, num_encoder_attention_heads=8, num_decoder_attention_heads=16, d_model=1024)
    assert read_shape(prophetnet, "test").heads == 16


FLAGSHIPS = ("llama4", "gemma4", "qwen3_5", "qwen3_5_moe", "marian", "whisper", "trocr", "xlm", "mamba", "rwkv")
"""Architectures whose sizes sit in a text sub-config, a decoder's keys or a mixer's: none had a faithful config
until their readers were added (#57)."""


@pytest.mark.parametrize("model_type", FLAGSHIPS)
def test_flagship_encoder_decoder_and_mixer_architectures_get_a_faithful_tiny_config(model_type):
    from transformers import CONFIG_MAPPING

    from matrix.derive import derived_entries

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"{model_type}: not in this transformers")
    entry = derived_entries({})[model_type]
    assert not entry.skip_reason, entry.skip_reason
    shaped = shaped_entry(entry, "faithful", 2, {})
    assert shaped.skip_reason is None, shaped.skip_reason
    real = faithful_groups(entry, {}, MATRIX_TP)[0].record  # a derived architecture's: its config class defaults
    assert split_differences(tiny_shape(model_type, shaped.tiny), real, MATRIX_TP) == []
    if "vision_config" in entry.tiny:  # a vision tower's sizes are the derived ones: only the text model is shaped
        assert shaped.tiny["vision_config"] == entry.tiny["vision_config"]

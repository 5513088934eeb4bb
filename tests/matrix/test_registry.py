"""Bad input gets a clear error naming the file, entry, field or value; the real registry is valid."""

import subprocess
import sys

import pytest

from matrix import PROJECT_ROOT
from matrix.cells import expand, parse_tp_sizes
from matrix.registry import RegistryError, load_models, pick
from matrix.variants import load_variants


def write_registry(tmp_path, text):
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_real_registry_has_at_least_40_valid_tiny_configs():
    from matrix.checkpoints import tiny_config

    models = load_models()
    assert len(models) >= 40
    for entry in models.values():
        config = tiny_config(entry)
        assert config.vocab_size >= 260, entry.name  # byte-level probe ids must fit
        assert entry.tiny_why, f"{entry.name}: record why its tiny dims are what they are"
    assert load_variants()["eager"].load == "eager"


def test_unknown_model_lists_close_names():
    with pytest.raises(RegistryError, match=r"unknown model 'lama'; did you mean: llama"):
        pick(load_models(), ["lama"], "model")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[models.x]\ntiny = {}\n", r"models.toml: entry \[models.x\] is missing required field 'model_type'"),
        ("[models.x]\nmodel_type = 3\ntiny = {}\n", r"entry \[models.x\] field 'model_type' must be a string, got 3"),
        (
            '[models.x]\nmodel_type = "llama"\ntiny = {}\nhub_id = "a/b"\n',
            r"entry \[models.x\] has unknown field\(s\) \['hub_id'\]; did you mean 'hub_ids'\?",
        ),
        (
            '[models.x]\nmodel_type = "llama"\ntiny = {}\nmin_transformers = "four"\n',
            r"entry \[models.x\] field 'min_transformers' is not a version: 'four'",
        ),
        (
            '[models.x]\nmodel_type = "llama"\ntiny = {}\ntolerance = { fp64 = { logits_rel = 1 } }\n',
            r"entry \[models.x\] field 'tolerance' has unknown key 'fp64' \(did you mean 'fp16'\?\); use one of "
            r"\('fp32', 'bf16', 'fp16'\)",
        ),
        ('[models.X-1]\nmodel_type = "llama"\ntiny = {}\n', r"entry \[models.X-1\] name must be lowercase"),
        ('[models.x\nmodel_type = "llama"\n', r"models.toml: not valid TOML: .*line 1"),
    ],
)
def test_malformed_registry_entry_names_file_entry_and_field(tmp_path, text, message):
    with pytest.raises(RegistryError, match=message):
        load_models(write_registry(tmp_path, text))


@pytest.mark.parametrize(
    "text, message",
    [
        ("0", "tp size 0 must be >= 1"),
        ("2,x", "tp size 'x' is not an integer"),
        ("1.5", "tp size '1.5' is not an integer"),
    ],
)
def test_bad_tp_size_is_refused(text, message):
    with pytest.raises(RegistryError, match=message):
        parse_tp_sizes(text)


def test_unknown_dtype_and_variant_are_refused():
    with pytest.raises(RegistryError, match="unknown dtype 'fp8'"):
        expand("llama", dtypes="fp8")
    with pytest.raises(RegistryError, match="unknown variant 'eagre'; did you mean: eager"):
        expand("llama", variants="eagre")


def test_remote_code_model_is_refused_without_the_flag(tmp_path):
    from suites.run.driver import RunOptions, skip_reason

    path = write_registry(
        tmp_path,
        '[models.remote]\nmodel_type = "llama"\ntiny = {}\ntrust_remote_code = true\nmin_transformers = "99.0"\n',
    )
    cell = expand("remote", tp="2", models_file=path)[0]
    assert "--allow-remote-code" in skip_reason(cell, RunOptions())
    assert "needs transformers >= 99.0" in skip_reason(cell, RunOptions(allow_remote_code=True))


def test_command_line_typo_is_a_usage_error_not_a_crash():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "suites",
            "--models",
            "lama",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 4, result.stdout + result.stderr
    assert "unknown model 'lama'; did you mean: llama" in result.stderr


def test_a_file_read_once_per_content_is_read_again_once_it_changes(tmp_path):
    """load_models and load_real_shapes parse each file once per content (a render reads them hundreds of times):
    a rewrite of the same size within the clock's granularity still gives the new entries, and an edit that breaks
    the file raises every time, never the last good parse."""
    from matrix.shapes import load_real_shapes

    models = tmp_path / "models.toml"
    shapes = tmp_path / "real_shapes.toml"
    models_text = (PROJECT_ROOT / "matrix" / "models.toml").read_text()
    shapes_text = (PROJECT_ROOT / "matrix" / "real_shapes.toml").read_text()
    models.write_text(models_text)
    shapes.write_text(shapes_text)
    assert load_models(models)["gpt2"].tiny["n_head"] == 6
    assert load_models(models) == load_models(models) and load_models(models) is not load_models(models)
    first = load_real_shapes(shapes)
    entry = next(iter(first))
    del first[entry]  # the caller's own dicts: the next caller still gets every entry
    assert entry in load_real_shapes(shapes)

    at = models_text.index("n_head = 6", models_text.index("[models.gpt2]"))
    models.write_text(f"{models_text[:at]}n_head = 3{models_text[at + len('n_head = 6') :]}")  # same size and inode
    assert load_models(models)["gpt2"].tiny["n_head"] == 3
    shapes.write_text(shapes_text.replace(f"[{entry}]", f"[{entry}", 1))
    for _ in range(2):
        with pytest.raises(RegistryError, match="real_shapes.toml"):
            load_real_shapes(shapes)

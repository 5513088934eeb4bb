"""The atlas's axes as data (matrix/atlas.toml, matrix/atlas.py): versions computed from recorded PyPI release data,
the combinations, the selections' options, the cost figures' file; a malformed file is refused naming the file and
the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.atlas import (
    AtlasConfigError,
    atlas_axes,
    atlas_combos,
    cost_text,
    load_atlas_config,
    load_cost,
)
from matrix.releases import MAX_AGE_ENV
from matrix.version_axes import AxisValueError

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def recorded_release_data(monkeypatch):
    monkeypatch.setenv(MAX_AGE_ENV, "inf")  # the fixtures are old files: never re-fetched


def test_the_axes_are_every_minor_from_the_oldest_and_master():
    axes = atlas_axes(load_atlas_config(), cache_dir=FIXTURES)
    assert [pin.id for pin in axes.deepspeed] == [
        "ds0.14.5",
        "ds0.15.4",
        "ds0.16.9",
        "ds0.17.6",
        "ds0.18.9",
        "ds0.19.8",
        "ds@master",
    ]
    transformers = [pin.label for pin in axes.transformers]
    assert transformers[0] == "4.41.2"  # versions.toml's min: the oldest the registry supports
    assert transformers[-1] == "5.25.0"
    # the newest patch of every minor, once
    minors = [tuple(label.split(".")[:2]) for label in transformers]
    assert len(minors) == len(set(minors)) == 43
    assert "4.57.6" in transformers and "4.57.5" not in transformers
    assert axes.torch.label == "2.13.0"


def test_combinations_run_transformers_major_and_carry_skip_reasons():
    combos = atlas_combos(atlas_axes(load_atlas_config(), cache_dir=FIXTURES))
    assert len(combos) == 7 * 43
    assert [c.id for c in combos[:2]] == ["ds0.14.5-tf4.41.2-pt2.13.0", "ds0.15.4-tf4.41.2-pt2.13.0"]
    assert combos[-1].id == "ds@master-tf5.25.0-pt2.13.0"
    assert not any(c.skip_reason for c in combos)  # 0.14.5 imports on torch 2.13 (versions.toml [[incompatible]])


def test_until_caps_an_axis_as_before_a_release():
    axes = atlas_axes(load_atlas_config(), {"transformers": "5.24.0"}, cache_dir=FIXTURES)
    assert axes.transformers[-1].label == "5.24.0"
    with pytest.raises(AxisValueError, match="torch is not an atlas axis"):
        atlas_axes(load_atlas_config(), {"torch": "2.12.0"}, cache_dir=FIXTURES)


def test_selections_are_coverage_and_the_registrys_training_row():
    config = load_atlas_config()
    assert config.tp == (2, 3, 4)
    inference, training = config.selections
    assert inference.suite_args(config.tp) == [
        "--models",
        "all",
        "--variants",
        "eager",
        "--dtypes",
        "fp32",
        "--tp",
        "2,3,4",
    ]
    assert (training.models, training.variants) == ("registry", "train")


@pytest.mark.parametrize(
    "text, expected",
    [
        ('deepspeed_since = "0.14"\ntransformers_since = "min"\ntp = [2]\nextra = 1\n', "unknown key(s) extra"),
        ('deepspeed_since = 0.14\ntransformers_since = "min"\ntp = [2]\n', "deepspeed_since must be a quoted"),
        ('deepspeed_since = "0.14"\ntransformers_since = "min"\ntp = [0]\n', "tp must be a list"),
        (
            'deepspeed_since = "0.14"\ntransformers_since = "min"\ntp = [2]\n[[selections]]\nname = "x"\nmodels = '
            '"all"\n',
            "[[selections]] #1 must have exactly name, models, variants, dtypes",
        ),
        ('deepspeed_since = "0.14\n', "atlas.toml: "),
    ],
)
def test_a_malformed_atlas_file_names_file_and_key(tmp_path, text, expected):
    path = tmp_path / "atlas.toml"
    path.write_text(text)
    with pytest.raises(AtlasConfigError) as error:
        load_atlas_config(path)
    assert expected in str(error.value) and str(path) in str(error.value)


def test_cost_figures_round_trip_through_their_file(tmp_path):
    """The committed calibration (matrix/atlas_cost.toml) written again by cost_text reads back equal."""
    figures = load_cost()
    assert set(figures.selections) == {"inference", "training"}
    path = tmp_path / "atlas_cost.toml"
    path.write_text(cost_text(figures))
    assert load_cost(path) == figures


def test_a_cost_file_without_measurements_says_how_to_make_one(tmp_path):
    path = tmp_path / "atlas_cost.toml"
    path.write_text('source = "x"\nfirst_environment_s = 1.0\n')
    with pytest.raises(AtlasConfigError, match="nox -s atlas -- --calibrate RESULTS"):
        load_cost(path)

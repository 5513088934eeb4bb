"""matrix/remedies.toml's reader: each remedy a frozen record with its arguments; a broken table is refused naming
the file, the line of its [[remedy]] and the field and value."""

from pathlib import Path

import pytest

from matrix.remedies import REMEDIES_FILE, RemedyError, load_remedies, remedies_for

CTRL = """
[[remedy]]
name = "ctrl-policy"
kind = "workaround"
cause_models = ["ctrl.faithful"]
summary = "pass injection_policy"
mechanism = "the parser misses it"
injection_policy = { EncoderLayer = ["multi_head_attention.dense", "ffn.2"] }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "remedies.toml"
    path.write_text(text)
    return path


def test_the_shipped_file_reads():
    remedies = load_remedies(REMEDIES_FILE)
    assert remedies and all(remedy.line > 0 for remedy in remedies)
    assert {r.name for r in remedies_for("ctrl.faithful", remedies)} >= {"ctrl-row-parallel-policy"}


def test_a_workaround_becomes_cell_arguments(tmp_path):
    (remedy,) = load_remedies(write(tmp_path, CTRL), tmp_path)
    assert remedy.line == 2
    assert remedy.arguments.injection_policy == (("EncoderLayer", ("multi_head_attention.dense", "ffn.2")),)
    assert remedies_for("ctrl", [remedy]) == [remedy]
    with pytest.raises(RemedyError, match="'bloom'.*known: ctrl-policy, ctrl.faithful"):
        remedies_for("bloom", [remedy])


@pytest.mark.parametrize(
    "edit, message",
    [
        (('kind = "workaround"', 'kind = "workround"'), r"'ctrl-policy-2'.*kind.*did you mean 'workaround'"),
        (('name = "ctrl-policy"', 'name = "Ctrl Policy"'), r"field 'name' must be a lowercase slug"),
        (("injection_policy = {", "injection_polcy = {"), r"unknown field\(s\) \['injection_polcy'\]"),
        (('["multi_head_attention.dense", "ffn.2"]', '"ffn.2"'), r"injection_policy.EncoderLayer' must be an array"),
        (('kind = "workaround"', 'kind = "patch"'), r"a patch names `patch`"),
        (('cause_models = ["ctrl.faithful"]', "cause_models = []"), r"cause_models' must name at least one"),
    ],
)
def test_a_broken_table_is_refused_naming_file_line_and_value(tmp_path, edit, message):
    path = write(tmp_path, CTRL + "\n" + CTRL.replace(*edit).replace("ctrl-policy", "ctrl-policy-2", 1))
    with pytest.raises(RemedyError, match=rf"{path}: line 11 .*" + message):
        load_remedies(path, tmp_path)


def test_a_name_twice_and_a_missing_patch_are_refused(tmp_path):
    with pytest.raises(RemedyError, match="line 11: remedy name 'ctrl-policy' is used twice"):
        load_remedies(write(tmp_path, CTRL + "\n" + CTRL), tmp_path)
    patch = CTRL.replace(
        'kind = "workaround"', 'kind = "patch"\npatch = "matrix/remedy_patches/x.diff"\ndeepspeed = "0.19.8"'
    )
    patch = patch.replace('injection_policy = { EncoderLayer = ["multi_head_attention.dense", "ffn.2"] }', "")
    with pytest.raises(RemedyError, match=r"line 2 .*patch 'matrix/remedy_patches/x.diff' is no file"):
        load_remedies(write(tmp_path, patch), tmp_path)

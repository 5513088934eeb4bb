"""matrix/remedies.toml's reader: each remedy a frozen record with its arguments; a broken table is refused naming
the file, the line of its [[remedy]] and the field and value."""

from pathlib import Path

import pytest

from matrix.remedies import REMEDIES_FILE, RemedyError, load_remedies, remedies_for, required_patches

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


def patch_table(name: str, requires: list[str] | None = None, release: str = "0.19.8") -> str:
    needs = f"requires = {requires!r}\n".replace("'", '"') if requires is not None else ""
    return f"""
[[remedy]]
name = "{name}"
kind = "patch"
cause_models = ["phimoe.faithful"]
summary = "s"
mechanism = "m"
patch = "matrix/remedy_patches/{name}.diff"
deepspeed = "{release}"
{needs}"""


def stack_file(tmp_path: Path, *tables: str) -> Path:
    (tmp_path / "matrix" / "remedy_patches").mkdir(parents=True, exist_ok=True)
    for name in ("experts", "router", "sinks", "old"):
        (tmp_path / f"matrix/remedy_patches/{name}.diff").write_text("")
    return write(tmp_path, "".join(tables))


def test_requires_orders_the_patch_stack_each_after_its_own_requirements(tmp_path):
    path = stack_file(
        tmp_path,
        patch_table("experts"),
        patch_table("sinks", ["experts"]),
        patch_table("router", ["sinks", "experts"]),
    )
    remedies = load_remedies(path, tmp_path)
    by_name = {remedy.name: remedy for remedy in remedies}
    assert by_name["router"].requires == ("sinks", "experts")
    assert [r.name for r in required_patches(by_name["router"], remedies)] == ["experts", "sinks"]
    assert required_patches(by_name["experts"], remedies) == ()


@pytest.mark.parametrize(
    "tables, message",
    [
        (
            (patch_table("router", ["expert"]), patch_table("experts")),
            r"line 2 \(\[\[remedy\]\] 'router'\): requires 'expert', which no \[\[remedy\]\] is named; "
            r"known: experts, router",
        ),
        ((patch_table("router", ["router"]),), r"line 2 .*'router'\): requires a cycle: router -> router"),
        (
            (patch_table("experts", ["sinks"]), patch_table("sinks", ["router"]), patch_table("router", ["experts"])),
            r"line 2 .*'experts'\): requires a cycle: experts -> sinks -> router -> experts",
        ),
        (
            (patch_table("old", release="0.18.9"), patch_table("router", ["old"])),
            r"line 11 .*requires 'old', a patch against deepspeed 0.18.9, not 0.19.8",
        ),
        (
            (CTRL, patch_table("router", ["ctrl-policy"])),
            r"line 10 .*requires 'ctrl-policy', a workaround; only patches",
        ),
        (
            (patch_table("experts"), patch_table("router", ["experts", "experts"])),
            r"line 11 .*field 'requires' names a remedy twice",
        ),
    ],
)
def test_a_broken_requires_is_refused_naming_file_line_and_names(tmp_path, tables, message):
    path = stack_file(tmp_path, *tables)
    with pytest.raises(RemedyError, match=rf"{path}: " + message):
        load_remedies(path, tmp_path)

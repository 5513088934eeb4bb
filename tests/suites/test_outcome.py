"""Whose fault an exception is: one rule (suites/verdicts/outcome.py `raising_owner`) for a stage's error and a
process's death, tried on synthetic tracebacks whose frames sit in chosen files."""

import sys
import types

import pytest

from matrix import PROJECT_ROOT
from suites.verdicts.outcome import death_record, harness_frame, raising_owner


def _raise_through(*files: str, error: BaseException):
    """Raise `error` from a chain of functions whose code objects claim to live in `files`, outermost first."""
    namespace: dict = {"error": error}
    for depth, filename in reversed(list(enumerate(files))):
        inner = f"f{depth + 1}()" if depth + 1 < len(files) else "raise error"
        exec(compile(f"def f{depth}():\n    {inner}\n", filename, "exec"), namespace)
    try:
        namespace["f0"]()
    except BaseException as raised:  # noqa: BLE001 - handed to the rule under test
        return raised.with_traceback(raised.__traceback__.tb_next)  # starts at f0, not in this test file
    raise AssertionError("did not raise")


@pytest.fixture
def library_root(tmp_path, monkeypatch):
    """A fake `deepspeed` package in a site-packages folder, registered as imported."""
    root = tmp_path / "site-packages" / "deepspeed"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    module = types.ModuleType("deepspeed")
    module.__file__ = str(root / "__init__.py")
    monkeypatch.setitem(sys.modules, "deepspeed", module)
    return root


HARNESS = str(PROJECT_ROOT / "suites" / "checks" / "probes.py")
STDLIB = "/usr/lib/python3.11/json/decoder.py"
TORCH = "/opt/env/site-packages/torch/functional.py"


def test_standard_library_raising_for_the_harness_is_the_harness(library_root):
    error = _raise_through(HARNESS, STDLIB, error=ValueError("bad json"))
    assert raising_owner(error)[0] == "harness"
    assert harness_frame(error) == "suites/checks/probes.py:f0"
    assert death_record(error, "rank 0").failure_class == "setup"


def test_torch_raising_for_deepspeed_is_deepspeed(library_root):
    error = _raise_through(
        HARNESS,
        str(library_root / "module_inject" / "layers.py"),
        TORCH,
        error=RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
    )
    assert raising_owner(error)[0] == "library"
    assert harness_frame(error) is None
    assert death_record(error, "rank 1").failure_class == "crash"


def test_deepspeed_calling_back_into_the_harness_is_the_harness(library_root):
    """A harness callback (a hook DeepSpeed calls) that raises is the harness's, whoever called it."""
    error = _raise_through(str(library_root / "runtime" / "engine.py"), HARNESS, STDLIB, error=KeyError("x"))
    assert raising_owner(error)[0] == "harness"


def test_a_checkout_under_a_folder_named_like_a_library_does_not_flip_the_rule(tmp_path, library_root, monkeypatch):
    """Paths are compared as folders, never substrings: /x/torch/autotp-matrix/suites/... is the harness."""
    import matrix
    import suites.verdicts.outcome as outcome

    checkout = tmp_path / "torch" / "deepspeed" / "autotp-matrix"
    monkeypatch.setattr(outcome, "PROJECT_ROOT", checkout)
    monkeypatch.setattr(matrix, "PROJECT_ROOT", checkout)  # matrix.is_harness_file: the harness's own packages
    error = _raise_through(str(checkout / "suites" / "driver.py"), error=OSError("disk full"))
    assert raising_owner(error)[0] == "harness"
    assert death_record(error, "rank 0").failure_class == "setup"


def test_a_config_the_harness_built_that_pydantic_refuses_is_the_harness(library_root):
    pydantic = pytest.importorskip("pydantic")

    class Config(pydantic.BaseModel):
        train_batch_size: int

    try:
        Config(train_batch_size="many")
    except pydantic.ValidationError as refused:
        error = refused
    assert raising_owner(error) == ("harness", None)
    assert harness_frame(error).startswith("a config the harness built")


def test_nothing_but_tools_is_nobodys_library_fault():
    error = _raise_through(STDLIB, error=MemoryError())
    assert raising_owner(error) == ("tool", None)
    assert death_record(error, "the fork server's imports").failure_class == "setup"

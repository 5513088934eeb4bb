"""The checks' names are spelled once (suites/verdicts/check_names.py): every name a check gives its `CheckResult` is
listed
there, every listed name is one a check gives, and the reports read each one's signature as judged, never as an
exception type. Strict mypy refuses an unlisted name statically (`CheckResult.name` is a `CheckName`); these tests
hold without it."""

import ast
import subprocess
import sys

from matrix import PROJECT_ROOT
from reports.analysis import reason
from suites.verdicts.check_names import CHECK_NAMES, judged_signature

CONSTRUCTORS = ("CheckResult", "CheckResult.judged", "CheckResult.failing")


def _names_the_checks_give() -> dict[str, str]:
    """Each string literal a check module passes as a `CheckResult`'s name → where; a name taken from another
    result (`memory.name`) is that result's."""
    found = {}
    for path in sorted((PROJECT_ROOT / "suites" / "checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or ast.unparse(node.func) not in CONSTRUCTORS:
                continue
            named = [keyword.value for keyword in node.keywords if keyword.arg == "name"] or node.args[:1]
            if named and isinstance(named[0], ast.Constant) and isinstance(named[0].value, str):
                found[named[0].value] = f"{path.name}:{node.lineno}"
    return found


def test_every_name_a_check_gives_is_listed_and_every_listed_name_is_given():
    given = _names_the_checks_give()
    assert len(given) > 10, given  # the scan finds the checks' constructors
    assert {name: where for name, where in given.items() if name not in CHECK_NAMES} == {}
    assert [name for name in CHECK_NAMES if name not in given] == []


def test_the_reports_read_every_checks_signature_as_judged():
    """A cause whose first word is an exception type is read as raised (its type in the words); a check's name
    never is, whatever its finding says."""
    raised = reason("forward", "ValueError: a finding @ harness.py:f").short
    assert raised == "the sharded model raises ValueError"
    for name in {*CHECK_NAMES, *_names_the_checks_give()}:
        judged = judged_signature(name, "a finding @ harness.py:f")
        assert reason("forward", judged).short == "the sharded model raises an error", name


def test_what_raised_in_a_training_stage_is_read_by_its_exception():
    """A training stage labels what raised in it with its check's name: the words are the exception's, as unlabelled;
    a finding of that check (no exception type first) stays judged."""
    raised = "RuntimeError: shape mismatch in the loaded weight @ deepspeed/runtime/engine.py:load_checkpoint"
    for stage in ("save", "gather", "load", "resume"):
        assert reason("forward", judged_signature(stage, raised)) == reason("forward", raised), stage
        finding = judged_signature(stage, "step 2 after load_checkpoint at tp 2: loss differs by 5 relative")
        assert reason("forward", finding).short == "the sharded model raises an error", stage


def test_a_training_stages_own_label_is_read_as_its_stage_and_its_shard_failure_names_deepspeed_initialize():
    """A training row labels what raised in stages no check names too (`initialize`, `step 2`): the words are the
    exception's, and a shard failure names what shards a training row's model, deepspeed.initialize (seen: a phi3
    training cause titled "init_inference fails to shard it"). Two causes the shard rule alone names are told apart
    by what raised and where (seen: the meta and the training shard causes of one run under one name)."""
    raised = "RuntimeError: shape mismatch @ transformers/models/llama/modeling_llama.py:forward"
    assert reason("forward", f"step 2: {raised}") == reason("forward", raised)
    plan = "ValueError: tp_plan contains unsupported partition style(s) @ deepspeed/x/tp_plan_converter.py:f"
    training = reason("shard", f"initialize: {plan}")
    assert training.short == "deepspeed.initialize fails to shard it in tp_plan_converter.py", training
    assert training.sentence.startswith("deepspeed.initialize raises ValueError in tp_plan_converter.py while")
    meta = reason("shard", "TypeError: Signature mismatch @ transformers/masking_utils.py:<module>")
    assert meta.short == "init_inference fails to shard it in masking_utils.py", meta
    no_policy = "AssertionError: Not able to determine model policy @ deepspeed/module_inject/auto_tp.py:tp_parser"
    assert "so deepspeed.initialize cannot shard it" in reason("shard", f"initialize: {no_policy}").sentence
    assert "so init_inference cannot shard it" in reason("shard", no_policy).sentence


def test_the_names_import_without_torch():
    """The reports read them: importing them must not import torch or the checks."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, suites.verdicts.check_names; print(sorted(m for m in sys.modules if 'torch' in m))",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "[]"

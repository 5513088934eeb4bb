"""A record keeps no folder of the machine that ran it: a quantized variant's skip (the unsharded model could not be
quantized, DeepSpeed's traceback quoted) is stored in cells.jsonl and in JUnit with its frames' paths inside their
packages and the harness's, never under the host's environment, interpreter or checkout folders."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import traceback
from pathlib import Path

import pytest
import torch

from matrix import PROJECT_ROOT
from matrix.cells import expand
from matrix.redaction import _FRAME_FILE, _INSTALLED, _STANDARD_LIBRARY, without_host_paths
from reports.outputs.library_trace import library_trace
from suites.records.run_records import CellRecorder, RunInfo, junit_properties
from suites.variants.quantization import QuantizationUnavailable, apply_post_init
from suites.verdicts.outcome import CellOutcome


def quantization_skip_message() -> str:
    """What the reference process answers when DeepSpeed cannot quantize the unsharded fp32 model (as
    suites/reference/unsharded.py `compute_reference` and `answer` word it): DeepSpeed really raises here."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    try:
        try:
            apply_post_init(model, "deepspeed_int8", 32)
        except Exception as error:
            raise QuantizationUnavailable("deepspeed_int8 cannot quantize the unsharded fp32 model") from error
    except QuantizationUnavailable as error:
        return "computing the unsharded reference failed:\n" + "".join(traceback.format_exception(error))
    raise AssertionError("DeepSpeed quantized an fp32 model: the fault this test needs is gone")


def host_folders() -> list[str]:
    """The folders of this machine a traceback's paths start with: the environment, the interpreter, the checkout."""
    return [sys.prefix, sys.base_prefix, str(PROJECT_ROOT)]


def test_a_quantized_skip_is_stored_without_host_paths(tmp_path: Path) -> None:
    message = quantization_skip_message()
    assert any(folder in message for folder in host_folders())  # the fault is real: the raw traceback has them
    (cell,) = expand("llama", tp="2", variants="ds_int8")
    run = RunInfo("local", started="2026-01-01T00:00:00Z", accelerator="cpu", backend="gloo", harness_git="")
    versions = {"deepspeed": "0.19.8", "transformers": "5.25.0", "torch": "2.13.0", "python": "3.11.7"}
    record = CellRecorder(tmp_path, run, versions).record(
        cell, CellOutcome("skip", message=f"not an AutoTP question here: {message}")
    )
    stored = (tmp_path / "cells.jsonl").read_text()
    junit = json.dumps(junit_properties(record))
    for text in (stored, record["message"], junit):  # JUnit's skip message is the record's (suites/test_autotp.py)
        for folder in host_folders():
            assert folder not in text.replace("\\/", "/")
    kept = record["message"]
    assert 'File "site-packages/deepspeed/inference/quantization/quantization.py"' in kept
    assert 'File "tests/suites/records/test_host_paths.py"' in kept
    assert 'File "suites/variants/quantization.py"' in kept
    # A draft still shows DeepSpeed's frames, from its package, and none of the harness's.
    trace = "\n".join(library_trace(kept))
    assert 'File "deepspeed/inference/quantization/quantization.py"' in trace and "suites/" not in trace


def test_host_paths_of_every_kind_go_and_the_rest_stays() -> None:
    text = "\n".join(
        [
            '  File "/work/envs/ds0.14.4-tf4.41.2-pt2.13.0/lib/python3.11/site-packages/deepspeed/x.py", line 3, in f',
            '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/importlib/__init__.py", line 126, in import_module',
            '  File "/work/wt/someone/suites/engine/cell_runner.py", line 219, in run_on_rank',
            '  File "/home/u/clones/DeepSpeed/deepspeed/inference/engine.py", line 162, in __init__',
            'n3.11/site-packages/torch/nn/modules/module.py", line 1778, in _wrapped_call_impl',
            "ModuleNotFoundError: No module named 'torchao'",
            "see deepspeedai/DeepSpeed/blob/0123abc/deepspeed/x.py and results/logs/llama-eager-fp32-tp2",
        ]
    )
    assert without_host_paths(text).splitlines() == [
        '  File "site-packages/deepspeed/x.py", line 3, in f',
        '  File "python3.11/importlib/__init__.py", line 126, in import_module',
        '  File "suites/engine/cell_runner.py", line 219, in run_on_rank',
        '  File "deepspeed/inference/engine.py", line 162, in __init__',
        'site-packages/torch/nn/modules/module.py", line 1778, in _wrapped_call_impl',
        "ModuleNotFoundError: No module named 'torchao'",
        "see deepspeedai/DeepSpeed/blob/0123abc/deepspeed/x.py and results/logs/llama-eager-fp32-tp2",
    ]
    assert without_host_paths(without_host_paths(text)) == without_host_paths(text)


def test_host_paths_read_in_words_cut_what_the_patterns_cut_over_the_whole_text() -> None:
    """without_host_paths reads the host-path patterns only in the words that hold their literal (#58): the same
    text as each pattern substituted over the whole text, for paths of every kind cut by every kind of whitespace
    (Unicode's too; a zero-width space is none), quotes, Windows drives and a word ending where the lookahead reads."""
    pieces = [
        *("/", "\\", "C:", "lib", "lib/", "python3.", "11", "python3.11/", "site", "dist", "-packages", "-packages/"),
        *("/usr/", "/work/envs/x/", "suites/", 'File "/', '"', "'", "a", ".", " ", "\n", "\t", "\u00a0", "\u2028"),
        *("\x1c", "\u200b", "\u3000"),
    ]
    rng = random.Random(58)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(30_000)]
    for text in texts:
        whole = _STANDARD_LIBRARY.sub(r"\1/", _INSTALLED.sub(r"\1/", text))
        assert without_host_paths(text) == _FRAME_FILE.sub(r"\1\3", whole), repr(text)


def test_junit_gets_a_skips_location_inside_the_project() -> None:
    """pytest writes a skip's location (the test file, absolute) before its reason into JUnit's `<skipped>`: the
    project's conftest makes it the project's path."""
    spec = importlib.util.spec_from_file_location("autotp_root_conftest", PROJECT_ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)  # the project's own, whichever conftest pytest named `conftest`
    spec.loader.exec_module(conftest)
    where = str(PROJECT_ROOT / "suites" / "test_autotp.py")
    report = pytest.TestReport(
        "suites/test_autotp.py::test_cell", ("x", 0, "x"), {}, "skipped", (where, 56, "r"), "call"
    )
    hook = conftest.pytest_runtest_makereport(None, None)  # the hook reads neither argument
    next(hook)
    try:
        hook.send(report)
    except StopIteration as done:
        assert done.value.longrepr == ("suites/test_autotp.py", 56, "r")
    else:
        raise AssertionError("the hook wrapper did not return the report")


def test_a_kept_logs_pointer_an_older_record_holds_absolute_is_the_results_folders_name_for_it() -> None:
    cell = "llama-eager-fp32-tp2"
    assert without_host_paths(f"/root/x/results/logs/{cell}") == f"logs/{cell}/"  # the record's `logs` field
    assert without_host_paths(f"/tmp/logs/run/results/logs/{cell}/") == f"logs/{cell}/"  # the last logs/ folder
    message = f"forward: shapes differ\nlogs: /home/runner/work/a/a/results/logs/{cell}\nmore"
    assert without_host_paths(message) == f"forward: shapes differ\nlogs: logs/{cell}/\nmore"
    assert without_host_paths(f"C:\\runner\\results\\logs\\{cell}") == f"logs/{cell}/"
    kept = f"see /var/logs/{cell} for more\n/var/logs/{cell}/rank0.log"  # not a pointer: a path inside a sentence,
    assert without_host_paths(kept) == kept  # or a file under a logs folder

"""The driver's unsharded steps computed once per model and optimizer: a row that compares with fewer steps than the
run's longest reads the first steps of the longest run (suites/variants/unsharded_cache.py). That
is only the same comparison if the first k steps of a longer run are, bit for bit, the k-step run."""

from __future__ import annotations

import pytest
import torch

from matrix.cells import expand
from matrix.checkpoints import tiny_checkpoint
from matrix.registry import load_models
from matrix.variants import load_variants
from suites.checks.contracts import UnshardedSteps
from suites.checks.inputs import ProbeSpec
from suites.reference.memory_plan import TrainingShape
from suites.run.driver import longest_steps
from suites.variants import training, unsharded_cache


def _assert_identical(shorter: UnshardedSteps, separate: UnshardedSteps) -> None:
    assert shorter["losses"] == separate["losses"]
    for name in ("grads", "weights", "adam_gradient_units"):
        assert len(shorter[name]) == len(separate[name]), name
        for ours, theirs in zip(shorter[name], separate[name], strict=True):
            assert ours.keys() == theirs.keys()
            assert all(torch.equal(ours[key], theirs[key]) for key in ours), name
    for name in ("bytes_by_name", "kinds", "shapes_by_name", "counts", "lm_head", "lm_head_weight"):
        assert shorter[name] == separate[name], name


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_first_steps_of_the_longest_run_are_the_shorter_runs(tmp_path, monkeypatch, optimizer):
    checkpoint = str(tiny_checkpoint(load_models()["llama"]))
    monkeypatch.setattr(unsharded_cache, "cache_root", lambda: tmp_path)
    common = {"checkpoint": checkpoint, "tokenizer": None, "dtype": "fp32", "spec": ProbeSpec()}
    paths = {
        steps: unsharded_cache.cached_unsharded_steps(
            **common, trust_remote_code=False, steps=steps, optimizer=optimizer, longest=3
        )
        for steps in (1, 2, 3)
    }
    for steps in (1, 2):
        separate = training.compute_unsharded_steps(
            **common, trust_remote_code=False, steps=steps, optimizer_name=optimizer
        )
        _assert_identical(torch.load(paths[steps], weights_only=False), separate)
    assert len(torch.load(paths[3], weights_only=False)["grads"]) == 3


def test_a_shorter_row_is_read_from_the_longer_run_not_computed(tmp_path, monkeypatch):
    checkpoint = str(tiny_checkpoint(load_models()["llama"]))
    monkeypatch.setattr(unsharded_cache, "cache_root", lambda: tmp_path)
    computed: list[int] = []
    compute = training.compute_unsharded_steps

    def counted(**arguments):
        computed.append(arguments["steps"])
        return compute(**arguments)

    monkeypatch.setattr(unsharded_cache, "compute_unsharded_steps", counted)
    common = {"checkpoint": checkpoint, "tokenizer": None, "dtype": "fp32", "spec": ProbeSpec()}
    for steps in (1, 2, 3, 2, 1):
        unsharded_cache.cached_unsharded_steps(
            **common, trust_remote_code=False, steps=steps, optimizer="sgd", longest=3
        )
    assert computed == [3]
    # Without a longest (a caller that knows no run, as the tests' RunOptions()), each count is its own run.
    unsharded_cache.cached_unsharded_steps(**common, trust_remote_code=False, steps=1, optimizer="adam")
    assert computed == [3, 1]


def test_the_longest_steps_are_per_optimizer_over_the_runs_training_cells():
    cells = [
        *expand("llama", "eager,train,train_zero1,train_ckpt,train_universal", tp="2"),
        *expand("qwen2", "train_two_models", tp="2"),
    ]
    assert longest_steps(cells) == {"sgd": 3, "adam": 3}
    assert longest_steps(expand("llama", "train,eager", tp="2")) == {"sgd": 1}
    assert longest_steps(expand("llama", "eager", tp="2")) == {}


def test_the_driver_is_planned_for_the_steps_it_computes():
    """A `train` cell of a run that also has 3-step rows makes the driver compute 3 steps: planned as such."""
    variants = load_variants()
    alone, in_train_all = TrainingShape.of(variants["train"]), TrainingShape.of(variants["train"], 3)
    three_steps = TrainingShape.of(variants["train_ckpt"], 3)
    assert alone and in_train_all and three_steps
    assert (alone.unsharded_copies, in_train_all.unsharded_copies, three_steps.unsharded_copies) == (6, 10, 10)
    assert in_train_all.compared_copies == alone.compared_copies == 3  # the ranks compare with the row's own steps

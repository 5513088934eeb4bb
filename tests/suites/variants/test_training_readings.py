"""Training checks read what DeepSpeed applies (issue #57): gradients as its step reads them, after the loss scale its
backward applied is divided out, and failures named by their mechanism, so two DeepSpeed bugs are two signatures.
DeepSpeed-side faults are planted in the cell's own engine (tests/faults.py)."""

from __future__ import annotations

import pytest
import torch

from matrix.cells import expand
from suites.checks.training import _comparison_result, magnitude
from suites.run.driver import RunOptions, run_cell
from suites.variants.trainee import Comparison


def _update_comparison(factor: float) -> Comparison:
    """One rank's update comparison where the applied update is `factor` times the unsharded one."""
    reference = torch.linspace(-1.0, 1.0, 64).reshape(8, 8)
    comparison = Comparison(largest=1.0, floor_share=2.0**-20)
    comparison.add("model.layers.0.mlp.up_proj.weight", factor * reference, reference)
    return comparison


def _signature(factor: float) -> str:
    finding = _comparison_result([_update_comparison(factor).record()], 1e-3, "after step 1", "weight update")
    assert finding is not None, factor
    return finding.short


def test_a_vanished_update_and_one_a_fifth_too_large_are_two_signatures():
    """Both read ~1 and ~0.2 of the update's scale; masked to digits-free words they stayed one signature before."""
    too_large = {_signature(factor) for factor in (1.18, 1.2, 1.22)}
    assert too_large == {
        "after step 1: weight update of model.layers.0.mlp.up_proj.weight on rank 0 differs from the unsharded weight "
        "update by tenths of its scale"
    }
    vanished = _signature(0.0)
    assert vanished == (
        "after step 1: weight update of model.layers.0.mlp.up_proj.weight on rank 0 is zero where the unsharded "
        "weight update is not"
    )
    assert _signature(65536.0).endswith("by tens of thousands of its scale")  # a loss scale never divided out


@pytest.mark.parametrize(
    "error, words",
    [(6.55e4, "tens of thousands"), (0.999, "tenths"), (1.0, "units"), (0.18, "tenths"), (3e-9, "millionths")],
)
def test_an_errors_order_of_magnitude_is_named_in_words(error, words):
    """The reports mask every digit of a signature when they group failures: the decade is a word."""
    assert magnitude(error) == words
    assert not any(character.isdigit() for character in words)


@pytest.fixture
def pool(rank_pool):
    return rank_pool


def _run(pool, fault=None):
    cell = expand("llama", "train", "fp32", "2")[0]  # one step at ZeRO 0: the update is that step's alone
    return run_cell(cell, pool, RunOptions(cell_timeout=600, faults=(f"tests.faults:{fault}",) if fault else ()))


@pytest.mark.autotp
def test_gradients_are_read_after_deepspeeds_loss_scale(pool):
    """A correct release that scales its loss (gradients 65536 times the true ones until its step divides that out)
    passes, and the scale it applied is recorded."""
    outcome = _run(pool, "deepspeed_scales_the_loss")
    assert outcome.outcome == "pass", outcome.message
    assert outcome.metrics["grad_loss_scale"] == 2.0**16
    assert outcome.metrics["grad_first_step_max_rel_error"] < 1e-5


@pytest.mark.autotp
def test_two_update_bugs_are_two_causes(pool):
    """An update DeepSpeed makes 20 % too large and one it never applies: both fail train_update, with two signatures
    and two causes, each naming its mechanism."""
    healthy = _run(pool)
    assert healthy.outcome == "pass", healthy.message
    assert healthy.metrics["grad_loss_scale"] == 1.0
    too_large, vanished = (
        _run(pool, fault) for fault in ("deepspeed_update_too_large_by_a_fifth", "deepspeed_update_vanishes")
    )
    for outcome in (too_large, vanished):
        assert (outcome.outcome, outcome.failure_class) == ("fail", "numerics"), outcome.message
        assert outcome.signature.startswith("train_update: after step 1: weight update of"), outcome.signature
    assert too_large.signature.endswith("differs from the unsharded weight update by tenths of its scale")
    assert 0.15 < too_large.metrics["update_max_rel_error"] < 0.25
    assert vanished.signature.endswith("is zero where the unsharded weight update is not"), vanished.signature
    assert too_large.cause is not None and vanished.cause is not None
    assert too_large.cause.mechanism_key != vanished.cause.mechanism_key

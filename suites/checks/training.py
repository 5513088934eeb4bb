"""The training variant's checks: the sharded step's loss and each rank's gradient shards must
match the unsharded step (gradients relative to their largest magnitude, per dtype tolerance)."""

from __future__ import annotations

import math

from matrix.registry import Tolerance
from suites.checks import CheckResult


def _nan_first(value: float) -> tuple[bool, float]:
    return math.isnan(value), value


def check(reference_loss: float, reports: list[dict], tolerance: Tolerance) -> list[CheckResult]:
    # _nan_first: Python's max drops a NaN that is not first, and a NaN loss or gradient must fail.
    loss_delta = max((abs(r["loss"] - reference_loss) for r in reports), key=_nan_first) / abs(reference_loss)
    loss_ok = loss_delta <= tolerance.ppl_rel
    loss = CheckResult("train_loss", loss_ok, "numerics", {"train_loss_ref": reference_loss, "train_loss_rel_delta": loss_delta},
                       "" if loss_ok else f"training loss differs from the unsharded step by {loss_delta:.3g} relative (allowed {tolerance.ppl_rel:g})")
    worst_rank = max(range(len(reports)), key=lambda r: _nan_first(reports[r]["max_rel_error"]))
    worst = reports[worst_rank]
    problems = [f"rank {rank}: {p}" for rank, r in enumerate(reports) for p in r["problems"]]
    grads_ok = worst["max_rel_error"] <= tolerance.rtol and not problems
    metrics = {"grad_max_rel_error": worst["max_rel_error"], "grad_params_compared": float(sum(r["compared"] for r in reports)),
               "grad_params_sharded": float(sum(r["sharded"] for r in reports))}
    reason = "" if grads_ok else ("; ".join(problems[:3]) if problems else
                                  f"gradient of {worst['worst_parameter']} on rank {worst_rank} differs from the unsharded "
                                  f"gradient by {worst['max_rel_error']:.3g} of its scale (allowed {tolerance.rtol:g})")
    sharded = sum(r["sharded"] for r in reports)
    split = CheckResult("train_sharded", sharded > 0, "memory", {},
                        "" if sharded else "no rank holds a slice of any parameter: AutoTP training did not shard the model")
    return [loss, CheckResult("train_grads", grads_ok, "numerics", metrics, reason), split]

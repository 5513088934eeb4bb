"""The training variants' checks, per trained model: each step's loss and each rank's gradient shards,
the weight update the optimizer applied, that the model is sharded (per-rank bytes by kind, as the
inference memory check), the lm_head mode DeepSpeed chose, and after a checkpoint round trip the saved
and gathered full weights and the loss of the step a resumed run takes. Reasons name the stage
(`step 2`, `save`, `gather`, `load`, `resume`), so the cell's signature does."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from matrix.registry import Tolerance
from suites.checks import memory as memory_checks
from suites.checks.interface import Check, CheckInputs
from suites.checks.probes import Footprint, SplitCounts
from suites.checks.result import CheckResult, Finding, joined
from suites.verdicts.check_names import at_floor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from suites.checks.contracts import (
        ComparisonRecord,
        RoundTripReport,
        TraineeReport,
        TrainingReport,
        UnshardedSteps,
    )


def _nan_first(value: float) -> tuple[bool, float]:
    return math.isnan(value), value


def _rank_problems(problems_per_rank: Sequence[Sequence[Finding]]) -> list[Finding]:
    """The ranks' problems (suites/variants/training.py), each naming its rank."""
    return [problem.prefixed(f"rank {rank}: ") for rank, found in enumerate(problems_per_rank) for problem in found]


DECADES = {
    -6: "millionths",
    -5: "hundred-thousandths",
    -4: "ten-thousandths",
    -3: "thousandths",
    -2: "hundredths",
    -1: "tenths",
    0: "units",
    1: "tens",
    2: "hundreds",
    3: "thousands",
    4: "tens of thousands",
    5: "hundreds of thousands",
    6: "millions",
}
"""A relative error's order of magnitude (the decade it falls in) in words, the part of it a signature keeps: it names
the mechanism (an update 20 % too large: 0.18-0.22, tenths; a gradient read at DeepSpeed's loss scale: 6.55e+04,
tens of thousands), where the figure itself differs from cell to cell. Words, not digits: the reports mask every
digit of a signature when they group failures (reports/analysis/signatures.py), which would make two decades one."""


def magnitude(error: float) -> str:
    """`error`'s decade in words (DECADES), for a finding's short part; its figure goes to the detail."""
    if not math.isfinite(error):
        return "a NaN or infinite amount"
    if error <= 0:
        return "nothing"
    decade = min(max(math.floor(math.log10(error)), min(DECADES)), max(DECADES))
    return DECADES[decade]


def _comparison_result(comparisons: list[ComparisonRecord], allowed: float, stage: str, what: str) -> Finding | None:
    """What is wrong over one Comparison per rank (suites/variants/training.py), None when nothing is. The short part
    keeps what names the mechanism: a vanished tensor, or the error's order of magnitude (`magnitude`)."""
    if problems := _rank_problems([c.problems for c in comparisons]):
        return joined(problems[:3], f"{stage}: ")
    worst_rank = max(range(len(comparisons)), key=lambda r: _nan_first(comparisons[r].max_rel_error))
    worst = comparisons[worst_rank]
    error = worst.max_rel_error
    if error <= allowed:
        return None
    which = f"{stage}: {what} of {worst.worst_parameter} on rank {worst_rank}"
    figures = f"({error:.3g} of its scale; allowed {allowed:.3g})"
    if worst.worst_vanished:
        return Finding(f"{which} is zero where the unsharded {what} is not", figures)
    return Finding(f"{which} differs from the unsharded {what} by {magnitude(error)} of its scale", figures)


def _at_floors(comparisons: list[ComparisonRecord], metric: str) -> dict[str, float]:
    """`metric` had the scale floor been each candidate (suites/variants/trainee.py FLOOR_CANDIDATES): what the floor's
    choice rests on (benchmarks/noise.py)."""
    floors = {int(k) for c in comparisons for k in c.errors_at_floor}
    return {at_floor(metric, k): max(c.errors_at_floor.get(str(k), 0.0) for c in comparisons) for k in sorted(floors)}


def _grad_bound(tolerance: Tolerance, step: int) -> float:
    """The first step's gradients are of the same weights on both sides; a later step's (and a resumed step's) are
    of weights that already differ by the earlier updates' noise, which the model amplifies."""
    return tolerance.train_grad_rel if step == 0 else tolerance.train_later_grad_rel


def _loss_delta(loss: float, reference: float) -> float:
    return abs(loss - reference) / abs(reference)


def _loss(unsharded: UnshardedSteps, reports: list[TraineeReport], tolerance: Tolerance, prefix: str) -> CheckResult:
    label = _label(reports, prefix)
    deltas = [
        max((_loss_delta(r["losses"][step], unsharded["losses"][step]) for r in reports), key=_nan_first)
        for step in range(len(reports[0]["losses"]))
    ]
    failing = next((step for step, delta in enumerate(deltas) if not delta <= tolerance.train_loss_rel), None)
    return CheckResult.judged(
        "train_loss",
        "numerics",
        {
            f"{prefix}train_loss_ref": unsharded["losses"][0],
            f"{prefix}train_loss_rel_delta": max(deltas, key=_nan_first),
        },
        None
        if failing is None
        else Finding(
            f"{label}step {failing + 1}: training loss differs from the unsharded step by "
            f"{magnitude(deltas[failing])} of its value",
            f"({deltas[failing]:.3g} relative; allowed {tolerance.train_loss_rel:.3g})",
        ),
    )


def _grads(reports: list[TraineeReport], tolerance: Tolerance, prefix: str) -> CheckResult:
    layout_problems = _rank_problems([r["problems"][:3] for r in reports])
    grads = joined(layout_problems, "sharded: ") if layout_problems else None
    for step in range(len(reports[0]["losses"])):
        if grads is None:
            grads = _comparison_result(
                [r["steps"][step] for r in reports], _grad_bound(tolerance, step), f"step {step + 1}", "gradient"
            )
    worst_grad = max((c.max_rel_error for r in reports for c in r["steps"]), key=_nan_first)
    return CheckResult.judged(
        "train_grads",
        "numerics",
        {
            f"{prefix}grad_max_rel_error": worst_grad,
            f"{prefix}grad_first_step_max_rel_error": max(
                (r["steps"][0].max_rel_error for r in reports), key=_nan_first
            ),
            **_at_floors([r["steps"][0] for r in reports], f"{prefix}grad_first_step_max_rel_error"),
            f"{prefix}grad_params_compared": float(sum(c.compared for r in reports for c in r["steps"][:1])),
            f"{prefix}grad_params_sharded": float(sum(r["sharded"] for r in reports)),
            f"{prefix}grad_loss_scale": max(c.loss_scale for r in reports for c in r["steps"]),
        },
        grads.prefixed(_label(reports, prefix)) if grads else None,
    )


def _update(reports: list[TraineeReport], tolerance: Tolerance, prefix: str) -> CheckResult:
    update = _comparison_result(
        [r["update"] for r in reports],
        tolerance.train_update_rel,
        f"after step {len(reports[0]['losses'])}",
        "weight update",
    )
    return CheckResult.judged(
        "train_update",
        "numerics",
        {
            f"{prefix}update_max_rel_error": max((r["update"].max_rel_error for r in reports), key=_nan_first),
            **_at_floors([r["update"] for r in reports], f"{prefix}update_max_rel_error"),
        },
        update.prefixed(_label(reports, prefix)) if update else None,
    )


def _memory(unsharded: UnshardedSteps, reports: list[TraineeReport], prefix: str) -> CheckResult:
    label = _label(reports, prefix)
    footprint = Footprint(
        bytes_by_name=unsharded["bytes_by_name"],
        kinds=unsharded["kinds"],
        shapes_by_name=unsharded["shapes_by_name"],
        counts=SplitCounts.read(unsharded["counts"]),
    )
    memory = memory_checks.check(footprint, [r["bytes_by_name"] for r in reports])
    return CheckResult(
        name=memory.name,
        passed=memory.passed,
        failure_class=memory.failure_class,
        metrics={f"{prefix}{k}": v for k, v in memory.metrics.items()},
        reason=label + memory.reason if memory.reason else "",
        signature=label + memory.signature if memory.signature else "",
    )


def _label(reports: list[TraineeReport], prefix: str) -> str:
    """How reasons name a second model (`prefix` set); the cell's own model goes unnamed."""
    return f"second model {reports[0]['label']}: " if prefix else ""


def check_model(
    unsharded: UnshardedSteps, reports: list[TraineeReport], tolerance: Tolerance, prefix: str = ""
) -> list[CheckResult]:
    """`unsharded`: the driver's steps (suites/variants/training.py compute_unsharded_steps); `reports`: one per
    rank for this model. `prefix` names a second model in reasons and metrics."""
    results = [
        _loss(unsharded, reports, tolerance, prefix),
        _grads(reports, tolerance, prefix),
        _update(reports, tolerance, prefix),
        _memory(unsharded, reports, prefix),
    ]
    weight = unsharded["lm_head_weight"]
    if weight:
        ratio = max(r["bytes_by_name"].get(weight, 0) for r in reports) / unsharded["bytes_by_name"][weight]
        results.append(
            CheckResult(
                "lm_head",
                True,
                "memory",
                {f"{prefix}lm_head_shard_ratio": ratio},
                f"{_label(reports, prefix)}lm_head: {reports[0]['lm_head_mode']}, {ratio:.0%} of it per rank",
            )
        )

    if "round_trip" in reports[0]:
        results += _check_round_trip(unsharded, [r["round_trip"] for r in reports], tolerance)
    return results


def _check_round_trip(
    unsharded: UnshardedSteps, trips: list[RoundTripReport], tolerance: Tolerance
) -> list[CheckResult]:
    saved_weights = trips[0]["saved"]
    if saved_weights is None:
        raise ValueError("rank 0's checkpoint round trip compared no saved weights (a harness bug)")
    saved = _comparison_result([saved_weights], tolerance.train_weight_rel, "save_16bit_model", "weight")
    gathered = _comparison_result(
        [t["gathered"] for t in trips], tolerance.train_weight_rel, "GatherReplacedLayerParams", "weight"
    )
    # The loaded weights are judged by the trained update they hold (their change from the initial weights).
    loaded = _comparison_result(
        [t["loaded"] for t in trips], tolerance.train_update_rel, "load_checkpoint", "weight update"
    )
    step, tp = trips[0]["resumed_step"], trips[0]["resumed_tp"]
    delta = max((_loss_delta(t["resumed_loss"], unsharded["losses"][step - 1]) for t in trips), key=_nan_first)
    resumed = _comparison_result(
        [t["resumed_grads"] for t in trips],
        _grad_bound(tolerance, step - 1),
        f"step {step} after load_checkpoint at tp {tp}",
        "gradient",
    )
    if resumed is None:
        resumed = _comparison_result(
            [t["resumed_update"] for t in trips],
            tolerance.train_update_rel,
            f"step {step} after load_checkpoint at tp {tp}",
            "weight update",
        )
    if not delta <= tolerance.train_loss_rel:
        resumed = Finding(
            f"step {step} after load_checkpoint at tp {tp}: loss differs from the uninterrupted run by "
            f"{magnitude(delta)} of its value",
            f"({delta:.3g} relative; allowed {tolerance.train_loss_rel:.3g})",
        )
    return [
        CheckResult.judged("save", "numerics", {"saved_max_rel_error": saved_weights.max_rel_error}, saved),
        CheckResult.judged(
            "gather",
            "numerics",
            {"gathered_max_rel_error": max((t["gathered"].max_rel_error for t in trips), key=_nan_first)},
            gathered,
        ),
        CheckResult.judged(
            "load",
            "numerics",
            {"loaded_max_rel_error": max((t["loaded"].max_rel_error for t in trips), key=_nan_first)},
            loaded,
        ),
        CheckResult.judged(
            "resume",
            "numerics",
            {
                "resumed_loss_rel_delta": delta,
                "resumed_grad_max_rel_error": max((t["resumed_grads"].max_rel_error for t in trips), key=_nan_first),
                "resumed_update_max_rel_error": max((t["resumed_update"].max_rel_error for t in trips), key=_nan_first),
            },
            resumed,
        ),
    ]


def check(
    unsharded_steps: list[UnshardedSteps], rank_reports: list[TrainingReport], tolerance: Tolerance
) -> list[CheckResult]:
    """Every trained model of the cell: the cell's own, then a second one (prefix `second_` in metrics)."""
    results = []
    for index, unsharded in enumerate(unsharded_steps):
        results += check_model(
            unsharded, [r["models"][index] for r in rank_reports], tolerance, "second_" if index else ""
        )
    return results


def _trained(inputs: CheckInputs) -> list[CheckResult]:
    reports = [rank.training for rank in inputs.ranks if rank.training is not None]
    if len(reports) != len(inputs.ranks):
        raise ValueError("a rank of a training cell handed rank 0 no training report (a harness bug)")
    return check(list(inputs.unsharded_steps), reports, inputs.tolerance)


CHECK = Check(
    ("train_loss", "train_grads", "train_update", "memory", "lm_head", "save", "gather", "load", "resume"),
    "variant",
    lambda inputs: bool(inputs.unsharded_steps),
    _trained,
)

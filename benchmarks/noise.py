"""The noise of correct runs against each check's bound: runs real cells, then prints per check and dtype the
largest noise measured in a passing cell, the bound, and bound / noise (#24: no bound more than 10x the noise).

    python benchmarks/noise.py run --models registry --tp 2,3,4 --dtypes fp32,bf16 --out results/noise.jsonl
    python benchmarks/noise.py run --models llama,qwen2 --variants train-all --tp 2,3 --out results/noise.jsonl
    python benchmarks/noise.py report results/noise.jsonl

`run` appends one JSON line per cell (id, dtype, outcome, metrics), so runs add up and `report` can be
repeated without running anything. Noise is each check's metric in the unit its bound is stated in (a share of
the logit or tensor scale, a relative loss or perplexity delta); the bound is read from the tolerance code
(matrix/registry.py) of the tree that reports, so a changed bound is reported against the same measurements.
Only passing cells count: a failing cell's numbers are a finding, not noise.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from matrix.cells import (
    expand,
    parse_cell_id,
)
from matrix.registry import (
    DEFAULT_TOLERANCES,
    EPSILON,
    DType,
    load_models,
)
from matrix.shapes import split_shaped_name
from matrix.variants import load_variants
from suites.engine.rank_group import RankGroupPool
from suites.run.driver import RunOptions, run_cell
from suites.verdicts.check_names import at_floor, current_metric_name, judged_signature


def run(args: argparse.Namespace) -> None:
    cells = expand(args.models, args.variants, args.dtypes, args.tp)
    print(f"{len(cells)} cells", flush=True)
    pool = RankGroupPool()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for cell in cells:
            outcome = run_cell(cell, pool, RunOptions())
            record = {
                "id": cell.id,
                "model": cell.model.name,
                "dtype": cell.dtype,
                "outcome": outcome.outcome,
                "failure_class": outcome.failure_class,
                "signature": outcome.signature,
                "metrics": outcome.metrics,
            }
            with out.open("a") as stream:
                stream.write(json.dumps(record) + "\n")
            print(f"{cell.id}: {outcome.outcome} {outcome.failure_class} {outcome.signature[:100]}", flush=True)
    finally:
        pool.close()


@dataclass(frozen=True)
class Bound:
    check: str
    unit: str
    metrics: tuple[str, ...]
    """The cell metrics that measure this check's noise in the bound's unit (the largest counts)."""
    field: str
    """The Tolerance field that bounds it (matrix/registry.py)."""


TRAINED = ("", "second_")
BOUNDS = (
    Bound("logits", "max|dlogit| / logit scale", ("logits_max_rel",), "logits_rel"),
    Bound(
        "generation",
        "decode-step max|dlogit| / scale",
        ("gen_logits_max_rel", "gen_padded0_logits_max_rel", "gen_padded1_logits_max_rel"),
        "logits_rel",
    ),
    Bound("perplexity", "relative perplexity delta", ("ppl_rel_delta",), "ppl_rel"),
    Bound("ranks_agree", "max|dlogit| across ranks (absolute)", ("rank_logits_spread",), ""),
    # A resumed step is a step like the others: its loss, gradients and update share their bounds.
    Bound(
        "train_loss",
        "relative loss delta",
        (*(p + "train_loss_rel_delta" for p in TRAINED), "resumed_loss_rel_delta"),
        "train_loss_rel",
    ),
    Bound(
        "train_grads step 1",
        "max|dgrad| / gradient scale",
        tuple(p + "grad_first_step_max_rel_error" for p in TRAINED),
        "train_grad_rel",
    ),
    Bound(
        "train_grads later",
        "max|dgrad| / gradient scale",
        (*(p + "grad_max_rel_error" for p in TRAINED), "resumed_grad_max_rel_error"),
        "train_later_grad_rel",
    ),
    # The loaded weights are judged by the update they hold; Adam's updates in gradient units (Adam's gain rule).
    Bound(
        "train_update, load",
        "max|dupdate| / update scale",
        (*(p + "update_max_rel_error" for p in TRAINED), "resumed_update_max_rel_error", "loaded_max_rel_error"),
        "train_update_rel",
    ),
    Bound(
        "save, gather",
        "max|dweight| / weight scale",
        ("saved_max_rel_error", "gathered_max_rel_error"),
        "train_weight_rel",
    ),
)
SAVE_16BIT_KEEPS_SHARDS = judged_signature("save", "save_16bit_model: rank 0:")
"""A finding at DeepSpeed 0.19.8 (README "Training"): below ZeRO-3 the 16-bit file holds rank 0's shards. The
checks before `save` passed and the ones after it run on the regular checkpoint, so only the saved file's metric
is not noise."""


def measured(record: dict[str, Any], bound: Bound) -> list[float]:
    """The record's values of the bound's metrics. Records from before `grad_first_step_max_rel_error` existed: a
    one-step row's `grad_max_rel_error` is its first step's."""
    values = [
        record["metrics"][m]
        for m in bound.metrics
        if m in record["metrics"]
        and not (m == "saved_max_rel_error" and record["signature"].startswith(SAVE_16BIT_KEEPS_SHARDS))
    ]
    if not values and bound.field == "train_grad_rel" and "grad_max_rel_error" in record["metrics"]:
        variants = load_variants()
        variant = variants[parse_cell_id(record["id"], load_models(), variants)[1]]
        if variant.training_steps == 1:
            values = [record["metrics"]["grad_max_rel_error"]]
    return values


def correct(record: dict[str, Any]) -> bool:
    """A cell whose numbers are right: it passed, failed only `memory` (judged after every numeric check), or
    failed `save` on the 16-bit file finding."""
    return bool(
        record["outcome"] == "pass"
        or record["failure_class"] == "memory"
        or record["signature"].startswith(SAVE_16BIT_KEEPS_SHARDS)
    )


@functools.cache
def registry() -> dict[str, Any]:
    return load_models()


def bound_value(bound: Bound, dtype: DType, model: str | None = None) -> float | None:
    """The default bound of the dtype, or `model`'s own (an override in matrix/models.toml)."""

    tolerance = registry()[split_shaped_name(model)[0]].tolerance_for(dtype) if model else DEFAULT_TOLERANCES[dtype]
    return getattr(tolerance, bound.field) if bound.field else None


def overridden(record: dict[str, Any], bound: Bound) -> bool:
    return bool(bound.field) and bound_value(bound, record["dtype"], record["model"]) != bound_value(
        bound, record["dtype"]
    )


def noise_rows(records: list[dict[str, Any]]) -> list[tuple[Bound, DType, float, str, int]]:
    """(bound, dtype, largest noise, the cell it was measured in, cells measured) per check and dtype with a
    correct cell. The last record of a cell id counts (a rerun replaces the earlier one)."""
    latest = {record["id"]: record for record in records}
    rows = []
    for dtype in sorted({record["dtype"] for record in latest.values()}):
        cells = [r for r in latest.values() if r["dtype"] == dtype and correct(r)]
        for bound in BOUNDS:
            values = [
                (max(found), r["id"]) for r in cells if not overridden(r, bound) and (found := measured(r, bound))
            ]
            if values:
                noise, where = max(values)
                rows.append((bound, dtype, noise, where, len(values)))
    return rows


def over_bounds(records: list[dict[str, Any]]) -> list[str]:
    """Cells with right numbers that a bound of this tree would fail, and `generation` failures whose prefill logits
    it fails first (`numerics`): the verdicts these bounds change (cells are deterministic on CPU, so a recorded
    metric is what a rerun measures)."""
    latest = {record["id"]: record for record in records}
    over = []
    for record in latest.values():
        logits_bound = bound_value(BOUNDS[0], record["dtype"], record["model"])
        if record["failure_class"] == "generation" and record["metrics"].get("logits_max_rel", 0) > logits_bound:
            over.append(
                f"{record['id']}: failed generation, its prefill logits {record['metrics']['logits_max_rel']:.3g} "
                f"> {logits_bound:.3g} now fail `logits` (numerics) first"
            )
        if not correct(record):
            continue
        for bound in BOUNDS:
            value, found = bound_value(bound, record["dtype"], record["model"]), measured(record, bound)
            if value is not None and found and not max(found) <= value:
                over.append(f"{record['id']}: {bound.check} {max(found):.3g} > {value:.3g}")
    return over


FLOORED = (
    ("train_grads step 1", "grad_first_step_max_rel_error", "train_grad_rel"),
    ("train_update", "update_max_rel_error", "train_update_rel"),
)
"""Checks whose tensors are judged against max(own scale, a floor share of the model's largest): each cell records its
error at every candidate floor (suites/variants/trainee.py FLOOR_CANDIDATES, metrics `<metric>_floor_2_to_minus_<k>`,
suites/verdicts/check_names.py at_floor; older records' `<metric>_floor2^-<k>` are read as those)."""


def floor_rows(records: list[dict[str, Any]]) -> list[str]:
    """Per dtype, check and candidate floor: the largest error of a correct cell had the floor been 2^-k of the
    largest magnitude, against the check's bound (how low the floor can go before noise fails)."""
    latest = {record["id"]: record for record in records}
    lines = []
    for dtype in sorted({r["dtype"] for r in latest.values()}):
        cells = [r for r in latest.values() if r["dtype"] == dtype and correct(r)]
        for check, metric, field in FLOORED:
            named = at_floor(metric, 0).removesuffix("0")  # every floor's name, its exponent after this
            floors = sorted({int(m.removeprefix(named)) for r in cells for m in r["metrics"] if m.startswith(named)})
            bound = bound_value(Bound(check, "", (), field), dtype)
            for k in floors:
                found = [
                    (r["metrics"][at_floor(metric, k)], r["id"]) for r in cells if at_floor(metric, k) in r["metrics"]
                ]
                noise, where = max(found)
                lines.append(
                    f"  {check} {dtype} at floor 2^-{k} of the largest: noise {noise:.3g} "
                    f"({len(found)} cells, {where}), bound {bound:.3g} "
                    f"({bound / noise if noise else float('inf'):.1f}x)"
                )
    return lines


def report(args: argparse.Namespace) -> None:
    records = [json.loads(line) for path in args.files for line in Path(path).read_text().splitlines() if line.strip()]
    for record in records:  # an older harness's names read as this one's
        record["metrics"] = {current_metric_name(name): value for name, value in record["metrics"].items()}
    latest = {record["id"]: record for record in records}
    for dtype in sorted({r["dtype"] for r in latest.values()}):
        cells = [r for r in latest.values() if r["dtype"] == dtype]
        print(
            f"{dtype}: {len(cells)} cells, {sum(r['outcome'] == 'pass' for r in cells)} pass, "
            f"{sum(correct(r) for r in cells)} with right numbers (pass, or fail memory only)"
        )
    print(
        f"{'check':<19} {'dtype':<5} {'cells':>5} {'noise':>9} {'ulps':>6} {'bound':>9} {'ulps':>6} {'ratio':>7}  "
        f"largest in"
    )
    for bound, dtype, noise, where, count in noise_rows(records):
        value = bound_value(bound, dtype)
        eps = EPSILON[dtype]
        limit = f"{value:9.2g} {value / eps:6.3g}" if value is not None else f"{'exact':>9} {'':>6}"
        ratio = f"{value / noise:.1f}x" if value is not None and noise else "-"
        print(f"{bound.check:<19} {dtype:<5} {count:5d} {noise:9.2g} {noise / eps:6.3g} {limit} {ratio:>7}  {where}")
    for record in latest.values():
        for bound in BOUNDS:
            if correct(record) and overridden(record, bound) and (found := measured(record, bound)):
                value = bound_value(bound, record["dtype"], record["model"])
                override = "exact" if value is None else f"{value:.3g}, {value / max(found):.1f}x its noise"
                print(
                    f"  {record['id']}: {bound.check} has its model's override {override} (noise {max(found):.2g}; "
                    "matrix/models.toml)"
                )
    for line in floor_rows(records):
        print(line)
    over = over_bounds(records)
    print(f"verdicts the bounds of this tree change: {len(over)}")
    for line in over:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runs = commands.add_parser("run", help="run cells and append their metrics to --out")
    runs.add_argument("--models", default="registry")
    runs.add_argument("--variants", default="eager")
    runs.add_argument("--dtypes", default="fp32")
    runs.add_argument("--tp", default="2,3,4")
    runs.add_argument("--out", required=True)
    reports = commands.add_parser("report", help="print noise, bound and ratio per check from run files")
    reports.add_argument("files", nargs="+")
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()

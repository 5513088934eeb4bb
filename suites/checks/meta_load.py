"""A `meta` variant's load: no rank may materialise the full model while it loads on the meta device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from suites.checks.interface import Check
from suites.checks.result import CheckResult, Finding

if TYPE_CHECKING:
    from suites.checks.probes import Footprint

META_LOAD_MIN_MODEL_BYTES = 100 << 20
"""Below this model size, import and allocator noise in a rank's RSS (tens of MB) hides the model."""


def check_meta_load(unsharded: Footprint, rank_peak_growth: float) -> CheckResult:
    """`meta` load: no rank may materialise the full model. Its peak RSS growth from before loading
    to the end of sharding must stay below the unsharded model's bytes (eager grows by more than them)."""
    full = unsharded.param_bytes
    metrics = {"meta_load_growth_ratio": rank_peak_growth / full}
    if full < META_LOAD_MIN_MODEL_BYTES:
        return CheckResult("meta_memory", True, "memory", metrics)
    return CheckResult.judged(
        "meta_memory",
        "memory",
        metrics,
        None
        if rank_peak_growth < full
        else Finding(
            f"a rank's peak RSS grew by {rank_peak_growth / 2**20:.0f} MiB while loading on the meta device",
            f"(full model {full / 2**20:.0f} MiB): the full model was materialised",
        ),
    )


CHECK = Check(
    ("meta_memory",),
    "variant",
    lambda inputs: inputs.meta_load,
    lambda inputs: [check_meta_load(inputs.inference()[0].unsharded_footprint(), inputs.load_peak_growth)],
)

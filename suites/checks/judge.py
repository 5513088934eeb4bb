"""How rank 0 judges an inference cell: the checks in order; the cell fails with the class of the first
failing one, and every check's metrics are recorded either way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.version import Version

from matrix.registry import Tolerance
from suites.checks import generation, logits, memory, perplexity
from suites.checks.contracts import RankSummary
from suites.checks.result import CheckResult

if TYPE_CHECKING:
    from suites.checks.probes import Observations, SplitCounts


def deepspeed_release() -> tuple[int, ...]:
    """The DeepSpeed release this rank sharded with (a commit checkout: the release its version names)."""
    import deepspeed

    return Version(deepspeed.__version__).release


def run_all(
    reference: Observations,
    sharded: Observations,
    ranks: list[RankSummary],
    tolerance: Tolerance,
    perplexity_skipped: str = "",
    real_counts: SplitCounts | None = None,
    checkpoint_json: bool = False,
) -> list[CheckResult]:
    """`sharded` is rank 0's observations; `ranks` what every rank handed rank 0; `perplexity_skipped` why the model
    cannot run the perplexity probe ("" when it ran); `real_counts` a faithful cell's real checkpoint counts;
    `checkpoint_json` whether init_inference loaded a checkpoint json (the meta load), which decides whether older
    releases split the output head."""
    rank_last_logits = [r.last_logits for r in ranks if r.last_logits is not None]
    rank_bytes_by_name = [r.bytes_by_name for r in ranks if r.bytes_by_name is not None]
    if len(rank_last_logits) != len(ranks) or len(rank_bytes_by_name) != len(ranks):
        raise ValueError("a rank of an inference cell handed rank 0 no last_logits or bytes_by_name (a harness bug)")
    for first in (logits.check_reference(reference), logits.check_shapes(reference, sharded, rank_last_logits)):
        if not first.passed:
            return [first]  # nothing else can be compared
    return [
        logits.check(reference, sharded, tolerance),
        logits.check_ranks_agree(rank_last_logits),
        generation.check(reference, sharded, tolerance),
        perplexity.check(reference, sharded, tolerance, perplexity_skipped),
        memory.check(
            reference.unsharded_footprint(),
            rank_bytes_by_name,
            [r.shapes_by_name or {} for r in ranks],
            real=real_counts,
            deepspeed_release=deepspeed_release(),
            checkpoint_json=checkpoint_json,
        ),
    ]

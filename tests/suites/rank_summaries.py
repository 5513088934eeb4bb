"""Rank summaries for judging observations in a test without a rank group."""

from suites.checks.contracts import RankSummary


def inference_rank(rank: int, observed) -> RankSummary:
    """What a rank of an inference cell hands rank 0, holding all of `observed`'s tensors (observations of an
    unsharded model, with its footprint) and its logits (no error, no memory figures)."""
    return RankSummary(rank, None, 0, 0, 0, 0, None, observed.footprint.bytes_by_name, observed.logits_plain[0, -1])

"""The earlier points a first night runs its new causes' example cells at, so a report can say since when a cause
fails without a history (`nox -s since-when`, reports/search/since_when.py): on each axis, the other axes at the
latest versions,

- DeepSpeed: the newest patch of each of the `deepspeed_minors` minor releases before the latest one's
  (0.18.9, 0.17.6, 0.16.9 under 0.19.8), never older than versions.toml's `min`;
- transformers: the newest release of the major line before the latest one's (4.57.6 under 5.25.0), when the
  latest is a new major: the layouts a major release rewrote are the likeliest change.

Releases are read as the harness reads them (matrix/versions.py: PyPI release data, cached); a point
versions.toml declares incompatible with the others is left out. At most `max_points` points, taken alternately
from the two axes (the newest DeepSpeed minor, the last transformers major, the next DeepSpeed minor, …), so a
small cap still tries both."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from packaging.version import InvalidVersion, Version

from matrix.version_axes import load_config
from matrix.versions import backfill_versions, skip_reason

DEFAULT_DEEPSPEED_MINORS = 3
DEFAULT_MAX_POINTS = 4
DEFAULT_MAX_CELLS = 16
"""The default caps: 4 points × 16 example cells = at most 64 cell runs and 4 environments; the default matrix's
first night has 15 new causes."""


@dataclass(frozen=True)
class EarlierPoint:
    """One axis at an earlier release, the others at the latest versions."""

    axis: str
    version: str

    def pins(self, latest: dict[str, str]) -> dict[str, str]:
        """Every axis's release at this point."""
        return {**latest, self.axis: self.version}


def earlier_points(
    latest: dict[str, str],
    *,
    deepspeed_minors: int = DEFAULT_DEEPSPEED_MINORS,
    max_points: int = DEFAULT_MAX_POINTS,
    cache_dir: Path | None = None,
) -> list[EarlierPoint]:
    """The points for `latest` (axis -> release, every axis of matrix/versions.py), alternating between the axes and
    cut at max_points; an axis at a value that is not a release (a git ref) gets none."""
    deepspeed = _older_minors(latest.get("deepspeed", ""), deepspeed_minors, cache_dir)
    transformers = _last_of_previous_major(latest.get("transformers", ""), cache_dir)
    interleaved = [
        point
        for pair in zip_longest(
            [EarlierPoint("deepspeed", v) for v in deepspeed], [EarlierPoint("transformers", v) for v in transformers]
        )
        for point in pair
        if point is not None and not skip_reason(point.pins(latest))
    ]
    return interleaved[: max(max_points, 0)]


def _release(text: str) -> Version | None:
    try:
        version = Version(text)
    except InvalidVersion:
        return None
    return None if version.is_prerelease or version.is_devrelease else version


def _older_minors(latest: str, count: int, cache_dir: Path | None) -> list[str]:
    """The newest patch of each of the `count` minors before latest's, newest first."""
    current = _release(latest)
    rule = load_config().axes["deepspeed"]
    if current is None or count <= 0:
        return []
    minors = backfill_versions("deepspeed", str(rule.min or "0.0"), latest, cache_dir=cache_dir)
    older = [v for v in minors if Version(v).release[:2] < current.release[:2]]
    return list(reversed(older))[:count]


def _last_of_previous_major(latest: str, cache_dir: Path | None) -> list[str]:
    """The newest release of the major line before latest's ([] when there is none)."""
    current = _release(latest)
    if current is None or current.major == 0:
        return []
    rule = load_config().axes["transformers"]
    minors = backfill_versions("transformers", str(rule.min or "0.0"), latest, cache_dir=cache_dir)
    return [v for v in minors if Version(v).major == current.major - 1][-1:]

"""Which DeepSpeed x transformers x torch combinations the AutoTP matrix tests.

The versions are computed from PyPI release data (matrix/releases.py) with the rules in versions.toml
(matrix/version_axes.py; in the spirit of sentry-python's populate_tox), so a new release enters the matrix without
anyone typing it in.

    python -m matrix.versions --tag latest          # CI job matrix as JSON
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from matrix.releases import CACHE_DIR_ENV, DEFAULT_CACHE_DIR, Fetch, Release, load_releases
from matrix.version_axes import (
    AXES,
    TAGS,
    AxisRule,
    AxisValueError,
    Combo,
    MatrixConfig,
    Pin,
    axis_value_error,
    load_config,
    parse_axis_value,
    parse_pins,
    release_pin,
)

# ---------------------------------------------------------------------------------------------
# Selection: rule + releases -> axis values


@dataclass(frozen=True)
class AxisSelection:
    package: str
    values: tuple[Pin, ...]  # every selected value: releases oldest first, then git refs / checkouts
    latest: Pin  # newest selected stable release
    min: Pin  # oldest selected stable release
    previous: Pin | None  # the release line before latest: the release-gate baseline
    prerelease: Pin | None  # selected by the prerelease rule


def select_versions(rule: AxisRule, releases: Iterable[Release], python: Version) -> AxisSelection:
    """Apply rule to a release list: yanked, dev and Python-incompatible releases are never selected."""
    settled_before = datetime.now(timezone.utc) - timedelta(days=rule.settle_days)
    releases = [release for release in releases if release.uploaded <= settled_before]
    newest_per_line = _installable_lines(releases, python)
    stable = sorted(version for version in newest_per_line.values() if not version.is_prerelease)
    if not stable:
        raise AxisValueError(f"{rule.package}: PyPI has no installable stable release for Python {python}")
    supported = [version for version in stable if rule.min is None or version >= rule.min]
    if rule.min is not None and not supported:
        raise AxisValueError(f"{rule.package}: no installable release at or above min {rule.min}")

    selected: set[Version] = set()
    if rule.min is not None:
        selected.add(supported[0])
    if rule.minors_window:
        newest_per_minor = {(version.release + (0,))[:2]: version for version in supported}  # ascending: newest wins
        selected.update(list(newest_per_minor.values())[-rule.minors_window :])
    if rule.latest:
        selected.add(stable[-1])
    newest_pre = max((version for version in newest_per_line.values() if version.is_prerelease), default=None)
    prerelease = newest_pre if rule.prerelease and newest_pre and newest_pre > stable[-1] else None
    if prerelease:
        selected.add(prerelease)
    extras = [parse_axis_value(text, rule) for text in rule.extra]
    selected.update(_resolve_release(pin.version, rule, releases, newest_per_line) for pin in extras if pin.version)

    release_pins = [release_pin(rule, version) for version in sorted(selected)]
    values = tuple(release_pins) + tuple(pin for pin in extras if pin.version is None)
    if not values:
        raise AxisValueError(f"{rule.package}: the rule in versions.toml selects nothing")
    stable_pins = [pin for pin in release_pins if pin.version and not pin.version.is_prerelease] or list(values)
    latest = stable_pins[-1]
    older = [version for version in stable if latest.version and version < latest.version]
    return AxisSelection(
        package=rule.package,
        values=values,
        latest=latest,
        min=stable_pins[0],
        previous=release_pin(rule, older[-1]) if older else None,
        prerelease=release_pin(rule, prerelease) if prerelease else None,
    )


LineKey = tuple[int, tuple[int, ...], tuple[str, int] | None]
"""A release line: epoch, release numbers without trailing zeros, pre-release."""


def _line_key(version: Version) -> LineKey:
    # Post-releases share their base release's line; 2.0 and 2.0.0 are the same line.
    release = list(version.release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return version.epoch, tuple(release), version.pre


def _installable_lines(releases: list[Release], python: Version) -> dict[LineKey, Version]:
    """Newest installable version of each release line; yanked, dev and wrong-Python ones never count."""
    installable = sorted(
        release.version
        for release in releases
        if not release.yanked and not release.version.is_devrelease and supports_python(release.requires_python, python)
    )
    return {_line_key(version): version for version in installable}  # ascending: newest wins


def _resolve_release(
    version: Version, rule: AxisRule, releases: list[Release], newest_per_line: dict[LineKey, Version]
) -> Version:
    """An explicitly named release, as its line's newest post-release; explains why when unusable."""
    if (newest := newest_per_line.get(_line_key(version))) is not None:
        return newest
    release = next((release for release in releases if release.version == version), None)
    if release is None:
        problem = "it is not a release on PyPI"
    elif release.yanked:
        problem = "it is yanked on PyPI"
    elif release.version.is_devrelease:
        problem = "dev releases are never selected"
    else:
        problem = f"it requires Python {release.requires_python}"
    raise axis_value_error(str(version), rule, problem)


def backfill_versions(
    package: str, since: str, until: str | None = None, *, python: Version | None = None, cache_dir: Path | None = None
) -> list[str]:
    """The newest installable stable patch of every minor from `since` to `until` (default: the newest
    stable), oldest first: the releases a new deployment runs to get its history."""
    python = python or load_config().python
    try:
        low, high = Version(since), Version(until) if until else None
    except InvalidVersion as error:
        raise AxisValueError(f"{package}: {error}; --since and --until take releases like 0.16.0") from None
    stable = sorted(
        v
        for v in _installable_lines(load_releases(package, cache_dir=cache_dir), python).values()
        if not v.is_prerelease
    )
    newest_per_minor = {
        (v.release + (0,))[:2]: v
        for v in stable
        if (v.release + (0,))[:2] >= (low.release + (0,))[:2] and (high is None or v <= high)
    }
    if not newest_per_minor:
        raise AxisValueError(
            f"{package}: no installable stable release from {since} to {until or 'the newest'} for Python {python}"
        )
    return [str(version) for version in newest_per_minor.values()]


def supports_python(requires_python: str | None, python: Version) -> bool:
    try:
        return requires_python is None or SpecifierSet(requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:  # old releases carry free-form metadata: treat as unconstrained
        return True


# ---------------------------------------------------------------------------------------------
# Combinations


def skip_reason(versions: Mapping[str, str | Version | None], config: MatrixConfig | None = None) -> str | None:
    """Reason of the first [[incompatible]] entry matching these versions (package -> version), or None.

    Values that are not versions (git refs, paths) count as unknown and match nothing.
    """
    config = config or load_config()
    known = {package: _as_version(value) for package, value in versions.items()}
    return next((entry.reason for entry in config.incompatible if entry.matches(known)), None)


def _as_version(value: str | Version | None) -> Version | None:
    if value is None or isinstance(value, Version):
        return value
    try:
        return Version(value)
    except InvalidVersion:
        return None


def select_axis(
    package: str,
    config: MatrixConfig,
    *,
    override: str | None = None,
    cache_dir: Path | None = None,
    fetch: Fetch = "when-stale",
) -> AxisSelection:
    """The values of one axis: from its rule, or the single override value (e.g. "deepspeed@pr/1234")."""
    rule = config.axes[package]
    if override is None:
        return select_versions(rule, load_releases(package, cache_dir=cache_dir, fetch=fetch), config.python)
    pin = parse_axis_value(override, rule)
    if pin.version is not None:  # a release is checked against PyPI data like any extra
        releases = load_releases(package, cache_dir=cache_dir, fetch=fetch)
        newest_per_line = _installable_lines(releases, config.python)
        pin = release_pin(rule, _resolve_release(pin.version, rule, releases, newest_per_line))
    return AxisSelection(package, values=(pin,), latest=pin, min=pin, previous=None, prerelease=None)


def combinations(
    tag: str | None = None,
    *,
    overrides: Mapping[str, str] | None = None,
    config: MatrixConfig | None = None,
    cache_dir: Path | None = None,
    fetch: Fetch = "when-stale",
) -> list[Combo]:
    """All combinations the axes select, each with its tags and skip reason; only those tagged tag if given.

    latest: newest stable of every axis (exactly one). min: oldest selected of every axis.
    release-gate: latest, and latest with the previous DeepSpeed release. prerelease: one axis at its
    pre-release, the others latest. nightly: the full product of all selected values.
    """
    if tag is not None and tag not in TAGS:
        raise ValueError(f"unknown tag {tag!r}; tags are {', '.join(TAGS)}")
    config = config or load_config()
    overrides = dict(overrides or {})
    if unknown := set(overrides) - set(AXES):
        raise AxisValueError(f"overrides for unknown axes {', '.join(sorted(unknown))}; axes are {', '.join(AXES)}")
    selections = [
        select_axis(package, config, override=overrides.get(package), cache_dir=cache_dir, fetch=fetch)
        for package in AXES
    ]

    tags_by_pins: dict[tuple[Pin, ...], set[str]] = {}  # insertion order: the headline combos first
    latest = tuple(selection.latest for selection in selections)
    tags_by_pins.setdefault(latest, set()).update({"latest", "release-gate"})
    if (previous := selections[0].previous) is not None:
        tags_by_pins.setdefault((previous, *latest[1:]), set()).add("release-gate")
    tags_by_pins.setdefault(tuple(selection.min for selection in selections), set()).add("min")
    for index, selection in enumerate(selections):
        if selection.prerelease is not None:
            pins = (*latest[:index], selection.prerelease, *latest[index + 1 :])
            tags_by_pins.setdefault(pins, set()).add("prerelease")
    for pins in itertools.product(*(selection.values for selection in selections)):
        tags_by_pins.setdefault(pins, set()).add("nightly")

    combos = [
        Combo(
            **dict(zip(AXES, pins)),  # one Pin per axis, in AXES order
            tags=tuple(t for t in TAGS if t in tags),
            skip_reason=skip_reason({pin.package: pin.version for pin in pins}, config),
        )
        for pins, tags in tags_by_pins.items()
    ]
    return [combo for combo in combos if tag is None or tag in combo.tags]


def ci_matrix(combos: Iterable[Combo], session: str = "autotp") -> list[dict[str, Any]]:
    """CI job matrix rows; session names follow nox's parametrize convention "<session>(<id>)"."""
    return [
        {
            "session": f"{session}({combo.id})",
            "id": combo.id,
            "tags": list(combo.tags),
            "skip_reason": combo.skip_reason,
        }
        for combo in combos
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print the AutoTP version matrix as a JSON CI job matrix.")
    parser.add_argument("--tag", choices=TAGS, help="only combinations with this tag")
    parser.add_argument("--session", default="autotp", help="nox session the jobs run (default: autotp)")
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="AXIS=VALUE",
        help="replace an axis by one value, e.g. deepspeed=deepspeed@pr/1234",
    )
    parser.add_argument("--refresh", action="store_true", help="re-fetch release data from PyPI")
    parser.add_argument(
        "--cache-dir", type=Path, help=f"release data cache (default: ${CACHE_DIR_ENV} or {DEFAULT_CACHE_DIR})"
    )
    args = parser.parse_args(argv)
    try:
        overrides = parse_pins(args.pin, "--pin")
    except AxisValueError as error:
        parser.error(str(error))
    combos = combinations(
        args.tag, overrides=overrides, cache_dir=args.cache_dir, fetch="refresh" if args.refresh else "when-stale"
    )
    json.dump(ci_matrix(combos, args.session), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

"""Version axes of the AutoTP matrix: which DeepSpeed x transformers x torch combinations to test.

The versions are computed from PyPI release data with the rules in versions.toml (in the spirit of
sentry-python's populate_tox), so a new release enters the matrix without anyone typing it in.
Release data is cached on disk and re-fetched once it is older than AUTOTP_RELEASES_MAX_AGE_HOURS
(default 12); offline, the cache is used with a warning, so once cached everything works offline.

    python -m matrix.versions --tag latest          # CI job matrix as JSON
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cache
from pathlib import Path
from typing import Any, Literal

import tomllib
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from matrix.toml_tables import TableError, read_table, written_as

AXES = ("deepspeed", "transformers", "torch")
TAGS = ("latest", "min", "release-gate", "prerelease", "nightly")
CONFIG_PATH = Path(__file__).with_name("versions.toml")
PYPI_JSON_URL = "https://pypi.org/pypi/{package}/json"
CACHE_DIR_ENV = "AUTOTP_MATRIX_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/autotp-matrix/releases"
MAX_AGE_ENV = "AUTOTP_RELEASES_MAX_AGE_HOURS"
Fetch = Literal["when-stale", "refresh", "never"]
"""When release data is fetched from PyPI rather than read from the cache (load_releases)."""
DEFAULT_MAX_AGE_HOURS = 12.0  # a nightly run sees the previous day's releases without asking PyPI per session


class ConfigError(ValueError):
    """versions.toml is malformed."""


class AxisValueError(ValueError):
    """An axis value (an extra in versions.toml or an override) cannot be used."""


class ReleaseDataUnavailable(RuntimeError):
    """Release data could neither be fetched from PyPI nor read from the cache."""


# ---------------------------------------------------------------------------------------------
# Release data


@dataclass(frozen=True)
class Release:
    version: Version
    uploaded: datetime
    yanked: bool
    requires_python: str | None


def fetch_pypi_json(package: str) -> dict[str, Any]:
    """Download PyPI's JSON document for package (the only network access in this module)."""
    request = urllib.request.Request(
        PYPI_JSON_URL.format(package=package),
        headers={"Accept": "application/json", "User-Agent": "autotp-matrix"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        document: dict[str, Any] = json.load(response)
        return document


def parse_releases(pypi_json: dict[str, Any]) -> list[Release]:
    """Releases in a PyPI JSON document (full or trimmed), oldest first."""
    releases = []
    for text, files in pypi_json["releases"].items():
        if not files:  # a release without files cannot be installed
            continue
        try:
            version = Version(text)
        except InvalidVersion:  # pre-PEP 440 versions cannot be compared or pinned reliably
            continue
        releases.append(
            Release(
                version=version,
                uploaded=datetime.fromisoformat(min(f["upload_time_iso_8601"] for f in files)),
                # PyPI yanks whole releases; requiring all files also copes with odd per-file data
                yanked=all(f["yanked"] for f in files),
                requires_python=next((f["requires_python"] for f in files if f.get("requires_python")), None),
            )
        )
    return sorted(releases, key=lambda release: release.version)


def trim_pypi_json(pypi_json: dict[str, Any]) -> dict[str, Any]:
    """The fields version selection needs, in PyPI's own layout: what the cache and fixtures hold."""
    return {
        "info": {"name": pypi_json["info"]["name"]},
        "releases": {
            str(release.version): [
                {
                    "upload_time_iso_8601": release.uploaded.isoformat(),
                    "yanked": release.yanked,
                    "requires_python": release.requires_python,
                }
            ]
            for release in parse_releases(pypi_json)
        },
    }


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR).expanduser()


def max_age_hours() -> float:
    """How old cached release data may get before it is re-fetched (env AUTOTP_RELEASES_MAX_AGE_HOURS)."""
    text = os.environ.get(MAX_AGE_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_AGE_HOURS
    try:
        hours = float(text)
    except ValueError:
        hours = -1.0
    if not hours >= 0:  # also rejects nan
        raise ValueError(f"{MAX_AGE_ENV}={text!r}: give the maximum age of cached release data in hours, e.g. 12")
    return hours


def load_releases(package: str, *, cache_dir: Path | None = None, fetch: Fetch = "when-stale") -> list[Release]:
    """Releases of package from the disk cache; fetched from PyPI when not cached yet or when the cache is older than
    max_age_hours() ("when-stale"), always ("refresh"), or never ("never": the cache at any age, else
    ReleaseDataUnavailable — what reading the noxfile uses, so `nox -l` asks no network).

    A failed refresh falls back to the cache with a warning, so a PyPI hiccup or an offline machine
    does not stop a run.
    """
    cache_file = (cache_dir or default_cache_dir()) / f"{package}.json"
    if cache_file.exists() and (
        fetch == "never" or (fetch == "when-stale" and _age_hours(cache_file) <= max_age_hours())
    ):
        return parse_releases(json.loads(cache_file.read_text()))
    if fetch == "never":
        raise ReleaseDataUnavailable(
            f"no cached release data for {package} at {cache_file}; any session that runs cells (e.g. `nox -s "
            "ci-matrix`) fetches it from PyPI once"
        )
    url = PYPI_JSON_URL.format(package=package)
    try:
        trimmed = trim_pypi_json(fetch_pypi_json(package))
    except (OSError, ValueError, KeyError) as error:  # URLError/timeouts are OSErrors, bad JSON ValueErrors
        if cache_file.exists():
            warnings.warn(
                f"refreshing {package} from {url} failed ({error}); using the cached {cache_file} "
                f"({_age_hours(cache_file):.1f} h old)",
                stacklevel=2,
            )
            return parse_releases(json.loads(cache_file.read_text()))
        raise ReleaseDataUnavailable(
            f"no release data for {package}: fetching {url} failed ({error}) and there is no cache at "
            f"{cache_file}. Run once with network access to fill the cache (or set {CACHE_DIR_ENV})."
        ) from error
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    # Write-then-rename: parallel sessions never read a half-written cache file.
    handle, temporary = tempfile.mkstemp(dir=cache_file.parent, suffix=".tmp")
    with os.fdopen(handle, "w") as stream:
        json.dump(trimmed, stream, indent=1)
    os.replace(temporary, cache_file)
    return parse_releases(trimmed)


def _age_hours(path: Path) -> float:
    return (time.time() - path.stat().st_mtime) / 3600


# ---------------------------------------------------------------------------------------------
# Configuration (versions.toml)


@dataclass(frozen=True)
class AxisRule:
    package: str
    short: str
    repo: str | None = None
    min: Version | None = field(default=None, metadata=written_as('a quoted release: min = "4.41.2"'))
    minors_window: int = 0
    latest: bool = False
    prerelease: bool = False
    extra: tuple[str, ...] = field(default=(), metadata=written_as('quoted releases: extra = ["0.16.2"]'))
    settle_days: int = 0
    """Releases younger than this are not picked by rule: their dependencies may not be on the index yet."""

    def validate(self) -> None:
        """versions.toml's rules beyond the fields' types (toml_tables.read_table)."""
        if self.minors_window < 0:
            raise TableError("minors_window", f"must be >= 0, got {self.minors_window}")


@dataclass(frozen=True)
class Incompatibility:
    specifiers: tuple[tuple[str, SpecifierSet], ...]
    reason: str

    def matches(self, versions: Mapping[str, Version | None]) -> bool:
        # An unknown version (git ref, local checkout) never matches: skipping it would hide results.
        return all(
            (version := versions.get(package)) is not None and specifier.contains(version, prereleases=True)
            for package, specifier in self.specifiers
        )


@dataclass(frozen=True)
class MatrixConfig:
    python: Version
    axes: Mapping[str, AxisRule]
    incompatible: tuple[Incompatibility, ...]


@cache
def short_prefixes() -> dict[str, str]:
    """Each axis's `short` prefix in combination and environment ids, from versions.toml: {"deepspeed": "ds", ...}."""
    return {axis: rule.short for axis, rule in load_config().axes.items()}


def load_config(path: Path = CONFIG_PATH) -> MatrixConfig:
    """Parse and validate versions.toml; unknown keys are errors so typos cannot silently drop a rule."""
    data = tomllib.loads(Path(path).read_text())
    _reject_unknown(data, {"python", "axes", "incompatible"}, f"{path}")
    axes = data.get("axes", {})
    if set(axes) != set(AXES):
        raise ConfigError(f"{path}: [axes] must define exactly {', '.join(AXES)}; found {', '.join(axes) or 'none'}")
    return MatrixConfig(
        python=_parse_version(
            data.get("python", f"{sys.version_info.major}.{sys.version_info.minor}"), f"{path}: python"
        ),
        axes={package: _axis_rule(package, axes[package], path) for package in AXES},
        incompatible=tuple(_incompatibility(entry, path) for entry in data.get("incompatible", [])),
    )


def _axis_rule(package: str, table: object, path: Path) -> AxisRule:
    given = {"package": package}
    return read_table(AxisRule, table, where=f"{path}: [axes.{package}]", error=ConfigError, given=given)


def _incompatibility(entry: dict[str, Any], path: Path) -> Incompatibility:
    where = f"{path}: [[incompatible]] {entry}"
    _reject_unknown(entry, {*AXES, "reason"}, where)
    if not entry.get("reason") or not set(entry) & set(AXES):
        raise ConfigError(f"{where} needs a reason and at least one of {', '.join(AXES)}")
    try:
        specifiers = tuple((package, SpecifierSet(entry[package])) for package in AXES if package in entry)
    except InvalidSpecifier as error:
        raise ConfigError(f"{where}: {error}") from error
    return Incompatibility(specifiers=specifiers, reason=entry["reason"])


def _reject_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    if unknown := set(table) - known:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")


def _parse_version(text: str, where: str) -> Version:
    # An unquoted TOML 3.10 is the float 3.1, so only strings are accepted.
    try:
        return Version(text if isinstance(text, str) else "not a string")
    except InvalidVersion as error:
        raise ConfigError(f'{where}: {text!r} is not a version (quote it: "3.11")') from error


# ---------------------------------------------------------------------------------------------
# Axis values: releases, git refs, local checkouts


@dataclass(frozen=True)
class Pin:
    """One value of one axis: what pip installs and how it reads in ids."""

    package: str
    requirement: str  # pip requirement string, or a local path
    id: str  # readable and filename-safe: ds0.19.8, ds@master, ds@pr1234, ds@local-DeepSpeed
    version: Version | None = None  # None for git refs and local checkouts: unknown before building
    # How the value reads where a version is recorded before one exists (an install failure): the release
    # version; a git ref as written (pr/1234, master; a sha cut to 10 characters); local-<folder>.
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", str(self.version) if self.version is not None else self.id)


_GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_GIT_SHA = re.compile(r"[0-9a-f]{7,40}")


def accepted_forms(package: str) -> tuple[str, ...]:
    return (
        "<version>                       e.g. 0.16.2",
        f"{package}@<branch|tag|sha>     e.g. {package}@master",
        f"{package}@pr/<number>          e.g. {package}@pr/1234",
        f"{package}@<local clone path>   e.g. {package}@/src/{package} or {package}@./{package}",
    )


def parse_axis_value(text: str, rule: AxisRule) -> Pin:
    """Turn one axis value into a Pin; release versions are taken as written (see select_versions)."""
    package, at, ref = text.strip().partition("@")
    if not at:
        try:
            return _release_pin(rule, Version(text))
        except InvalidVersion:
            raise _axis_value_error(text, rule, "it is not a version") from None
    if package.strip() != rule.package:
        raise _axis_value_error(text, rule, f"it names {package.strip()!r}, but the axis is {rule.package!r}")
    ref = ref.strip()
    if ref.startswith(("/", ".", "~")):  # git refs cannot start with these, so it is a path
        path = Path(ref).expanduser().resolve()
        if not path.is_dir():
            raise _axis_value_error(text, rule, f"there is no directory at {path}")
        return Pin(
            rule.package,
            requirement=str(path),
            id=f"{rule.short}@local-{_slug(path.name)}",
            label=f"local-{_slug(path.name)}",
        )
    if rule.repo is None:
        raise _axis_value_error(text, rule, f"{rule.package} has no repo in versions.toml, so only versions work")
    if match := re.fullmatch(r"pr/(\d+)", ref):
        git_ref, readable, label = f"refs/pull/{match[1]}/head", f"pr{match[1]}", ref
    elif ref.startswith("pr/"):
        raise _axis_value_error(text, rule, "a PR is given by its number, e.g. pr/1234")
    elif _GIT_REF.fullmatch(ref) and ".." not in ref:
        git_ref, readable = ref, ref[:10] if _GIT_SHA.fullmatch(ref) else _slug(ref)
        label = ref[:10] if _GIT_SHA.fullmatch(ref) else ref
    else:
        raise _axis_value_error(text, rule, "it is not a branch, tag or commit name")
    return Pin(
        rule.package,
        requirement=f"{rule.package} @ git+{rule.repo}@{git_ref}",
        id=f"{rule.short}@{readable}",
        label=label,
    )


def _release_pin(rule: AxisRule, version: Version) -> Pin:
    return Pin(
        rule.package,
        requirement=f"{rule.package}=={version}",
        id=f"{rule.short}{version}",
        version=version,
        label=str(version),
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def _axis_value_error(text: str, rule: AxisRule, problem: str) -> AxisValueError:
    forms = "\n  ".join(accepted_forms(rule.package))
    return AxisValueError(f"bad {rule.package} axis value {text!r}: {problem}. Accepted forms:\n  {forms}")


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

    release_pins = [_release_pin(rule, version) for version in sorted(selected)]
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
        previous=_release_pin(rule, older[-1]) if older else None,
        prerelease=_release_pin(rule, prerelease) if prerelease else None,
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
    raise _axis_value_error(str(version), rule, problem)


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


def parse_pins(entries: Iterable[str], where: str, axes: Iterable[str] = AXES) -> dict[str, str]:
    """The one reading of `AXIS=VALUE` pins, as every command takes them: repeated options and/or
    comma-separated lists (`deepspeed=0.19.7,transformers=5.24.0`), spaces ignored, each axis once."""
    axes = tuple(axes)
    pins: dict[str, str] = {}
    for entry in (part.strip() for text in entries for part in text.split(",")):
        if not entry:
            continue
        axis, equals, value = (part.strip() for part in entry.partition("="))
        if not equals or axis not in axes or not value:
            raise AxisValueError(
                f"{where}: {entry!r} must be AXIS=VALUE with AXIS one of {', '.join(axes)}, e.g. {axes[0]}=0.19.7"
            )
        if pins.get(axis, value) != value:
            raise AxisValueError(f"{where}: {axis} is pinned twice ({pins[axis]} and {value}); keep one")
        pins[axis] = value
    return pins


def supports_python(requires_python: str | None, python: Version) -> bool:
    try:
        return requires_python is None or SpecifierSet(requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:  # old releases carry free-form metadata: treat as unconstrained
        return True


# ---------------------------------------------------------------------------------------------
# Combinations


@dataclass(frozen=True)
class Combo:
    deepspeed: Pin
    transformers: Pin
    torch: Pin
    tags: tuple[str, ...]
    skip_reason: str | None

    @property
    def pins(self) -> tuple[Pin, ...]:
        """One per axis, in AXES order."""
        return tuple(getattr(self, axis) for axis in AXES)

    @property
    def id(self) -> str:
        return "-".join(pin.id for pin in self.pins)

    @property
    def requirements(self) -> list[str]:
        return [pin.requirement for pin in self.pins]


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
        pin = _release_pin(rule, _resolve_release(pin.version, rule, releases, newest_per_line))
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

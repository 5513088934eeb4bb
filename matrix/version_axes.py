"""The version axes (deepspeed, transformers, torch): versions.toml's rules for each, and the values an axis takes
(a release, a git ref or pull request, a local checkout) as a `Pin`, one per axis a `Combo`."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import tomllib
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from matrix.toml_tables import TableError, read_table, written_as

AXES = ("deepspeed", "transformers", "torch")
TAGS = ("latest", "min", "release-gate", "prerelease", "nightly")
CONFIG_PATH = Path(__file__).with_name("versions.toml")


class ConfigError(ValueError):
    """versions.toml is malformed."""


class AxisValueError(ValueError):
    """An axis value (an extra in versions.toml or an override) cannot be used."""


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
            return release_pin(rule, Version(text))
        except InvalidVersion:
            raise axis_value_error(text, rule, "it is not a version") from None
    if package.strip() != rule.package:
        raise axis_value_error(text, rule, f"it names {package.strip()!r}, but the axis is {rule.package!r}")
    ref = ref.strip()
    if ref.startswith(("/", ".", "~")):  # git refs cannot start with these, so it is a path
        path = Path(ref).expanduser().resolve()
        if not path.is_dir():
            raise axis_value_error(text, rule, f"there is no directory at {path}")
        return Pin(
            rule.package,
            requirement=str(path),
            id=f"{rule.short}@local-{_slug(path.name)}",
            label=f"local-{_slug(path.name)}",
        )
    if rule.repo is None:
        raise axis_value_error(text, rule, f"{rule.package} has no repo in versions.toml, so only versions work")
    if match := re.fullmatch(r"pr/(\d+)", ref):
        git_ref, readable, label = f"refs/pull/{match[1]}/head", f"pr{match[1]}", ref
    elif ref.startswith("pr/"):
        raise axis_value_error(text, rule, "a PR is given by its number, e.g. pr/1234")
    elif _GIT_REF.fullmatch(ref) and ".." not in ref:
        git_ref, readable = ref, ref[:10] if _GIT_SHA.fullmatch(ref) else _slug(ref)
        label = ref[:10] if _GIT_SHA.fullmatch(ref) else ref
    else:
        raise axis_value_error(text, rule, "it is not a branch, tag or commit name")
    return Pin(
        rule.package,
        requirement=f"{rule.package} @ git+{rule.repo}@{git_ref}",
        id=f"{rule.short}@{readable}",
        label=label,
    )


def release_pin(rule: AxisRule, version: Version) -> Pin:
    return Pin(
        rule.package,
        requirement=f"{rule.package}=={version}",
        id=f"{rule.short}{version}",
        version=version,
        label=str(version),
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def axis_value_error(text: str, rule: AxisRule, problem: str) -> AxisValueError:
    forms = "\n  ".join(accepted_forms(rule.package))
    return AxisValueError(f"bad {rule.package} axis value {text!r}: {problem}. Accepted forms:\n  {forms}")


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

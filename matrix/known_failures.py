"""The failures known upstream, as data in `matrix/known_failures.toml`: one frozen `KnownFailure` per table, every
field documented on the class; a malformed table raises `RegistryError` naming the file, the table and the field."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from matrix.registry import MATRIX_DIR, is_version, load_tables, read_entry
from matrix.toml_tables import TableError
from matrix.version_axes import AXES as INSTALLED_AXES

KNOWN_FAILURES_FILE = MATRIX_DIR / "known_failures.toml"

KnownFailureState = Literal["open", "fixed", "unsupported"]
"""`unsupported`: known by design — DeepSpeed documents the models as not supported by AutoTP (its
automatic-tensor-parallelism page's "Unsupported Models"; any failure of theirs) or refuses them on purpose (an assert
stating a requirement: the failures its `signature` names); shown as "unsupported upstream", never new."""
VERSION_AXES = (*INSTALLED_AXES, "python")
"""The version axes a known failure can name (the reports' axes: the installed ones and python)."""
UPSTREAM_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+")
UPSTREAM_PAGE = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/[\w./-]+\.md(?:#[\w-]+)?")
SOURCE_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/blob/(?:v\d[\w.]*|[0-9a-f]{40})/[\w./-]+#L\d+(?:-L\d+)?")
"""An `unsupported` entry's upstream: the documentation page that says so, at the commit it was read from, or the
line of DeepSpeed's source that refuses the model on purpose (an assert stating a requirement), at a release tag
or a commit, with its line anchor."""
NO_VERDICT_CLASSES = ("setup", "install")
"""Failures of the harness or the environment: no entry covers them without naming them, whatever it says."""


@dataclass(frozen=True)
class KnownFailure:
    """A failure already reported upstream: the failures it covers, where it is tracked and whether it is fixed."""

    name: str
    """Short name (the TOML table key)."""
    upstream: str
    """The issue or pull request that tracks it: https://github.com/<owner>/<repo>/(issues|pull)/<number>; for an
    `unsupported` entry the page that documents it, at a commit (https://github.com/<owner>/<repo>/blob/<sha>/...md),
    or the refusing line of DeepSpeed's source at a tag (.../blob/v0.19.8/<file>#L<n>)."""
    failure_class: str = ""
    """The failure class it covers (setup, shard, forward, numerics, ...); required but with state `unsupported`,
    where "" (left out) is every class AutoTP can be blamed for (not NO_VERDICT_CLASSES)."""
    signature: str = ""
    """Regular expression searched in the failure's cause: its signature with every number masked as N
    (`reports/analysis/signatures.py`), so one pattern covers every tp size and every byte count; required but with
    state `unsupported` (left out: any cause)."""
    state: KnownFailureState = "open"
    """`open` (not fixed upstream yet), `fixed` (then `fixed_in` says where) or `unsupported` (documented upstream
    as not supported: `models` must name them)."""
    fixed_in: str = ""
    """`fixed` only: the axis and first release with the fix, e.g. "deepspeed 0.19.6"."""
    note: str = ""
    """One line for people reading the report."""
    models: tuple[str, ...] = ()
    """Only these models' cells (empty: any model): registry entry names (a cell's model without its shape), or
    model_types for architectures derived outside the registry."""
    variants: tuple[str, ...] = ()
    """Only these variants' cells (empty: any variant)."""
    versions: dict[str, str] = field(default_factory=dict, hash=False)
    """Only at these versions: axis -> PEP 440 specifier set, e.g. { deepspeed = "<0.19.6" } (empty: any)."""

    def covers(self, failure_class: str, cause: str, model: str, variant: str, versions: dict[str, str]) -> bool:
        """Whether a cell's failure (its class and cause) at `versions` (axis -> version) is this one."""
        if failure_class != self.failure_class and (self.failure_class or failure_class in NO_VERDICT_CLASSES):
            return False
        if not re.search(self.signature, cause):
            return False
        entry = model.split(".", 1)[0]  # a cell's model names its shape after the entry (matrix/shapes/)
        if (self.models and entry not in self.models) or (self.variants and variant not in self.variants):
            return False
        return all(_version_in(versions.get(axis, ""), specifiers) for axis, specifiers in self.versions.items())

    def validate(self) -> None:
        """known_failures.toml's rules beyond the fields' types (toml_tables.read_table)."""
        unsupported = self.state == "unsupported"
        required = ("models",) if unsupported else ("failure_class", "signature")
        if missing := [key for key in required if not getattr(self, key)]:
            raise TableError("", f"is missing required field '{missing[0]}'")
        try:
            re.compile(self.signature)
        except re.error as error:
            raise TableError("signature", f"is not a regular expression ({error}): {self.signature!r}") from None
        self._validate_upstream()
        self._validate_versions()

    def _validate_upstream(self) -> None:
        unsupported = self.state == "unsupported"
        if not UPSTREAM_URL.fullmatch(self.upstream) and not (
            unsupported and (UPSTREAM_PAGE.fullmatch(self.upstream) or SOURCE_URL.fullmatch(self.upstream))
        ):
            raise TableError(
                "upstream",
                "must be a GitHub issue or pull request URL (https://github.com/<owner>/<repo>/issues/<n> or /pull/<n>)"
                + (
                    ", or the page that documents it at a commit (https://github.com/<owner>/<repo>/blob/<40-hex sha>/"
                    "<path>.md#anchor), or the refusing line of DeepSpeed's source (.../blob/<tag>/<file>#L<n>)"
                    if unsupported
                    else ""
                )
                + f", got {self.upstream!r}",
            )

    def _validate_versions(self) -> None:
        if (self.state == "fixed") != bool(self.fixed_in):
            raise TableError(
                "fixed_in",
                '("<axis> <release>", e.g. "deepspeed 0.19.6") is needed with state = "fixed" and only there',
            )
        axis, _, version = self.fixed_in.partition(" ")
        if self.fixed_in and (axis not in VERSION_AXES or not is_version(version)):
            raise TableError(
                "fixed_in",
                f'must be "<axis> <release>" with an axis of {VERSION_AXES}, e.g. "deepspeed 0.19.6", '
                f"got {self.fixed_in!r}",
            )
        for axis, specifiers in self.versions.items():
            if axis not in VERSION_AXES:
                raise TableError("versions", f"has unknown axis {axis!r}; use {VERSION_AXES}")
            try:
                SpecifierSet(specifiers)
            except InvalidSpecifier:
                raise TableError(
                    f"versions.{axis}",
                    f'is not a PEP 440 specifier set (e.g. "<0.19.6", ">=4.57,<5"), got {specifiers!r}',
                ) from None


def _version_in(value: str, specifiers: str) -> bool:
    """A version inside the specifier set; a label that is no release (master, pr/1234) is inside none."""
    try:
        return SpecifierSet(specifiers).contains(Version(value), prereleases=True)
    except InvalidVersion:
        return False


def load_known_failures(failure_classes: Collection[str], path: Path = KNOWN_FAILURES_FILE) -> dict[str, KnownFailure]:
    """The known-failures registry; `failure_classes`: the classes a cell can fail with (suites/verdicts/outcome.py, a
    layer above this one)."""

    def known_class(failure: KnownFailure) -> None:
        unsupported = failure.state == "unsupported"
        if failure.failure_class not in failure_classes and not (unsupported and failure.failure_class == ""):
            raise TableError(
                "failure_class",
                f"must be one of {sorted(failure_classes)}"
                + (" (or left out: any class)" if unsupported else "")
                + f", got {failure.failure_class!r}",
            )

    return load_tables(
        path,
        "known_failures",
        lambda file, name, raw: read_entry(KnownFailure, file, "known_failures", name, raw, known_class),
    )

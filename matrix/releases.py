"""PyPI release data of the version axes' packages: fetched, trimmed to what the rules read, cached on disk and
re-fetched once older than AUTOTP_RELEASES_MAX_AGE_HOURS (default 12); offline, the cache is used with a warning, so
once cached everything works offline."""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.request
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

PYPI_JSON_URL = "https://pypi.org/pypi/{package}/json"
CACHE_DIR_ENV = "AUTOTP_MATRIX_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/autotp-matrix/releases"
MAX_AGE_ENV = "AUTOTP_RELEASES_MAX_AGE_HOURS"
Fetch = Literal["when-stale", "refresh", "never"]
"""When release data is fetched from PyPI rather than read from the cache (load_releases)."""
DEFAULT_MAX_AGE_HOURS = 12.0  # a nightly run sees the previous day's releases without asking PyPI per session


class ReleaseDataUnavailable(RuntimeError):
    """Release data could neither be fetched from PyPI nor read from the cache."""


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

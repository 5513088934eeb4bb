"""Version axes: selection rules on recorded release lists, git refs, incompatibilities, caching.

Offline: release data comes from fixtures/ (trimmed PyPI JSON; deepspeed, transformers and torch were
recorded from PyPI, synthetic.json is hand-made to hold every kind of awkward release).
"""

import json
import os
import re
import shutil
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from packaging.version import Version

from matrix import releases, versions
from matrix.releases import ReleaseDataUnavailable, load_releases, parse_releases, trim_pypi_json
from matrix.version_axes import AxisRule, AxisValueError, ConfigError, load_config, parse_axis_value
from matrix.versions import ci_matrix, combinations, select_versions, skip_reason
from reports import ReportsError

FIXTURES = Path(__file__).parent / "fixtures"
PY311 = Version("3.11")

DEEPSPEED = AxisRule("deepspeed", "ds", repo="https://github.com/deepspeedai/DeepSpeed")
TORCH = AxisRule("torch", "pt")  # no repo: git refs are not available

# Mirrors the shape of matrix/versions.toml, frozen here so data edits there do not break these tests.
TEST_CONFIG = """
python = "3.11"

[axes.deepspeed]
short = "ds"
repo = "https://github.com/deepspeedai/DeepSpeed"
min = "0.14.4"
minors_window = 4
latest = true
prerelease = true
extra = ["deepspeed@master"]

[axes.transformers]
short = "tf"
repo = "https://github.com/huggingface/transformers"
min = "4.41.2"
minors_window = 4
latest = true
prerelease = true
extra = ["4.57.6"]

[axes.torch]
short = "pt"
extra = ["2.13.0"]

[[incompatible]]
deepspeed = "<0.14.1"
reason = "CPU/gloo path only exists from DeepSpeed 0.14.1 on"

[[incompatible]]
deepspeed = "<0.14.4"
torch = ">=2.13"
reason = "DeepSpeed 0.14.1–0.14.3 fail at import on torch 2.13 (and need numpy<2)"
"""


def fixture_json(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def fixture_releases(name):
    return parse_releases(fixture_json(name))


def values(selection):
    return [str(pin.version) if pin.version else pin.id for pin in selection.values]


@pytest.fixture
def no_network(monkeypatch):
    def refuse(package):
        raise OSError(f"network disabled in tests (asked for {package})")

    monkeypatch.setattr(releases, "fetch_pypi_json", refuse)


@pytest.fixture
def cache_dir(tmp_path):
    """A release cache pre-filled with the recorded fixtures, as a previous online run would leave it."""
    directory = tmp_path / "cache"
    directory.mkdir()
    for package in ("deepspeed", "transformers", "torch"):
        shutil.copy(FIXTURES / f"{package}.json", directory / f"{package}.json")
    return directory


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "versions.toml"
    path.write_text(TEST_CONFIG)
    return load_config(path)


# --- release data ----------------------------------------------------------------------------


def test_parse_releases_skips_fileless_and_non_pep440_and_sorts():
    releases = fixture_releases("synthetic")
    listed = [str(r.version) for r in releases]
    assert "3.1.0" not in listed  # no files
    assert "not-a-version" not in listed
    assert listed == sorted(listed, key=Version)
    by_version = {str(r.version): r for r in releases}
    assert by_version["1.2.1"].yanked and by_version["2.0.1.post1"].yanked
    assert by_version["3.0.0"].requires_python == ">=3.99"
    assert by_version["1.0.0"].uploaded.year == 2023


def test_trim_keeps_pypi_layout_and_is_idempotent():
    recorded = fixture_json("deepspeed")
    assert trim_pypi_json(recorded) == recorded


def test_trim_summarises_a_full_pypi_document():
    full = {
        "info": {"name": "pkg", "version": "1.0", "summary": "dropped"},
        "releases": {
            "1.0": [
                {
                    "upload_time_iso_8601": "2024-01-02T00:00:00Z",
                    "yanked": False,
                    "requires_python": ">=3.9",
                    "size": 1,
                },
                {"upload_time_iso_8601": "2024-01-01T00:00:00Z", "yanked": False, "requires_python": None, "size": 2},
            ]
        },
    }
    assert trim_pypi_json(full) == {
        "info": {"name": "pkg"},
        "releases": {
            "1.0": [{"upload_time_iso_8601": "2024-01-01T00:00:00+00:00", "yanked": False, "requires_python": ">=3.9"}]
        },
    }


# --- selection rules -------------------------------------------------------------------------


def test_synthetic_selection_min_window_latest_prerelease():
    rule = AxisRule("example", "ex", min=Version("1.0.1"), minors_window=3, latest=True, prerelease=True)
    selection = select_versions(rule, fixture_releases("synthetic"), PY311)
    # 1.2.1 yanked -> 1.2.0; 2.0.1.post1 yanked -> 2.0.1; 3.0.0 needs Python 3.99; dev releases never.
    assert values(selection) == ["1.0.1", "1.2.0", "1.3.0", "2.0.1", "2.1.0rc2"]
    assert str(selection.latest.version) == "2.0.1"
    assert str(selection.min.version) == "1.0.1"
    assert str(selection.previous.version) == "2.0.0"
    assert str(selection.prerelease.version) == "2.1.0rc2"  # rc3 is yanked


def test_post_release_replaces_its_base_release():
    rule = AxisRule("example", "ex", min=Version("1.1.0"), minors_window=5)
    selection = select_versions(rule, fixture_releases("synthetic"), PY311)
    assert "1.1.1.post1" in values(selection) and "1.1.1" not in values(selection)


def test_min_bound_excludes_older_minors():
    rule = AxisRule("example", "ex", min=Version("1.3.0"), minors_window=10)
    assert values(select_versions(rule, fixture_releases("synthetic"), PY311)) == ["1.3.0", "2.0.1"]


def test_min_between_releases_selects_first_release_above_it():
    rule = AxisRule("example", "ex", min=Version("1.1.5"))
    assert values(select_versions(rule, fixture_releases("synthetic"), PY311)) == ["1.2.0"]


def test_min_above_every_release_is_an_error():
    rule = AxisRule("example", "ex", min=Version("9.0"))
    with pytest.raises(AxisValueError, match="min 9.0"):
        select_versions(rule, fixture_releases("synthetic"), PY311)


def test_prerelease_only_when_newer_than_latest_stable():
    rule = AxisRule("example", "ex", latest=True, prerelease=True)
    # On Python 3.8 the 2.x line is out, so 1.3.0b1 is older than the latest stable 1.3.0.
    selection = select_versions(rule, fixture_releases("synthetic"), Version("3.8"))
    assert values(selection) == ["1.3.0"] and selection.prerelease is None


def test_recorded_deepspeed_minors_window():
    rule = AxisRule("deepspeed", "ds", min=Version("0.14.4"), minors_window=4, latest=True, prerelease=True)
    selection = select_versions(rule, fixture_releases("deepspeed"), PY311)
    assert values(selection) == ["0.14.4", "0.16.9", "0.17.6", "0.18.9", "0.19.8"]
    assert str(selection.previous.version) == "0.19.7"
    assert selection.prerelease is None  # only ancient 0.3.1.devN exist, and dev is never selected


def test_recorded_transformers_skips_yanked_and_old_prereleases():
    rule = AxisRule("transformers", "tf", min=Version("5.9.0"), minors_window=20, prerelease=True)
    selection = select_versions(rule, fixture_releases("transformers"), PY311)
    assert "5.10.0" not in values(selection)  # yanked; 5.10.4 is the newest of that minor
    assert "5.10.4" in values(selection)
    assert selection.prerelease is None  # 5.0.0rc3 is older than 5.25.0


def test_recorded_transformers_prerelease_newer_than_stable():
    recorded = fixture_json("transformers")
    before_v5 = {v: files for v, files in recorded["releases"].items() if not Version(v) >= Version("5.0.0")}
    rule = AxisRule("transformers", "tf", latest=True, prerelease=True)
    selection = select_versions(rule, parse_releases({"releases": before_v5}), PY311)
    assert values(selection) == ["4.57.6", "5.0.0rc3"]
    assert selection.latest.version == Version("4.57.6")


def test_requires_python_filters_releases():
    rule = AxisRule("transformers", "tf", latest=True)
    # transformers 5.x requires Python >= 3.10
    assert values(select_versions(rule, fixture_releases("transformers"), Version("3.9"))) == ["4.57.6"]


def test_extras_resolve_to_newest_post_release_and_keep_git_refs():
    rule = AxisRule("example", "ex", repo="https://example.invalid/repo", extra=("1.1.1", "2.0.1", "example@main"))
    selection = select_versions(rule, fixture_releases("synthetic"), PY311)
    assert values(selection) == ["1.1.1.post1", "2.0.1", "ex@main"]  # 2.0.1.post1 is yanked
    assert selection.latest.version == Version("2.0.1")


@pytest.mark.parametrize(
    "extra, problem",
    [
        ("1.2.1", "yanked"),
        ("1.3.1.dev0", "dev releases"),
        ("3.0.0", "requires Python >=3.99"),
        ("7.7.7", "not a release"),
    ],
)
def test_unusable_extras_are_explained(extra, problem):
    rule = AxisRule("example", "ex", extra=(extra,))
    with pytest.raises(AxisValueError, match=problem) as error:
        select_versions(rule, fixture_releases("synthetic"), PY311)
    assert extra in str(error.value)


def test_a_rule_that_selects_nothing_is_an_error():
    with pytest.raises(AxisValueError, match="selects nothing"):
        select_versions(AxisRule("example", "ex"), fixture_releases("synthetic"), PY311)


# --- git refs and local checkouts ------------------------------------------------------------


@pytest.mark.parametrize(
    "text, requirement, readable",
    [
        ("deepspeed@master", "deepspeed @ git+https://github.com/deepspeedai/DeepSpeed@master", "ds@master"),
        ("deepspeed@v0.16.2", "deepspeed @ git+https://github.com/deepspeedai/DeepSpeed@v0.16.2", "ds@v0.16.2"),
        (
            "deepspeed@feature/tp-fix",
            "deepspeed @ git+https://github.com/deepspeedai/DeepSpeed@feature/tp-fix",
            "ds@feature-tp-fix",
        ),
        (
            "deepspeed@0123456789abcdef0123456789abcdef01234567",
            "deepspeed @ git+https://github.com/deepspeedai/DeepSpeed@0123456789abcdef0123456789abcdef01234567",
            "ds@0123456789",
        ),
        (
            "deepspeed@pr/1234",
            "deepspeed @ git+https://github.com/deepspeedai/DeepSpeed@refs/pull/1234/head",
            "ds@pr1234",
        ),
        ("0.16.2", "deepspeed==0.16.2", "ds0.16.2"),
    ],
)
def test_parse_axis_value(text, requirement, readable):
    pin = parse_axis_value(text, DEEPSPEED)
    assert (pin.requirement, pin.id) == (requirement, readable)
    assert (pin.version is None) == ("@" in text)


def test_parse_local_checkout(tmp_path, monkeypatch):
    clone = tmp_path / "DeepSpeed"
    clone.mkdir()
    pin = parse_axis_value(f"deepspeed@{clone}", DEEPSPEED)
    assert (pin.requirement, pin.id, pin.version) == (str(clone), "ds@local-DeepSpeed", None)
    monkeypatch.chdir(tmp_path)
    assert parse_axis_value("deepspeed@./DeepSpeed", DEEPSPEED).requirement == str(clone)


@pytest.mark.parametrize(
    "text, rule, problem",
    [
        ("latest", DEEPSPEED, "not a version"),
        ("==0.16.2", DEEPSPEED, "not a version"),
        ("transformers@main", DEEPSPEED, "names 'transformers'"),
        ("deepspeed@pr/abc", DEEPSPEED, "PR is given by its number"),
        ("deepspeed@", DEEPSPEED, "not a branch"),
        ("deepspeed@bad ref", DEEPSPEED, "not a branch"),
        ("deepspeed@a..b", DEEPSPEED, "not a branch"),
        ("deepspeed@/no/such/clone", DEEPSPEED, "no directory at /no/such/clone"),
        ("torch@main", TORCH, "no repo"),
    ],
)
def test_parse_errors_name_the_value_and_show_accepted_forms(text, rule, problem):
    with pytest.raises(AxisValueError, match=problem) as error:
        parse_axis_value(text, rule)
    message = str(error.value)
    assert repr(text) in message
    assert f"{rule.package}@pr/<number>" in message and "<version>" in message


# --- incompatibilities -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "pins, reason",
    [
        ({"deepspeed": "0.14.2", "torch": "2.13.0"}, "fail at import"),
        ({"deepspeed": "0.14.2", "torch": "2.12.1"}, None),
        ({"deepspeed": "0.14.0", "torch": "2.13.0"}, "CPU/gloo"),  # first matching entry wins
        ({"deepspeed": "0.14.4", "torch": "2.13.0"}, None),
        ({"deepspeed": "0.14.2"}, None),  # torch unknown: the torch entry cannot match
        ({"deepspeed": "deepspeed @ git+https://x@master", "torch": "2.13.0"}, None),
        ({"deepspeed": Version("0.13.5"), "torch": None}, "CPU/gloo"),
    ],
)
def test_skip_reason(config, pins, reason):
    found = skip_reason(pins, config)
    assert found == reason if reason is None else reason in found


# --- config ----------------------------------------------------------------------------------


def test_shipped_config_loads_and_keeps_torch_to_the_runner_version():
    config = load_config()
    assert set(config.axes) == {"deepspeed", "transformers", "torch"}
    torch = config.axes["torch"]
    assert (torch.minors_window, torch.latest, torch.prerelease, torch.extra) == (0, False, False, ("2.13.0",))
    assert all(entry.reason for entry in config.incompatible)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (("minors_window = 4", "minors_windw = 4"), "unknown field.*did you mean 'minors_window'"),
        (
            ("minors_window = 4", "minors_window = true"),
            r"\[axes.deepspeed\] field 'minors_window' must be an integer, got True",
        ),
        (("minors_window = 4", "minors_window = -1"), ">= 0"),
        (('min = "0.14.4"', 'min = "fourteen"'), "field 'min' must be a Version \\(Invalid version: 'fourteen'\\)"),
        (('python = "3.11"', "python = 3.10"), "quote it"),
        (('extra = ["2.13.0"]', "extra = [2.13]"), "field 'extra\\[0\\]' must be a string, got 2.13"),
        (('short = "pt"', ""), "is missing required field 'short'"),
        (('torch = ">=2.13"', 'torch = "=>2.13"'), "Invalid specifier"),
        (('reason = "CPU/gloo path only exists from DeepSpeed 0.14.1 on"', ""), "needs a reason"),
        (("[axes.torch]", "[axes.jax]"), "exactly deepspeed, transformers, torch"),
    ],
)
def test_config_errors(tmp_path, edit, problem):
    path = tmp_path / "versions.toml"
    path.write_text(TEST_CONFIG.replace(*edit, 1))
    with pytest.raises(ConfigError, match=problem):
        load_config(path)


# --- cache -----------------------------------------------------------------------------------


def test_offline_without_cache_names_url_and_cache_path(tmp_path, no_network):
    with pytest.raises(ReleaseDataUnavailable) as error:
        load_releases("deepspeed", cache_dir=tmp_path)
    assert "https://pypi.org/pypi/deepspeed/json" in str(error.value)
    assert str(tmp_path / "deepspeed.json") in str(error.value)


def test_fetch_fills_cache_then_later_runs_stay_offline(tmp_path, monkeypatch):
    fetched = []

    def fake_fetch(package):
        fetched.append(package)
        return fixture_json("deepspeed")

    monkeypatch.setattr(releases, "fetch_pypi_json", fake_fetch)
    first = load_releases("deepspeed", cache_dir=tmp_path)
    assert json.loads((tmp_path / "deepspeed.json").read_text()) == fixture_json("deepspeed")
    monkeypatch.setattr(releases, "fetch_pypi_json", lambda package: pytest.fail("fetched despite cache"))
    assert load_releases("deepspeed", cache_dir=tmp_path) == first
    assert fetched == ["deepspeed"]


def test_refresh_refetches_and_rewrites_cache(cache_dir, monkeypatch):
    newer = fixture_json("deepspeed")
    newer["releases"]["0.20.0"] = [
        {"upload_time_iso_8601": "2027-01-01T00:00:00+00:00", "yanked": False, "requires_python": None}
    ]
    monkeypatch.setattr(releases, "fetch_pypi_json", lambda package: newer)
    assert Version("0.20.0") not in [r.version for r in load_releases("deepspeed", cache_dir=cache_dir)]
    assert load_releases("deepspeed", cache_dir=cache_dir, fetch="refresh")[-1].version == Version("0.20.0")
    assert "0.20.0" in json.loads((cache_dir / "deepspeed.json").read_text())["releases"]


def test_failed_refresh_falls_back_to_cache_with_warning(cache_dir, no_network):
    with pytest.warns(UserWarning, match="using the cached"):
        releases = load_releases("deepspeed", cache_dir=cache_dir, fetch="refresh")
    assert releases[-1].version == Version("0.19.8")


def test_cache_dir_from_environment(tmp_path, monkeypatch, no_network):
    shutil.copy(FIXTURES / "torch.json", tmp_path / "torch.json")
    monkeypatch.setenv(releases.CACHE_DIR_ENV, str(tmp_path))
    assert load_releases("torch")[-1].version == Version("2.15.0")


def age_cache_file(path, hours):
    stamp = time.time() - hours * 3600
    os.utime(path, (stamp, stamp))


def with_new_release(pypi_json):
    newer = json.loads(json.dumps(pypi_json))
    newer["releases"]["0.20.0"] = [
        {"upload_time_iso_8601": "2027-01-01T00:00:00+00:00", "yanked": False, "requires_python": None}
    ]
    return newer


def test_cache_older_than_max_age_is_refreshed(cache_dir, monkeypatch):
    monkeypatch.setattr(releases, "fetch_pypi_json", lambda package: with_new_release(fixture_json(package)))
    age_cache_file(cache_dir / "deepspeed.json", releases.DEFAULT_MAX_AGE_HOURS + 1)
    assert load_releases("deepspeed", cache_dir=cache_dir)[-1].version == Version("0.20.0")
    # the rewritten cache is fresh again: the next load must not fetch
    monkeypatch.setattr(releases, "fetch_pypi_json", lambda package: pytest.fail("fetched a fresh cache"))
    assert load_releases("deepspeed", cache_dir=cache_dir)[-1].version == Version("0.20.0")


def test_cache_younger_than_max_age_is_not_fetched(cache_dir, monkeypatch):
    monkeypatch.setattr(releases, "fetch_pypi_json", lambda package: pytest.fail("fetched a fresh cache"))
    age_cache_file(cache_dir / "deepspeed.json", releases.DEFAULT_MAX_AGE_HOURS - 1)
    assert load_releases("deepspeed", cache_dir=cache_dir)[-1].version == Version("0.19.8")


def test_max_age_from_environment(cache_dir, monkeypatch):
    fetched = []
    monkeypatch.setattr(releases, "fetch_pypi_json", lambda package: fetched.append(package) or fixture_json(package))
    age_cache_file(cache_dir / "deepspeed.json", 2)
    monkeypatch.setenv(releases.MAX_AGE_ENV, "3")
    load_releases("deepspeed", cache_dir=cache_dir)
    assert fetched == []
    monkeypatch.setenv(releases.MAX_AGE_ENV, "1.5")
    load_releases("deepspeed", cache_dir=cache_dir)
    assert fetched == ["deepspeed"]
    monkeypatch.setenv(releases.MAX_AGE_ENV, "inf")  # CI cell jobs: exactly the release data of the plan job
    age_cache_file(cache_dir / "deepspeed.json", 10_000)
    load_releases("deepspeed", cache_dir=cache_dir)
    assert fetched == ["deepspeed"]


def test_stale_cache_offline_falls_back_with_a_warning_naming_its_age(cache_dir, no_network):
    age_cache_file(cache_dir / "deepspeed.json", 30)
    with pytest.warns(UserWarning, match=r"using the cached .*deepspeed.json \(30.0 h old\)"):
        releases = load_releases("deepspeed", cache_dir=cache_dir)
    assert releases[-1].version == Version("0.19.8")


@pytest.mark.parametrize("text", ["twelve", "-1", "nan"])
def test_bad_max_age_names_the_variable(cache_dir, monkeypatch, no_network, text):
    monkeypatch.setenv(releases.MAX_AGE_ENV, text)
    with pytest.raises(ValueError, match=f"{releases.MAX_AGE_ENV}=.*in hours"):
        load_releases("deepspeed", cache_dir=cache_dir)


# --- combinations ----------------------------------------------------------------------------


def ids(combos):
    return [combo.id for combo in combos]


def test_latest_is_exactly_one_combo_offline_from_cache(config, cache_dir, no_network):
    (latest,) = combinations("latest", config=config, cache_dir=cache_dir)
    assert latest.id == "ds0.19.8-tf5.25.0-pt2.13.0"
    assert latest.requirements == ["deepspeed==0.19.8", "transformers==5.25.0", "torch==2.13.0"]
    assert latest.skip_reason is None
    assert set(latest.tags) >= {"latest", "release-gate", "nightly"}


def test_release_gate_compares_latest_with_previous_deepspeed(config, cache_dir, no_network):
    assert ids(combinations("release-gate", config=config, cache_dir=cache_dir)) == [
        "ds0.19.8-tf5.25.0-pt2.13.0",
        "ds0.19.7-tf5.25.0-pt2.13.0",
    ]


def test_min_combo(config, cache_dir, no_network):
    assert ids(combinations("min", config=config, cache_dir=cache_dir)) == ["ds0.14.4-tf4.41.2-pt2.13.0"]


def test_nightly_is_the_full_product_without_duplicates(config, cache_dir, no_network):
    nightly = combinations("nightly", config=config, cache_dir=cache_dir)
    # deepspeed: min + 4 minors (latest among them) + master; transformers: min + 4 minors + last v4
    assert len(nightly) == 6 * 6 * 1 == len(set(ids(nightly)))
    assert "ds@master-tf4.57.6-pt2.13.0" in ids(nightly)
    everything = combinations(config=config, cache_dir=cache_dir)
    assert len(everything) == len(nightly) + 1  # + the release-gate baseline 0.19.7, not selected otherwise
    assert combinations("prerelease", config=config, cache_dir=cache_dir) == []


def test_prerelease_combo_pairs_the_prerelease_with_latest_others(config, cache_dir, no_network):
    recorded = fixture_json("deepspeed")
    recorded["releases"]["0.20.0rc1"] = [
        {"upload_time_iso_8601": "2026-11-01T00:00:00+00:00", "yanked": False, "requires_python": None}
    ]
    (cache_dir / "deepspeed.json").write_text(json.dumps(recorded))
    assert ids(combinations("prerelease", config=config, cache_dir=cache_dir)) == ["ds0.20.0rc1-tf5.25.0-pt2.13.0"]
    assert ids(combinations("latest", config=config, cache_dir=cache_dir)) == ["ds0.19.8-tf5.25.0-pt2.13.0"]


def test_override_with_a_pr(config, cache_dir, no_network):
    combos = combinations(overrides={"deepspeed": "deepspeed@pr/1234"}, config=config, cache_dir=cache_dir)
    assert {combo.deepspeed.id for combo in combos} == {"ds@pr1234"}
    (latest,) = [combo for combo in combos if "latest" in combo.tags]
    assert latest.id == "ds@pr1234-tf5.25.0-pt2.13.0"
    assert (
        latest.deepspeed.requirement == "deepspeed @ git+https://github.com/deepspeedai/DeepSpeed@refs/pull/1234/head"
    )
    assert latest.skip_reason is None


def test_override_with_an_incompatible_release_carries_the_skip_reason(config, cache_dir, no_network):
    (latest,) = combinations("latest", overrides={"deepspeed": "0.14.2"}, config=config, cache_dir=cache_dir)
    assert latest.id == "ds0.14.2-tf5.25.0-pt2.13.0"
    assert "fail at import" in latest.skip_reason


def test_bad_tag_and_bad_override_axis(config, cache_dir, no_network):
    with pytest.raises(ValueError, match="unknown tag 'weekly'"):
        combinations("weekly", config=config, cache_dir=cache_dir)
    with pytest.raises(AxisValueError, match="unknown axes jax"):
        combinations(overrides={"jax": "0.4"}, config=config, cache_dir=cache_dir)


def test_shipped_config_has_one_latest_combo(cache_dir, no_network):
    (latest,) = combinations("latest", cache_dir=cache_dir)
    settled = datetime.now(timezone.utc) - timedelta(days=load_config().axes["transformers"].settle_days)
    newest_settled = max(
        r.version
        for r in load_releases("transformers", cache_dir=cache_dir)
        if r.uploaded <= settled and not r.version.is_prerelease and not r.yanked
    )
    assert latest.id.startswith("ds0.19.8-") and latest.transformers.version == newest_settled


def test_a_release_younger_than_settle_days_is_not_picked(cache_dir, no_network):
    releases = load_releases("transformers", cache_dir=cache_dir)
    newest = max(releases, key=lambda r: r.version)
    rule = replace(load_config().axes["transformers"], min=None, minors_window=0, extra=(), prerelease=False)
    age_days = (datetime.now(timezone.utc) - newest.uploaded).days
    assert select_versions(replace(rule, settle_days=0), releases, Version("3.11")).latest.version == newest.version
    assert (
        select_versions(replace(rule, settle_days=age_days + 1), releases, Version("3.11")).latest.version
        < newest.version
    )


# --- CI export -------------------------------------------------------------------------------


def test_ci_matrix_rows(config, cache_dir, no_network):
    rows = ci_matrix(combinations("release-gate", overrides={"torch": "2.12.1"}, config=config, cache_dir=cache_dir))
    assert rows[0] == {
        "session": "autotp(ds0.19.8-tf5.25.0-pt2.12.1)",
        "id": "ds0.19.8-tf5.25.0-pt2.12.1",
        "tags": ["latest", "release-gate", "nightly"],
        "skip_reason": None,
    }
    json.dumps(rows)  # serialisable as is


def test_command_line_prints_the_job_matrix(cache_dir, no_network, capsys):
    versions.main(["--tag", "latest", "--cache-dir", str(cache_dir), "--session", "cpu"])
    (row,) = json.loads(capsys.readouterr().out)
    (latest,) = combinations("latest", cache_dir=cache_dir)
    assert row["session"] == f"cpu({latest.id})" and "latest" in row["tags"]


@pytest.mark.parametrize(
    "entries, expected",
    [
        (["deepspeed=0.19.7,transformers=5.24.0"], {"deepspeed": "0.19.7", "transformers": "5.24.0"}),
        ([" deepspeed = 0.19.7 , ", "torch=2.13.0"], {"deepspeed": "0.19.7", "torch": "2.13.0"}),
        (["deepspeed=deepspeed@pr/1234"], {"deepspeed": "deepspeed@pr/1234"}),
        ([""], {}),
    ],
)
def test_pins_are_read_one_way_by_every_command(entries, expected, monkeypatch):
    from matrix.version_axes import parse_pins
    from sessions.nox_sessions import pin_overrides

    assert parse_pins(entries, "--pin") == expected
    monkeypatch.setenv("AUTOTP_PINS", ",".join(entries))
    assert pin_overrides() == expected


@pytest.mark.parametrize(
    "text, problem",
    [
        ("deepspeed", "'deepspeed' must be AXIS=VALUE"),
        ("numpy=2", "'numpy=2' must be AXIS=VALUE"),
        ("deepspeed=", "'deepspeed=' must be AXIS=VALUE"),
        ("deepspeed=0.19.7,deepspeed=0.19.8", "deepspeed is pinned twice (0.19.7 and 0.19.8)"),
    ],
)
def test_bad_pins_get_the_same_answer_from_every_command(text, problem, monkeypatch, capsys, tmp_path):
    from matrix.version_axes import AxisValueError, parse_pins
    from reports.__main__ import main as reports_main
    from reports.analysis.comparison import select
    from sessions.nox_sessions import pin_overrides

    with pytest.raises(AxisValueError, match=re.escape(problem)):
        parse_pins([text], "--pin")
    monkeypatch.setenv("AUTOTP_PINS", text)
    with pytest.raises(SystemExit, match=re.escape(problem)):
        pin_overrides()
    if "=" in text:  # without one, the gate reads a run id
        with pytest.raises(ReportsError, match=re.escape(problem)):
            select([], text, "--baseline")
    assert (
        reports_main(
            [
                "bisect",
                "--cell",
                "llama-eager-fp32-tp2",
                "--good",
                "0.16.4",
                "--bad",
                "0.17.0",
                *[arg for pin in text.split(",") for arg in ("--pin", pin)],
                "--store",
                str(tmp_path / "s.sqlite"),
            ]
        )
        == 2
    )
    assert problem.split(" must")[0].split(" (")[0] in capsys.readouterr().err


def test_backfill_takes_the_newest_patch_of_every_minor_in_the_range(cache_dir, no_network):
    from matrix.version_axes import AxisValueError
    from matrix.versions import backfill_versions

    releases = [
        r.version
        for r in load_releases("deepspeed", cache_dir=cache_dir)
        if not r.yanked and not r.version.is_prerelease and not r.version.is_devrelease
    ]
    minors = {}
    for version in sorted(releases):
        if version >= Version("0.16.0"):
            minors[version.release[:2]] = version
    chosen = backfill_versions("deepspeed", "0.16.0", python=Version("3.11"), cache_dir=cache_dir)
    assert chosen == [str(v) for v in minors.values()] and len(chosen) >= 2
    assert backfill_versions(
        "deepspeed", "0.16.0", str(minors[(0, 16)]), python=Version("3.11"), cache_dir=cache_dir
    ) == [str(minors[(0, 16)])]
    with pytest.raises(AxisValueError, match="no installable stable release from 9.0 to the newest"):
        backfill_versions("deepspeed", "9.0", python=Version("3.11"), cache_dir=cache_dir)
    with pytest.raises(AxisValueError, match="--since and --until take releases like 0.16.0"):
        backfill_versions("deepspeed", "latest", python=Version("3.11"), cache_dir=cache_dir)


def test_backfill_passes_triage_options_on_and_the_rest_to_pytest():
    from sessions.history_sessions import backfill_options

    args, triage, pytest_args = backfill_options(
        [
            "--axis",
            "deepspeed",
            "--since",
            "0.16.0",
            "--tp",
            "2",
            "--max-cells",
            "2",
            "--models",
            "llama",
            "--max-minutes=30",
        ]
    )
    assert (args.axis, args.since, args.until) == ("deepspeed", "0.16.0", None)
    assert triage == ["--max-cells", "2", "--max-minutes", "30"]
    assert pytest_args == ["--tp", "2", "--models", "llama"]  # the "2" of --tp stays, whatever --max-cells says

"""Issue #53 item 6, names: the atlas's slugs escape what they would have stripped (no two names share a page or a
version set's id), sessions are names every OS can check out (no device names, no trailing `.`, no case twins in one
archive) and a version is one line of ASCII. A generator crafts names of each class."""

from __future__ import annotations

import itertools
import json
import tarfile
from collections.abc import Iterator

import pytest
from reports_testkit import Cell, write_junit

from reports.__main__ import main
from reports.atlas.model import label_slug, slug
from reports.store.archive import RECORDS_MEMBER, _tar_gz

pytestmark = pytest.mark.usefixtures("no_github")


def crafted_twins() -> Iterator[tuple[str, str]]:
    """Pairs of distinct names a stripping or lossy slug would give one page: a trailing or leading `-`, `.` or `/`,
    `--` against `/`, characters outside the slug's set, a trailing newline."""
    for name in ("0.19.8", "meta-llama/Llama-3", "X/Y"):
        for mark in ("-", ".", "/", "\n", " ", "@", "+"):
            yield name, name + mark
            yield name, mark + name
    yield "a/b", "a--b"
    yield "a-/b", "a/-b"
    yield "a/b-c", "a/b@c"
    yield "0.19.9+abc@abc1234567", "0.19.9-abc-abc1234567"


@pytest.mark.parametrize(("plain", "crafted"), list(crafted_twins()))
def test_no_two_names_share_a_slug(plain, crafted):
    for spelling in (slug, label_slug):
        assert spelling(plain) != spelling(crafted), (spelling.__name__, plain, crafted)
        for text in (spelling(plain), spelling(crafted)):  # a file name every OS keeps as it is
            assert text and text[-1] not in ".- " and "/" not in text and "\n" not in text


def test_ordinary_names_keep_their_urls():
    assert slug("meta-llama/Meta-Llama-3-8B") == "meta-llama--Meta-Llama-3-8B"
    assert [label_slug(v) for v in ("0.19.8", "5.24.0", "2.13.0+cpu", "3.11.7")] == [
        "0.19.8",
        "5.24.0",
        "2.13.0+cpu",
        "3.11.7",
    ]


def test_version_sets_with_a_label_holding_a_dash_do_not_share_an_id():
    """A version set's id joins its labels with `-`: `1-tf2` and `2-tf3` must not join into the same text."""
    from reports.atlas.model import VersionSet
    from reports.store import Versions

    first = VersionSet.of(Versions(deepspeed="1-tf2", transformers="3", torch="2.13.0", python="3.11.7"))
    second = VersionSet.of(Versions(deepspeed="1", transformers="2-tf3", torch="2.13.0", python="3.11.7"))
    assert first.id != second.id


def crafted_sessions() -> Iterator[tuple[str, str]]:
    """Sessions no OS-portable archive folder can have, with the words each is refused with."""
    for device in ("nul", "CON", "Aux", "com1", "LPT9", "nul.txt", "CONIN$"):
        yield device, "is a device name on Windows" if "$" not in device else "is not a session name"
    yield "matrix.", "ends in '.'"
    yield "..", "is not a session name"


@pytest.mark.parametrize(("session", "says"), list(crafted_sessions()))
def test_a_session_no_os_can_check_out_is_refused_at_the_door(session, says, tmp_path, capsys):
    path = write_junit(
        tmp_path / "junit" / "run.xml",
        [Cell("llama")],
        run_id="x@2025-01-01T00:00:00Z@h",
        started="2025-01-01T00:00:00Z",
        session=session,
    )
    assert main(["merge", str(path), "--store", str(tmp_path / "history.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "run.session=" in err and says in err, err


@pytest.mark.parametrize(("first", "second"), [("nightly", "Nightly"), ("release-gate", "RELEASE-GATE")])
def test_a_session_differing_only_in_case_is_refused_by_the_archive(first, second, tmp_path, capsys):
    """On a case-insensitive file system the two folders are one: the second run is refused (named), never looped on."""
    counter = itertools.count(1)
    for session in (first, second):
        n = next(counter)
        write_junit(
            tmp_path / "junit" / f"{n}.xml",
            [Cell("llama")],
            run_id=f"{session}@2025-01-0{n}T00:00:00Z@h",
            started=f"2025-01-0{n}T00:00:00Z",
        )
    assert main(["merge", str(tmp_path / "junit"), "--store", str(tmp_path / "history.sqlite")]) == 2
    err = capsys.readouterr().err
    assert f"beside {first!r}, whose name differs from its only in case" in err, err
    assert [path.name for path in (tmp_path / "archive").iterdir()] == [first]


@pytest.mark.parametrize("version", ["0.19.8\n", " 0.19.8", "0.19.8 ", "0.19.\u0668", "0.19.8\r"])
def test_a_version_is_one_line_of_ascii(version, tmp_path, capsys):
    """A JUnit file's attributes arrive stripped; an archive entry's JSON does not: a version PEP 440 would forgive
    (spaces, a line break) is refused where the entry is read, and rebuild names it."""
    write_junit(
        tmp_path / "junit" / "run.xml",
        [Cell("llama")],
        run_id="nightly@2025-01-01T00:00:00Z@h",
        started="2025-01-01T00:00:00Z",
        deepspeed="0.19.8",
    )
    assert main(["merge", str(tmp_path / "junit"), "--store", str(tmp_path / "history.sqlite")]) == 0
    (entry,) = (tmp_path / "archive").rglob("*.tar.gz")
    with tarfile.open(entry, "r:gz") as tar:
        records = json.loads(tar.extractfile(RECORDS_MEMBER).read())  # type: ignore[union-attr]
    records["run"]["versions"]["deepspeed"] = version
    entry.write_bytes(_tar_gz({RECORDS_MEMBER: json.dumps(records).encode()}))
    capsys.readouterr()
    assert main(["rebuild", "--store", str(tmp_path / "rebuilt.sqlite")]) == 0
    assert "version.deepspeed=" in capsys.readouterr().err

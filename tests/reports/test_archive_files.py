"""Issue #53 items 3 and 6: the archive read as hostile input. A generator plants one crafted file of each class in a
copy of a real archive (a link to a device or to an entry outside, a FIFO, an oversized or inflating entry, a run id
under two names, an entry in another session's folder, an attempt contradicting the first, an entry saying it is
untrusted, answers whose commit climbs out of its URL or whose tp overflows, a linked folder); rebuild, verify, the
atlas and `render --history` each name it and go on, within 5 s, and verify fails on every one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

from reports.__main__ import main
from reports.outputs.markdown_safety import OUR_URL
from reports.store import entry_files
from reports.store.archive import RECORDS_MEMBER, _tar_gz, answer_key
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey

pytestmark = pytest.mark.usefixtures("no_github")

SECONDS = 5  # issue #53: each command names and skips a crafted entry within this


@dataclass(frozen=True)
class Crafted:
    """One crafted file planted in an archive: `plant(archive, outside)` makes it and returns the path it is at (what
    every command must name), `says` the words of the reason it is left out."""

    name: str
    plant: Callable[[Path, Path], Path]
    says: str
    bounds: dict[str, int] | None = None  # entry_files bounds lowered for this case (the real ones are hundreds of MB)


def _entries(archive: Path) -> list[Path]:
    return sorted(archive.glob("*/*.tar.gz"))


def _records(entry: Path) -> dict:
    with tarfile.open(entry, "r:gz") as tar:
        member = tar.extractfile(RECORDS_MEMBER)
        assert member is not None
        return json.loads(member.read())


def _entry_bytes(records: dict) -> bytes:
    return _tar_gz({RECORDS_MEMBER: json.dumps(records).encode()})


def _another_run(records: dict, run_id: str) -> dict:
    return {**records, "run": {**records["run"], "run_id": run_id}}


def _quoted(run_id: str) -> str:
    return run_id.replace(":", "%3A")


def _bisection(**changes) -> dict:
    answer = Bisection(
        CellKey("opt", "eager", "fp32", 2),
        "broken",
        "deepspeed",
        "0.19.7",
        "0.19.8",
        (("transformers", "4.44.0"),),
        "shard",
        "ValueError: heads",
        commit="0123456789abcdef0123456789abcdef01234567",
        recorded_at="2025-01-03T00:00:00+00:00",
    )
    return {**json.loads(answer_key(answer)), **changes}


def crafted_inputs() -> Iterator[Crafted]:
    """Every class of crafted archive file issue #53 names, built here (not the issue's literal inputs)."""
    new = "nightly@2025-01-09T00:00:00Z@runner-9"

    def at_new_name(archive: Path) -> Path:
        return archive / "nightly" / f"{_quoted(new)}.1.tar.gz"

    def link(target: str) -> Callable[[Path, Path], Path]:
        def plant(archive: Path, outside: Path) -> Path:
            at_new_name(archive).symlink_to(target)
            return at_new_name(archive)

        return plant

    yield Crafted("link to a device", link("/dev/zero"), "is a symbolic link, not a regular file")

    def link_outside(archive: Path, outside: Path) -> Path:
        entry = _entries(archive)[0]
        moved = outside / entry.name
        shutil.move(entry, moved)
        entry.symlink_to(moved)  # a valid entry, outside the archive
        return entry

    yield Crafted("link to an entry outside", link_outside, "is a symbolic link, not a regular file")

    def fifo(archive: Path, outside: Path) -> Path:
        os.mkfifo(at_new_name(archive))
        return at_new_name(archive)

    yield Crafted("FIFO", fifo, "is a FIFO, not a regular file")

    def oversized(archive: Path, outside: Path) -> Path:
        with open(at_new_name(archive), "wb") as file:
            file.truncate(entry_files.MAX_ENTRY_BYTES + 1)  # sparse: nothing is written
        return at_new_name(archive)

    yield Crafted("oversized", oversized, f"more than the {entry_files.MAX_ENTRY_BYTES}")

    def inflating(archive: Path, outside: Path) -> Path:
        padding = {f"pad-{n}": bytes(600_000) for n in range(4)}  # 2.4 MB of zeros in a few KB, each under the bound
        at_new_name(archive).write_bytes(_tar_gz({**padding, RECORDS_MEMBER: b"{}"}))
        return at_new_name(archive)

    yield Crafted("inflating", inflating, "inflates to more than", {"MAX_UNPACKED_BYTES": 1_000_000})

    def inflating_member(archive: Path, outside: Path) -> Path:
        at_new_name(archive).write_bytes(_tar_gz({RECORDS_MEMBER: bytes(2_000_000)}))
        return at_new_name(archive)

    yield Crafted("an inflating member", inflating_member, "holds 2000000 bytes", {"MAX_UNPACKED_BYTES": 1_000_000})

    def other_folder(archive: Path, outside: Path) -> Path:
        entry = _entries(archive)[0]
        (archive / "matrix").mkdir()
        return Path(shutil.copy(entry, archive / "matrix" / entry.name))

    yield Crafted("the same run id in another folder", other_folder, "is listed under 2 names")

    def encoded_twin(archive: Path, outside: Path) -> Path:
        entry = _entries(archive)[0]
        twin = entry.with_name(entry.name.replace("@", "%40", 1))
        records = _records(entry)
        records["results"][0]["outcome"], records["results"][0]["failure_class"] = "fail", "forward"
        twin.write_bytes(_entry_bytes(records))  # the same run id, other verdicts
        return twin

    yield Crafted("a %40 twin", encoded_twin, "not the name merge gives an entry")

    def wrong_session(archive: Path, outside: Path) -> Path:
        records = _another_run(_records(_entries(archive)[0]), "release-gate@2025-01-09T00:00:00Z@runner-9")
        records["run"]["session"] = "release-gate"
        planted = archive / "matrix" / f"{_quoted(records['run']['run_id'])}.1.tar.gz"
        planted.parent.mkdir()
        planted.write_bytes(_entry_bytes(records))
        return planted

    yield Crafted("a session in another's folder", wrong_session, "the entry was moved")

    def contradicting_attempt(archive: Path, outside: Path) -> Path:
        entry = next(e for e in _entries(archive) if any(r["outcome"] == "fail" for r in _records(e)["results"]))
        records = _records(entry)
        for result in records["results"]:
            result.update(outcome="pass", failure_class="", signature="")  # attempt 1 failed these cells
        planted = entry.with_name(entry.name.replace(".1.tar.gz", ".2.tar.gz"))
        planted.write_bytes(_entry_bytes(records))
        return planted

    yield Crafted("an attempt 2 contradicting attempt 1", contradicting_attempt, "other verdicts")

    def untrusted(archive: Path, outside: Path) -> Path:
        records = _another_run(_records(_entries(archive)[0]), new)
        records["run"]["trusted"] = False
        at_new_name(archive).write_bytes(_entry_bytes(records))
        return at_new_name(archive)

    yield Crafted("an untrusted run", untrusted, "its run says trusted=False")

    def answer(content: dict) -> Callable[[Path, Path], Path]:
        def plant(archive: Path, outside: Path) -> Path:
            path = archive / "answers" / "bisection-0123456789abcdef.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(content))
            return path

        return plant

    yield Crafted(
        "a commit climbing out of its URL",
        answer(_bisection(commit="0123456/../../../attacker/repo/issues/1")),
        "commit='0123456/../../../attacker/repo/issues/1' is not a git commit (hex)",
    )
    yield Crafted(
        "an answer's tp past any integer",
        answer(_bisection(cell={"model": "opt", "variant": "eager", "dtype": "fp32", "tp": 2**70})),
        f"cell.tp={2**70} is not a tensor-parallel size",
    )
    yield Crafted(
        "a touched file climbing out",
        answer(_bisection(files=["deepspeed/../../etc/passwd"])),
        "files='deepspeed/../../etc/passwd' lists",
    )

    def answer_link(archive: Path, outside: Path) -> Path:
        path = archive / "answers" / "triage-attempt-0123456789abcdef.json"
        path.parent.mkdir(exist_ok=True)
        path.symlink_to("/dev/zero")
        return path

    yield Crafted("an answer linked to a device", answer_link, "is a symbolic link, not a regular file")

    def answer_fifo(archive: Path, outside: Path) -> Path:
        path = archive / "answers" / "bisection-fifo.json"
        path.parent.mkdir(exist_ok=True)
        os.mkfifo(path)
        return path

    yield Crafted("an answer that is a FIFO", answer_fifo, "is a FIFO, not a regular file")

    def linked_folder(archive: Path, outside: Path) -> Path:
        elsewhere = outside / "elsewhere"
        elsewhere.mkdir()
        shutil.copy(_entries(archive)[0], elsewhere / f"{_quoted(new)}.1.tar.gz")
        (archive / "elsewhere").symlink_to(elsewhere)
        return archive / "elsewhere"

    yield Crafted("a linked session folder", linked_folder, "is a link to a folder")


CRAFTED = list(crafted_inputs())


@pytest.fixture(scope="module")
def nightly(tmp_path_factory) -> Path:
    """A results folder of two nightly runs (one failing cell), merged: its store and archive."""
    folder = tmp_path_factory.mktemp("nightly")
    for day, cells in ((1, [Cell("llama"), Cell("opt")]), (2, [Cell("llama"), fail("opt", "shard")])):
        write_junit(
            folder / "junit" / f"{day}.xml",
            cells,
            run_id=f"nightly@2025-01-0{day}T00:00:00Z@runner-1",
            started=f"2025-01-0{day}T00:00:00Z",
        )
    assert main(["merge", str(folder / "junit"), "--store", str(folder / "history.sqlite")]) == 0
    return folder


def timed(command: list[str]) -> tuple[int, float]:
    """The command's exit status and seconds; a command that hangs (a FIFO read) fails the test after 60 s."""

    def hung(signum, frame):
        raise AssertionError(f"{command[0]} hung on a crafted archive file")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        start = time.monotonic()
        status = main(command)
        return status, time.monotonic() - start
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("crafted", CRAFTED, ids=[c.name for c in CRAFTED])
def test_every_command_names_and_skips_a_crafted_archive_file(crafted, nightly, tmp_path, monkeypatch, capsys):
    for name, value in (crafted.bounds or {}).items():
        monkeypatch.setattr(entry_files, name, value)
    archive, store = tmp_path / "archive", tmp_path / "history.sqlite"
    shutil.copytree(nightly / "archive", archive)
    shutil.copy(nightly / "history.sqlite", store)
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = crafted.plant(archive, outside)
    capsys.readouterr()

    commands = {
        "rebuild": (["rebuild", "--archive", str(archive), "--store", str(tmp_path / "rebuilt.sqlite")], 0),
        "verify": (["verify", "--archive", str(archive), "--store", str(store)], 1),
        "atlas": (["atlas", "site", "--archive", str(archive), "--out", str(tmp_path / "site")], 0),
        "render --history": (
            ["render", "--store", str(store), "--out", str(tmp_path / "out"), "--history", str(archive)],
            0,
        ),
    }
    for verb, (command, expected) in commands.items():
        status, seconds = timed(command)
        err = capsys.readouterr().err
        named = [line for line in err.splitlines() if str(planted) in line and crafted.says in line]
        assert status == expected and named, f"{verb}: exit {status}, {err}"
        assert seconds < SECONDS, f"{verb} took {seconds:.1f} s"
    with HistoryStore(tmp_path / "rebuilt.sqlite", create=False) as rebuilt:
        assert all(run.trusted for run in rebuilt.runs())  # the rest rebuilt, none of it as a PR's


def test_every_class_is_crafted():
    """The generator covers each class issue #53 lists for the archive (a new class needs a case)."""
    classes = {
        "link",
        "FIFO",
        "oversized",
        "inflating",
        "another folder",
        "%40 twin",
        "session",
        "attempt 2",
        "untrusted",
        "commit",
        "tp",
        "file",
        "linked session folder",
    }
    names = " ".join(crafted.name for crafted in CRAFTED)
    assert all(word in names for word in classes), names


def test_a_published_history_cloned_with_links_reads_them_as_damaged_entries(nightly, tmp_path, capsys):
    """`render --history URL` clones anyone's repository; git would materialise a committed link to /dev/zero: the
    clone checks links out as the small files naming their targets, so the entry is named as damaged and skipped."""
    published = tmp_path / "published"
    shutil.copytree(nightly / "archive", published)
    linked = published / "nightly" / f"{_quoted('nightly@2025-01-09T00:00:00Z@runner-9')}.1.tar.gz"
    linked.symlink_to("/dev/zero")
    for command in (
        ["git", "init", "-q", "-b", "autotp-history"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.com", "commit", "-qm", "archive"],
    ):
        subprocess.run(command, cwd=published, check=True)
    capsys.readouterr()
    command = ["render", "--store", str(nightly / "history.sqlite"), "--out", str(tmp_path / "out")]
    status, seconds = timed([*command, "--history", published.as_uri()])
    captured = capsys.readouterr()
    assert status == 0 and seconds < SECONDS
    assert "runner-9.1.tar.gz: not a readable archive entry" in captured.err, captured.err
    assert "1 skipped (above)" in captured.out


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/deepspeedai/DeepSpeed/commit/0123456789/../../../../attacker/repo/issues/1",
        "https://github.com/deepspeedai/DeepSpeed/commit/./0123456789",
        "https://github.com/deepspeedai/../commit/0123456789",
        "https://github.com/deepspeedai/DeepSpeed/blob/0123456789/..",
    ],
)
def test_a_link_with_a_dot_segment_is_never_one_of_ours(url):
    """What GitHub resolves `..` in leads anywhere on github.com: such a URL stays text in every output."""
    assert OUR_URL.fullmatch(url) is None
    assert OUR_URL.fullmatch(url.replace("/..", "/v0.1..v0.2").replace("/./", "/")) is not None

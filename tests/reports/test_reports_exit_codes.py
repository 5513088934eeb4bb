"""Exit codes that mean something (issue #25): merge fails when nothing usable came in or a run id comes back with
other verdicts; a damaged store, a foreign schema, a binary --docs or a file as --out is one line naming the file;
render and gate only read (SQLite mode=ro): a read-only store works, a 0-byte file never becomes a store."""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

from reports.__main__ import main
from reports.store.history_store import HistoryStore
from reports.store.schema import APPLICATION_ID, SCHEMA_VERSION


def one_error_line(capsys) -> str:
    """The command's stderr, which must be exactly one `error: ...` line (no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("skipped ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_merge_of_nothing_usable_fails_and_creates_no_store(tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    (tmp_path / "empty").mkdir()
    assert main(["merge", str(tmp_path / "empty"), "--store", str(store)]) == 2
    assert "no JUnit (*.xml) file in them" in one_error_line(capsys)

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "truncated.xml").write_text("<testsuites><testsuite")
    (tmp_path / "broken" / "empty.xml").write_text("")
    assert main(["merge", str(tmp_path / "broken"), "--store", str(store)]) == 2
    assert "all 2 file(s) were skipped (above)" in one_error_line(capsys)
    assert not store.exists()


def test_a_run_id_merged_again_with_other_verdicts_fails(tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    run = dict(run_id="nightly@2025-01-01T00:00:00Z@runner-1", started="2025-01-01T00:00:00Z")
    write_junit(tmp_path / "first" / "s.xml", [Cell("llama"), fail("opt", "shard")], **run)
    assert main(["merge", str(tmp_path / "first"), "--store", str(store)]) == 0
    capsys.readouterr()

    write_junit(tmp_path / "again" / "a.xml", [fail("llama", "forward"), fail("opt", "shard")], **run)
    write_junit(
        tmp_path / "again" / "b.xml",
        [Cell("bloom")],
        run_id="other@2025-01-02T00:00:00Z@runner-1",
        started="2025-01-02T00:00:00Z",
    )
    assert main(["merge", str(tmp_path / "again"), "--store", str(store)]) == 2
    out, err = capsys.readouterr()
    assert "1 new run(s), 1 new result(s) from 1 file(s)" in out  # the other file still went in
    # the archive (what the store is rebuilt from) is asked first and names the cell
    assert "cell llama-eager-fp32-tp2 is fail (forward: ForwardError: broken) here but pass in the archive" in err, err
    assert err.splitlines()[-1] == (
        f"error: 1 file(s) contradict runs already in {store} or its archive (above) and were not imported"
    )
    with sqlite3.connect(store) as conn:
        assert conn.execute(
            "SELECT outcome FROM results JOIN cells ON cells.id = results.cell WHERE model = 'llama'"
        ).fetchall() == [("pass",)]

    # The same verdicts again (a re-download of the same artifact) are fine.
    write_junit(tmp_path / "same" / "s.xml", [Cell("llama"), fail("opt", "shard")], **run)
    assert main(["merge", str(tmp_path / "same"), "--store", str(store)]) == 0


@pytest.fixture
def store(tmp_path):
    """A store with enough results to span many pages, so a damaged page lies inside the tables."""
    cells = [fail(f"model{m}", "shard", f"AssertionError: {'x' * 200} {m}", tp=tp) for m in range(60) for tp in (2, 3)]
    for n in range(3):
        write_junit(
            tmp_path / "junit" / f"s{n}.xml",
            cells,
            run_id=f"s{n}@2025-01-0{n + 1}T00:00:00Z@r",
            started=f"2025-01-0{n + 1}T00:00:00Z",
        )
    path = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(path)]) == 0
    return path


def test_a_store_damaged_mid_file_is_one_line(store, tmp_path, capsys):
    data = bytearray(store.read_bytes())
    page = 4096
    assert len(data) > 20 * page
    for offset in range(4 * page, len(data) - page, 3 * page):  # leave the header page intact: it still opens
        data[offset : offset + page] = b"\xde\xad\xbe\xef" * (page // 4)
    store.write_bytes(bytes(data))
    for command in (["render", "--out", str(tmp_path / "out")], ["gate", "--baseline", "x=1", "--candidate", "x=2"]):
        capsys.readouterr()
        assert main([*command, "--store", str(store)]) == 2
        line = one_error_line(capsys)
        assert f"{store}: the history store is damaged or not SQLite (database disk image is malformed)" in line
        assert "move it aside and re-import" in line


def test_our_application_id_with_another_schema_is_one_line(tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    with sqlite3.connect(store) as conn:
        conn.execute("CREATE TABLE runs (run_id TEXT)")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 2
    assert (
        f"{store}: marked as an autotp-matrix history store, but its tables are not those of schema"
        in one_error_line(capsys)
    )
    write_junit(
        tmp_path / "junit" / "s.xml", [Cell("llama")], run_id="s@2025-01-01T00:00:00Z@r", started="2025-01-01T00:00:00Z"
    )
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 2
    assert "its tables are not those of schema" in one_error_line(capsys)


def test_binary_docs_and_a_file_as_out_are_one_line(store, tmp_path, capsys):
    binary = tmp_path / "docs.md"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out"), "--docs", str(binary)]) == 2
    assert f"--docs {binary}: not a UTF-8 text file" in one_error_line(capsys)

    a_file = tmp_path / "out.txt"
    a_file.write_text("not a folder")
    assert main(["render", "--store", str(store), "--out", str(a_file)]) == 2
    assert f"--out {a_file}: cannot write" in one_error_line(capsys)
    assert main(["publish", "--store", str(store), "--out", str(a_file)]) == 2
    assert f"--out {a_file}: cannot write" in one_error_line(capsys)
    assert a_file.read_text() == "not a folder"

    assert main(["merge", str(tmp_path / "junit"), "--store", str(tmp_path)]) == 2  # a folder as the store
    assert f"{tmp_path}: cannot open the history store" in one_error_line(capsys)
    assert main(["merge", str(tmp_path / "junit"), "--store", str(a_file / "history.sqlite")]) == 2
    assert f"{a_file / 'history.sqlite'}: cannot create the history store" in one_error_line(capsys)


def test_render_and_gate_only_read_the_store(store, tmp_path, monkeypatch, capsys):
    """A read-only file works, and another process holding the write lock does not block a reader (the old
    open began a write transaction: it waited for the lock, then gave up)."""
    monkeypatch.setattr("reports.store.history_store.LOCK_TIMEOUT_S", 1)
    before = store.read_bytes()
    store.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    writer = sqlite3.connect(store, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # a merge in progress in another process
    try:
        assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
        assert (
            main(
                [
                    "gate",
                    "--store",
                    str(store),
                    "--baseline",
                    "s0@2025-01-01T00:00:00Z@r",
                    "--candidate",
                    "s2@2025-01-03T00:00:00Z@r",
                ]
            )
            == 0
        )
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert store.read_bytes() == before
    assert not os.access(store, os.W_OK) or os.geteuid() == 0  # root writes anyway; the lock above still proves it


def test_an_empty_file_never_becomes_a_store(tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    store.touch()
    for command in (
        ["render", "--out", str(tmp_path / "out")],
        ["gate", "--baseline", "x=1", "--candidate", "x=2"],
        ["publish", "--out", str(tmp_path / "out")],
    ):
        assert main([*command, "--store", str(store)]) == 2
        assert f"{store}: an empty file (0 bytes), not a history store" in one_error_line(capsys)
    write_junit(
        tmp_path / "junit" / "s.xml", [Cell("llama")], run_id="s@2025-01-01T00:00:00Z@r", started="2025-01-01T00:00:00Z"
    )
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 2  # a truncated history: not a new one
    assert "an empty file (0 bytes)" in one_error_line(capsys)
    assert store.stat().st_size == 0


def test_gate_on_a_store_without_results_is_one_line(tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    with HistoryStore(store, create=True):  # a real store, with its tables, and no run yet
        pass
    assert (
        main(["gate", "--store", str(store), "--baseline", "deepspeed=0.19.7", "--candidate", "deepspeed=0.19.8"]) == 2
    )
    assert "holds no results, so there is nothing to gate on" in one_error_line(capsys)


def test_a_merge_the_full_disk_stops_is_one_disk_full_line_and_keeps_what_was_merged(tmp_path, capsys, monkeypatch):
    """The archive's writes meet ENOSPC (faked at the write, a real disk is never filled): merge says "disk full at
    <path>" in one line, not a traceback; the run merged before stays in the store, no half-written staging file is
    left, and the same merge once there is space takes the new run in."""
    store = tmp_path / "history.sqlite"
    write_junit(
        tmp_path / "first" / "s.xml", [Cell("llama")], run_id="a@2025-01-01T00:00:00Z@r", started="2025-01-01T00:00:00Z"
    )
    assert main(["merge", str(tmp_path / "first"), "--store", str(store)]) == 0
    capsys.readouterr()
    write_junit(
        tmp_path / "second" / "s.xml",
        [fail("opt", "shard")],
        run_id="b@2025-01-02T00:00:00Z@r",
        started="2025-01-02T00:00:00Z",
    )
    write_bytes = Path.write_bytes

    def full_disk(path: Path, data: bytes) -> int:
        if ".tmp" in path.name:  # the archive's staging file: cut short, as a full disk leaves it
            write_bytes(path, data[:7])
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_bytes(path, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    assert main(["merge", str(tmp_path / "second"), "--store", str(store)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: disk full at {tmp_path}/") and "run the same command again" in line, line
    assert not [path for path in tmp_path.rglob("*") if ".tmp" in path.name]
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT model FROM results JOIN cells ON cells.id = results.cell").fetchall() == [
            ("llama",)
        ]
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    assert main(["merge", str(tmp_path / "second"), "--store", str(store)]) == 0

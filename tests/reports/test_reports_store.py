import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

from reports import ReportsError
from reports.__main__ import main
from reports.store.history_store import HistoryStore
from reports.store.junit import read_junit
from reports.store.schema import SCHEMA_VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]


def count(store: Path, table: str) -> int:
    with sqlite3.connect(store) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_merge_keeps_provenance_and_is_idempotent(session, tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    first = session(
        [Cell("llama", metrics={"logits_max_abs": 1e-6}), fail("opt", "shard")],
        deepspeed="0.14.3.dev0",
        deepspeed_git="a" * 40,
        host="gpu-7",
    )
    session([Cell("llama")], transformers="4.45.0")

    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{store}: 2 new run(s), 3 new result(s) from 2 file(s); 0 skipped",
        f"{tmp_path / 'archive'}: 2 new archive entries, 0 new answer(s)",
    ]
    assert main(["merge", str(tmp_path / "junit"), str(first), "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{store}: 0 new run(s), 0 new result(s) from 3 file(s); 0 skipped",
        f"{tmp_path / 'archive'}: 0 new archive entries, 0 new answer(s)",
    ]

    with HistoryStore(store, create=False) as history:
        run = history.runs()[0]
        observations = history.observations()
    assert (run.run_id, run.host) == ("session1@2025-01-01T00:00:00Z@runner-1", "gpu-7")
    assert run.started == "2025-01-01T00:00:00Z"
    assert run.versions.label("deepspeed") == "0.14.3.dev0@aaaaaaaaaa"
    assert (run.versions.transformers, run.versions.torch, run.versions.python) == ("4.44.0", "2.4.0", "3.11.7")
    failed = next(o.result for o in observations if o.cell.model == "opt")
    assert (failed.outcome, failed.failure_class, failed.signature) == ("fail", "shard", "ShardError: broken")
    assert next(o.result.metrics for o in observations if o.run.run_id == run.run_id and o.cell.model == "llama") == {
        "logits_max_abs": 1e-6
    }


def test_malformed_files_are_reported_and_skipped(session, tmp_path, capsys):
    good = session([Cell("llama")])
    truncated = tmp_path / "junit" / "truncated.xml"
    truncated.write_text(session([Cell("opt")]).read_text()[:300])
    (tmp_path / "junit" / "session2.xml").unlink()
    (tmp_path / "junit" / "page.xml").write_text("<html><body>not junit</body></html>")
    (tmp_path / "junit" / "other-tests.xml").write_text(
        '<testsuites><testsuite name="x"><testcase classname="a" name="b"/></testsuite></testsuites>'
    )
    (tmp_path / "junit" / "binary.xml").write_bytes(b"\x00\x01garbage")
    store = tmp_path / "history.sqlite"

    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"{store}: 1 new run(s), 1 new result(s) from 1 file(s); 4 skipped"
    skipped = err.splitlines()
    assert len(skipped) == 4 and str(good) not in err
    assert f"skipped {truncated}: unreadable XML" in err
    assert f"skipped {tmp_path / 'junit' / 'page.xml'}: not a JUnit file" in err
    assert f"skipped {tmp_path / 'junit' / 'other-tests.xml'}: contains no autotp cells" in err
    assert f"skipped {tmp_path / 'junit' / 'binary.xml'}: unreadable XML" in err


def test_missing_property_and_bad_version_name_the_value(session, tmp_path, capsys):
    session([Cell("llama")], torch="2.4.0 nightly")
    assert main(["merge", str(tmp_path / "junit"), "--store", str(tmp_path / "s.sqlite")]) == 2  # nothing usable
    assert "version.torch='2.4.0 nightly' is not a version (ASCII letters, digits" in capsys.readouterr().err
    session([Cell("llama")], deepspeed="")
    assert main(["merge", str(tmp_path / "junit"), "--store", str(tmp_path / "s.sqlite")]) == 2
    assert "property 'version.deepspeed' is missing or empty" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "nowhere"), "--store", str(tmp_path / "s.sqlite")]) == 2
    assert "nowhere: no such file or folder" in capsys.readouterr().err


def test_two_processes_import_concurrently(tmp_path):
    for n in range(40):
        folder = tmp_path / ("a" if n % 2 else "b")
        cells = [Cell(f"model{m}", tp=tp) for m in range(5) for tp in (1, 2)]
        write_junit(folder / f"s{n}.xml", cells, run_id=f"run{n}", started=f"2025-02-01T00:{n:02d}:00Z")
    shared = write_junit(tmp_path / "shared" / "s.xml", [Cell("llama")], run_id="shared", started="2025-02-02T00:00Z")
    store = tmp_path / "history.sqlite"

    importers = [
        subprocess.Popen(
            [sys.executable, "-m", "reports", "merge", str(tmp_path / folder), str(shared), "--store", str(store)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for folder in ("a", "b")
    ]
    for importer in importers:
        out, err = importer.communicate(timeout=60)
        assert importer.returncode == 0, err.decode()
    assert count(store, "runs") == 41
    assert count(store, "results") == 40 * 10 + 1
    with sqlite3.connect(store) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_an_importer_reads_known_ids_under_the_write_lock(tmp_path):
    """Another importer may add a cell between this one's open and its write lock: ids read before the lock would
    insert that cell again (UNIQUE constraint failed: cells...)."""
    store = tmp_path / "history.sqlite"
    other = write_junit(tmp_path / "other" / "s.xml", [Cell("llama")], run_id="other", started="2025-02-01T00:00Z")
    mine = write_junit(tmp_path / "mine" / "s.xml", [Cell("llama")], run_id="mine", started="2025-02-02T00:00Z")
    with HistoryStore(store, create=True) as history:
        locked = history._write

        @contextmanager
        def other_importer_first():
            merged = subprocess.run(
                [sys.executable, "-m", "reports", "merge", str(other), "--store", str(store)],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
            )
            assert merged.returncode == 0, merged.stderr
            with locked():
                yield

        history._write = other_importer_first  # type: ignore[method-assign]
        counts = history.import_runs([(r.run, list(r.results)) for r in read_junit(mine)], source=mine)
    assert (counts.new_runs, counts.new_results) == (1, 1)
    assert count(store, "cells") == 1
    assert count(store, "results") == 2


def test_store_from_another_schema_version_is_rejected(session, tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(session([Cell("llama")])), "--store", str(store)]) == 0
    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(ReportsError, match="schema version 99 is newer than this tool understands"):
        HistoryStore(store, create=False)
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 2
    assert f"error: {store}: store schema version 99 is newer" in capsys.readouterr().err

    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA user_version = 0")
    with pytest.raises(ReportsError, match="schema version 0 predates version 1 and cannot be migrated"):
        HistoryStore(store, create=True)


def test_unrelated_sqlite_file_and_missing_store_are_rejected(tmp_path):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(ReportsError, match="not an autotp-matrix history store"):
        HistoryStore(other, create=True)
    with pytest.raises(ReportsError, match="no history store here; import results first"):
        HistoryStore(tmp_path / "absent.sqlite", create=False)


HARNESS = "c0ffee1234" + "0" * 30
HASH_DIRTY = HARNESS + "-dirty"


def test_merge_keeps_harness_git_apart_from_deepspeed_git(session, tmp_path):
    """deepspeed_git is DeepSpeed's own commit; the harness's commit (which old runs stamped there) is dropped."""
    store = tmp_path / "history.sqlite"
    session([Cell("llama")], deepspeed="0.19.8", deepspeed_git="c0ffee1", harness_git=HASH_DIRTY)  # stamped harness
    session([Cell("llama")], deepspeed="0.19.8", deepspeed_git="b9b025f", harness_git=None)  # old file, release
    session([Cell("llama")], deepspeed="0.18.1+abc1234", deepspeed_git="abc1234", harness_git=None)  # old, git build
    session([Cell("llama")], deepspeed="0.19.9.dev0", deepspeed_git="d" * 40, harness_git=HARNESS)  # new, from git
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    with HistoryStore(store, create=False) as history:
        runs = history.runs()
    assert [(r.versions.deepspeed_git, r.harness_git) for r in runs] == [
        ("", HASH_DIRTY),
        ("", ""),
        ("abc1234", ""),
        ("d" * 40, HARNESS),
    ]


_SCHEMA_1_RUNS = """CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, session TEXT NOT NULL, host TEXT NOT NULL, started TEXT NOT NULL,
    accelerator TEXT NOT NULL, backend TEXT NOT NULL, deepspeed TEXT NOT NULL, deepspeed_git TEXT NOT NULL,
    transformers TEXT NOT NULL, torch TEXT NOT NULL, python TEXT NOT NULL, imported_from TEXT NOT NULL,
    imported_at TEXT NOT NULL)"""
_SCHEMA_1_RESULTS = """CREATE TABLE results (
    run_id TEXT NOT NULL REFERENCES runs(run_id), model TEXT NOT NULL, variant TEXT NOT NULL, dtype TEXT NOT NULL,
    tp INTEGER NOT NULL, outcome TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'skip')),
    failure_class TEXT NOT NULL, signature TEXT NOT NULL, message TEXT NOT NULL, metrics TEXT NOT NULL,
    PRIMARY KEY (run_id, model, variant, dtype, tp))"""


def _old_store(path: Path, version: int, runs: list[tuple[str, str, str]]) -> Path:
    """A store as schema `version` (1 or 2) wrote it, holding (run_id, deepspeed, deepspeed_git) runs."""
    from reports.store.schema import _BISECTIONS, APPLICATION_ID

    with sqlite3.connect(path) as conn:
        for statement in (_SCHEMA_1_RUNS, _SCHEMA_1_RESULTS, *((_BISECTIONS,) if version >= 2 else ())):
            conn.execute(statement)
        for n, (run_id, deepspeed, deepspeed_git) in enumerate(runs, 1):
            conn.execute(
                "INSERT INTO runs VALUES (?, ?, 'runner-1', ?, 'cpu', 'gloo', ?, ?, '4.44.0', "
                "'2.4.0', '3.11.7', 'old.xml', '2025-01-01')",
                (run_id, run_id.split("@")[0], f"2025-01-{n:02d}T00:00:00Z", deepspeed, deepspeed_git),
            )
            conn.execute(
                "INSERT INTO results VALUES (?, 'llama', 'eager', 'fp32', 2, 'pass', '', '', '', '{}')", (run_id,)
            )
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {version}")
    return path


def _columns(store: Path, table: str) -> list[tuple]:
    with sqlite3.connect(store) as conn:
        return conn.execute(f"PRAGMA table_info({table})").fetchall()


@pytest.mark.parametrize("version", [1, 2])
def test_old_stores_are_migrated_to_the_current_schema(version, tmp_path, capsys):
    old = _old_store(
        tmp_path / "old.sqlite",
        version,
        [
            ("release@2025-01-01T00:00:00Z@runner-1", "0.19.8", "b9b025f"),  # the harness's HEAD, stamped by setup.py
            ("git@2025-01-02T00:00:00Z@runner-1", "0.18.1+abc1234", "abc1234"),  # a source build from git: kept
            ("plain@2025-01-03T00:00:00Z@runner-1", "0.19.7", ""),
        ],
    )
    before = old.read_bytes()
    with HistoryStore(old, create=False, read_only=True) as history:  # render, gate: a migrated copy in memory
        assert len(history.runs()) == 3 and history.triage_attempts() == []
    assert old.read_bytes() == before
    with HistoryStore(old, create=False) as history:
        runs = history.runs()
        assert history.bisections() == []
    assert [(r.versions.deepspeed_git, r.harness_git) for r in runs] == [("", ""), ("abc1234", ""), ("", "")]
    with sqlite3.connect(old) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    # The migrated tables are the ones a new store gets.
    with HistoryStore(tmp_path / "new.sqlite", create=True):
        pass
    for table in ("runs", "results", "bisections", "triage_attempts"):
        assert _columns(old, table) == _columns(tmp_path / "new.sqlite", table)

    # The old JUnit file of a migrated run imports as the same run (import applies the same rule).
    old_file = write_junit(
        tmp_path / "old.xml",
        [Cell("llama")],
        run_id="release@2025-01-01T00:00:00Z@runner-1",
        started="2025-01-01T00:00:00Z",
        deepspeed="0.19.8",
        deepspeed_git="b9b025f",
        harness_git=None,
    )
    assert main(["merge", str(old_file), "--store", str(old)]) == 0
    assert "0 new run(s), 0 new result(s) from 1 file(s); 0 skipped" in capsys.readouterr().out


def test_answers_stored_before_their_scope_was_kept_read_back_and_attach_as_their_mode_says(tmp_path):
    old = _old_store(tmp_path / "old.sqlite", 2, [("r@2025-01-01T00:00:00Z@runner-1", "0.19.8", "")])
    with sqlite3.connect(old) as conn:  # a schema-2 row: no suspects, confirmation, kind or searched range
        conn.execute(
            "INSERT INTO bisections VALUES ('llama', 'eager', 'fp32', 2, 'broken', 'deepspeed', '0.19.7', "
            "'0.19.8', 'transformers 4.44.0, torch 2.4.0', 'shard', 'X', '', '', NULL, '[]', '[]', "
            "'2025-01-02T00:00:00+00:00')"
        )
    with HistoryStore(old, create=False) as history:
        (stored,) = history.bisections()
    assert (stored.kind, stored.searched_older, stored.searched_newer, stored.confirmed_from) == ("", "", "", "")
    assert (stored.mode, stored.before, stored.after, stored.failure_class) == ("broken", "0.19.7", "0.19.8", "shard")
    with HistoryStore(old, create=False) as history:  # written and read back with the new fields
        history.add_bisection(replace(stored, kind="class-change", searched_older="0.19.0", searched_newer="0.19.8"))
        assert history.bisections()[1] == replace(
            stored, kind="class-change", searched_older="0.19.0", searched_newer="0.19.8"
        )


def test_a_new_store_migrates_by_the_columns_each_step_had(tmp_path, monkeypatch):
    """A new version axis adds its runs column in a later migration: schema 8's step reads the point columns of its
    time, not today's, or every new store fails there ("no such column: accelerate")."""
    from reports.store import schema

    monkeypatch.setattr(schema, "POINT_COLUMNS", f"{schema.POINT_COLUMNS}, accelerate")
    with HistoryStore(tmp_path / "new.sqlite", create=True) as history:
        assert history.runs() == []

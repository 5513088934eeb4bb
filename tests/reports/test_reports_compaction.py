"""Compaction of the history store (HistoryStore.compact, schema 6): old results keep their verdict and signature,
their detail (message, metrics) stays where a report reads it, each distinct text is stored once, and every report,
transition, "since", gate, publish and draft-issue output stays as it was."""

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

from reports.__main__ import main
from reports.analysis.history import analyse
from reports.outputs.model import DETAIL_KEYS, DETAILS_FILE, read_report, report_json
from reports.store.compaction import CompactionCounts
from reports.store.history_store import HistoryStore
from reports.store.schema import _MIGRATIONS, APPLICATION_ID, FIRST_SCHEMA, SCHEMA_VERSION

RELEASES = ("0.18.0", "0.19.0", "0.20.0")
RUNS_PER_RELEASE = 4
SESSIONS = {"nightly": "4.44.0", "compat": "4.45.0"}  # session -> the transformers it holds
OPT_TRACEBACK = (
    'Traceback (most recent call last):\n  File "deepspeed/module_inject/auto_tp.py", line 412\n'
    "logits_max_rel 0.3 > 0.01"
)


def run_id(session: str, day: int) -> str:
    return f"{session}@2025-01-{day:02d}T00:00:00Z@runner-1"


def nightlies(folder: Path) -> list[Path]:
    """Two sessions, four nightly runs at each of three DeepSpeed releases: llama passes, breaks at 0.19.0 (a
    traceback with the run's number in it) and is fixed at 0.20.0; gpt-neox changes failure class at 0.19.0; opt
    fails the same way every night (one traceback, stored once); bloom always passes, with metrics except in the
    newest run at each release (so the key metric the report shows there comes from the run before)."""
    files = []
    for session, transformers in SESSIONS.items():
        for n, deepspeed in enumerate(release for release in RELEASES for _ in range(RUNS_PER_RELEASE)):
            day = n + 1
            llama = (
                fail(
                    "llama",
                    "shard",
                    "AssertionError: heads 32 % tp 3 != 0",
                    message=f"Traceback ...\nAssertionError: heads 32 % tp 3 != 0 at step {day}",
                )
                if deepspeed == "0.19.0"
                else Cell("llama", metrics={"logits_max_abs": day * 1e-6})
            )
            neox = fail("gpt-neox", "forward" if deepspeed == "0.18.0" else "shard")
            cells = [
                llama,
                neox,
                fail("opt", "numerics", "logits_max_rel 0.3 > 0.01", message=OPT_TRACEBACK),
                Cell("bloom", metrics={} if day % RUNS_PER_RELEASE == 0 else {"logits_max_abs": day * 2e-6}),
            ]
            files.append(
                write_junit(
                    folder / f"{session}-{day:02d}.xml",
                    cells,
                    run_id=run_id(session, day),
                    started=f"2025-01-{day:02d}T00:00:00Z",
                    deepspeed=deepspeed,
                    transformers=transformers,
                    harness_git="c" * 40,
                )
            )
    return files


RESULTS = len(SESSIONS) * len(RELEASES) * RUNS_PER_RELEASE * 4


def merged(tmp_path: Path, *keep: str) -> Path:
    nightlies(tmp_path / "junit")
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store), *keep]) == 0
    return store


def detailed(store: Path) -> set[tuple[str, str]]:
    """(run id, model) of every result that kept its detail."""
    with sqlite3.connect(store) as conn:
        return set(
            conn.execute(
                "SELECT runs.run_id, cells.model FROM results JOIN runs ON runs.id = results.run "
                "JOIN cells ON cells.id = results.cell "
                "WHERE message IS NOT NULL OR metrics IS NOT NULL"
            )
        )


def everything_shown(store: Path, out: Path, capsys) -> dict:
    """What render, gate, publish and draft-issue make of the store: every file and every line they print (written
    to the same folder each time, so the paths they print compare too)."""
    shutil.rmtree(out, ignore_errors=True)
    capsys.readouterr()
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    report = report_json(read_report(out))
    report.pop("generated_at")
    shown = {"report": report, **{name: (out / name).read_text() for name in ("report.md", "supported-models.md")}}
    shown["gate"] = (
        main(["gate", "--baseline", "deepspeed=0.18.0", "--candidate", "deepspeed=0.19.0", "--store", str(store)]),
        capsys.readouterr().out,
    )
    assert main(["publish", "--store", str(store), "--out", str(out)]) == 0
    shown["publish"] = {str(path.relative_to(out)): path.read_text() for path in (out / "publish").rglob("*.md")}
    capsys.readouterr()
    assert main(["draft-issue", "--cell", "opt-eager-fp32-tp2", "--store", str(store), "--out", str(out)]) == 0
    shown["draft-issue"] = capsys.readouterr()
    with HistoryStore(store, create=False, read_only=True) as history:
        transitions = analyse(history.observations()).transitions
    shown["transitions"] = [
        (t.kind, t.cell, t.axis, t.before, t.after, t.before_status, t.after_status) for t in transitions
    ]
    return shown


def test_compaction_changes_no_verdict_transition_report_or_since(tmp_path, capsys):
    store = merged(tmp_path, "--keep-recent-runs", "1000")  # every run is recent: nothing compacted
    assert len(detailed(store)) == RESULTS
    full = everything_shown(store, tmp_path / "out", capsys)
    assert {t[0] for t in full["transitions"]} == {"broke", "fixed", "class-change"}
    assert full["report"]["failing_now"]["causes"] and "since" in full["report"]["failing_now"]["causes"][0]

    with HistoryStore(store, create=False) as history:
        counts = history.compact(keep_runs=2)
    assert counts.results == RESULTS - len(detailed(store)) > RESULTS / 3  # it did drop detail
    assert everything_shown(store, tmp_path / "out", capsys) == full


def full_regression(shown: dict) -> dict:
    return next(t for t in shown["report"]["regressions"] if t["held_fixed"].startswith("transformers 4.44.0"))


def test_dropping_a_transition_ends_detail_would_change_the_report(tmp_path, capsys):
    """What the previous test compares is sensitive to what compaction keeps: drop the detail of llama's last good
    run before it broke (the newest run at 0.18.0, which compaction keeps) and the report changes: the point's newest
    metrics (point_metrics) are gone, and the report shows none rather than an older run's."""
    store = merged(tmp_path, "--keep-recent-runs", "1000")
    full = everything_shown(store, tmp_path / "out", capsys)
    with sqlite3.connect(store) as conn:
        conn.execute(
            "UPDATE results SET message = NULL, metrics = NULL WHERE run = (SELECT id FROM runs WHERE "
            "run_id = ?) AND cell = (SELECT id FROM cells WHERE model = 'llama')",
            (run_id("nightly", 4),),
        )
    broken = everything_shown(store, tmp_path / "out", capsys)
    assert broken["report"] != full["report"]
    regression = full_regression(broken)
    assert full_regression(full)["before_status"]["key_metric"] is not None
    assert regression["before_status"]["key_metric"] is None


def test_detail_stays_at_recent_runs_and_every_points_ends_and_goes_elsewhere(tmp_path):
    store = merged(tmp_path, "--keep-recent-runs", "2")
    kept_days = {1, 4, 5, 8, 9, 12} | {
        11
    }  # each release's first and newest run (every transition's ends), the 2 newest
    expected = {
        (run_id(session, day), model)
        for session in SESSIONS
        for day in kept_days
        for model in ("llama", "gpt-neox", "opt", "bloom")
    }
    expected |= {(run_id(session, day), "bloom") for session in SESSIONS for day in (3, 7)}  # newest with metrics
    assert detailed(store) == expected
    with HistoryStore(store, create=False) as history:
        observations = {(o.run.run_id, o.cell.model): o.result for o in history.observations()}
    dropped = observations[run_id("nightly", 6), "llama"]  # inside 0.19.0's four runs
    assert (dropped.outcome, dropped.failure_class, dropped.signature, dropped.message, dropped.metrics) == (
        "fail",
        "shard",
        "AssertionError: heads 32 % tp 3 != 0",
        "",
        {},
    )
    first_bad = observations[run_id("nightly", 5), "llama"]
    assert first_bad.message == "Traceback ...\nAssertionError: heads 32 % tp 3 != 0 at step 5"
    assert observations[run_id("nightly", 4), "llama"].metrics == {"logits_max_abs": 4e-6}  # last good


def test_each_distinct_message_and_signature_is_stored_once(tmp_path):
    store = merged(tmp_path, "--keep-recent-runs", "1000")
    with sqlite3.connect(store) as conn:
        texts, distinct = conn.execute("SELECT count(*), count(DISTINCT text) FROM texts").fetchone()
        opt = conn.execute(
            "SELECT count(*), count(DISTINCT message) FROM results WHERE cell = "
            "(SELECT id FROM cells WHERE model = 'opt')"
        ).fetchone()
        stored = conn.execute("SELECT count(*) FROM texts WHERE text = ?", (OPT_TRACEBACK,)).fetchone()[0]
    assert texts == distinct
    # "", 2 gpt-neox signatures + their 2 tracebacks, opt's signature and traceback, llama's signature and its 8
    # tracebacks (one per day it failed, the same day in both sessions)
    assert texts == 1 + 4 + 2 + 1 + 4
    assert opt == (24, 1) and stored == 1

    with HistoryStore(store, create=False) as history:  # compaction deletes the texts no result refers to any more
        counts = history.compact(keep_runs=2)
    with sqlite3.connect(store) as conn:
        left = {text for (text,) in conn.execute("SELECT text FROM texts")}
    assert counts.texts == 2 and "Traceback ...\nAssertionError: heads 32 % tp 3 != 0 at step 6" not in left
    assert "Traceback ...\nAssertionError: heads 32 % tp 3 != 0 at step 5" in left


def test_compacting_after_every_merge_and_rebuilding_then_compacting_give_the_same_store(tmp_path):
    files = nightlies(tmp_path / "junit")
    store = tmp_path / "history.sqlite"
    for path in sorted(files, key=lambda p: p.name.split("-")[1]):  # night after night, both sessions
        assert main(["merge", str(path), "--store", str(store), "--keep-recent-runs", "2"]) == 0
    with HistoryStore(store, create=False) as history:
        nightly = history.observations()
        assert history.compact(keep_runs=2) == CompactionCounts(0, 0)  # nothing new since the last merge: nothing to do
    assert len(detailed(store)) < RESULTS

    store.unlink()
    assert main(["rebuild", "--store", str(store), "--keep-recent-runs", "2"]) == 0
    with HistoryStore(store, create=False) as history:
        assert history.observations() == nightly  # verdicts, signatures, and the same messages and metrics kept


def _schema_5_store(path: Path) -> None:
    """A store as schema 5 wrote it (the migrations up to 5, as an older release ran them), holding two runs that
    failed with the same long message."""
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in FIRST_SCHEMA:
        conn.execute(statement)
    for version in range(1, 5):
        for step in _MIGRATIONS[version]:
            step(conn) if callable(step) else conn.execute(step)
    for day in (1, 2):
        conn.execute(
            "INSERT INTO runs VALUES (?, 'nightly', 'runner-1', ?, 'cpu', 'gloo', '0.19.0', '', '4.44.0', "
            "'2.4.0', '3.11.7', 'old.xml', '2025-01-03', ?)",
            (run_id("nightly", day), f"2025-01-{day:02d}T00:00:00Z", "c" * 40),
        )
        conn.execute(
            "INSERT INTO results VALUES (?, 'opt', 'eager', 'fp32', 2, 'fail', 'numerics', "
            "'logits_max_rel 0.3 > 0.01', ?, '{}')",
            (run_id("nightly", day), OPT_TRACEBACK),
        )
        conn.execute(
            "INSERT INTO results VALUES (?, 'bloom', 'eager', 'fp32', 2, 'pass', '', '', '', ?)",
            (run_id("nightly", day), f'{{"logits_max_abs": {day}e-06}}'),
        )
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 5")
    conn.close()


def test_a_schema_5_store_is_migrated_with_every_result_and_text_once(tmp_path):
    old = tmp_path / "old.sqlite"
    _schema_5_store(old)
    before = old.read_bytes()
    with HistoryStore(old, create=False, read_only=True) as history:  # render's view: migrated in memory
        in_memory = history.observations()
    assert old.read_bytes() == before
    with HistoryStore(old, create=False) as history:
        migrated = history.observations()
    assert migrated == in_memory
    assert [
        (o.run.run_id, o.cell.model, o.result.outcome, o.result.message, o.result.metrics, o.run.harness_git)
        for o in migrated
    ] == [
        (run_id("nightly", day), model, outcome, message, metrics, "c" * 40)
        for day in (1, 2)
        for model, outcome, message, metrics in (
            ("bloom", "pass", "", {"logits_max_abs": day * 1e-6}),
            ("opt", "fail", OPT_TRACEBACK, {}),
        )
    ]
    with sqlite3.connect(old) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 12
        assert conn.execute("SELECT count(*) FROM texts WHERE text = ?", (OPT_TRACEBACK,)).fetchone()[0] == 1
    with HistoryStore(tmp_path / "new.sqlite", create=True):
        pass
    for table in ("runs", "cells", "results", "texts", "compaction", "points", "result_groups", "point_metrics"):
        with sqlite3.connect(old) as a, sqlite3.connect(tmp_path / "new.sqlite") as b:
            assert (
                a.execute(f"PRAGMA table_info({table})").fetchall()
                == b.execute(f"PRAGMA table_info({table})").fetchall()
            ), table


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_keep_recent_runs_must_be_a_positive_number(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["merge", str(tmp_path), "--keep-recent-runs", value])
    assert exited.value.code == 2
    assert f"'{value}' is not a number of runs; give a whole number of 1 or more" in capsys.readouterr().err


def test_report_json_holds_the_first_screen_and_names_the_file_with_the_rest(tmp_path):
    store, out = merged(tmp_path), tmp_path / "out"
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    first_screen = json.loads((out / "report.json").read_text())
    assert first_screen["details"] == {"file": DETAILS_FILE, "keys": list(DETAIL_KEYS)}
    assert not set(DETAIL_KEYS) & set(first_screen) and first_screen["root_causes"] and first_screen["failing_now"]
    whole = report_json(read_report(out))
    assert set(DETAIL_KEYS) <= set(whole) and len(whole["matrices"]) == 6  # 3 releases x 2 sessions
    regression = next(cause for cause in first_screen["root_causes"] if cause["kind"] == "broke")
    assert {whole["regressions"][i]["cell"] for i in regression["members"]} == {"llama-eager-fp32-tp2"}

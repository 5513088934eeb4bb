"""The report reads per-point aggregates (reports/store/aggregates.py), computed in SQL by HistoryStore.aggregates: they
must say what the results themselves say — the same groups, metrics, recent runs and hub ids as `aggregate` finds
in every result held in memory, hence the same report — on a store with flaky points, ties in start time, a
verdict that changed with the harness, transitions and compacted old runs."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from reports.__main__ import main
from reports.analysis.history import analyse, analyse_aggregates
from reports.outputs.model import build_report, read_report, report_json
from reports.store.aggregates import Aggregates, aggregate
from reports.store.history_store import HistoryStore
from reports.store.records import CellKey, CellResult, Observation, Run, Versions

RELEASES = ("0.18.0", "0.19.0", "0.20.0")
NIGHTS_PER_RELEASE = 3
SESSIONS = ("compat", "nightly")
LLAMA, BLOOM, GPT, OPT = (CellKey(model, "eager", "fp32", 2) for model in ("llama", "bloom", "gpt2", "opt"))
QWEN = CellKey("qwen2.faithful-7b", "eager", "fp32", 2)
HUB_IDS = ("Qwen/Qwen2-7B",)


def night_results(run: Run, release: str, night: int) -> list[CellResult]:
    """llama breaks at 0.19.0 (shard) and is fixed at 0.20.0; bloom at 0.18.0 in the nightly session passes twice
    and fails twice, once shard, once forward (flaky; two classes as common: the first listed is shown); gpt2 passes
    under harness a… and fails under harness b… at 0.20.0 (a harness change); opt fails the same way throughout;
    qwen2's faithful cell stands for a hub id. Passes carry metrics, except every third night's."""

    def passed(cell: CellKey) -> CellResult:
        metrics = {} if night % 3 == 2 else {"logits_max_abs": (night + 1) * 1e-6, "load_s": 1.0 + night}
        return CellResult(run.run_id, cell, "pass", metrics=metrics)

    def failed(cell: CellKey, failure_class: str, signature: str) -> CellResult:
        return CellResult(run.run_id, cell, "fail", failure_class, signature, f"Traceback (night {night})\n{signature}")

    llama = failed(LLAMA, "shard", "AssertionError: heads 32 % tp 3 != 0") if release == "0.19.0" else passed(LLAMA)
    bloom = passed(BLOOM)
    if run.session == "nightly" and release == "0.18.0" and night in (1, 2):
        bloom = failed(BLOOM, ("shard", "forward")[night - 1], f"RuntimeError: flaky {night}")
    gpt = failed(GPT, "numerics", "logits_max_rel 0.3 > 0.01") if run.harness_git.startswith("b") else passed(GPT)
    qwen = CellResult(run.run_id, QWEN, "pass", checkpoints=HUB_IDS)
    return [llama, bloom, gpt, failed(OPT, "forward", "TypeError: forward() got an unexpected keyword"), qwen]


def history_runs() -> list[tuple[Run, list[CellResult]]]:
    """Both sessions start together each night (ties in start time, told apart by run id); the nightly session's
    harness commit changes for the last two nights of 0.20.0."""
    runs = []
    for night, release in enumerate(release for release in RELEASES for _ in range(NIGHTS_PER_RELEASE)):
        started = f"2026-01-{night + 1:02d}T00:00:00Z"
        for session in SESSIONS:
            harness = "b" * 40 if session == "nightly" and night >= len(RELEASES) * NIGHTS_PER_RELEASE - 2 else "a" * 40
            run = Run(
                f"{session}@{started}@runner-1",
                session,
                "runner-1",
                started,
                "cpu",
                "gloo",
                Versions(release, "4.44.0", "2.4.0", "3.11.7"),
                harness,
            )
            runs.append((run, night_results(run, release, night % NIGHTS_PER_RELEASE)))
    return runs


@pytest.fixture
def store(tmp_path) -> Path:
    path = tmp_path / "history.sqlite"
    with HistoryStore(path, create=True) as history:
        history.import_runs(history_runs(), source=Path("synthetic"))
        history.compact(keep_runs=2)  # every earlier run loses its detail, except where a report reads it
    return path


def test_the_stores_aggregates_are_what_every_result_says(store):
    from_sql, observations = same_aggregates(store)
    # 2 runs per night, 5 cells each, 9 nights: the groups hold every result once; the recent runs are the last night's
    # and the one before, of each session.
    assert sum(group.count for group in from_sql.groups) == len(observations) == 2 * 5 * 9
    assert {obs.run.run_id for obs in from_sql.recent} == {
        f"{s}@2026-01-{d:02d}T00:00:00Z@runner-1" for s in SESSIONS for d in (8, 9)
    }
    # Compaction dropped the metrics of older runs, yet each point keeps its newest that had any.
    llama_020 = from_sql.metrics[LLAMA, Versions("0.20.0", "4.44.0", "2.4.0", "3.11.7"), "a" * 40]
    assert (llama_020.run_id, llama_020.metrics["logits_max_abs"]) == ("compat@2026-01-08T00:00:00Z@runner-1", 2e-6)


def test_the_history_and_report_from_sql_are_those_of_every_result(store):
    with HistoryStore(store, create=False, read_only=True) as history:
        aggregates, observations = history.aggregates(), history.observations()
    from_sql, in_memory = analyse_aggregates(aggregates), analyse(observations)
    assert from_sql == in_memory
    report = {
        key: value
        for key, value in report_json(build_report(from_sql, aggregates, None, {})).items()
        if key != "generated_at"
    }
    expected = report_json(build_report(in_memory, aggregate(observations), None, {}))
    assert report == {key: value for key, value in expected.items() if key != "generated_at"}


def test_the_rendered_report_states_the_facts_of_the_history(store, tmp_path):
    out = tmp_path / "out"
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    report = report_json(read_report(out))
    flaky = {entry["cell"]: entry for entry in report["flaky"]}
    assert list(flaky) == [BLOOM.id]
    # both sessions pass 4 times; two failures, one shard, one forward: the first listed (by run id) is shown
    assert (flaky[BLOOM.id]["passes"], flaky[BLOOM.id]["fails"], flaky[BLOOM.id]["failure_class"]) == (4, 2, "shard")
    assert [(t["cell"], t["before"], t["after"]) for t in report["regressions"]] == [(LLAMA.id, "0.18.0", "0.19.0")]
    assert [(t["cell"], t["before"], t["after"]) for t in report["fixes"]] == [(LLAMA.id, "0.19.0", "0.20.0")]
    (change,) = report["harness_changes"]
    assert change["cell"] == GPT.id and change["change"].startswith(
        "pass ×4 at harness aaaaaaaaaa → fail ×2 at harness"
    )
    # opt failed in the first run, which compaction left without its message: "since the first run" all the same
    (opt,) = [c for c in report["failing_now"]["causes"] if c["cells"] == [OPT.id]]
    assert opt["since"]["text"] == "since the first run"
    assert opt["since"]["run"] == "compat@2026-01-01T00:00:00Z@runner-1"
    # the latest matrix's key metric is the newest measured result's (night 8: the newest, night 9, measured none)
    latest = {entry["cell"]: entry for row in report["matrix"]["rows"] for entry in row["cells"].values()}
    assert latest[LLAMA.id]["key_metric"] == 2e-6
    assert report["checkpoints"]["faithful"][0]["checkpoint"] == HUB_IDS[0]
    timeline = {cell["cell"]: cell for cell in report["timeline"]["cells"]}
    newest_set = report["timeline"]["version_sets"].index(report["latest_label"])
    assert timeline[LLAMA.id]["run_counts"][newest_set] == 6  # 3 nights × 2 sessions
    assert timeline[LLAMA.id]["newest_runs"][newest_set] == "nightly@2026-01-09T00:00:00Z@runner-1"
    since = report["since_previous_run"]
    assert [s["previous_run"] for s in since["sessions"]] == [f"{s}@2026-01-08T00:00:00Z@runner-1" for s in SESSIONS]
    # gpt2 failed in the nightly session's last two runs (the newer harness): still failing, no new failure
    kinds = {cause["kind"]: cause["cells"] for cause in since["causes"]}
    assert GPT.id in kinds["still failing"] and "new failure" not in kinds
    assert json.loads((out / "report.json").read_text())["details"]["file"] == "report-details.json"


def same_aggregates(path: Path) -> tuple[Aggregates, list[Observation]]:
    """The store's aggregates (kept by import) are those of every result it holds, computed in memory; both back."""
    with HistoryStore(path, create=False, read_only=True) as history:
        from_store, observations = history.aggregates(), history.observations()
    in_memory = aggregate(observations)
    assert sorted(map(repr, from_store.groups)) == sorted(map(repr, in_memory.groups))
    assert from_store.metrics == in_memory.metrics
    assert from_store.recent == in_memory.recent
    assert from_store.checkpoints == in_memory.checkpoints
    return from_store, observations


def test_the_aggregates_do_not_depend_on_the_order_runs_came_in(tmp_path):
    """Merges bring runs in any order (a re-run, an older session's artifacts, a rebuild session by session): each
    group's first listed, earliest and newest run and each point's newest metrics come out the same."""
    import random

    runs = history_runs()
    random.Random(25).shuffle(runs)
    path = tmp_path / "shuffled.sqlite"
    with HistoryStore(path, create=True) as history:
        for run in runs:
            history.import_runs([run], source=Path("synthetic"))
        # a continued run: its last cell comes in a second import
        history.import_runs([(runs[0][0], runs[0][1][:-1])], source=Path("again"))
    same_aggregates(path)


def test_a_schema_7_store_gets_its_aggregates_from_its_results(store, tmp_path):
    """Schema 8 adds the aggregate tables: migrating a store that lacks them fills them from its (compacted) results,
    in a copy in memory for render (the file stays as it is) and in the file for merge."""
    import sqlite3

    with sqlite3.connect(store) as conn:
        schema_8_to_12 = (
            "point_metrics",
            "result_groups",
            "points",
            "archive_entries",
            "cell_causes",
            "remedy_results",
        )
        for table in schema_8_to_12:
            conn.execute(f"DROP TABLE {table}")
        conn.execute("ALTER TABLE runs DROP COLUMN trusted")
        conn.execute("PRAGMA user_version = 7")
    before = store.read_bytes()
    same_aggregates(store)  # read-only: migrated in memory
    assert store.read_bytes() == before
    with HistoryStore(store, create=False):
        pass
    with sqlite3.connect(store) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 12
        assert conn.execute("SELECT sum(count) FROM result_groups").fetchone()[0] == 2 * 5 * 9
    same_aggregates(store)


def test_render_leaves_the_cycle_collector_on_as_it_found_it(store, tmp_path):
    """render turns the cycle collector off while it builds the report
    (reports.commands.render.without_cycle_collection);
    a process that goes on afterwards (tests, a caller of main) gets it back, also when render fails."""
    assert main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    assert gc.isenabled()
    assert main(["render", "--store", str(tmp_path / "missing.sqlite"), "--out", str(tmp_path / "out")]) == 2
    assert gc.isenabled()

"""The results archive (reports/store/archive.py): every merged run's raw results, append-only, and the history store
rebuilt from it with the same history."""

import json
import tarfile
from dataclasses import replace

import pytest
from reports_testkit import Cell, fail, issue_18_store, write_junit

from reports.__main__ import main
from reports.analysis.history import analyse
from reports.store.archive import CELLS_MEMBER, JUNIT_MEMBER, RECORDS_MEMBER, ResultsArchive, _tar_gz, entry_json
from reports.store.door import admit, redactor
from reports.store.history_store import HistoryStore
from reports.store.records import CellKey, TriageAttempt


def history_of(store):
    """Everything a report is made of: runs, every observation (verdict, signature, message, metrics) and the
    analysed history (statuses, transitions)."""
    with HistoryStore(store, create=False) as history:
        runs, observations = history.runs(), history.observations()
    return runs, observations, analyse(observations)


def archive_files(archive):
    return sorted(str(path.relative_to(archive)) for path in archive.rglob("*.tar.gz"))


def members(entry):
    with tarfile.open(entry, "r:gz") as tar:
        return {member.name: tar.extractfile(member).read() for member in tar}


def test_deleted_store_is_rebuilt_from_the_archive_with_the_same_history(scenario, tmp_path, capsys):
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    files = sorted(scenario.glob("*.xml"))
    for path in files:  # one nightly merge after another
        assert main(["merge", str(path), "--store", str(store)]) == 0
    before = history_of(store)
    assert len(before[0]) == len(files) == len(archive_files(archive)) == 6 and before[2].transitions

    store.unlink()  # the cache is gone
    capsys.readouterr()
    assert main(["rebuild", "--archive", str(archive), "--store", str(store)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{store}: 6 new run(s), {len(before[1])} new result(s) from 6 of 6 archive entries in {archive}, "
        "0 new answer(s)"
    )
    assert history_of(store) == before

    # the comparison sees a lost run: without its entry the rebuilt history differs
    store.unlink()
    sorted(archive.rglob("*.tar.gz"))[2].unlink()
    assert main(["rebuild", "--archive", str(archive), "--store", str(store)]) == 0
    assert history_of(store) != before


def test_bisect_and_triage_answers_are_archived_and_rebuilt(tmp_path, capsys):
    """issue #18's store: 45 failing cells, 44 answered by one triage bisection and its confirmations; plus a
    question triage could not answer. The next merge archives them; a rebuilt store answers the same."""
    store = issue_18_store(tmp_path)
    with HistoryStore(store, create=False) as history:
        history.add_triage_attempt(
            TriageAttempt(
                CellKey("cohere", "eager", "fp32", 3),
                "deepspeed",
                "fixed",
                "0.18.9",
                "0.19.8",
                (("transformers", "5.24.0"),),
                "every step untestable",
                "2026-12-05T01:00:00+00:00",
            )
        )
        bisections, attempts = history.bisections(), history.triage_attempts()
    archive = tmp_path / "archive"
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "issue18"), "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{archive}: 0 new archive entries, 45 new answer(s)"
    assert len(list((archive / "answers").glob("bisection-*.json"))) == len(bisections) == 44
    before = history_of(store)
    assert main(["merge", str(tmp_path / "issue18"), "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{archive}: 0 new archive entries, 0 new answer(s)"

    store.unlink()
    assert main(["rebuild", "--store", str(store)]) == 0
    assert capsys.readouterr().out.strip().endswith(", 45 new answer(s)")
    with HistoryStore(store, create=False) as history:
        assert sorted(history.bisections(), key=repr) == sorted(bisections, key=repr)
        assert history.triage_attempts() == attempts
        runs, observations = history.runs(), history.observations()
        answered = analyse(observations, None, history.bisections(), history.triage_attempts())
    assert (runs, observations) == before[:2]
    original = analyse(observations, None, bisections, attempts)  # answers recorded at one time may change order
    assert replace(answered, bisections=sorted(answered.bisections, key=repr)) == replace(
        original, bisections=sorted(original.bisections, key=repr)
    )
    assert sum(t.bisection is not None for t in answered.transitions) >= 44
    assert main(["rebuild", "--store", str(store)]) == 0  # nothing twice
    assert capsys.readouterr().out.strip().endswith(", 0 new answer(s)")
    with HistoryStore(store, create=False) as history:
        assert len(history.bisections()) == 44 and len(history.triage_attempts()) == 1

    # a damaged answer is skipped with one line naming it (the rest rebuilds), and verify fails on it
    next((archive / "answers").glob("triage-attempt-*.json")).write_text('{"cell": {"model": "x"}}')
    store.unlink()
    assert main(["rebuild", "--store", str(store)]) == 0
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "triage-attempt-" in err and "not a readable archived answer" in err and len(err.splitlines()) == 1
    assert captured.out.strip().endswith("44 new answer(s); 1 skipped (above)")
    assert main(["verify", "--store", str(store)]) == 1
    assert "not a readable archived answer" in capsys.readouterr().err


def test_verify_finds_runs_and_answers_a_lost_store_would_lose(session, tmp_path, capsys):
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    assert main(["merge", str(session([Cell("llama")])), str(session([Cell("opt")])), "--store", str(store)]) == 0
    assert main(["verify", "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"{archive}: 2 of 2 entries read back valid",
        f"{store}: all 2 run(s) and 0 answer(s) are in the archive {archive}",
    ]

    next(archive.rglob("session2@*.tar.gz")).unlink()  # an entry lost (or a run merged before the archive existed)
    with HistoryStore(store, create=False) as history:  # an answer recorded after the last merge
        history.add_triage_attempt(
            TriageAttempt(
                CellKey("llama", "eager", "fp32", 2),
                "deepspeed",
                "broken",
                "0.1",
                "0.2",
                (),
                "every step untestable",
                "2026-01-01T00:00:00+00:00",
            )
        )
    assert main(["verify", "--store", str(store)]) == 1
    err = capsys.readouterr().err.strip()
    entry = "session2/session2@2025-01-02T00%3A00%3A00Z@runner-1.1.tar.gz"
    assert err.splitlines()[0] == (
        f"error: {archive / entry}: recorded in {store} but no longer in the archive; restore it from the data "
        "branch's history"
    )
    assert err.splitlines()[1].startswith(
        f"error: {store}: 1 run(s) (session2@2025-01-02T00:00:00Z@runner-1) and 1 answer(s) are not "
        f"in the archive {archive}"
    )
    assert len(err.splitlines()) == 2
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0  # merging again repairs both
    assert main(["verify", "--store", str(store)]) == 0


def test_a_stale_store_is_brought_up_to_date_and_rebuild_is_idempotent(scenario, tmp_path, capsys):
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    files = sorted(scenario.glob("*.xml"))
    assert main(["merge", str(files[0]), "--store", str(tmp_path / "old.sqlite"), "--archive", str(archive)]) == 0
    assert main(["merge", *map(str, files), "--store", str(store)]) == 0
    stale = tmp_path / "old.sqlite"  # an older cache: it has the first run only
    capsys.readouterr()
    assert main(["rebuild", "--archive", str(archive), "--store", str(stale)]) == 0
    assert "5 new run(s)" in capsys.readouterr().out
    assert history_of(stale) == history_of(store)
    assert main(["rebuild", "--archive", str(archive), "--store", str(stale)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{stale}: 0 new run(s), 0 new result(s) from 0 of 6 archive entries in {archive}, 0 new answer(s)"
    )


def test_merging_again_adds_nothing_and_a_changed_verdict_is_an_error(session, tmp_path, capsys):
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    first = session([Cell("llama"), fail("opt", "shard")])
    assert main(["merge", str(first), "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{archive}: 1 new archive entry, 0 new answer(s)"
    entry = archive / "session1" / "session1@2025-01-01T00%3A00%3A00Z@runner-1.1.tar.gz"
    assert archive_files(archive) == [str(entry.relative_to(archive))]
    written = entry.read_bytes()

    assert main(["merge", str(first), str(tmp_path / "junit"), "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{archive}: 0 new archive entries, 0 new answer(s)"
    assert archive_files(archive) == [str(entry.relative_to(archive))] and entry.read_bytes() == written

    # the same run id comes back with opt passing: an error naming the cell, and nothing changes
    changed = write_junit(
        tmp_path / "changed" / "s.xml",
        [Cell("llama"), Cell("opt")],
        run_id="session1@2025-01-01T00:00:00Z@runner-1",
        started="2025-01-01T00:00:00Z",
    )
    before = history_of(store)
    assert main(["merge", str(changed), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"conflict {changed}: run 'session1@2025-01-01T00:00:00Z@runner-1' cell opt-eager-fp32-tp2 "
        "is pass here but fail (shard: ShardError: broken) in the archive"
    )
    assert err.splitlines()[-1].startswith("error: 1 file(s) contradict runs already in")
    assert archive_files(archive) == [str(entry.relative_to(archive))] and entry.read_bytes() == written
    assert history_of(store) == before

    # other provenance under the same run id: an error as well
    moved = write_junit(
        tmp_path / "moved" / "s.xml",
        [Cell("llama")],
        host="elsewhere",
        run_id="session1@2025-01-01T00:00:00Z@runner-1",
        started="2025-01-01T00:00:00Z",
    )
    assert main(["merge", str(moved), "--store", str(store)]) == 2
    assert "is archived in" in capsys.readouterr().err


def test_a_continued_run_adds_an_attempt_with_its_new_cells(tmp_path, capsys):
    """A run interrupted, merged, then continued under the same run id: the new cells are attempt 2."""
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    run = {"run_id": "nightly@2025-03-01T00:00:00Z@vm", "started": "2025-03-01T00:00:00Z"}
    partial = write_junit(tmp_path / "a" / "nightly.xml", [Cell("llama")], **run)
    complete = write_junit(tmp_path / "b" / "nightly.xml", [Cell("llama"), fail("opt", "forward")], **run)
    assert main(["merge", str(partial), "--store", str(store)]) == 0
    assert main(["merge", str(complete), str(partial), "--store", str(store)]) == 0
    assert archive_files(archive) == [
        "nightly/nightly@2025-03-01T00%3A00%3A00Z@vm.1.tar.gz",
        "nightly/nightly@2025-03-01T00%3A00%3A00Z@vm.2.tar.gz",
    ]
    before = history_of(store)
    assert len(before[1]) == 2
    store.unlink()
    assert main(["rebuild", "--store", str(store)]) == 0  # the archive next to the store by default
    assert history_of(store) == before


def test_an_entry_holds_the_runs_validated_records_never_the_raw_bytes(tmp_path):
    """Format 2: one member, the run's records as they passed the door (the other runs' cells.jsonl lines and harness
    self-tests are not the run's), as canonical JSON; the same input gives the same bytes."""
    results = tmp_path / "results"
    junit = write_junit(
        results / "junit" / "nightly.xml",
        [Cell("llama", metrics={"logits_max_abs": 1e-6}), fail("opt", "shard")],
        run_id="nightly@2026-01-02T00:00:00Z@vm",
        started="2026-01-02T00:00:00Z",
    )
    records = [
        {"run": {"id": "nightly@2026-01-01T00:00:00Z@vm"}, "cell": {"id": "llama-eager-fp32-tp2"}, "outcome": "pass"},
        {
            "run": {"id": "nightly@2026-01-02T00:00:00Z@vm"},
            "cell": {"id": "opt-eager-fp32-tp2"},
            "outcome": "fail",
            "failure_class": "timeout",
            "faults": ["hang"],
        },
    ]
    (results / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"cut sho')
    for store in ("one/history.sqlite", "two/history.sqlite"):
        assert main(["merge", str(results / "junit"), "--store", str(tmp_path / store)]) == 0
    one, two = (sorted((tmp_path / folder / "archive").rglob("*.tar.gz")) for folder in ("one", "two"))
    assert len(one) == 1 and one[0].read_bytes() == two[0].read_bytes()  # the same input, the same bytes
    content = members(one[0])
    assert list(content) == [RECORDS_MEMBER]
    (records,) = admit(junit, redactor())
    assert content[RECORDS_MEMBER] == entry_json(records)
    stored = json.loads(content[RECORDS_MEMBER])
    assert stored["format"] == 2 and stored["run"]["run_id"] == "nightly@2026-01-02T00:00:00Z@vm"
    assert [(r["cell"]["model"], r["outcome"], r["metrics"]) for r in stored["results"]] == [
        ("llama", "pass", {"logits_max_abs": 1e-6}),
        ("opt", "fail", {}),
    ]
    assert (
        ResultsArchive(tmp_path / "one" / "archive").read(ResultsArchive(tmp_path / "one" / "archive").entries()[0])
        == records
    )


def test_an_entry_of_format_1_still_rebuilds_through_the_door(session, tmp_path, capsys):
    """Entries written before format 2 (the JUnit byte for byte, cells.jsonl lines) are read back through the same
    door as a merged file: the same runs, redacted and validated; nothing in the history is lost."""
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    junit = session([Cell("llama"), fail("opt", "shard", "ShardError: broken with hf_" + "Zq8vXw3KpL2mNj7RtY5cBd")])
    assert main(["merge", str(junit), "--store", str(store)]) == 0
    before = history_of(store)
    (entry,) = archive.rglob("*.tar.gz")
    entry.unlink()
    entry.write_bytes(_tar_gz({JUNIT_MEMBER: junit.read_bytes(), CELLS_MEMBER: b""}))  # as format 1 wrote it
    store.unlink()
    assert main(["rebuild", "--store", str(store)]) == 0
    assert history_of(store) == before
    assert "Zq8vXw3K" not in str(history_of(store)[1]) and "***" in str(history_of(store)[1])
    assert main(["verify", "--store", str(store)]) == 0


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda entry: entry.write_bytes(entry.read_bytes()[:40]), "not a readable archive entry"),
        (lambda entry: entry.write_bytes(b"garbage" * 100), "not a readable archive entry"),
        (lambda entry: entry.rename(entry.with_name("other@run.1.tar.gz")), "not 'other@run': the entry was renamed"),
        (
            lambda entry: entry.write_bytes(_tar_gz({RECORDS_MEMBER: b'{"format": 2, "run": {}}'})),
            "records.json is not a run's records",
        ),
        (
            lambda entry: entry.write_bytes(
                _tar_gz({RECORDS_MEMBER: members(entry)[RECORDS_MEMBER].replace(b'"tp":2', b'"tp":99999999999')})
            ),
            "its records are not what merge lets in: cell llama-eager-fp32-tp99999999999: cell.tp=99999999999 is not",
        ),
        (lambda entry: entry.write_bytes(_tar_gz({"notes.txt": b"x"})), "holds neither records.json"),
    ],
)
def test_a_damaged_entry_is_skipped_by_rebuild_and_named_by_verify(session, tmp_path, capsys, damage, expected):
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(session([Cell("llama")])), str(session([Cell("opt")])), "--store", str(store)]) == 0
    damage(sorted((tmp_path / "archive").rglob("*.tar.gz"))[0])
    assert main(["verify", "--store", str(store)]) == 1  # the store it was recorded in sees the damage
    err = capsys.readouterr().err
    assert expected in err, err
    store.unlink()
    assert main(["rebuild", "--store", str(store)]) == 0  # the other run rebuilds; the damaged one is named
    captured = capsys.readouterr()
    assert expected in captured.err and len(captured.err.strip().splitlines()) == 1
    assert "1 new run(s)" in captured.out and "1 skipped (above)" in captured.out
    with HistoryStore(store, create=False) as history:
        assert [run.run_id for run in history.runs()] == ["session2@2025-01-02T00:00:00Z@runner-1"]
    assert main(["verify", "--store", str(store)]) == 1
    assert expected in capsys.readouterr().err


def test_verify_finds_an_entry_changed_since_it_was_merged(session, tmp_path, capsys):
    """A valid entry replaced by other valid records (the history rewritten) differs from the hash recorded."""
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(session([fail("llama", "shard")])), "--store", str(store)]) == 0
    (entry,) = (tmp_path / "archive").rglob("*.tar.gz")
    forged = (
        members(entry)[RECORDS_MEMBER]
        .replace(b'"outcome":"fail"', b'"outcome":"pass"')
        .replace(b'"failure_class":"shard"', b'"failure_class":""')
    )
    entry.write_bytes(_tar_gz({RECORDS_MEMBER: forged}))
    assert main(["verify", "--store", str(store)]) == 1
    assert "differs from the" in capsys.readouterr().err
    entry.unlink()
    assert main(["verify", "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert f"recorded in {store} but no longer in the archive" in err and "1 run(s)" in err


def test_rebuild_never_leaves_a_half_imported_store(scenario, tmp_path, monkeypatch):
    """An import that dies midway (here: the fourth entry) leaves the store as it was: one transaction."""
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(scenario), "--store", str(store)]) == 0
    store.unlink()
    imported = []
    real = HistoryStore.import_runs

    def dies_on_the_fourth(self, runs, source):
        imported.append(source)
        if len(imported) == 4:
            raise KeyboardInterrupt  # a kill, not an error rebuild handles
        return real(self, runs, source)

    monkeypatch.setattr(HistoryStore, "import_runs", dies_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        main(["rebuild", "--store", str(store)])
    with HistoryStore(store, create=False) as history:
        assert history.runs() == []
    monkeypatch.setattr(HistoryStore, "import_runs", real)
    assert main(["rebuild", "--store", str(store)]) == 0
    with HistoryStore(store, create=False) as history:
        assert len(history.runs()) == 6


def test_rebuild_without_an_archive_says_where_it_looked(tmp_path, capsys):
    assert main(["rebuild", "--archive", str(tmp_path / "nowhere"), "--store", str(tmp_path / "s.sqlite")]) == 2
    assert f"{tmp_path / 'nowhere'}: no results archive here" in capsys.readouterr().err


def test_archive_entries_are_listed_in_order(session, tmp_path):
    for _ in range(3):
        session([Cell("llama")])
    assert main(["merge", str(tmp_path / "junit"), "--store", str(tmp_path / "history.sqlite")]) == 0
    entries = ResultsArchive(tmp_path / "archive").entries()
    assert [(entry.run_id, entry.attempt) for entry in entries] == [
        (f"session{n}@2025-01-0{n}T00:00:00Z@runner-1", 1) for n in (1, 2, 3)
    ]


CAUSE = {
    "cause.key": "left whole|norm",
    "cause.words": "`self_attn.q_norm.weight` (width of the split `self_attn.q_proj`, 256) left whole",
    "cause.whose": "autotp",
    "broke_at.path": "model.layers.0.self_attn.q_norm",
    "broke_at.module_class": "Olmo2RMSNorm",
    "broke_at.layer_class": "",
    "broke_at.how": "raised",
    "broke_at.origin": "model.layers.0.self_attn.q_norm",
    "broke_at.origin_class": "Olmo2RMSNorm",
    "broke_at.detail": "",
}


def test_a_rebuilt_store_keeps_each_failures_cause_and_break_point(tmp_path, capsys):
    """Causes travel in the archive's records (format 2): a store rebuilt from the archive groups failures by the
    same causes as the store merge wrote."""
    junit = write_junit(
        tmp_path / "junit" / "nightly.xml",
        [fail("olmo2", "forward", "RuntimeError: The size of tensor a (8) must match", properties=CAUSE)],
        run_id="nightly@2026-01-02T00:00:00Z@vm",
        started="2026-01-02T00:00:00Z",
    )
    store, rebuilt = tmp_path / "history.sqlite", tmp_path / "rebuilt" / "history.sqlite"
    assert main(["merge", str(junit.parent), "--store", str(store)]) == 0
    assert main(["rebuild", "--store", str(rebuilt), "--archive", str(tmp_path / "archive")]) == 0
    for path in (store, rebuilt):
        with HistoryStore(path, create=False, read_only=True) as history:
            (observation,) = history.observations()
        assert (
            observation.result.cause.mechanism_key == "left whole|norm" and observation.result.cause.whose == "autotp"
        )
        assert observation.result.broke_at.path == "model.layers.0.self_attn.q_norm"


@pytest.mark.parametrize(
    "crafted, field",
    [
        ({"cause.whose": "nobody"}, "cause.whose"),
        ({"cause.words": "left whole " * 500}, "cause.*"),
        ({"broke_at.path": "x" * 5_000}, "broke_at.*"),
    ],
)
def test_a_crafted_cause_is_refused_at_the_door(tmp_path, capsys, crafted, field):
    """A cause's whose must be one of the harness's, its texts one line of bounded length: merge skips the file
    naming the field, and nothing of it is archived."""
    junit = write_junit(
        tmp_path / "junit" / "pr.xml",
        [fail("olmo2", "forward", "RuntimeError: boom", properties={**CAUSE, **crafted})],
        run_id="pr@2026-01-02T00:00:00Z@vm",
        started="2026-01-02T00:00:00Z",
    )
    main(["merge", str(junit.parent), "--store", str(tmp_path / "history.sqlite")])
    assert field in capsys.readouterr().err
    assert not list((tmp_path / "archive").rglob("*.tar.gz"))


def test_a_cause_spanning_lines_in_an_archive_entry_is_refused():
    """JUnit attributes cannot carry a newline (XML normalises it), a crafted format-2 entry's JSON can: the same
    rule refuses it there, so no heading is planted in a report through a rebuilt store."""
    from reports.store.records import CellResult, Run, RunRecords, Versions
    from reports.store.validation import first_problem
    from suites.verdicts.cause import Cause

    run = Run(
        "nightly@2026-01-02T00:00:00Z@vm",
        "nightly",
        "vm",
        "2026-01-02T00:00:00Z",
        "cpu",
        "gloo",
        Versions("0.19.8", "5.25.0", "2.13.0", "3.11.7"),
    )
    cause = Cause("left whole|norm", "left whole\n# a heading planted in every report", "autotp")
    result = CellResult(run.run_id, CellKey("olmo2", "eager", "fp32", 2), "fail", "forward", "x", cause=cause)
    problem = first_problem(RunRecords(run, (result,), (), ""))
    assert problem is not None and problem.field == "cause.*" and "spans several lines" in str(problem)

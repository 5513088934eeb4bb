"""`nox -s remedy`'s results enter the history: `python -m reports merge` takes a results folder's remedies.json
through its door (reports/store/remedy_door.py) into the store and the archive, so a proof outlives the folder (a
cache eviction, a replaced results/) and `rebuild` restores it; a hostile file is refused naming the file, the entry
and the field, a secret in one is redacted before it is stored or archived, and a pull request's are never merged.
The report stating the proofs from the store alone: tests/reports/test_default_matrix_outputs.py."""

import json
import shutil
from pathlib import Path

import pytest

from matrix.remedies import TakenAt
from reports.__main__ import main
from reports.store import HistoryStore

FIXTURES = Path(__file__).parent / "fixtures"
REMEDY_RESULTS = FIXTURES / "remedy-results"  # a real `nox -s remedy` results folder (fixtures/README.md)
LEGACY_CTRL = FIXTURES / "remedies-ctrl.json"  # a real remedies.json with no runs beside it
TAKEN = TakenAt(
    deepspeed="0.19.8",
    transformers="5.25.0",
    harness_git="45708c69c0500dd72107c18789bcc38c09fefa27",
    recorded_at="2026-12-07T09:30:48Z",
)


def merge(*args: object) -> int:
    return main(["merge", *map(str, args)])


def stored(store: Path) -> list:
    with HistoryStore(store, create=False, read_only=True) as history:
        return history.remedy_results()


def test_a_real_results_folder_merges_into_the_history_once_and_outlives_its_folder(tmp_path, capsys):
    results = shutil.copytree(REMEDY_RESULTS, tmp_path / "results")
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    assert merge(results, "--store", store, "--archive", archive) == 0
    proofs = stored(store)
    written = json.loads((REMEDY_RESULTS / "remedies.json").read_text())
    assert [p.remedy for p in proofs] == sorted(r["remedy"] for r in written)
    assert all(p.status == "verified" and p.taken_at == TAKEN for p in proofs)  # read from the runs beside
    assert len(list((archive / "remedies").glob("*.json"))) == len(written)
    assert merge(results, "--store", store, "--archive", archive) == 0  # again: nothing new
    assert ": 0 and 0 new remedy result(s) from 1 remedies.json file(s)" in capsys.readouterr().out
    with HistoryStore(store, create=False, read_only=True) as history:
        assert history.remedy_results() == proofs
    shutil.rmtree(results)
    store.unlink()  # the cache evicted: the archive rebuilds the proofs
    assert main(["rebuild", "--archive", str(archive), "--store", str(store)]) == 0
    assert f"{len(written)} new remedy result(s)" in capsys.readouterr().out
    assert stored(store) == proofs


def _results_with(tmp_path: Path, change) -> Path:
    """The real results folder with its first result changed by `change` (a dict of the entry, edited in place)."""
    results = shutil.copytree(REMEDY_RESULTS, tmp_path / "results")
    entries = json.loads((results / "remedies.json").read_text())
    change(entries[0])
    (results / "remedies.json").write_text(json.dumps(entries))
    return results


HOSTILE = {
    "unknown remedy": (
        lambda e: e.update(remedy="drop-all-asserts"),
        "no [[remedy]] of matrix/remedies.toml is named so",
    ),
    "wrong type": (lambda e: e.update(cause_cells=3), "entry 1: "),
    "verified without its cells": (
        lambda e: e.update(fixed=e["fixed"][:1]),
        "verified means every cause cell passes and none changed",
    ),
    "another cause's cells": (
        lambda e: e.update(cause_cells=["llama.faithful-eager-fp32-tp2"], fixed=["llama.faithful-eager-fp32-tp2"]),
        "is not a cell of its cause models",
    ),
    "another release than its patch's": (
        lambda e: e.update(taken_at={**vars(TAKEN), "deepspeed": "0.18.9"}),
        "taken at DeepSpeed 0.18.9, but its patch is against 0.19.8",
    ),
    "no harness revision": (
        lambda e: e.update(taken_at={**vars(TAKEN), "harness_git": "main; rm -rf /"}),
        "taken_at.harness_git='main; rm -rf /' is not a git commit",
    ),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_remedies_file_is_refused_whole_naming_the_file_and_what_is_wrong(tmp_path, capsys, name):
    change, reason = HOSTILE[name]
    results = _results_with(tmp_path, change)
    store = tmp_path / "history.sqlite"
    assert merge(results, "--store", store) == 2  # nothing usable: no JUnit, the one remedies.json refused
    error = capsys.readouterr().err
    assert f"skipped {results / 'remedies.json'}: entry 1" in error and reason in error, error
    assert not store.exists() and not (tmp_path / "archive").exists()


def test_a_file_that_names_no_versions_and_has_no_runs_beside_is_refused(tmp_path, capsys):
    legacy = tmp_path / "results" / "remedies.json"
    legacy.parent.mkdir()
    shutil.copy(LEGACY_CTRL, legacy)
    assert merge(legacy, "--store", tmp_path / "history.sqlite") == 2
    error = capsys.readouterr().err
    assert str(legacy) in error and "names no DeepSpeed release, harness revision and time" in error
    assert "re-run `nox -s remedy`" in error


def test_a_secret_in_a_remedies_file_is_redacted_before_the_store_and_the_archive(tmp_path, monkeypatch):
    secret = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm0123456789"
    monkeypatch.setenv("HF_TOKEN", secret)
    results = _results_with(tmp_path, lambda e: e.update(how=e["how"] + f"\n# pushed with HF_TOKEN={secret}\n"))
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    assert merge(results, "--store", store, "--archive", archive) == 0
    assert all(secret not in p.how for p in stored(store)) and "HF_TOKEN=***" in stored(store)[0].how
    assert secret.encode() not in store.read_bytes()
    assert all(secret not in path.read_text() for path in (archive / "remedies").glob("*.json"))


def test_a_pull_requests_remedy_results_are_never_merged(tmp_path, capsys):
    results = shutil.copytree(REMEDY_RESULTS, tmp_path / "results")
    assert merge(results, "--store", tmp_path / "history.sqlite", "--untrusted") == 2
    assert "a pull request's remedy results are not merged" in capsys.readouterr().err


def test_verify_fails_when_the_archive_lost_a_proof_the_store_holds(tmp_path, capsys):
    results = shutil.copytree(REMEDY_RESULTS, tmp_path / "results")
    store, archive = tmp_path / "history.sqlite", tmp_path / "archive"
    assert merge(results, "--store", store, "--archive", archive) == 0
    assert main(["verify", "--archive", str(archive), "--store", str(store)]) == 0
    next((archive / "remedies").glob("fused-experts-split-*.json")).unlink()
    assert main(["verify", "--archive", str(archive), "--store", str(store)]) == 1
    assert "1 remedy result(s) are not in the archive" in capsys.readouterr().err  # and a lost store would lose it

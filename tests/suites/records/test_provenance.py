"""Which commits a run records (issue #13): deepspeed_git is DeepSpeed's own commit, only when DeepSpeed
was installed from git; run.harness_git is this harness's commit. And an install failure at a git ref
records its label (pr/1234), which reaches the history and the report.

No torch or DeepSpeed needed: PEP 610 metadata is faked, git repositories are made in tmp_path."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from matrix.json_records import write_record
from matrix.version_axes import AxisRule, Combo, parse_axis_value
from reports.__main__ import main
from sessions import install_failure
from suites.records.run_records import RunInfo, deepspeed_commit, git_has_commit, harness_commit, junit_properties
from suites.run.command import parse_suite_options

SHA = "0123456789abcdef0123456789abcdef01234567"
DEEPSPEED = AxisRule("deepspeed", "ds", repo="https://github.com/deepspeedai/DeepSpeed")


class Commits:
    """A fake `git cat-file -e` that remembers what it was asked."""

    def __init__(self, *known: tuple[str, str]):
        self.known, self.asked = set(known), []

    def __call__(self, folder: Path, sha: str) -> bool:
        self.asked.append((str(folder), sha))
        return (str(folder), sha) in self.known


def test_release_installs_never_carry_a_commit():
    has_commit = Commits(("/src/DeepSpeed", "b9b025f"))
    assert deepspeed_commit(None, "b9b025f", has_commit) == ""  # from an index: no direct_url.json
    archive = {"url": "https://files.example/deepspeed-0.19.8.tar.gz", "archive_info": {"hashes": {}}}
    assert deepspeed_commit(archive, "b9b025f", has_commit) == ""
    assert has_commit.asked == []


def test_git_install_records_the_commit_pip_checked_out():
    origin = {
        "url": "https://github.com/deepspeedai/DeepSpeed",
        "vcs_info": {"vcs": "git", "requested_revision": "refs/pull/1234/head", "commit_id": SHA},
    }
    assert deepspeed_commit(origin, "b9b025f", Commits()) == SHA  # not the stamped hash
    assert (
        deepspeed_commit({"url": "https://hg.example/ds", "vcs_info": {"vcs": "hg", "commit_id": "1"}}, "", Commits())
        == ""
    )


def test_local_folder_install_keeps_the_stamped_hash_only_if_that_folder_has_it():
    origin = {"url": "file:///src/Deep%20Speed", "dir_info": {"editable": True}}
    has_commit = Commits(("/src/Deep Speed", "abc1234"))
    assert deepspeed_commit(origin, "abc1234", has_commit) == "abc1234"
    assert deepspeed_commit(origin, "b9b025f", has_commit) == ""  # stamped from some other repository
    assert deepspeed_commit(origin, "unknown", has_commit) == ""
    assert deepspeed_commit(origin, "", has_commit) == ""
    assert has_commit.asked == [("/src/Deep Speed", "abc1234"), ("/src/Deep Speed", "b9b025f")]
    # The harness's own HEAD is never DeepSpeed's, even when the folder's repository holds it.
    assert deepspeed_commit(origin, "abc1234", has_commit, harness="abc1234" + "0" * 33 + "-dirty") == ""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "checkout"
    (repo / "sub").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "file.txt").write_text("one\n")
    git(repo, "add", "file.txt")
    git(repo, "-c", "user.email=dev@example.com", "-c", "user.name=dev", "commit", "-q", "-m", "one")
    return repo


def test_harness_commit_is_head_of_its_own_checkout(repo, tmp_path):
    head = git(repo, "rev-parse", "HEAD")
    commit = harness_commit.__wrapped__  # uncached
    assert commit(repo) == head
    (repo / "untracked.txt").write_text("new\n")
    assert commit(repo) == head  # untracked files do not make it dirty
    (repo / "file.txt").write_text("two\n")
    assert commit(repo) == f"{head}-dirty"
    assert commit(repo / "sub") == ""  # a folder inside some other checkout is not a checkout of its own
    assert commit(tmp_path / "plain") == ""
    assert git_has_commit(repo, head[:7]) and not git_has_commit(repo, "b9b025f")
    assert not git_has_commit(tmp_path / "plain", head)


def test_run_records_the_harness_commit():
    run = RunInfo("nightly", accelerator="cpu", backend="gloo", harness_git=SHA)
    record = {
        "cell": {"id": "llama-eager-fp32-tp2"},
        "outcome": "pass",
        "failure_class": "",
        "signature": "",
        "versions": {"deepspeed": "0.19.8", "deepspeed_git": ""},
        "run": write_record(run),
        "metrics": {},
    }
    assert write_record(run)["harness_git"] == SHA
    assert junit_properties(record)["run.harness_git"] == SHA
    assert RunInfo("nightly", accelerator="cpu", backend="gloo").harness_git == harness_commit()


@pytest.mark.parametrize(
    "value, label",
    [
        ("0.19.8", "0.19.8"),
        ("deepspeed@pr/1234", "pr/1234"),
        ("deepspeed@master", "master"),
        (f"deepspeed@{SHA}", SHA[:10]),
    ],
)
def test_pin_labels(value, label):
    assert parse_axis_value(value, DEEPSPEED).label == label


def test_local_clone_pin_label(tmp_path):
    (tmp_path / "DeepSpeed").mkdir()
    assert parse_axis_value(f"deepspeed@{tmp_path / 'DeepSpeed'}", DEEPSPEED).label == "local-DeepSpeed"


def test_install_failure_at_a_pr_reaches_the_history_and_the_report(tmp_path, monkeypatch, capsys):
    def no_deepspeed():  # nox's own Python, where the failure is recorded, need not have DeepSpeed
        raise ImportError("No module named 'deepspeed'")

    monkeypatch.setattr(install_failure, "platform_of_run", no_deepspeed)
    release = {"transformers": "5.24.0", "torch": "2.13.0"}
    rules = {name: AxisRule(name, name[:2]) for name in release}
    combo = Combo(
        parse_axis_value("deepspeed@pr/1234", DEEPSPEED),
        *(parse_axis_value(version, rules[name]) for name, version in release.items()),
        (),
        None,
    )
    results = tmp_path / "results"
    # The cells are read from the session's own options, --models-file included (a registry of its own).
    models_file = tmp_path / "models.toml"
    models_file.write_text(
        '[models.my_llama]\nmodel_type = "llama"\ntiny = { hidden_size = 64, '
        "num_attention_heads = 4, num_hidden_layers = 1, vocab_size = 128 }\n"
    )
    selection = parse_suite_options(
        ["--models", "my_llama", "--models-file", str(models_file), "--tp", "2", "--results", str(results), "-q"]
    )
    assert install_failure.record_install_failure("autotp(ds@pr1234)", combo, "pip: no such ref", selection) == 1

    (record,) = [json.loads(line) for line in (results / "cells.jsonl").read_text().splitlines()]
    assert record["cell"]["id"] == "my_llama.faithful-eager-fp32-tp2"  # the command line's default shape
    assert record["versions"]["deepspeed"] == "pr/1234" and record["versions"]["deepspeed_git"] == ""
    assert record["run"]["harness_git"] == harness_commit()

    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(results / "junit"), "--store", str(store)]) == 0
    merged, skipped = capsys.readouterr()
    assert merged.splitlines()[0].endswith("1 new run(s), 1 new result(s) from 1 file(s); 0 skipped") and not skipped
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "deepspeed pr/1234, transformers 5.24.0, torch 2.13.0" in report
    assert "| my_llama.faithful | ❌ install |" in report


def test_records_made_under_an_injected_fault_are_marked_never_replayed_and_never_merged(tmp_path):
    import xml.etree.ElementTree as ElementTree

    from matrix.cells import expand
    from reports.store.junit import read_junit
    from suites.records.run_records import CellRecorder
    from suites.verdicts.outcome import CellOutcome

    fault = ("tests.faults:noop_allreduce",)
    versions = {
        "deepspeed": "0.19.8",
        "transformers": "5.24.0",
        "torch": "2.13.0",
        "python": "3.11.7",
        "deepspeed_git": "",
    }
    llama, opt = expand("llama,opt", tp="2")
    run = RunInfo("local", started="2026-01-01T00:00:00Z", accelerator="cpu", backend="gloo", harness_git=SHA)
    faulty = CellRecorder(tmp_path, run, versions, faults=fault).record(
        llama, CellOutcome("fail", "numerics", "logits: x")
    )
    assert faulty["faults"] == list(fault) and junit_properties(faulty)["faults"] == fault[0]
    assert CellRecorder(tmp_path, run, versions).replay(llama.id) is None  # a normal run never reuses it
    assert CellRecorder(tmp_path, run, versions, faults=fault).replay(llama.id) == faulty

    healthy = CellRecorder(tmp_path, run, versions).record(opt, CellOutcome("pass"))
    suite = ElementTree.Element("testsuite", name="pytest")
    for record in (faulty, healthy):
        case = ElementTree.SubElement(
            suite, "testcase", classname="suites.test_autotp", name=f"test_cell[{record['cell']['id']}]"
        )
        properties = ElementTree.SubElement(case, "properties")
        for key, value in junit_properties(record).items():
            ElementTree.SubElement(properties, "property", name=key, value=value)
    junit = tmp_path / "session.xml"
    ElementTree.ElementTree(suite).write(junit, encoding="utf-8", xml_declaration=True)
    (records,) = read_junit(junit)
    assert [result.cell.model for result in records.results] == ["opt"]


@pytest.mark.parametrize(
    "record, problem",
    [
        (
            {"cell": {"id": "llama-eager-fp32-tp2"}, "outcome": "passed"},
            "outcome 'passed' is not one of pass, fail, skip",
        ),
        (
            {"cell": {"id": "llama-eager-fp32-tp2"}, "outcome": "fail", "failure_class": "ds_to_universal"},
            "failure_class 'ds_to_universal' is not one of setup, shard, forward",
        ),
        ({"outcome": "pass"}, "not a cell record (no cell.id)"),
    ],
)
def test_a_record_the_harness_did_not_write_is_refused_naming_its_line(tmp_path, record, problem):
    """cells.jsonl is read in one place: a record whose outcome or class is not the harness's stops there, named,
    instead of reaching the store or a bisection as a verdict; a cut last line (a kill mid-write) is still skipped."""
    from suites.records.run_records import MalformedRecord, read_records

    good = {"cell": {"id": "llama-eager-bf16-tp2"}, "outcome": "fail", "failure_class": "numerics"}
    (tmp_path / "cells.jsonl").write_text(f"{json.dumps(good)}\n{json.dumps(record)}\n")
    with pytest.raises(MalformedRecord, match=f"^{tmp_path / 'cells.jsonl'}:2: {re.escape(problem)}"):
        read_records(tmp_path)
    (tmp_path / "cells.jsonl").write_text(f"{json.dumps(good)}\n{json.dumps(good)[:20]}")
    assert read_records(tmp_path) == [good]


def test_a_recorder_reads_each_appended_line_once_and_sees_the_other_workers_cells(tmp_path):
    """The run is complete once every expected cell is in cells.jsonl, whichever pytest-xdist worker wrote it; the
    recorder reads only what was appended since it last looked, a line still being written once it is whole."""
    from matrix.cells import expand
    from suites.records.run_records import AppendedRecords, CellRecorder, RunState, read_records
    from suites.verdicts.outcome import CellOutcome

    llama, opt, gpt2 = expand("llama,opt,gpt2", tp="2")
    run = RunInfo("local", started="2026-01-01T00:00:00Z", accelerator="cpu", backend="gloo", harness_git=SHA)
    versions = {"deepspeed": "0.19.8"}
    earlier = RunInfo("local", started="2025-12-31T00:00:00Z", accelerator="cpu", backend="gloo", harness_git=SHA)
    CellRecorder(tmp_path, earlier, versions).record(gpt2, CellOutcome("pass"))  # another run's: never counted

    state = RunState(tmp_path, "local", {}, versions)
    ids = {llama.id, opt.id, gpt2.id}
    mine = CellRecorder(tmp_path, run, versions, state=state, expected_cells=ids)
    other = CellRecorder(tmp_path, run, versions, state=state, expected_cells=ids)
    mine.record(llama, CellOutcome("pass"))
    other.record(opt, CellOutcome("pass"))
    assert not state.path.exists()
    mine.record(gpt2, CellOutcome("pass"))  # the other worker's opt completes the run
    assert json.loads(state.path.read_text())["complete"] is True
    assert mine.cells_of_run_on_disk == ids

    appended = AppendedRecords(tmp_path / "cells.jsonl")
    assert [r["cell"]["id"] for r in appended.new()] == [gpt2.id, llama.id, opt.id, gpt2.id]
    line = json.dumps(read_records(tmp_path)[1]) + "\n"
    with (tmp_path / "cells.jsonl").open("a") as stream:
        stream.write(line[:20])  # a worker mid-write: nothing new yet
        stream.flush()
        assert appended.new() == []
        stream.write(line[20:])
    assert [r["cell"]["id"] for r in appended.new()] == [llama.id]
    with (tmp_path / "cells.jsonl").open("a") as stream:
        stream.write('{"cell": {"id": "x"}, "outcome": "maybe"}\n')
    with pytest.raises(ValueError, match=r"cells.jsonl:6: outcome 'maybe'"):
        appended.new()


def test_the_environment_report_attached_to_a_draft_names_no_folder_of_this_host():
    """env_<cell>.txt goes beside a draft issue and a repro script, read on another machine: versions and hardware,
    not the path of the interpreter that ran the cell."""
    import sys

    from suites.records.run_records import environment_report

    run = RunInfo("nightly", accelerator="cpu", backend="gloo", harness_git=SHA)
    for ran_here in (True, False):
        report = environment_report(run, {"torch": "2"}, ran_here)
        assert "torch: 2" in report and "accelerator: cpu" in report
        assert sys.executable not in report and sys.prefix not in report
        assert ("os: " in report) is ran_here  # rendered elsewhere, the renderer's machine is not the cell's

"""Every cell ends with a record: what the harness's own work meets on a shared machine (a file another process
removed, a library that cannot be imported, a full disk) is a `setup` or `install` record saying what happened and
what to do, its rank group is restarted, and the next cells run. Real rank groups, real faults."""

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT
from matrix.cells import expand
from suites.engine.rank_group import RankGroupPool
from suites.records.run_records import CellRecorder, RecordNotWritten, RunInfo, cells_without_record, read_records
from suites.run.driver import RunOptions, run_cell
from suites.verdicts.outcome import CellOutcome

pytestmark = pytest.mark.autotp


@pytest.fixture
def own_pool(rank_pool, tmp_path):
    rank_pool.close()  # one live group at a time: these tests start a pool (and fork server) of their own
    pool = RankGroupPool(results=tmp_path)
    yield pool
    pool.close()


def test_a_work_folder_removed_under_a_live_group_fails_only_its_cell_as_setup_and_the_next_cell_runs(own_pool):
    """A temporary-folder cleaner (or another process) removes the group's work folder between two cells: the
    driver's own write of the next job raises FileNotFoundError. Before, that exception left pytest with no record of
    the cell; now the cell is `setup` with what happened and the command that reruns it, the group is restarted and
    the cell after it passes."""
    (cell,) = expand("llama", tp="2")
    options = RunOptions(cell_timeout=120.0)
    first = run_cell(cell, own_pool, options)
    assert first.outcome == "pass", first.message
    assert own_pool.group is not None
    shutil.rmtree(own_pool.group.workdir)

    broken = run_cell(cell, own_pool, options)
    assert (broken.outcome, broken.failure_class) == ("fail", "setup"), broken.message
    assert broken.signature.startswith("FileNotFoundError:"), broken.signature
    assert "a file the harness was using vanished" in broken.message
    assert "nox -s matrix -- --models llama.stress --variants eager --dtypes fp32 --tp 2" in broken.message
    assert broken.cause is not None and broken.cause.whose == "harness"
    assert own_pool.group is None  # discarded: its state was unknown

    after = run_cell(cell, own_pool, options)
    assert after.outcome == "pass", after.message
    assert own_pool.launches == 2


SHADOWED_DEPENDENCY = "hjson"
"""A package DeepSpeed imports at its own import (deepspeed/runtime/config_utils.py) and torch and transformers do
not: a broken copy of it on the path breaks DeepSpeed's import and nothing before it."""


def broken_dependency(folder):
    """A broken install of DeepSpeed's dependency under `folder` (put first on PYTHONPATH): importing it raises."""
    package = folder / SHADOWED_DEPENDENCY
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from hjson._compiled_decoder import decode  # a file the install lacks\n")
    return folder


def test_a_library_whose_import_fails_in_the_ranks_is_an_install_failure_with_what_to_do(own_pool, tmp_path):
    """DeepSpeed's own import raises ImportError in the fork server (a dependency of it broken in the environment):
    every cell of that environment would fail so, and no AutoTP code ran. The cell's record is `install` (the
    environment's, no verdict on AutoTP), saying which library could not be imported and what to do, not `crash`
    (a DeepSpeed bug) nor a harness bug."""
    own_pool.close()
    shadow = broken_dependency(tmp_path / "shadow")
    environment = own_pool.fork_server.env if own_pool.fork_server is not None else None
    assert environment is not None, "CPU rank groups are forked from the fork server"
    environment["PYTHONPATH"] = os.pathsep.join([str(shadow), environment["PYTHONPATH"]])
    (cell,) = expand("llama", tp="2")
    outcome = run_cell(cell, own_pool, RunOptions(cell_timeout=120.0))
    assert (outcome.outcome, outcome.failure_class) == ("fail", "install"), outcome.message
    assert outcome.signature.startswith("ModuleNotFoundError: No module named 'hjson._compiled_decoder'")
    assert "could not import deepspeed" in outcome.message
    assert "Rebuild the environment" in outcome.message
    assert outcome.cause is not None and outcome.cause.whose == "environment"


def test_an_import_error_is_the_environments_only_where_a_library_under_test_raised_it(tmp_path):
    """The rule on its own, in a fresh process: DeepSpeed's failed import (its dependency broken) is `install`; a
    harness import of a module the installed release lacks stays the harness's `setup`."""
    shadow = broken_dependency(tmp_path / "shadow")
    script = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(shadow)!r})
        from suites.verdicts.outcome import death_record
        classes = []
        try:
            import deepspeed
        except ImportError as error:
            classes.append(death_record(error, "rank 0").failure_class)
        try:
            import transformers.no_such_module_in_this_release
        except ImportError as error:
            classes.append(death_record(error, "rank 0").failure_class)
        print(classes)
    """)
    ran = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert ran.stdout.strip().splitlines()[-1] == "['install', 'setup']", ran.stdout + ran.stderr


def test_a_record_the_full_disk_refuses_says_so_and_the_next_record_is_not_swallowed(tmp_path):
    """cells.jsonl on a full disk (the kernel's /dev/full answers every write with ENOSPC): the cell's outcome and
    what to do are in the error, and the end of the run lists it among the cells without a record. A line a full disk
    cut short does not swallow the record written after it."""
    (llama, opt) = expand("llama,opt", tp="2")
    results = tmp_path / "results"
    recorder = CellRecorder(results, RunInfo("survival", accelerator="cpu", backend="gloo"), {"deepspeed": "0"})
    recorder.path.symlink_to("/dev/full")
    with pytest.raises(RecordNotWritten) as refused:
        recorder.record(llama, CellOutcome("pass"))
    assert "llama-eager-fp32-tp2 ended pass" in str(refused.value)
    assert f"disk full at {results / 'cells.jsonl'} (" in str(refused.value)

    recorder.path.unlink()
    recorder.path.write_text('{"cell": {"id": "llama-eager-fp32-tp2"}, "outco')  # cut short by the full disk
    recorder.record(opt, CellOutcome("pass"))
    recorded = read_records(results)
    assert [record["cell"]["id"] for record in recorded] == ["opt-eager-fp32-tp2"]
    lines = cells_without_record([llama, opt], recorded)
    assert lines[0] == "1 of 2 cells of this run have no result: llama-eager-fp32-tp2"
    assert "nox -s matrix -- --models llama.stress --variants eager --dtypes fp32 --tp 2" in lines[1]
    json.loads(recorder.path.read_text().splitlines()[-1])  # the last line is whole


def test_a_write_the_full_disk_refuses_mid_cell_says_disk_full_at_its_path_and_the_next_cell_runs(
    own_pool, monkeypatch, tmp_path
):
    """The tiny checkpoint's write meets ENOSPC (faked at that one write: the real disk is never filled): the cell is
    `setup` whose message starts "disk full at <the file>", with the free space there and what to do, not a bare
    traceback; the next cell, with space again, runs to its verdict."""
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    write_text = Path.write_text

    def full_disk(path: Path, data: str, *args, **kwargs) -> int:
        if path.name == "autotp-manifest.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_text(path, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    (cell,) = expand("llama", tp="2")
    options = RunOptions(cell_timeout=120.0)
    refused = run_cell(cell, own_pool, options)
    assert (refused.outcome, refused.failure_class) == ("fail", "setup"), refused.message
    assert refused.message.startswith(f"disk full at {tmp_path / 'cache' / 'tiny'}/"), refused.message
    assert "autotp-manifest.json (" in refused.message and "nox -s cache -- --prune" in refused.message

    monkeypatch.setattr(Path, "write_text", write_text)
    after = run_cell(cell, own_pool, options)
    assert after.outcome == "pass", after.message

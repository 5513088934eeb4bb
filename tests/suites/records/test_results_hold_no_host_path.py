"""Nothing a run keeps names the folder it ran in: a real failing cell's record (cells.jsonl, its JUnit properties
and failure message) points at its kept logs relative to the results folder, and merge keeps no host path in the
history store or the archive. Records written before (an absolute `logs:` pointer) still pass the door, and what it
keeps of them is the relative form. A real run of the suites on one cell AutoTP refuses (gpt2's Conv1D at tp 2)."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT
from suites.records.run_records import read_records

pytestmark = pytest.mark.autotp

CELL = "gpt2.faithful-eager-fp32-tp2"


def readable_bytes(path: Path) -> bytes:
    """A file's bytes, an archive entry's members unpacked (a path inside a gzip is not in its bytes)."""
    if path.name.endswith(".tar.gz"):
        with tarfile.open(fileobj=io.BytesIO(path.read_bytes()), mode="r:gz") as tar:
            members = [tar.extractfile(member) for member in tar.getmembers()]
            return b"\n".join(member.read() for member in members if member is not None)
    content = path.read_bytes()
    return gzip.decompress(content) if path.suffix == ".gz" else content


def holding(root: Path, text: str) -> list[str]:
    """The files under `root` whose (unpacked) bytes hold `text`."""
    files = [path for path in root.rglob("*") if path.is_file()]
    return sorted(str(path.relative_to(root)) for path in files if text.encode() in readable_bytes(path))


def merge(junit: Path, store: Path, archive: Path) -> None:
    command = ["merge", str(junit), "--store", str(store), "--archive", str(archive)]
    done = subprocess.run(
        [sys.executable, "-m", "reports", *command], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_failing_cell_and_its_merge_keep_no_host_path(tmp_path: Path) -> None:
    results = (tmp_path / "results").absolute()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--models", "gpt2.faithful", "--tp", "2", "--results", str(results)]
        + ["-q", "-p", "no:cacheprovider"],
        cwd=PROJECT_ROOT,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=900,
    )
    (record,) = read_records(results)
    assert record["cell"]["id"] == CELL and record["failure_class"] == "shard", done.stdout[-3000:]
    # The pointer is the results folder's own name for the logs, and following it from there finds them.
    assert record["logs"] == f"logs/{CELL}/" and f"\nlogs: logs/{CELL}/" in record["message"]
    assert any((results / record["logs"]).glob("*.log"))
    junit = "\n".join(path.read_text() for path in (results / "junit").glob("*.xml"))
    assert f'name="logs" value="logs/{CELL}/"' in junit and f"logs: logs/{CELL}/" in junit

    merge(results / "junit", results / "history.sqlite", results / "archive")  # an absolute path, as CI passes one
    assert holding(results, str(results)) == []
    assert holding(results, str(results.resolve())) == []


def test_older_records_with_absolute_pointers_are_kept_relative(tmp_path: Path) -> None:
    """A JUnit file the harness wrote before its pointers were relative (a real night's, its `logs` properties and
    the messages' `logs:` lines under the folder it ran in) merges whole, and the store and the archive keep
    `logs/<cell>/`."""
    old_root = "/work/final/results"
    junit = tmp_path / "artifact" / "junit" / "matrix.xml"
    junit.parent.mkdir(parents=True)
    junit.write_bytes((PROJECT_ROOT / "tests" / "reports" / "fixtures" / "since_when_run" / "matrix.xml").read_bytes())
    assert f'name="logs" value="{old_root}/logs/bloom.faithful-eager-fp32-tp2"' in junit.read_text()
    assert f"logs: {old_root}/logs/bloom.faithful-eager-fp32-tp2" in junit.read_text()

    store = tmp_path / "store"
    merge(junit, store / "history.sqlite", store / "archive")
    assert holding(store, old_root) == [] and holding(store, str(tmp_path)) == []
    kept = holding(store, "logs/bloom.faithful-eager-fp32-tp2/")
    assert "history.sqlite" in kept and any(name.endswith(".tar.gz") for name in kept), kept

""".github/scripts/results-archive.sh against a local bare repository as the data branch's remote (no network): a
store restored from the cache gets a partial clone holding only what merging the new results needs, a lost store
every file, and merge, verify and push work on either."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reports.__main__ import main

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = PROJECT_ROOT / ".github/scripts/results-archive.sh"
BRANCH = "autotp-history"


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout


def script(harness: Path, server: Path, *args: str) -> str:
    env = {
        **os.environ,
        "ARCHIVE_BRANCH": BRANCH,
        "GITHUB_TOKEN": "not-used-by-a-file-remote",
        "GITHUB_REPOSITORY": "owner/harness",
        "GITHUB_SERVER_URL": server.as_uri(),
        "GITHUB_WORKFLOW": "autotp",
        "GITHUB_RUN_ID": "7",
        "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_JOB": "report",
        "ARCHIVE_PYTHON": sys.executable,
        "PYTHONPATH": str(PROJECT_ROOT),
    }
    done = subprocess.run(["bash", str(SCRIPT), *args], cwd=harness, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def present(archive: Path) -> list[str]:
    return sorted(str(path.relative_to(archive)) for path in archive.rglob("*.tar.gz"))


def indexed(archive: Path) -> list[str]:
    return sorted(git(archive, "ls-files", "*.tar.gz").split())


@pytest.fixture
def data_branch(scenario, tmp_path):
    """The data branch holds the archive of the scenario's first four nights; the cached store knows the first three
    only (a cache older than the last push). Returns (harness folder, server, the night files)."""
    nights = sorted(scenario.glob("*.xml"))
    published = tmp_path / "published"
    for night in nights[:4]:
        assert main(["merge", str(night), "--store", str(published / "history.sqlite")]) == 0
    server = tmp_path / "server"
    bare = server / "owner" / "harness.git"
    bare.mkdir(parents=True)
    git(bare, "init", "-q", "--bare")
    git(bare, "config", "uploadpack.allowFilter", "true")  # as GitHub serves partial clones
    archive = published / "archive"
    git(archive, "init", "-q", "-b", BRANCH)
    git(archive, "add", "-A", ".")
    git(archive, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "four nights")
    git(archive, "push", "-q", bare.as_uri(), f"HEAD:refs/heads/{BRANCH}")
    harness = tmp_path / "harness"
    cached = harness / "results" / "history.sqlite"
    for night in nights[:3]:
        assert main(["merge", str(night), "--store", str(cached), "--archive", str(tmp_path / "scratch")]) == 0
    return harness, server, nights


def test_a_cached_store_fetches_only_what_merge_needs(data_branch, tmp_path, capsys):
    harness, server, nights = data_branch
    incoming = tmp_path / "artifacts"
    incoming.mkdir()
    for night in (nights[2], *nights[4:]):  # night 3 comes again (a re-run's artifacts), 5 and 6 are new
        shutil.copy(night, incoming / night.name)
    printed = script(harness, server, "fetch", "results/history.sqlite", str(incoming))
    archive, store = harness / "results" / "archive", harness / "results" / "history.sqlite"

    # In the index: all four nights' entries. As files: the night the store lacks (rebuild reads it) and the
    # night that comes again (merge compares it with its entry); nights 1 and 2 only by name, their blobs unfetched.
    everything = indexed(archive)
    assert len(everything) == 4
    assert present(archive) == everything[2:] == sorted(everything[2:])
    missing = [line for line in git(archive, "rev-list", "--objects", "--missing=print", "HEAD").split("\n") if line]
    assert len([line for line in missing if line.startswith("?")]) == 2
    assert "partial checkout: 2 entr(ies) of 4 read" in printed

    # what `nox -s report -- --verify` runs: rebuild, merge, verify, on the partial checkout
    capsys.readouterr()
    assert main(["rebuild", "--store", str(store)]) == 0
    assert "1 new run(s)" in capsys.readouterr().out
    assert main(["merge", str(incoming), "--store", str(store)]) == 0
    assert main(["verify", "--store", str(store)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"all 6 run(s) and 0 answer(s) are in the archive {archive}")

    # Another run pushed first: the push puts the two new entries on top of its commit, keeping the four entries
    # this checkout never fetched and the other run's file.
    bare = server / "owner" / "harness.git"
    other = tmp_path / "other-run"
    git(tmp_path, "clone", "-q", "-b", BRANCH, bare.as_uri(), str(other))
    (other / "answers").mkdir()
    (other / "answers" / "from-another-run.json").write_text("{}")
    git(other, "add", "answers")
    git(other, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "another run")
    git(other, "push", "-q", "origin", BRANCH)
    script(harness, server, "push")
    pushed = sorted(git(bare, "ls-tree", "-r", "--name-only", BRANCH).split())
    assert len(pushed) == 7 and set(everything) < set(pushed) and "answers/from-another-run.json" in pushed
    assert len([name for name in pushed if name.endswith(".tar.gz")]) == 6


def test_without_a_store_every_entry_is_fetched(data_branch, tmp_path, capsys):
    harness, server, nights = data_branch
    (harness / "results" / "history.sqlite").unlink()  # the cache is gone
    script(harness, server, "fetch", "results/history.sqlite", str(nights[4]))
    archive = harness / "results" / "archive"
    assert len(present(archive)) == 4 and present(archive) == indexed(archive)
    store = harness / "results" / "history.sqlite"
    assert main(["rebuild", "--store", str(store)]) == 0
    assert main(["merge", str(nights[4]), "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(["verify", "--store", str(store)]) == 0
    assert "all 5 run(s)" in capsys.readouterr().out


def test_archive_needs_names_the_entries_merge_reads(data_branch, tmp_path, capsys):
    harness, server, nights = data_branch
    names = tmp_path / "names"
    archive = tmp_path / "published" / "archive"
    names.write_text(git(archive, "ls-files"))
    capsys.readouterr()
    store = harness / "results" / "history.sqlite"
    assert main(["archive-needs", "--names", str(names), "--store", str(store), str(nights[0])]) == 0
    needed = capsys.readouterr().out.split()
    entries = indexed(archive)
    assert needed == [entries[0], entries[3]]  # night 1 comes again; night 4 is not in the store
    assert main(["archive-needs", "--names", str(tmp_path / "absent"), "--store", str(store), str(nights[0])]) == 2
    assert f"{tmp_path / 'absent'}: cannot read the archive's entry names" in capsys.readouterr().err

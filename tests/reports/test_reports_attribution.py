import subprocess

import pytest
from reports_testkit import Cell, fail, render, section

from reports.__main__ import main


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(repo, path: str, subject: str) -> str:
    file = repo / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(file.read_text() + subject + "\n" if file.exists() else subject + "\n")
    git(repo, "add", path)
    git(repo, "commit", "-q", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def deepspeed_repo(tmp_path):
    """A tiny DeepSpeed-like history: v0.14.2, four commits (two touching AutoTP paths), v0.14.3."""
    repo = tmp_path / "DeepSpeed"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "master")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "dev")
    shas = {"base": commit(repo, "deepspeed/__init__.py", "Initial import (#1)")}
    git(repo, "tag", "v0.14.2")
    shas["autotp"] = commit(repo, "deepspeed/module_inject/auto_tp.py", "Fix AutoTP for llama (#5436)")
    shas["docs"] = commit(repo, "docs/index.md", "Update docs (#5437)")
    shas["accelerator"] = commit(repo, "deepspeed/accelerator/real_accelerator.py", "Accelerator tweak (#5440)")
    shas["readme"] = commit(repo, "README.md", "Direct push without a PR number")
    git(repo, "tag", "v0.14.3")
    return repo, shas


def test_release_range_lists_autotp_commits_first(deepspeed_repo, session, tmp_path):
    repo, shas = deepspeed_repo
    session([Cell("llama")], deepspeed="0.14.2")
    session([fail("llama", "shard")], deepspeed="0.14.3")
    report = (render(tmp_path / "junit", tmp_path, "--deepspeed-repo", str(repo)) / "report.md").read_text()
    url = "https://github.com/deepspeedai/DeepSpeed"

    def commit(name: str, pr: int | None, subject: str) -> str:
        sha = shas[name]
        number = f"[#{pr}]({url}/pull/{pr}) " if pr else ""
        return f'[{sha[:10]}]({url}/commit/{sha}) ({number}"{subject}")'

    assert section(report, "Root causes")[2:] == [
        "1. shard: init_inference fails to shard it `ShardError: broken` — deepspeed 0.14.2 → 0.14.3 — 1 cell: "
        "eager fp32: llama tp2",
        "   - answer: not yet triaged",
        "   - candidate commits (2 of 4 touch AutoTP paths, listed first): "
        + "; ".join(
            [
                commit("accelerator", 5440, "Accelerator tweak"),
                commit("autotp", 5436, "Fix AutoTP for llama"),
                commit("readme", None, "Direct push without a PR number"),
                commit("docs", 5437, "Update docs"),
            ]
        ),
    ]


def test_git_builds_are_ordered_topologically_not_by_date(deepspeed_repo, session, tmp_path):
    repo, shas = deepspeed_repo
    # Runs tested newer commits first, so date order would put the break in the wrong place.
    session([fail("llama", "numerics")], deepspeed="0.14.3.dev0", deepspeed_git=shas["accelerator"])
    session([Cell("llama")], deepspeed="0.14.3.dev0", deepspeed_git=shas["docs"])
    session([Cell("llama")], deepspeed="0.14.3.dev0", deepspeed_git=shas["autotp"])
    report = (render(tmp_path / "junit", tmp_path, "--deepspeed-repo", str(repo)) / "report.md").read_text()
    docs, accelerator = shas["docs"], shas["accelerator"]
    url = "https://github.com/deepspeedai/DeepSpeed"
    assert section(report, "Root causes")[2:] == [
        "1. numerics: logits differ from the unsharded model `NumericsError: broken` — "
        f"deepspeed 0.14.3.dev0@{docs[:10]} → 0.14.3.dev0@{accelerator[:10]} — 1 cell: eager fp32: llama tp2",
        "   - answer: not yet triaged",
        f"   - candidate commits (1 of 1 touch AutoTP paths, listed first): "
        f"[{accelerator[:10]}]({url}/commit/{accelerator}) "
        f'([#5440]({url}/pull/5440) "Accelerator tweak")',
    ]


def test_unknown_version_in_repo_is_a_clear_error(deepspeed_repo, session, tmp_path, capsys):
    repo, _ = deepspeed_repo
    session([Cell("llama")], deepspeed="0.15.0")
    store = tmp_path / "history.sqlite"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    assert main(["render", "--store", str(store), "--out", str(tmp_path), "--deepspeed-repo", str(repo)]) == 2
    assert (
        f"cannot find DeepSpeed 0.15.0 (tried v0.15.0, 0.15.0); run `git -C {repo} fetch --tags origin`"
        in capsys.readouterr().err
    )
    assert main(["render", "--store", str(store), "--deepspeed-repo", str(tmp_path / "junit")]) == 2
    assert "not a git clone" in capsys.readouterr().err


def test_a_label_that_is_not_a_release_is_ordered_without_the_clone(deepspeed_repo, session, tmp_path):
    # An install failure at a PR records its label (pr/1234), which names no commit of the clone.
    repo, _ = deepspeed_repo
    session([Cell("llama")], deepspeed="0.14.3")
    session([fail("llama", "install", "pip failed")], deepspeed="pr/1234")
    report = (render(tmp_path / "junit", tmp_path, "--deepspeed-repo", str(repo)) / "report.md").read_text()
    assert section(report, "Root causes")[2:] == [
        "1. install: install failure `pip failed` — deepspeed 0.14.3 → pr/1234 — 1 cell: eager fp32: llama tp2",
        "   - answer: not yet triaged",
    ]

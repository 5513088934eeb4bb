"""Issue #42: secrets planted in every input path a runner controls — a JUnit failure's message, text and signature,
its system-out, a skip message, the logs and checkpoint.revision properties, the run's host and so its run id, the
cells.jsonl beside it, a file merge refuses and one that contradicts the archive — appear 0 times, and not as one
4-character piece, in the archive (its entries unpacked), the store, every output of render, publish (with upstream
reports and their repro scripts), draft-issue and gate, and everything every command printed; with the secret's
variable set at merge time, only at render time, and never (then only shaped tokens are secrets).

The same scenario run against the code before the fix (`python tests/reports/planted_run.py`, see its docstring)
leaves 63 whole shaped tokens and 2,167 pieces of them in 6 places (the archive's entries, the stores, merge's and
archive-needs' output), 25 whole values of the variable set at merge time, and 204 pieces of it when it is set only
for render (a number masked before the redactor ran)."""

from __future__ import annotations

import pytest
from planted_run import ENV_NAME, left_behind, run_commands, secrets_in

from reports.__main__ import main


@pytest.fixture(autouse=True)
def no_github(monkeypatch):
    for name in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY", "GITHUB_REPOSITORY", "HF_TOKEN", ENV_NAME):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("set_at", ["merge", "render", "never"])
def test_no_planted_secret_or_piece_of_one_is_left_anywhere(tmp_path, set_at):
    printed = run_commands(tmp_path, set_at, main)
    assert secrets_in(tmp_path, set_at, printed) == {
        "shaped tokens, whole": {},
        "shaped tokens, 4-character pieces": {},
        "crafted secrets, 8-character pieces": {},
        **(
            {"the variable's value, whole": {}, "the variable's value, 4-character pieces": {}}
            if set_at != "never"
            else {}
        ),
    }
    # The leaky texts did reach these places, redacted: the test looks where the secrets would be.
    made = {**left_behind(tmp_path, printed)["merge"], **left_behind(tmp_path, printed)["render"]}
    reached = [
        "printed by merge",
        "printed by render",
        "printed by draft-issue",
        "printed by gate",
        "merged.sqlite",
        "history.sqlite",
        "2025-01-02T00%3A00%3A00Z@r-",  # the failing night's archive entry
        "report.md",
        "report.json",
        "report.html",
        "step-summary.md",
        "comment.md",
        "publish/issues/",
        "-full.py",  # the full script attached to publish's report for DeepSpeed's tracker and to the draft
        "draft-issue/forward-",
    ]
    reached += [where for where in made if "/publish/upstream/" in where and where.endswith(".md")]
    for part in reached:
        places = [where for where in made if part in where]
        assert places and all("***" in made[where] for where in places), part
    merge = next(text for name, text in printed.items() if name.startswith("merge"))
    assert "skipped" in merge and "checkpoint.revision='***'" in merge  # the refused file, named with its value
    assert "conflict" in merge and "Bearer ***" in merge  # the contradicting file, its signature redacted
    assert len(list((tmp_path / "results" / "archive").rglob("*.tar.gz"))) == 2
    assert (tmp_path / "out" / "publish" / "upstream").is_dir() and (tmp_path / "out" / "draft-issue").is_dir()

"""Issue #53 item 2: time from the door. A run's start is read at the door (ASCII digits, a year from 2000, not a day
past the time it is imported), kept in UTC in one spelling, and harness commits are ordered by the harness's git
history, never by a runner's clock. A generator crafts starts of each class."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from reports_testkit import Cell, fail, render, section, write_junit

from reports.__main__ import main
from reports.clones import git
from reports.outputs.model import read_report
from reports.store.history_store import HistoryStore

pytestmark = pytest.mark.usefixtures("no_github")


def crafted_starts() -> Iterator[tuple[str, str]]:
    """(a start no session writes, the words it is refused with): each class of clock a runner could claim."""
    arabic_indic = "".join(chr(0x0660 + int(digit)) for digit in "2025")
    yield f"{arabic_indic}-01-05T00:00:00Z", "is not a start time"  # int() reads them; text order does not
    yield "2025-01-05T00:00:00+2400", "is not a time"
    yield "2025-02-30T00:00:00Z", "is not a time"
    yield "1999-12-31T23:59:59Z", "is before 2000"
    future = datetime.now(timezone.utc) + timedelta(days=2)
    yield future.strftime("%Y-%m-%dT%H:%M:%SZ"), "a day past the time it is read at"
    yield "2099-01-01T00:00:00Z", "a day past the time it is read at"
    yield "2025-01-05 00:00:00Z", "is not a start time"


STARTS = list(crafted_starts())


@pytest.mark.parametrize(("started", "says"), STARTS, ids=[f"{n}-{says}" for n, (_, says) in enumerate(STARTS)])
def test_a_start_no_clock_gives_is_refused_at_the_door(started, says, tmp_path, capsys):
    path = write_junit(tmp_path / "junit" / "run.xml", [Cell("llama")], run_id="nightly@x@runner-1", started=started)
    assert main(["merge", str(path), "--store", str(tmp_path / "history.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "run.started=" in err and says in err, err


def test_starts_are_kept_in_utc_so_they_sort_as_time(tmp_path):
    """`+09:00` at 08:00 is 23:00 the day before: kept as ...Z, it sorts before a UTC run at midnight."""
    for name, started in (("tokyo", "2025-01-05T08:00:00+09:00"), ("utc", "2025-01-05T00:00:00Z")):
        write_junit(tmp_path / "junit" / f"{name}.xml", [Cell("llama")], run_id=f"{name}@1@h", started=started)
    assert main(["merge", str(tmp_path / "junit"), "--store", str(tmp_path / "history.sqlite")]) == 0
    with HistoryStore(tmp_path / "history.sqlite", create=False) as history:
        assert [(run.session, run.started) for run in history.runs()] == [
            ("tokyo", "2025-01-04T23:00:00Z"),
            ("utc", "2025-01-05T00:00:00Z"),
        ]
    assert main(["verify", "--store", str(tmp_path / "history.sqlite")]) == 0  # the archive holds the same


def test_a_past_dated_run_of_the_newer_harness_does_not_make_it_the_older(session, tmp_path, monkeypatch):
    """The harness fix's run claims 2020: by the clock it would be the older harness and its failure the old verdict
    (a regression read as fixed by the harness); by the harness's git history it is the newer."""
    old, fix = "a" * 40, "b" * 40
    monkeypatch.setattr(git, "harness_history", lambda: (old, fix))
    session([Cell("llama")], deepspeed="0.19.8", harness_git=old)
    session([Cell("llama")], deepspeed="0.19.8", harness_git=old)
    session([fail("llama", "numerics")], deepspeed="0.19.8", harness_git=fix, started="2020-01-01T00:00:00Z")
    out = render(tmp_path / "junit", tmp_path)
    assert section((out / "report.md").read_text(), "Harness changes")[1:] == [
        "- llama-eager-fp32-tp2 at deepspeed 0.19.8, transformers 4.44.0, torch 2.4.0, python 3.11.7: "
        "pass ×2 at harness aaaaaaaaaa → fail ×1 at harness bbbbbbbbbb"
    ]
    assert read_report(out).harness_changes[0].before_status.status == "pass"


def test_the_harness_history_is_read_from_its_own_checkout():
    history = git.harness_history()
    if len(history) < 2:
        pytest.skip("the harness runs from a shallow checkout or an installed copy: no history to order by")
    newest, older = history[-1], history[-2]
    assert git.harness_order([newest[:10], older + "-dirty"]) == {
        newest[:10]: len(history) - 1,
        older + "-dirty": len(history) - 2,
    }
    assert git.harness_order([newest, "f" * 40]) is None  # a commit git cannot place: no order from git at all

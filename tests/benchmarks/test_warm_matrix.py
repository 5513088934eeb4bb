"""benchmarks/warm_matrix.py's checks of one run against another: verdicts and compared numbers, context switches."""

import json
import os
import signal
import subprocess
import sys
import time

from benchmarks.warm_matrix import TreeSwitches, differences


def write_cells(folder, cells):
    folder.mkdir(parents=True)
    lines = [
        json.dumps({"cell": {"id": cell}, "outcome": outcome, "failure_class": klass, "signature": sign, "metrics": m})
        for cell, (outcome, klass, sign, m) in cells.items()
    ]
    (folder / "cells.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_a_run_differs_by_its_verdicts_and_compared_numbers_never_by_its_timings(tmp_path):
    same = {"logits_max_abs": 1.5e-7, "time_forward_s": 0.3, "cpu_cell_s": 0.5, "rss_max_bytes": 1e8}
    measured = {"time_forward_s": 9.0, "cpu_cell_s": 7.0, "rss_max_bytes": 2e8, "plan_host_available_bytes": 1e9}
    first = write_cells(
        tmp_path / "first",
        {
            "a-tp3": ("pass", "", "", same),
            "b-tp3": ("fail", "forward", "RuntimeError: x", same),
            "c-tp4": ("pass", "", "", same),
            "d-tp4": ("pass", "", "", same),
        },
    )
    other = write_cells(
        tmp_path / "other",
        {
            "a-tp3": ("pass", "", "", {**same, **measured}),
            "b-tp3": ("fail", "forward", "RuntimeError: y", same),
            "c-tp4": ("pass", "", "", {**same, "logits_max_abs": 1.6e-7}),
            "e-tp4": ("pass", "", "", same),
        },
    )
    assert differences(first, other) == {
        "verdicts_differ": ["d-tp4", "e-tp4", "b-tp3"],
        "numbers_differ": ["d-tp4", "e-tp4", "c-tp4"],
    }
    assert differences(first, first) == {"verdicts_differ": [], "numbers_differ": []}


def test_context_switches_are_counted_over_the_run_s_process_tree():
    """A grandchild that naps 300 times (as a rank forked from the fork server does) is counted; its parent, which
    only waits, is seen too."""
    naps = "if os.fork() == 0:\n    [time.sleep(0.001) for _ in range(300)]\n    time.sleep(60)\nos.wait()"
    child = subprocess.Popen([sys.executable, "-c", f"import os, time\n{naps}"], start_new_session=True)
    try:
        switches, deadline = TreeSwitches(child.pid), time.monotonic() + 60
        while time.monotonic() < deadline and switches.totals()["switches_voluntary"] < 300:
            switches.sample()
            time.sleep(0.1)
        assert len(switches.seen) == 2 and os.getpid() not in switches.seen, switches.seen
        assert switches.totals()["switches_voluntary"] >= 300, switches.seen
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()

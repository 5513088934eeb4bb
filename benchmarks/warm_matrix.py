"""Warm pytest seconds of the AutoTP suites for harness checkouts side by side, with where they go: JUnit seconds per
tp size (sum, and the median cell's), the ranks' load / shard / probe wall seconds (rank 0's) and CPU seconds (every
rank's, summed: `cpu_<stage>_s` of the records, 0 for a revision that does not record them; `cell` is a rank's whole
cell up to its hand-off to rank 0) from the records (the rest: driver, judging, group starts, hand-overs), the CPU
seconds of the whole run's process tree and the load average, and ratios against the first harness.

    python benchmarks/warm_matrix.py --python <combination env>/bin/python --out /tmp/warm \\
        --harness base=<checkout of main> --harness new=. [--repeat 2] \\
        [--selection "--models llama,qwen2,gpt2,bloom,mixtral,gemma2 --tp 2,3,4"]

One checkout under several labels with `--env LABEL=NAME=VALUE` compares settings of it, e.g. the ways ranks wait
(suites/engine/rank_waits.py): `--harness naps=. --harness spin=. --env spin=AUTOTP_RANK_WAIT=spin`.
Labels of one checkout share its fill. Each run's verdicts (outcome, class, signature) and the numbers its probes
compared (every metric but the measured ones, MEASURED_PREFIXES) are checked against the first label's first run,
and the ranks' context switches (voluntary: naps and sleeps; involuntary: taken off-core) are sampled from /proc.

Each harness first fills a harness cache of its own with one untimed run of the selection (its references are
keyed by its own probe code), or takes `--cache LABEL=PATH`; every timed run reads a hard-linked copy of it
(nothing a run writes reaches it: every write is a rename). Rounds run the harnesses in turn, so the runs of a round
meet about the same load on a shared machine; the median run per harness is printed. CPU seconds come from a
cpuacct cgroup of the run (exact, every process of the tree) where this machine lets one be made, else from /proc
samples of the tree once a second (a process that ends between two samples keeps its last figure).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from benchmarks.cold_start import ProcessTreeCPU, process_table, process_tree
from sessions.environments import environment_variables

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
RANK_PHASES = ("time_load_s", "time_shard_s", "time_forward_s")
RANK_CPU = ("cpu_load_s", "cpu_shard_s", "cpu_forward_s", "cpu_cell_s")
DEFAULT_SELECTION = "--models llama,qwen2,gpt2,bloom,mixtral,gemma2 --tp 2,3,4"
MEASURED_PREFIXES = ("time_", "cpu_", "rss_", "reference_peak_rss_", "plan_host_available_")
"""Metrics that measure the run or the machine (they differ between any two runs: seconds, resident memory, the memory
the host has free); every other metric is a number the probes compared or the plan computed, the same in every run
when the ranks compute the same bits."""


class TreeCPU:
    """CPU seconds of a process and all its descendants: a cpuacct cgroup (cgroup v1) when one can be made, the
    child joining it before it execs; else /proc samples of the tree (benchmarks/cold_start.py ProcessTreeCPU)."""

    def __init__(self, label: str):
        self.group: Path | None = CPUACCT / f"autotp-warm-{label}-{os.getpid()}"
        try:
            self.group.mkdir()
        except OSError:
            self.group = None
        self.sampled: ProcessTreeCPU | None = None

    def join(self) -> None:
        """In the child, before exec."""
        if self.group is not None:
            (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def started(self, pid: int) -> None:
        if self.group is None:
            self.sampled = ProcessTreeCPU(pid)

    def sample(self) -> None:
        if self.sampled is not None:
            self.sampled.sample()

    def seconds(self) -> float:
        if self.group is not None:
            used = int((self.group / "cpuacct.usage").read_text()) / 1e9
            try:
                self.group.rmdir()  # fails while a process of the run still lives: the group is left, named
            except OSError:
                pass
            return used
        assert self.sampled is not None
        return sum(self.sampled.by_role().values())


class TreeSwitches:
    """Context switches of each process of a run's tree (its main thread's: where a rank spins in the all-reduce),
    sampled once a second from /proc (a process keeps its last figure when it ends: ranks live the whole run)."""

    def __init__(self, driver: int):
        self.driver = driver
        self.seen: dict[int, tuple[int, int]] = {}

    def sample(self) -> None:
        tree = process_tree(self.driver, process_table())
        for pid in tree:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue  # ended while we looked
            counts = dict(re.findall(r"^(\w*ctxt_switches):\s+(\d+)", status, re.MULTILINE))
            if len(counts) == 2:
                self.seen[pid] = (int(counts["voluntary_ctxt_switches"]), int(counts["nonvoluntary_ctxt_switches"]))

    def totals(self) -> dict[str, int]:
        return {
            "switches_voluntary": sum(voluntary for voluntary, _ in self.seen.values()),
            "switches_involuntary": sum(involuntary for _, involuntary in self.seen.values()),
        }


def run_suites(
    python: Path, harness: Path, cache: Path, results: Path, log: Path, selection: list[str], extra: dict[str, str]
) -> dict[str, Any]:
    """One `pytest suites` run of the selection as `nox -s matrix` runs it, `extra` added to its environment."""
    env = {**environment_variables(python), "AUTOTP_CACHE": str(cache), **extra}
    command = [str(python), "-m", "pytest", "suites", "--session-name", "matrix", "--no-resume"]
    command += ["--results", str(results), *selection]
    cpu = TreeCPU(results.parent.name)
    load_before, started = os.getloadavg(), time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=harness, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=cpu.join
        )
        cpu.started(process.pid)
        switches = TreeSwitches(process.pid)
        while process.poll() is None:
            cpu.sample()
            switches.sample()
            time.sleep(1.0)
    return {
        "wall_s": time.perf_counter() - started,
        "cpu_s": cpu.seconds(),
        **switches.totals(),
        "load_before": load_before[0],
        "load_after": os.getloadavg()[0],
        "rc": process.returncode,
        **junit_breakdown(results),
        "log": str(log),
    }


def junit_breakdown(results: Path) -> dict[str, Any]:
    """pytest seconds (the JUnit suite's), and per tp size the cells' JUnit seconds and the ranks' phases."""
    records = {}
    for line in (results / "cells.jsonl").read_text().splitlines():
        record = json.loads(line)
        records[record["cell"]["id"]] = record
    root = ElementTree.parse(results / "junit" / "matrix.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, f"{results}/junit/matrix.xml holds no testsuite"
    per_tp: dict[str, dict[str, float]] = {}
    cell_seconds: dict[str, list[float]] = {}
    for case in suite.iter("testcase"):
        cell = re.search(r"\[(.*)\]$", case.get("name", ""))
        record = records.get(cell.group(1)) if cell else None
        if record is None:
            continue
        tp = str(record["cell"]["tp"])
        row = per_tp.setdefault(tp, dict.fromkeys(("cells", "junit_s", *RANK_PHASES, *RANK_CPU), 0.0))
        row["cells"] += 1
        row["junit_s"] += float(case.get("time", 0.0))
        cell_seconds.setdefault(tp, []).append(float(case.get("time", 0.0)))
        for phase in (*RANK_PHASES, *RANK_CPU):
            row[phase] += record["metrics"].get(phase, 0.0)
    for tp, seconds in cell_seconds.items():
        per_tp[tp]["junit_median_s"] = statistics.median(seconds)
    return {"pytest_s": float(suite.get("time", 0.0)), "per_tp": per_tp, "cells": str(results / "cells.jsonl")}


def cell_results(results: Path) -> dict[str, tuple[tuple[str, str, str], dict[str, float]]]:
    """Each cell's verdict (outcome, class, signature) and the numbers its probes compared (MEASURED_PREFIXES)."""
    cells = {}
    for line in (results / "cells.jsonl").read_text().splitlines():
        record = json.loads(line)
        numbers = {k: v for k, v in record["metrics"].items() if not k.startswith(MEASURED_PREFIXES)}
        cells[record["cell"]["id"]] = ((record["outcome"], record["failure_class"], record["signature"]), numbers)
    return cells


def differences(first: Path, other: Path) -> dict[str, list[str]]:
    """Cells whose verdict, or whose compared numbers, differ between two runs' results (a cell only one ran: both)."""
    base, new = cell_results(first), cell_results(other)
    missing = sorted(base.keys() ^ new.keys())
    both = sorted(base.keys() & new.keys())
    return {
        "verdicts_differ": missing + [cell for cell in both if base[cell][0] != new[cell][0]],
        "numbers_differ": missing + [cell for cell in both if base[cell][1] != new[cell][1]],
    }


def linked_copy(cache: Path) -> Path:
    copy = Path(tempfile.mkdtemp(prefix="warm-cache-")) / "cache"
    subprocess.run(["cp", "-al", str(cache), str(copy)], check=True)
    return copy


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda run: run["pytest_s"])[len(runs) // 2]


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    labels = list(runs)
    medians = {label: median_run(runs[label]) for label in labels}
    first = medians[labels[0]]
    lines = [
        f"{'median run':<34}"
        + "".join(f"{label:>14}" for label in labels)
        + "  "
        + " ".join(f"{labels[0]}/{label}" for label in labels[1:])
    ]

    def row(title: str, values: list[float], ratio: bool = True, digits: int = 1) -> None:
        cells = "".join(f"{value:>14.{digits}f}" for value in values)
        ratios = "  " + " ".join(f"{values[0] / value:.2f}x" for value in values[1:] if value) if ratio else ""
        lines.append(f"{title:<34}{cells}{ratios}")

    row("pytest s", [medians[label]["pytest_s"] for label in labels])
    for tp in sorted(first["per_tp"], key=int):
        row(f"  tp {tp}: JUnit s", [medians[label]["per_tp"].get(tp, {}).get("junit_s", 0.0) for label in labels])
        median = [medians[label]["per_tp"].get(tp, {}).get("junit_median_s", 0.0) for label in labels]
        row("    median cell's JUnit s", median, digits=3)
        for phase in RANK_PHASES:
            values = [medians[label]["per_tp"].get(tp, {}).get(phase, 0.0) for label in labels]
            row(f"    ranks {phase.removeprefix('time_').removesuffix('_s')} s", values)
        rest = [
            medians[label]["per_tp"].get(tp, {}).get("junit_s", 0.0)
            - sum(medians[label]["per_tp"].get(tp, {}).get(phase, 0.0) for phase in RANK_PHASES)
            for label in labels
        ]
        row("    rest s", rest)
        for phase in RANK_CPU:
            values = [medians[label]["per_tp"].get(tp, {}).get(phase, 0.0) for label in labels]
            row(f"    ranks' CPU {phase.removeprefix('cpu_').removesuffix('_s')} s", values)
    row("CPU s (whole process tree)", [medians[label]["cpu_s"] for label in labels])
    for kind in ("voluntary", "involuntary"):
        row(f"{kind} switches (tree, k)", [medians[label].get(f"switches_{kind}", 0) / 1e3 for label in labels])
    row("wall s (imports to exit)", [medians[label]["wall_s"] for label in labels])
    row("load average before", [medians[label]["load_before"] for label in labels], ratio=False)
    for label in labels:
        every = ", ".join(f"{run['pytest_s']:.1f}" for run in runs[label])
        lines.append(f"{label}: pytest s of every run {every}")
    for label in labels:
        for kind in ("verdicts_differ", "numbers_differ"):
            cells = sorted({cell for run in runs[label] for cell in run.get(kind, [])})
            said = (
                f"{len(cells)} cells ({', '.join(cells[:5])}{', ...' if len(cells) > 5 else ''})" if cells else "none"
            )
            lines.append(f"{label}: {kind.replace('_', ' ')} from {labels[0]}'s first run: {said}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, required=True, help="the combination environment's python")
    parser.add_argument("--harness", action="append", required=True, metavar="LABEL=PATH", help="a harness checkout")
    parser.add_argument("--cache", action="append", default=[], metavar="LABEL=PATH", help="a filled harness cache")
    parser.add_argument(
        "--env", action="append", default=[], metavar="LABEL=NAME=VALUE", help="a variable set for that label's runs"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=2, help="rounds (the median run per harness is printed)")
    parser.add_argument("--selection", default=DEFAULT_SELECTION, help="pytest options of the runs ('' for all)")
    args = parser.parse_args()
    harnesses = {label: Path(path).resolve() for label, path in (item.split("=", 1) for item in args.harness)}
    caches = {label: Path(path).resolve() for label, path in (item.split("=", 1) for item in args.cache)}
    extra: dict[str, dict[str, str]] = {label: {} for label in harnesses}
    for item in args.env:
        label, name, value = item.split("=", 2)
        extra[label][name] = value
    selection = shlex.split(args.selection)
    for label, harness in harnesses.items():
        shared = next((caches[other] for other in caches if harnesses.get(other) == harness), None)
        if label not in caches and shared is not None:
            caches[label] = shared  # another label of this checkout: the same references
        elif label not in caches:  # untimed: fills this harness's own cache
            caches[label] = Path(tempfile.mkdtemp(prefix=f"warm-fill-{label}-")) / "cache"
            folder = args.out / label / "fill"
            folder.mkdir(parents=True, exist_ok=True)
            filled = run_suites(
                args.python, harness, caches[label], folder / "results", folder / "pytest.log", selection, extra[label]
            )
            print(f"{label} fill: {filled['pytest_s']:.1f} s", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in harnesses}
    for round_ in range(args.repeat):
        for label, harness in harnesses.items():
            folder = args.out / label / f"round-{round_}"
            folder.mkdir(parents=True, exist_ok=True)
            copy = linked_copy(caches[label])
            run = run_suites(
                args.python, harness, copy, folder / "results", folder / "pytest.log", selection, extra[label]
            )
            shutil.rmtree(copy.parent)
            first = args.out / next(iter(harnesses)) / "round-0" / "results"
            run.update(differences(first, folder / "results"))
            runs[label].append(run)
            print(f"{label} round {round_}: {json.dumps(run)}", flush=True)
    (args.out / "summary.json").write_text(json.dumps(runs, indent=1))
    print(table(runs))


if __name__ == "__main__":
    main()

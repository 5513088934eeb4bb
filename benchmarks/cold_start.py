"""Time to the first verdict of the default matrix with an empty cache, and its warm pytest time, for
one or more harness checkouts side by side (the same environment, one after the other).

    python benchmarks/cold_start.py --python <combination env>/bin/python --out /tmp/cold \\
        [--harness base=/tmp/autotp-base] [--harness new=.] [--against /tmp/earlier/summary.json]
    python benchmarks/cold_start.py --python <combination env>/bin/python --out /tmp/first \\
        --first-record --harness old=<worktree of e684cfc> --harness new=.
    python benchmarks/cold_start.py --python <combination env>/bin/python --out /tmp/cold-subset --repeat 2 \\
        --selection "--models llama,qwen2,gpt2 --tp 2" --bytecode /tmp/layers-bytecode \\
        --harness base=... --harness new=.

`--first-record`: seconds from `pytest suites --models llama --tp 2 --dtypes fp32` (`--first-record-selection`)
to its first record, stopped there, for each harness in turn within each case (the same load, as near as a
shared machine allows), `--repeat` times: `warm` (its harness cache filled by an untimed run of the same
selection: the same combination again, a bisection's next cell) and `new transformers release` (an empty cache:
the model's tiny checkpoint and reference are written first, as for a combination whose transformers version the
cache has never seen; the environment itself is benchmarks/environments.py's). With each figure: the CPU seconds
each process of the run had used by then (driver, fork server, reference process, ranks), read from /proc,
and the load average; ratios against the first --harness.

For each harness: `pytest suites -v` (the default selection) with an empty AUTOTP_CACHE (cold: tiny
checkpoints and references are made on the way), then again with that cache (warm). The first verdict is
the first record in the run's cells.jsonl (written as each cell ends). Each run's cells.jsonl is
kept under --out for `compare_cells`-style verdict comparison; `--against` adds an earlier summary's
columns (measured at another time: its load average is printed with it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from sessions.environments import environment_variables
from suites.engine.fork_server import REFERENCE_PROCESS_NAME

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_table() -> dict[int, tuple[int, float, str]]:
    """pid: (parent pid, CPU seconds used so far, process name and command line) of every process readable in
    /proc (a forked reference's process is told by its name, suites/engine/fork_server.py REFERENCE_PROCESS_NAME)."""
    table: dict[int, tuple[int, float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, stat_tail = (entry / "stat").read_text().split("(", 1)[1].rsplit(")", 1)
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = stat_tail.split()
        except (OSError, IndexError, ValueError):
            continue  # ended while we looked
        table[int(entry.name)] = (
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
            f"[{name}] {command}",
        )
    return table


def process_tree(root: int, table: dict[int, tuple[int, float, str]]) -> set[int]:
    """`root` and every process of `table` descended from it."""
    tree, grew = {root}, True
    while grew:
        grown = tree | {pid for pid, (parent, _, _) in table.items() if parent in tree}
        grew, tree = grown != tree, grown
    return tree


def _role(pid: int, table: dict[int, tuple[int, float, str]], driver: int) -> str:
    """What a process of the run is: forked processes keep their parent's command line, so group leaders and
    ranks are named by whose children they are."""
    if pid == driver:
        return "driver"
    parent, _, command = table[pid]
    if "suites.reference.unsharded" in command or command.startswith(f"[{REFERENCE_PROCESS_NAME[:15]}]"):
        return "reference"
    parent_role = _role(parent, table, driver) if parent in table else ""
    if parent_role == "fork server":
        return "group leader"
    if parent_role == "group leader":
        return "ranks"
    if "suites.engine.fork_server" in command:
        return "fork server"
    return "other"


class ProcessTreeCPU:
    """CPU seconds per role of a run's process tree, sampled while it runs (a process that ended between two
    samples keeps its last figure; one that lived less than a sample is missed: compilers, git)."""

    def __init__(self, driver: int):
        self.driver = driver
        self.seen: dict[int, tuple[str, float]] = {}

    def sample(self) -> None:
        table = process_table()
        tree = process_tree(self.driver, table)
        for pid in tree & table.keys():
            self.seen[pid] = (_role(pid, table, self.driver), table[pid][1])

    def by_role(self) -> dict[str, float]:
        roles: dict[str, float] = {}
        for role, seconds in self.seen.values():
            roles[role] = round(roles.get(role, 0.0) + seconds, 2)
        return roles


def run_matrix(
    python: Path,
    harness: Path,
    cache: Path,
    results: Path,
    log: Path,
    stop_at_first_verdict: bool = False,
    models: str | None = None,
    selection: tuple[str, ...] = (),
    bytecode: Path | None = None,
) -> dict[str, Any]:
    """One `pytest suites` run of the default matrix (or `selection`: pytest options), as `nox -s matrix` runs it;
    seconds to the first verdict (the first record in cells.jsonl, written as each cell ends) and in all, and the
    CPU seconds per process role until the first verdict. `stop_at_first_verdict`: interrupt it there (Ctrl-C:
    the driver ends its rank group and reference process). `bytecode`: see `bytecode_environment`."""
    env = {**environment_variables(python), "AUTOTP_CACHE": str(cache), **bytecode_environment(bytecode)}
    command = [
        str(python),
        "-m",
        "pytest",
        "suites",
        "-p",
        "no:cacheprovider",
        "--no-resume",
        "--results",
        str(results),
        "--session-name",
        "matrix",
        *(["--models", models] if models else []),
        *selection,
    ]
    records = results / "cells.jsonl"
    load_before = os.getloadavg()[0]
    started, first_verdict, sampled, load_at_first_verdict = time.perf_counter(), None, 0.0, None
    with log.open("w") as out:
        # A shell's background job ignores SIGINT, and its children inherit that: restore it for the Ctrl-C below.
        process = subprocess.Popen(
            command,
            cwd=harness,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        cpu = ProcessTreeCPU(process.pid)
        while process.poll() is None:
            if first_verdict is None and time.perf_counter() - sampled > 0.25:  # /proc costs a core's share too
                cpu.sample()
                sampled = time.perf_counter()
            if first_verdict is None and records.exists() and records.stat().st_size:
                first_verdict = time.perf_counter() - started
                cpu.sample()
                load_at_first_verdict = os.getloadavg()[0]
                if stop_at_first_verdict:
                    process.send_signal(signal.SIGINT)
                    process.wait()
            time.sleep(0.05)
    verdicts = len(records.read_text().splitlines()) if records.exists() else 0
    return {
        "first_verdict_s": first_verdict,
        "total_s": time.perf_counter() - started,
        "verdicts": verdicts,
        "rc": process.returncode,
        "cpu_s_to_first_verdict": cpu.by_role(),
        "load_before": load_before,
        "load_at_first_verdict": load_at_first_verdict,
        "load_after": os.getloadavg()[0],
        "cells": str(records),
        "log": str(log),
    }


def bytecode_environment(folder: Path | None) -> dict[str, str]:
    """The variable that makes every process of a run read compiled bytecode from `folder` (a PYTHONPYCACHEPREFIX
    tree) instead of next to the sources (none: as the caller's environment says). Where PYTHONDONTWRITEBYTECODE is
    set, an environment without bytecode compiles every module it imports in every process, every run; a tree
    compiled from the torch and DeepSpeed layers stands for layers that carry their bytecode (sessions/
    environments.py), while transformers, which is not in it, is compiled as it is imported:

        PYTHONPYCACHEPREFIX=/tmp/layers-bytecode python -m compileall -q -j 0 <torch layer> <DeepSpeed layer>
    """
    return {"PYTHONPYCACHEPREFIX": str(folder)} if folder is not None else {}


def measure(
    python: Path,
    label: str,
    harness: Path,
    out: Path,
    cold_first_verdict_only: bool,
    warm_cache: Path | None,
    warm_models: str | None,
    bytecode: Path | None = None,
    selection: tuple[str, ...] = (),
) -> dict[str, Any]:
    cold_cache = Path(tempfile.mkdtemp(prefix=f"cold-cache-{label}-"))
    runs = {}
    for kind in ("cold", "warm"):
        folder = out / label / kind
        folder.mkdir(parents=True, exist_ok=True)
        cache = cold_cache
        if kind == "warm" and warm_cache is not None:
            cache = Path(tempfile.mkdtemp(prefix=f"warm-cache-{label}-")) / "cache"
            # Hard links: instant, and nothing the run writes reaches the given cache (every write is a rename).
            subprocess.run(["cp", "-al", str(warm_cache), str(cache)], check=True)
        runs[kind] = run_matrix(
            python,
            harness,
            cache,
            folder / "results",
            folder / "pytest.log",
            stop_at_first_verdict=kind == "cold" and cold_first_verdict_only,
            models=warm_models if kind == "warm" else None,
            selection=selection,
            bytecode=bytecode,
        )
        print(f"{label} {kind}: {json.dumps(runs[kind])}", flush=True)
    return runs


def table(summaries: dict[str, dict[str, Any]]) -> str:
    rows = [
        ("first verdict, cold (s)", "cold", "first_verdict_s"),
        ("pytest total, cold (s)", "cold", "total_s"),
        ("first verdict, warm (s)", "warm", "first_verdict_s"),
        ("pytest total, warm (s)", "warm", "total_s"),
        ("cells with a verdict, warm", "warm", "verdicts"),
        ("load average before, warm", "warm", "load_before"),
    ]
    labels = list(summaries)
    lines = [f"{'':<28}" + "".join(f"{label:>12}" for label in labels)]
    for title, kind, field in rows:
        values = [summaries[label][kind][field] for label in labels]
        lines.append(
            f"{title:<28}"
            + "".join(f"{value:>12.1f}" if isinstance(value, float) else f"{value!s:>12}" for value in values)
        )
    return "\n".join(lines)


FIRST_RECORD_SELECTION = "--models llama --tp 2 --dtypes fp32"
FIRST_RECORD_CASES = {
    "warm": "the same combination again (harness cache warm)",
    "new transformers release": "the model's tiny checkpoint and reference not in the cache",
}


def first_records(
    python: Path, harnesses: dict[str, Path], out: Path, selection: str, repeat: int, bytecode: Path | None = None
) -> dict[str, Any]:
    """{case: {label: [run, ...]}}: each case runs every harness in turn (`repeat` rounds), so the harnesses of a
    round meet about the same load."""
    warm_caches = {}
    for label, harness in harnesses.items():  # untimed: fills each harness's own cache (its own reference keys)
        warm_caches[label] = Path(tempfile.mkdtemp(prefix=f"first-record-{label}-")) / "cache"
        (out / label).mkdir(parents=True, exist_ok=True)
        filled = run_matrix(
            python,
            harness,
            warm_caches[label],
            out / label / "fill",
            out / label / "fill.log",
            selection=tuple(selection.split()),
            bytecode=bytecode,
        )
        if not filled["verdicts"]:
            raise SystemExit(f"{label}: the untimed run wrote no record; see {filled['log']}")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        case: {label: [] for label in harnesses} for case in FIRST_RECORD_CASES
    }
    for round_ in range(repeat):
        for case in FIRST_RECORD_CASES:
            for label, harness in harnesses.items():
                cache = Path(tempfile.mkdtemp(prefix=f"first-record-{label}-")) / "cache"
                if case == "warm":
                    subprocess.run(["cp", "-al", str(warm_caches[label]), str(cache)], check=True)
                folder = out / label / f"{case.replace(' ', '-')}-{round_}"
                folder.mkdir(parents=True, exist_ok=True)
                run = run_matrix(
                    python,
                    harness,
                    cache,
                    folder / "results",
                    folder / "pytest.log",
                    stop_at_first_verdict=True,
                    selection=tuple(selection.split()),
                    bytecode=bytecode,
                )
                runs[case][label].append(run)
                print(f"{case}, {label}, round {round_}: {json.dumps(run)}", flush=True)
    return runs


def first_record_table(runs: dict[str, Any]) -> str:
    """Median seconds to the first record per case and harness, ratio against the first harness, the CPU seconds
    per process role of that median run and its load average."""
    lines = []
    for case, by_label in runs.items():
        labels = list(by_label)
        medians = {
            label: sorted(r["first_verdict_s"] for r in by_label[label])[len(by_label[label]) // 2] for label in labels
        }
        lines.append(f"{case}: {FIRST_RECORD_CASES[case]}")
        for label in labels:
            run = next(r for r in by_label[label] if r["first_verdict_s"] == medians[label])
            all_runs = ", ".join(f"{r['first_verdict_s']:.1f}" for r in by_label[label])
            cpu = ", ".join(f"{role} {seconds:.1f}" for role, seconds in sorted(run["cpu_s_to_first_verdict"].items()))
            lines.append(
                f"  {label:<8} {medians[label]:6.1f} s to the first record ({medians[labels[0]] / medians[label]:.2f}x "
                f"of {labels[0]}; runs {all_runs}); load {run['load_before']:.1f} -> "
                f"{run['load_at_first_verdict']:.1f}; "
                f"CPU s: {cpu}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, required=True, help="the combination environment's python")
    parser.add_argument(
        "--harness",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a harness checkout to measure (default: new=this checkout)",
    )
    parser.add_argument("--against", type=Path, action="append", default=[], help="an earlier run's summary.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--cold-first-verdict-only",
        action="store_true",
        help="interrupt the cold run at its first verdict (its total is then not measured)",
    )
    parser.add_argument(
        "--warm-cache",
        type=Path,
        help="run the warm run on a hard-linked copy of this cache (default: the cache the cold run filled)",
    )
    parser.add_argument(
        "--warm-models",
        help="--models of the warm run (default: the default matrix); e.g. the models "
        "whose references --warm-cache holds",
    )
    parser.add_argument(
        "--first-record",
        action="store_true",
        help="instead: seconds to the first record of one selection, warm and as a new transformers release",
    )
    parser.add_argument("--first-record-selection", default=FIRST_RECORD_SELECTION, help="its pytest options")
    parser.add_argument(
        "--selection",
        default="",
        help="pytest options of the matrix's cold and warm runs (default: the default matrix)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of --first-record (the median is printed), or of the matrix (the harnesses alternate each round)",
    )
    parser.add_argument(
        "--bytecode",
        type=Path,
        help="every process reads compiled bytecode from this PYTHONPYCACHEPREFIX tree (see bytecode_environment)",
    )
    args = parser.parse_args()
    if args.first_record:
        harnesses = {
            label: Path(path).resolve()
            for label, _, path in (item.partition("=") for item in args.harness or [f"new={PROJECT_ROOT}"])
        }
        runs = first_records(args.python, harnesses, args.out, args.first_record_selection, args.repeat, args.bytecode)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "first-records.json").write_text(json.dumps(runs, indent=1))
        print(f"\n{os.cpu_count()} cores, {args.first_record_selection}\n" + first_record_table(runs))
        return
    summaries = {}
    for path in args.against:
        summaries.update(json.loads(path.read_text()))
    for round_ in range(args.repeat):  # each round runs every harness in turn: its rounds meet about the same load
        for item in args.harness or [f"new={PROJECT_ROOT}"]:
            label, _, path = item.partition("=")
            summaries[label if args.repeat == 1 else f"{label} {round_}"] = measure(
                args.python,
                label if args.repeat == 1 else f"{label}-{round_}",
                Path(path).resolve(),
                args.out,
                args.cold_first_verdict_only,
                args.warm_cache,
                args.warm_models,
                args.bytecode,
                tuple(args.selection.split()),
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=1))
    print(f"\n{os.cpu_count()} cores\n" + table(summaries))


if __name__ == "__main__":
    main()

"""The history store over a synthetic year: size, render time and memory, report.json size, against their targets.

    python benchmarks/history_store.py [--runs 7300] [--cells 200] [--sessions 20] [--work /tmp/autotp-history-bench]
                                       [--no-compact]

A year of nightlies at 20 combinations is 7,300 runs of 200 cells (1.46 M results), built directly through the
store's own import (HistoryStore.import_runs, one night's runs per call, as a nightly `merge` adds them; no JUnit
is written or parsed) and compacted as merges do (here every 30 nights, which gives what compacting after every
night gives: compaction keeps only less as results are added). The history is mostly stable: each session holds
transformers/torch/python fixed and follows the DeepSpeed releases (one every 3 weeks); each release breaks or
fixes a few cells; one result in 500 flips (flaky); failing cells carry a signature of their class and a
traceback whose numbers take a few hundred values; every measured result has 6 metrics.

Then, each in a child process (peak memory from resource.getrusage(RUSAGE_CHILDREN).ru_maxrss):
`python -m reports render` (wall and CPU time, peak memory, report.json size; with the load average, since wall
time on a shared machine grows with it) and one more night's `merge`-equivalent import
plus compaction (the cost each nightly merge pays). Printed with each target and the ratio against the issue's
figures before compaction (600 runs: 307 MB, render 5.5 s, 731 MB peak, report.json 6.8 MB; a year extrapolates
to ~3.7 GB and ~9 GB). `--no-compact` builds the same history without compaction, for the ratio at a scale that
fits (e.g. --runs 730).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from reports.store import CellKey, CellResult, HistoryStore, Run, Versions

TARGETS = {"store_mb": 300, "render_s": 5, "render_peak_mb": 500, "report_json_mb": 1}
# The (#25) figures for the store before compaction, 600 runs of 207 cells, and their linear extrapolation
# to a year (7,300 runs).
BEFORE_600_RUNS = {"store_mb": 307, "render_s": 5.5, "render_peak_mb": 731, "report_json_mb": 6.8}
COMPACT_EVERY_NIGHTS = 30
FAILURE_CLASSES = ("shard", "forward", "numeric", "oom", "setup")
MODELS = [f"model{m:02d}" for m in range(50)]
LAYOUTS = [(variant, dtype, tp) for variant, dtype in (("eager", "fp32"), ("meta", "bf16")) for tp in (2, 3)]
DEEPSPEED_RELEASES = [f"0.{16 + n // 10}.{n % 10}" for n in range(30)]
RELEASE_EVERY_NIGHTS = 21


def cells(count: int) -> list[CellKey]:
    every = [CellKey(model, variant, dtype, tp) for model in MODELS for variant, dtype, tp in LAYOUTS]
    if count > len(every):
        raise SystemExit(f"--cells {count}: at most {len(every)}")
    return every[:count]


class SyntheticYear:
    """Verdicts per (cell, DeepSpeed release): a base verdict per cell; each release flips ~2% of cells."""

    def __init__(self, cell_keys: list[CellKey], seed: int = 25):
        self.random = random.Random(seed)
        self.cells = cell_keys
        verdict = {cell: self._failure() if self.random.random() < 0.25 else None for cell in cell_keys}
        self.by_release = []
        for _ in DEEPSPEED_RELEASES:
            verdict = {
                cell: (self._failure() if v is None else None) if self.random.random() < 0.02 else v
                for cell, v in verdict.items()
            }
            self.by_release.append(verdict)

    def _failure(self) -> tuple[str, str]:
        failure_class = self.random.choice(FAILURE_CLASSES)
        return (
            failure_class,
            f"{failure_class.title()}Error: {self.random.choice(('tensor', 'rank', 'shard'))} "
            f"mismatch in layer {self.random.randrange(40)}",
        )

    def night(self, night: int, sessions: int, cell_keys: list[CellKey]) -> list[tuple[Run, list[CellResult]]]:
        release = min(night // RELEASE_EVERY_NIGHTS, len(DEEPSPEED_RELEASES) - 1)
        verdicts = self.by_release[release]
        runs = []
        for session in range(sessions):
            started = f"2026-{1 + night // 31 % 12:02d}-{1 + night % 31:02d}T{session % 24:02d}:00:{night // 372:02d}Z"
            versions = Versions(
                deepspeed=DEEPSPEED_RELEASES[release],
                transformers=f"4.{40 + session % 10}.0",
                torch=f"2.{4 + session // 10}.0",
                python="3.11.7",
            )
            run = Run(
                run_id=f"s{session:02d}@{night:04d}@{started}@runner-{session % 3}",
                session=f"s{session:02d}",
                host=f"runner-{session % 3}",
                started=started,
                accelerator="cpu",
                backend="gloo",
                versions=versions,
                harness_git="b" * 40,
            )
            results = []
            for cell in cell_keys:
                failure = verdicts[cell]
                if self.random.random() < 0.002:  # flaky
                    failure = None if failure else self._failure()
                results.append(self._result(run.run_id, cell, failure))
            runs.append((run, results))
        return runs

    def _result(self, run_id: str, cell: CellKey, failure: tuple[str, str] | None) -> CellResult:
        if failure is None:
            metrics = {
                name: self.random.random() * 1e-5
                for name in ("logits_max_abs", "logits_mean_abs", "loss_delta", "peak_rss_mb", "load_s", "forward_s")
            }
            return CellResult(run_id, cell, "pass", metrics=metrics)
        failure_class, signature = failure
        line = 300 + self.random.randrange(300)  # a few hundred distinct messages per signature
        message = (
            "Traceback (most recent call last):\n"
            + "".join(
                f'  File "/site-packages/deepspeed/module_inject/layer_{n}.py", line {line + n}, in forward\n'
                f"    out = self.mp_group.all_reduce(x{n})\n"
                for n in range(12)
            )
            + signature
        )
        return CellResult(run_id, cell, "fail", failure_class, signature, message)


def build(store: Path, runs: int, cell_count: int, sessions: int, compact: bool) -> float:
    store.unlink(missing_ok=True)
    keys = cells(cell_count)
    year = SyntheticYear(keys)
    nights = runs // sessions
    started = time.perf_counter()
    with HistoryStore(store, create=True) as history:
        for night in range(nights):
            history.import_runs(year.night(night, sessions, keys), source=Path("synthetic"))
            if compact and (night + 1) % COMPACT_EVERY_NIGHTS == 0:
                history.compact()
        if compact:
            history.compact()
    return time.perf_counter() - started


def next_night(store: Path, cell_count: int, sessions: int) -> tuple[float, float]:
    """(import s, compaction s) of one more night on the built store: what each nightly merge adds to its time."""
    keys = cells(cell_count)
    with HistoryStore(store, create=True) as history:
        night = SyntheticYear(keys).night(len(history.runs()) // sessions, sessions, keys)  # after those stored
        started = time.perf_counter()
        history.import_runs(night, source=Path("synthetic"))
        imported = time.perf_counter()
        history.compact()
        return imported - started, time.perf_counter() - imported


def child(command: list[str], timeout: float) -> tuple[float, float, float, str]:
    """(seconds, CPU seconds, peak resident MB, output) of a command in a fresh child process. The CPU seconds (user
    + system) are what a machine shared with other work changes least: wall time grows with the load average."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=timeout)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu, after.ru_maxrss / 1024, done.stdout


def live_mb(store: Path) -> float:
    """The pages holding data (a compacted store reuses its free pages for the next nights)."""
    with sqlite3.connect(store) as conn:
        pages, free, size = (
            int(conn.execute(f"PRAGMA {p}").fetchone()[0]) for p in ("page_count", "freelist_count", "page_size")
        )
    return (pages - free) * size / 2**20


def line(name: str, value: float, unit: str, target: float | None, before: float | None = None) -> str:
    verdict = "" if target is None else f"  target <= {target:g} {unit}: {'OK' if value <= target else 'MISSED'}"
    ratio = f"  (before: {before:.3g} {unit}, ratio {value / before:.3f})" if before else ""
    return f"{name:<34} {value:10.2f} {unit:<3}{verdict}{ratio}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7300)
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--work", type=Path, default=Path("/tmp/autotp-history-bench"))
    parser.add_argument("--no-compact", action="store_true")
    parser.add_argument("--reuse", action="store_true", help="measure the store --work holds, built before")
    parser.add_argument("--render-timeout", type=float, default=3600, help="seconds before the render is given up")
    args = parser.parse_args()
    if args.runs < args.sessions or args.sessions < 1 or args.cells < 1:
        parser.error("--runs must be at least --sessions, both and --cells positive")
    args.work.mkdir(parents=True, exist_ok=True)
    store, out = args.work / "history.sqlite", args.work / "out"
    shutil.rmtree(out, ignore_errors=True)
    if args.reuse and store.exists():
        build_s = 0.0
    else:
        build_s = build(store, args.runs, args.cells, args.sessions, not args.no_compact)
    with HistoryStore(store, create=False):  # a store of an older schema (--reuse) is migrated, as the merge before
        pass  # a nightly render migrates it: render itself would migrate a copy in memory every time
    with sqlite3.connect(store) as conn:
        results, detailed, texts = conn.execute(
            "SELECT count(*), count(message), (SELECT count(*) FROM texts) FROM results"
        ).fetchone()
    render_s, render_cpu_s, render_peak, _ = child(
        [sys.executable, "-m", "reports", "render", "--store", str(store), "--out", str(out)], args.render_timeout
    )
    scale = args.runs / 600  # the figures, scaled linearly to this many runs
    before = {name: value * scale for name, value in BEFORE_600_RUNS.items()}
    print(
        f"synthetic history: {args.runs // args.sessions * args.sessions} runs x {args.cells} cells = {results} "
        f"results; {detailed} with detail, {texts} distinct texts; built in {build_s:.0f} s "
        f"({'compacted' if not args.no_compact else 'NOT compacted'})"
    )
    print("before = the issue's 600-run figures scaled linearly to this many runs")
    print(line("store file", store.stat().st_size / 2**20, "MB", TARGETS["store_mb"], before["store_mb"]))
    print(line("store pages in use", live_mb(store), "MB", TARGETS["store_mb"], before["store_mb"]))
    print(line("render", render_s, "s", TARGETS["render_s"], before["render_s"]))
    print(line("render CPU (user + system)", render_cpu_s, "s", TARGETS["render_s"]))
    print(f"{'load average (1, 5, 15 min)':<34} {', '.join(f'{load:.1f}' for load in os.getloadavg())}")
    print(line("render peak memory", render_peak, "MB", TARGETS["render_peak_mb"], before["render_peak_mb"]))
    report = out / "report.json"
    print(
        line(
            "report.json (first screen)",
            report.stat().st_size / 2**20,
            "MB",
            TARGETS["report_json_mb"],
            before["report_json_mb"],
        )
    )
    details = sorted(path for path in out.rglob("*.json") if path != report)
    if details:
        sizes = [path.stat().st_size / 2**20 for path in details]
        print(f"{'detail pages':<34} {len(details):10d} files, {sum(sizes):.1f} MB in all, largest {max(sizes):.2f} MB")
    if not args.no_compact:
        import_s, compact_s = next_night(store, args.cells, args.sessions)
        print(f"{'one more night (a merge)':<34} import {import_s:.1f} s, compaction {compact_s:.1f} s")
    print(json.dumps({"runs": args.runs, "cells": args.cells, "compacted": not args.no_compact}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time to the first verdict of the default matrix with an empty cache, and its warm pytest time, for
one or more harness checkouts side by side (the same environment, one after the other).

    python benchmarks/cold_start.py --python <combination env>/bin/python --out /tmp/cold \\
        [--harness base=/tmp/autotp-base] [--harness new=.] [--against /tmp/earlier/summary.json]

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions.environments import environment_variables  # noqa: E402


def run_matrix(
    python: Path,
    harness: Path,
    cache: Path,
    results: Path,
    log: Path,
    stop_at_first_verdict: bool = False,
    models: str | None = None,
) -> dict:
    """One `pytest suites` run of the default matrix, as `nox -s matrix` runs it; seconds to the first verdict
    (the first record in cells.jsonl, written as each cell ends) and in all. `stop_at_first_verdict`: interrupt
    it there (Ctrl-C: the driver ends its rank group and reference process)."""
    env = {**environment_variables(python), "AUTOTP_CACHE": str(cache)}
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
    ]
    records = results / "cells.jsonl"
    load_before = os.getloadavg()[0]
    started, first_verdict = time.perf_counter(), None
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
        while process.poll() is None:
            if first_verdict is None and records.exists() and records.stat().st_size:
                first_verdict = time.perf_counter() - started
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
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "cells": str(records),
        "log": str(log),
    }


def measure(
    python: Path,
    label: str,
    harness: Path,
    out: Path,
    cold_first_verdict_only: bool,
    warm_cache: Path | None,
    warm_models: str | None,
) -> dict:
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
        )
        print(f"{label} {kind}: {json.dumps(runs[kind])}", flush=True)
    return runs


def table(summaries: dict[str, dict]) -> str:
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
    args = parser.parse_args()
    summaries = {}
    for path in args.against:
        summaries.update(json.loads(path.read_text()))
    for item in args.harness or [f"new={Path(__file__).resolve().parent.parent}"]:
        label, _, path = item.partition("=")
        summaries[label] = measure(
            args.python,
            label,
            Path(path).resolve(),
            args.out,
            args.cold_first_verdict_only,
            args.warm_cache,
            args.warm_models,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=1))
    print(f"\n{os.cpu_count()} cores\n" + table(summaries))


if __name__ == "__main__":
    sys.exit(main())

"""CPU seconds of the run around the cells (#58 "the run around the cells"): what `nox -s matrix` runs after pytest on
a warm machine, `python -m reports merge` of the new run's JUnit and `python -m reports render`, for harness
checkouts side by side on a copy of one real results folder, and whether they write the same outputs. A harness
whose `python -m reports` chains verbs (`--then`) runs both in one process, as its `nox -s matrix` does; an older
one runs them as two processes, as its session did. Beside them, what the session runs before pytest (nox reading
the noxfile, the environment's versions): the same code in both, unless a harness changed it.

    python benchmarks/around_cells.py --python <combination env>/bin/python --results /work/fresh-b/results \\
        --harness base=<checkout of main> --harness new=. [--rounds 3] [--scratch DIR]

The results folder's run is merged again as a new run of the same cells (its start moved an hour on): the store and
archive already hold the previous run, as a warm `nox -s matrix` finds them. Each harness renders with a harness
cache of its own (AUTOTP_CACHE under the scratch folder), filled by one untimed merge and render first, as the
previous warm run leaves it. Rounds run the harnesses in turn, so the runs of a round meet about the same load on a
shared machine; CPU seconds (user + system, of the process and its children, exact) are the figures to compare, the
median round's per harness; wall seconds and the load average are printed beside them. Every render's outputs are
compared with the first harness's (its moment of rendering masked): a difference is printed by file. The scratch
folder (default: a new one under the results folder's parent) is removed at the end.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from sessions.environments import environment_variables

STARTED = re.compile(r'name="run\.started" value="([^"]+)"')
RENDERED = ("report.md", "report.json", "report-details.json", "report.html", "supported-models.md", "step-summary.md")
RENDERED_FOLDERS = ("repro", "draft-issue", "checkpoints")


def new_run(results: Path, into: Path) -> Path:
    """A copy of `results` whose JUnit holds a new run of the same cells: every start an hour later."""
    shutil.copytree(results, into)
    for junit in (into / "junit").rglob("*.xml"):
        text = junit.read_text()
        for started in set(STARTED.findall(text)):
            later = calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")) + 3600
            text = text.replace(started, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(later)))
        junit.write_text(text)
    return into


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def step(
    python: Path, harness: Path, cache: Path, args: list[str], log: Path, env: dict[str, str] | None = None
) -> dict[str, float]:
    """One `python -m reports <args>` of `harness` (`python -m <args>` where args start with `-m`): CPU and wall
    seconds; it must exit 0."""
    env = {**(env or environment_variables(python)), "AUTOTP_CACHE": str(cache)}
    command = [str(python), *(args if args[0] == "-m" else ["-m", "reports", *args])]
    before, started, load = children_cpu(), time.perf_counter(), os.getloadavg()[0]
    with log.open("a") as out:
        code = subprocess.call(command, cwd=harness, env=env, stdout=out, stderr=out)
    if code != 0:
        said = log.read_text()[-3000:]
        raise SystemExit(f"{harness}: {' '.join(command)} exited {code}; it said:\n{said}")
    return {"cpu_s": children_cpu() - before, "wall_s": time.perf_counter() - started, "load": load}


def session_start(python: Path, harness: Path, cache: Path, log: Path) -> dict[str, dict[str, float]]:
    """What `nox -s matrix` runs before pytest, unchanged by a warm cache: nox reading the noxfile (`nox -l`, in this
    interpreter) and the environment saying what it holds (`python -m suites.records.run_records --versions`)."""
    nox = step(Path(sys.executable), harness, cache, ["-m", "nox", "-l"], log, dict(os.environ))
    versions = step(python, harness, cache, ["-m", "suites.records.run_records", "--versions"], log)
    return {"nox start": nox, "versions": versions}


def chains_verbs(harness: Path) -> bool:
    """Whether the harness's `python -m reports` runs several verbs in one process (`--then`)."""
    return 'THEN = "--then"' in (harness / "reports" / "__main__.py").read_text()


def around(python: Path, harness: Path, cache: Path, results: Path, log: Path) -> dict[str, dict[str, float]]:
    """The session's start, then merge and render as the harness's `nox -s matrix` runs them: by process, its CPU and
    wall seconds."""
    store = str(results / "history.sqlite")
    merge = ["merge", str(results / "junit"), "--store", store]
    render = ["render", "--store", store, "--out", str(results)]
    if chains_verbs(harness):
        merged = {"merge+render": step(python, harness, cache, [*merge, "--then", *render], log)}
    else:
        merged = {
            "merge": step(python, harness, cache, merge, log),
            "render": step(python, harness, cache, render, log),
        }
    return {**session_start(python, harness, cache, log), **merged}


def outputs(results: Path) -> dict[str, bytes]:
    """What render wrote, its moment of rendering masked."""
    generated_at = json.loads((results / "report.json").read_text())["generated_at"].encode()
    files = [results / name for name in RENDERED] + [
        path for folder in RENDERED_FOLDERS for path in (results / folder).rglob("*") if path.is_file()
    ]
    return {
        str(path.relative_to(results)): path.read_bytes().replace(generated_at, b"<generated_at>")
        for path in files
        if path.is_file()
    }


Runs = dict[str, list[dict[str, dict[str, float]]]]
"""By harness label, each round's merge and render figures."""


def timed_rounds(
    python: Path, harnesses: dict[str, Path], source: Path, scratch: Path, rounds: int
) -> tuple[Runs, set[str]]:
    """The harnesses in turn, `rounds` times, each on a fresh copy of the same new run; and the files whose bytes
    differ from the first harness's."""
    prepared = new_run(source, scratch / "prepared")
    caches = {label: scratch / f"cache-{label}" for label in harnesses}
    log = scratch / "log"
    for label, harness in harnesses.items():  # untimed: the cache a previous warm run leaves
        around(python, harness, caches[label], new_run(source, scratch / f"warm-{label}"), log)
        shutil.rmtree(scratch / f"warm-{label}")
    runs: Runs = {label: [] for label in harnesses}
    differing: set[str] = set()
    for round_number in range(rounds):
        first: dict[str, bytes] | None = None
        for label, harness in harnesses.items():
            results = scratch / f"round{round_number}-{label}"
            shutil.copytree(prepared, results)
            runs[label].append(around(python, harness, caches[label], results, log))
            written = outputs(results)
            first = first if first is not None else written
            differing |= {name for name in first.keys() | written.keys() if first.get(name) != written.get(name)}
            shutil.rmtree(results)
            figures = ", ".join(
                f"{name} {run['cpu_s']:.2f} s CPU ({run['wall_s']:.2f} s wall, load {run['load']:.2f})"
                for name, run in runs[label][-1].items()
            )
            print(f"round {round_number + 1} {label}: {figures}", flush=True)
    return runs, differing


def summary(runs: Runs) -> list[str]:
    """The median round's CPU seconds per harness (everything outside pytest together, and each process's), against
    the first harness."""
    lines, base = [], 0.0
    for label, label_runs in runs.items():
        processes = {name: statistics.median(run[name]["cpu_s"] for run in label_runs) for name in label_runs[0]}
        together = statistics.median(sum(step["cpu_s"] for step in run.values()) for run in label_runs)
        wall = statistics.median(sum(step["wall_s"] for step in run.values()) for run in label_runs)
        base = base or together
        split = ", ".join(f"{name} {cpu:.2f}" for name, cpu in processes.items())
        lines.append(
            f"  {label:>8}: together {together:6.2f} ({together / base:.2f}x of {next(iter(runs))}; wall {wall:.2f}) "
            f"in {len(processes)} process(es): {split}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", type=Path, required=True, help="the combination environment's python")
    parser.add_argument("--results", type=Path, required=True, help="a results folder of a finished `nox -s matrix`")
    parser.add_argument("--harness", action="append", required=True, metavar="LABEL=CHECKOUT")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scratch", type=Path, help="where the copies go (default: beside --results)")
    args = parser.parse_args()
    harnesses = {label: Path(path).resolve() for label, path in (item.split("=", 1) for item in args.harness)}
    scratch = Path(tempfile.mkdtemp(prefix="around-cells-", dir=args.scratch or args.results.resolve().parent))
    try:
        runs, differing = timed_rounds(args.python, harnesses, args.results, scratch, args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nmedian of {args.rounds} rounds (CPU seconds, user + system; wall beside):", *summary(runs), sep="\n")
    print(f"outputs: {'identical' if not differing else 'DIFFERENT: ' + ', '.join(sorted(differing))}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())

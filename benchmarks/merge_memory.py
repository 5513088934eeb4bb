"""Peak memory of `python -m reports merge` on one JUnit file of many testcases (#53 "Bounded work": 100k testcases,
83 MB, peaked at 1.1 GB before merge streamed its input), for the harness as it was and as it is, side by side.

    python benchmarks/merge_memory.py [--testcases 100000] [--before REF] [--work /tmp/autotp-merge-memory]

Writes one session's JUnit file of --testcases cells (the properties a session writes, README.md "Results"; one cell in
ten failing with a traceback, the others passing with two metrics: ~830 bytes a testcase, as the issue's), then, each in
a child process of its own, for the tree at REF (`git archive`, default: main before merge streamed) and for this
checkout: `python -m reports merge` of the file into an empty store and archive, and `python -m reports merge --help`
(the same imports, nothing read). Peak memory is the child's own high-water mark of resident memory (VmHWM); what merge
itself adds is the difference of the two. Memory figures hold on a shared machine; the wall times printed beside them do
not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# main just before merge streamed its input (#53): it parsed the whole file into a tree, then held every run's
# records of every file before writing any.
BEFORE_STREAMING = "dc32d7ad97e11db27b59ff36f4e693e49e0bae19"
TARGET_MB = 300
METRICS = ("logits_max_abs", "peak_bytes")
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/opt/venv/lib/python3.12/site-packages/deepspeed/module_inject/auto_tp.py", line 412, in _replace\n'
    "    setattr(child, name, LinearLayer(weight=shard))\n"
    "RuntimeError: shape '[{n}, 64]' is invalid for input of size 8192\n"
)


@dataclass(frozen=True)
class Measured:
    tree: str
    peak_mb: float
    imports_mb: float
    wall_s: float
    exit_status: int


def write_junit(path: Path, testcases: int) -> None:
    """One run's JUnit file, written as text (a tree of this size is what is being measured, not what writes it)."""
    run = {
        "version.deepspeed": "0.19.8",
        "version.transformers": "5.24.0",
        "version.torch": "2.13.0",
        "version.python": "3.12.3",
        "version.deepspeed_git": "",
        "run.id": "nightly-latest@2026-12-06T01:00:00Z@runner-1",
        "run.session": "nightly-latest",
        "run.host": "runner-1",
        "run.started": "2026-12-06T01:00:00Z",
        "run.accelerator": "cpu",
        "run.backend": "gloo",
        "run.harness_git": "0123456789abcdef0123456789abcdef01234567",
    }
    with path.open("w", encoding="utf-8") as out:
        out.write('<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="pytest">\n')
        for n in range(testcases):
            model, tp = f"model{n // 4:06d}", 2 + n % 4
            cell = f"{model}-eager-fp32-tp{tp}"
            failing = n % 10 == 0
            props = {
                "cell.id": cell,
                "cell.model": model,
                "cell.variant": "eager",
                "cell.dtype": "fp32",
                "cell.tp": str(tp),
                "outcome": "fail" if failing else "pass",
                "failure_class": "shard" if failing else "",
                "signature": "RuntimeError: shape '[N, N]' is invalid for input of size N" if failing else "",
                **run,
                **({} if failing else {f"metric.{name}": repr(1.0 / (n + i + 1)) for i, name in enumerate(METRICS)}),
            }
            out.write(f'<testcase classname="suites.test_autotp" name="test_cell[{cell}]" time="1.5">\n<properties>\n')
            out.writelines(f"<property name={quoteattr(k)} value={quoteattr(v)}/>\n" for k, v in props.items())
            out.write("</properties>\n")
            if failing:
                message = quoteattr(f"shard: {props['signature']}")
                out.write(f"<failure message={message}>{escape(TRACEBACK.format(n=n))}</failure>\n")
            out.write("</testcase>\n")
        out.write("</testsuite></testsuites>\n")


# A child's peak resident memory is its own address space's high-water mark (VmHWM): the rusage of a child that
# Python starts by vfork counts the parent's memory too.
MEASURED = """
import runpy, sys
peak_file, sys.argv = sys.argv[1], ["reports", *sys.argv[2:]]
try:
    runpy.run_module("reports", run_name="__main__", alter_sys=True)
finally:
    peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    open(peak_file, "w").write(peak.split()[1])
"""


def peak_of(arguments: list[str], cwd: Path, scratch: Path) -> tuple[float, float, int]:
    """`python -m reports <arguments>` in cwd: its peak resident memory in MB, its wall time and exit status."""
    peak_file = scratch / "peak-kib"
    started = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", MEASURED, str(peak_file), *arguments],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    wall_s = time.monotonic() - started
    if child.returncode:
        print(f"  {' '.join(arguments[:2])} in {cwd}: exit {child.returncode}\n{child.stderr[-2000:]}", file=sys.stderr)
    return int(peak_file.read_text()) / 1024, wall_s, child.returncode


def measure(tree: str, root: Path, junit: Path, work: Path) -> Measured:
    scratch = Path(tempfile.mkdtemp(prefix=f"{tree}-", dir=work))
    merge = ["merge", str(junit), "--store", str(scratch / "history.sqlite"), "--archive", str(scratch / "archive")]
    imports_mb, _, _ = peak_of(["merge", "--help"], root, scratch)
    peak_mb, wall_s, status = peak_of(merge, root, scratch)
    return Measured(tree, peak_mb, imports_mb, wall_s, status)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--testcases", type=int, default=100_000)
    parser.add_argument("--before", default=BEFORE_STREAMING, help="git ref of the harness to compare with")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "autotp-merge-memory")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    before = args.work / "before"
    before.mkdir()
    archive = subprocess.run(["git", "-C", str(PROJECT_ROOT), "archive", args.before], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
    junit = args.work / "junit" / "nightly-latest.xml"
    junit.parent.mkdir()
    write_junit(junit, args.testcases)
    size_mb = junit.stat().st_size / 1e6
    print(f"{args.testcases} testcases, {size_mb:.0f} MB of JUnit ({junit}); load average {os.getloadavg()[0]:.1f}")
    rows = [
        measure(f"before ({args.before[:10]})", before, junit, args.work),
        measure("now", PROJECT_ROOT, junit, args.work),
    ]
    print(f"{'tree':<22} {'peak MB':>8} {'imports MB':>11} {'merge adds MB':>14} {'wall s':>7} exit")
    for row in rows:
        print(
            f"{row.tree:<22} {row.peak_mb:8.0f} {row.imports_mb:11.0f} {row.peak_mb - row.imports_mb:14.0f} "
            f"{row.wall_s:7.1f} {row.exit_status}"
        )
    now = rows[-1]
    print(
        f"target: peak under {TARGET_MB} MB — {'met' if now.peak_mb < TARGET_MB else 'NOT met'} ({now.peak_mb:.0f} MB)"
    )
    return 0 if now.exit_status == 0 and now.peak_mb < TARGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())

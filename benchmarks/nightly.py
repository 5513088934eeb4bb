"""The nightly over the whole registry, timed per version combination, in this checkout's layered uv
environments and in the previous pip layout (a git worktree of --old-ref), one layout after the other:

    python benchmarks/nightly.py run --scratch DIR [--layout new] [--layout old] [-- --tp 2,3]
    python benchmarks/nightly.py report --scratch DIR

`run` lists the sessions `nox -t <tag>` would run (`nox -l --json`) and runs each as `nox -s <session> -- <pytest
args>` in turn, timed from the nox command's start to its end, exactly as `nox -t nightly` runs them one after the
other (plus nox's own start, ~1 s, per session). Each layout starts as a new self-hosted runner's first night: an
environment root (AUTOTP_ENV_ROOT) and a harness cache (AUTOTP_CACHE) of its own under --scratch, empty but for
the PyPI release data copied from the machine's cache (so both layouts expand the same sessions offline); uv's and
pip's download caches are the machine's (warm). Every session's figures are appended to DIR/nightly.jsonl as it
ends, so a stopped run keeps what it measured and `report` prints what there is: seconds per combination side by
side, old/new ratios, the cells each layout ran (passed/failed/skipped, from pytest's summary line in the session's
log) and the load average at each session's end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from benchmarks.environments import OLD_LAYOUT_REF, old_layout_checkout
from matrix import cache_root
from matrix.redaction import secret_values

RECORDS = "nightly.jsonl"


@dataclass(frozen=True)
class SessionTime:
    """One nox session of the nightly in one layout."""

    layout: str
    session: str
    seconds: float
    exit_code: int
    load: float
    """1-minute load average when the session ended (2 cores here: above 2, something else competed)."""


def layout_checkout(layout: str, scratch: Path, old_ref: str) -> Path:
    """This checkout for `new`; for `old`, a detached git worktree of `old_ref` under `scratch`."""
    return PROJECT_ROOT if layout == "new" else old_layout_checkout(scratch, old_ref)


def layout_environment(layout: str, scratch: Path) -> dict[str, str]:
    """The layout's own environment root and harness cache, the release data frozen as copied; no credential
    (tiny checkpoints need none, and the sessions' whole output goes to the logs under --scratch)."""
    cache = scratch / layout / "cache"
    if not (cache / "releases").exists():
        shutil.copytree(cache_root() / "releases", cache / "releases")
    secrets = set(secret_values())
    return {
        **{name: value for name, value in os.environ.items() if value not in secrets},
        "AUTOTP_ENV_ROOT": str(scratch / layout / "envs"),
        "AUTOTP_CACHE": str(cache),
        "AUTOTP_RELEASES_MAX_AGE_HOURS": "inf",
    }


@dataclass(frozen=True)
class PytestSummary:
    """pytest's last summary line in a session's log: what its cells did and pytest's own seconds (the rest of
    the session is its environment, the merge and the report)."""

    counts: dict[str, int]
    seconds: float


SUMMARY_LINE = re.compile(r"^=+ (?P<counts>.*) in (?P<seconds>[0-9.]+)s\b.*=+$", re.MULTILINE)


def pytest_summary(log: Path) -> PytestSummary | None:
    """The session's pytest summary; None when pytest never ended (an environment that could not be installed)."""
    lines = SUMMARY_LINE.findall(log.read_text(errors="replace")) if log.exists() else []
    if not lines:
        return None
    counts_text, seconds = lines[-1]
    counts = {}
    for part in counts_text.split(", "):
        number, _, outcome = part.partition(" ")
        if number.isdigit():
            counts[outcome.removesuffix("s") if outcome in ("errors", "warnings") else outcome] = int(number)
    return PytestSummary(counts, float(seconds))


def session_log(scratch: Path, layout: str, session: str) -> Path:
    return scratch / layout / "logs" / f"{session}.txt"


def run_layout(layout: str, scratch: Path, tag: str, pytest_args: list[str], nox: str, old_ref: str) -> None:
    checkout = layout_checkout(layout, scratch, old_ref)
    env = layout_environment(layout, scratch)
    listing = subprocess.run(
        [nox, "-t", tag, "-l", "--json"], cwd=checkout, env=env, capture_output=True, text=True, check=True
    )
    sessions = [entry["session"] for entry in json.loads(listing.stdout)]
    results = scratch / layout / "results"
    done = {record.session for record in read_records(scratch) if record.layout == layout}
    print(f"{layout}: {len(sessions)} sessions tagged {tag} ({len(done)} measured before), {checkout}", flush=True)
    for session in sessions:
        if session in done:
            continue
        log = session_log(scratch, layout, session)
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with log.open("w") as output:
            exit_code = subprocess.run(
                [nox, "-s", session, "--", *pytest_args, "--results", str(results)],
                cwd=checkout,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            ).returncode
        seconds = time.perf_counter() - start
        record = SessionTime(layout, session, seconds, exit_code, os.getloadavg()[0])
        with (scratch / RECORDS).open("a") as records:
            records.write(json.dumps(asdict(record)) + "\n")
        summary = pytest_summary(log)
        print(
            f"{layout} {session}: {seconds:.1f} s, exit {exit_code}, "
            f"{f'pytest {summary.seconds:.1f} s, {summary.counts}' if summary else 'no pytest summary'}, "
            f"load {record.load:.1f}",
            flush=True,
        )


def read_records(scratch: Path) -> list[SessionTime]:
    path = scratch / RECORDS
    if not path.exists():
        return []
    return [SessionTime(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def report(scratch: Path) -> None:
    """Seconds per session (pytest's share in brackets), old/new, cells (passed/failed/skipped), load at its end."""
    by_layout: dict[str, dict[str, SessionTime]] = {}
    for record in read_records(scratch):
        by_layout.setdefault(record.layout, {})[record.session] = record
    sessions = list(dict.fromkeys(session for records in by_layout.values() for session in records))
    layouts = [layout for layout in ("new", "old") if layout in by_layout]

    def column(layout: str, session: str) -> str:
        record = by_layout[layout].get(session)
        if record is None:
            return f"{'-':>38}"
        summary = pytest_summary(session_log(scratch, layout, session))
        if summary is None:
            return f"{record.seconds:7.1f} (no pytest, exit {record.exit_code:3})    load {record.load:4.1f}"
        cells = "/".join(str(summary.counts.get(outcome, 0)) for outcome in ("passed", "failed", "skipped"))
        return f"{record.seconds:7.1f} ({summary.seconds:6.1f}) {cells:>11} load {record.load:4.1f}"

    print(f"{'session':38} " + " | ".join(f"{layout + ' s (pytest s) pass/fail/skip':38}" for layout in layouts))
    for session in sessions:
        name = session.removeprefix("autotp(").removesuffix(")")
        ratio = ""
        if len(layouts) == 2 and all(session in by_layout[layout] for layout in layouts):
            ratio = f"  old/new {by_layout['old'][session].seconds / by_layout['new'][session].seconds:.2f}"
        print(f"{name:38} " + " | ".join(column(layout, session) for layout in layouts) + ratio)
    for layout in layouts:
        total = sum(record.seconds for record in by_layout[layout].values())
        print(f"{layout}: {len(by_layout[layout])} sessions, {total:.0f} s ({total / 60:.1f} min)")
    if len(layouts) == 2:
        both = [session for session in sessions if all(session in by_layout[layout] for layout in layouts)]
        new_total = sum(by_layout["new"][session].seconds for session in both)
        old_total = sum(by_layout["old"][session].seconds for session in both)
        if both:
            print(
                f"the {len(both)} sessions both layouts ran: new {new_total:.0f} s, old {old_total:.0f} s, "
                f"old/new {old_total / new_total:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the tagged sessions in each layout, appending to DIR/nightly.jsonl")
    run.add_argument("--scratch", type=Path, required=True)
    run.add_argument("--layout", action="append", choices=["new", "old"], help="default: new, then old")
    run.add_argument("--tag", default="nightly")
    run.add_argument("--old-ref", default=OLD_LAYOUT_REF)
    run.add_argument("--nox", default=shutil.which("nox") or "nox")
    run.add_argument("pytest_args", nargs="*", help="after --: the sessions' pytest arguments (e.g. --tp 2,3)")
    shown = commands.add_parser("report", help="per-session seconds of both layouts side by side")
    shown.add_argument("--scratch", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "report":
        report(args.scratch)
        return
    args.scratch.mkdir(parents=True, exist_ok=True)
    for layout in args.layout or ["new", "old"]:
        run_layout(layout, args.scratch.resolve(), args.tag, args.pytest_args, args.nox, args.old_ref)
    report(args.scratch)


if __name__ == "__main__":
    main()

"""Compare a candidate against a baseline and decide whether the candidate may ship."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from reports import ReportsError
from reports.history import summarise
from reports.model import AXES, CellKey, Observation

SELECTOR_KEYS = (*AXES, "deepspeed_git")
# Printed in this order; only "regression" blocks.
VERDICTS = ("regression", "unconfirmed", "baseline flaky", "new failure", "known", "fixed", "not run", "pass")


@dataclass(frozen=True)
class GateRow:
    cell: CellKey
    baseline: str  # pass | fail | flaky | skip | not run
    candidate_fails: int
    candidate_runs: int  # runs that produced a verdict (skips excluded)
    verdict: str


def select(observations: list[Observation], selector: str, option: str) -> list[Observation]:
    """Observations of a run id, or of every run matching a version set like `deepspeed=0.19.7,torch=2.4.0`."""
    by_run = [obs for obs in observations if obs.run.run_id == selector]
    if by_run:
        return by_run
    if "=" not in selector:
        raise ReportsError(
            f"{option} {selector!r}: no stored run has this id, and it is not a version set like deepspeed=0.19.7"
        )
    wanted = {}
    for pair in selector.split(","):
        key, _, value = pair.partition("=")
        key = key.strip()
        if key not in SELECTOR_KEYS or not value.strip():
            raise ReportsError(
                f"{option} {selector!r}: {pair!r} must be KEY=VALUE with KEY one of {', '.join(SELECTOR_KEYS)}"
            )
        wanted[key] = value.strip()
    chosen = [obs for obs in observations if all(_matches(obs, key, value) for key, value in wanted.items())]
    if not chosen:
        known = sorted({obs.versions.describe() for obs in observations})
        listing = "\n  ".join(known)
        raise ReportsError(f"{option} {selector!r} matches no stored run; stored version sets:\n  {listing}")
    return chosen


def _matches(obs: Observation, key: str, value: str) -> bool:
    stored = getattr(obs.versions, key)
    return stored.startswith(value) if key == "deepspeed_git" else stored == value  # a sha prefix is enough


def compare(baseline: list[Observation], candidate: list[Observation], confirmations: int) -> list[GateRow]:
    if confirmations < 1:
        raise ReportsError(f"--confirmations {confirmations}: must be 1 or more")
    baseline_by_cell, candidate_by_cell = defaultdict(list), defaultdict(list)
    for obs in baseline:
        baseline_by_cell[obs.cell].append(obs)
    for obs in candidate:
        candidate_by_cell[obs.cell].append(obs)
    rows = []
    for cell in sorted(baseline_by_cell.keys() | candidate_by_cell.keys()):
        before = summarise(baseline_by_cell[cell]).status if cell in baseline_by_cell else "not run"
        after = summarise(candidate_by_cell[cell]) if cell in candidate_by_cell else None
        fails = after.fails if after else 0
        runs = after.passes + after.fails if after else 0
        rows.append(GateRow(cell, before, fails, runs, _verdict(before, fails, runs, confirmations)))
    return sorted(rows, key=lambda row: (VERDICTS.index(row.verdict), row.cell))


def _verdict(baseline: str, fails: int, runs: int, confirmations: int) -> str:
    if runs == 0:
        return "not run"
    if fails == 0:
        return "fixed" if baseline == "fail" else "pass"
    if baseline == "pass":
        return "regression" if fails >= confirmations else "unconfirmed"
    if baseline == "fail":
        return "known"
    if baseline == "flaky":
        return "baseline flaky"
    return "new failure"  # no verdict in the baseline (not run or only skipped)


def format_table(rows: list[GateRow], confirmations: int) -> str:
    shown = [row for row in rows if row.verdict != "pass"]
    header = ("cell", "baseline", "candidate", "verdict")
    body = [
        (row.cell.id, row.baseline, f"{row.candidate_fails}/{row.candidate_runs} runs failed", row.verdict)
        for row in shown
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    counts = {verdict: sum(row.verdict == verdict for row in rows) for verdict in VERDICTS}
    summary = ", ".join(f"{count} {verdict}" for verdict, count in counts.items() if count)
    blocking = counts["regression"]
    decision = (
        f"FAIL: {blocking} cell(s) pass in the baseline and failed in ≥{confirmations} candidate run(s)"
        if blocking else "OK: no cell that passes in the baseline fails in the candidate"
    )
    return "\n".join([*(lines if shown else []), "", summary, decision])

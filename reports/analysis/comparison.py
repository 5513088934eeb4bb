"""A candidate's cells against a baseline's: each cell's gate verdict (regression, known, fixed, …) and which block."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from matrix.version_axes import AxisValueError, parse_pins
from reports import ReportsError
from reports.analysis.statuses import CellStatus, harness_change_text, harness_ranks, point_status, summarise
from reports.store import AXES, CellKey, Observation

SELECTOR_KEYS = (*AXES, "deepspeed_git")
# Printed in this order; "regression" and "missing" block (the latter not with --allow-missing), "changed failure"
# with --block-changed.
VERDICTS = (
    "regression",
    "missing",
    "changed failure",
    "unconfirmed",
    "baseline flaky",
    "new failure",
    "known",
    "fixed",
    "not run",
    "pass",
)


@dataclass(frozen=True)
class GateRow:
    cell: CellKey
    baseline: str  # pass | fail | flaky | skip | not run
    candidate_fails: int
    candidate_runs: int  # runs that produced a verdict (skips excluded)
    verdict: str
    baseline_failure: str = ""  # "class: signature" where the baseline fails
    candidate_failure: str = ""
    # Where the baseline's verdict changed with the harness commit (not flaky): "pass at harness abc → fail at
    # harness def"; baseline is then the newer harness commits' verdict.
    baseline_harness_change: str = ""


def select(observations: list[Observation], selector: str, option: str) -> list[Observation]:
    """Observations of a run id, or of every run matching a version set like `deepspeed=0.19.7,torch=2.4.0`."""
    by_run = [obs for obs in observations if obs.run.run_id == selector]
    if by_run:
        return by_run
    if "=" not in selector:
        raise ReportsError(
            f"{option} {selector!r}: no stored run has this id, and it is not a version set like deepspeed=0.19.7"
        )
    try:
        wanted = parse_pins([selector], option, SELECTOR_KEYS)
    except AxisValueError as error:
        raise ReportsError(str(error)) from None
    chosen = [obs for obs in observations if all(_matches(obs, key, value) for key, value in wanted.items())]
    if not chosen:
        known = sorted({obs.versions.describe() for obs in observations})
        listing = "\n  ".join(known)
        raise ReportsError(f"{option} {selector!r} matches no stored run; stored version sets:\n  {listing}")
    return chosen


def _matches(obs: Observation, key: str, value: str) -> bool:
    stored = str(getattr(obs.versions, key))
    return stored.startswith(value) if key == "deepspeed_git" else stored == value  # a sha prefix is enough


def compare(baseline: list[Observation], candidate: list[Observation], confirmations: int) -> list[GateRow]:
    if confirmations < 1:
        raise ReportsError(f"--confirmations {confirmations}: must be 1 or more")
    baseline_by_cell, candidate_by_cell = defaultdict(list), defaultdict(list)
    for obs in baseline:
        baseline_by_cell[obs.cell].append(obs)
    for obs in candidate:
        candidate_by_cell[obs.cell].append(obs)
    ranks = harness_ranks([*baseline, *candidate])
    rows = []
    for cell in sorted(baseline_by_cell.keys() | candidate_by_cell.keys()):
        baseline_status = point_status(baseline_by_cell[cell], ranks) if cell in baseline_by_cell else None
        before = baseline_status.status if baseline_status else "not run"
        after = summarise(candidate_by_cell[cell]) if cell in candidate_by_cell else None
        fails = after.fails if after else 0
        runs = after.passes + after.fails if after else 0
        was, now = _failure(baseline_status), _failure(after)
        verdict = _verdict(before, fails, runs, confirmations)
        if verdict == "known" and was != now:
            verdict = "changed failure"  # fails both ways, but another way: a new bug may hide behind the old one
        changed = harness_change_text(baseline_status) if baseline_status else ""
        rows.append(
            GateRow(
                cell=cell,
                baseline=before,
                candidate_fails=fails,
                candidate_runs=runs,
                verdict=verdict,
                baseline_failure=was,
                candidate_failure=now,
                baseline_harness_change=changed,
            )
        )
    return sorted(rows, key=lambda row: (VERDICTS.index(row.verdict), row.cell))


def _failure(status: CellStatus | None) -> str:
    return f"{status.failure_class}: {status.signature}" if status and status.fails else ""


def blocking(rows: list[GateRow], block_changed: bool, allow_missing: bool = False) -> list[GateRow]:
    """The rows that fail the gate: regressions, baseline verdicts the candidate has none for (a cell it skipped, did
    not run or renamed: what the gate never saw cannot pass it) unless allowed, changed failures when asked."""
    return [
        row
        for row in rows
        if row.verdict == "regression"
        or (row.verdict == "missing" and not allow_missing)
        or (block_changed and row.verdict == "changed failure")
    ]


def _verdict(baseline: str, fails: int, runs: int, confirmations: int) -> str:
    if runs == 0:
        return "missing" if baseline in ("pass", "fail", "flaky") else "not run"
    if fails == 0:
        return "fixed" if baseline == "fail" else "pass"
    if baseline == "pass":
        return "regression" if fails >= confirmations else "unconfirmed"
    if baseline == "fail":
        return "known"
    if baseline == "flaky":
        return "baseline flaky"
    return "new failure"  # no verdict in the baseline (not run or only skipped)

"""The gate's text, as `python -m reports gate` prints it: "As of <head> with merge base <sha>" for a pull request,
the count line and the causes (reports.outputs.pr_check, which the PR comment renders too), what the candidate fixed
and what it never ran, then each cell's verdict against the baseline and the decision."""

from __future__ import annotations

from collections import defaultdict

from reports.analysis import VERDICTS, GateRow, blocking, cells_text, count_text, plain_link
from reports.outputs.pr_check import PrCheck
from reports.outputs.pr_failures import cause_lines, summary_line


def gate_text(
    pr: PrCheck, confirmations: int, *, block_changed: bool, allow_missing: bool, ignored: list[str]
) -> tuple[str, bool]:
    """The gate's text and whether it blocks. `ignored`: lines naming the untrusted runs left out of the base."""
    prefix = f"As of {pr.commits.head} with merge base {pr.commits.merge_base}: " if pr.commits else ""
    missing = pr.missing
    lines = [
        prefix + summary_line(list(pr.failures), len(pr.fixed), len(missing)),
        pr.base,
        *ignored,
        *cause_lines(list(pr.failures), plain_link),
        *fixed_lines(pr),
    ]
    if missing:
        lines.append(
            f"missing (a verdict on the base, none in the candidate: skipped, not run or renamed"
            f"{'; allowed by --allow-missing' if allow_missing else ''}): {cells_text(missing)}"
        )
    table = format_table(list(pr.rows), confirmations, block_changed, allow_missing)
    blocks = bool(blocking(list(pr.rows), block_changed, allow_missing))
    return "\n".join([*lines, "", table]), blocks


def fixed_lines(pr: PrCheck) -> list[str]:
    """One line per cause of the base's failures that pass in the candidate."""
    by_cause = defaultdict(list)
    for fixed in pr.fixed:
        by_cause[fixed.cause_id].append(fixed)
    return [
        f"- fixed cause {cause_id}: {members[0].failure_class}: {members[0].words} — "
        f"{count_text(len(members), 'cell')}: {cells_text([f.cell for f in members])}"
        for cause_id, members in sorted(by_cause.items(), key=lambda item: (-len(item[1]), item[0]))
    ]


def format_table(
    rows: list[GateRow], confirmations: int, block_changed: bool = False, allow_missing: bool = False
) -> str:
    shown = [row for row in rows if row.verdict != "pass"]
    header = ("cell", "baseline", "candidate", "verdict")
    body = [
        (row.cell.id, row.baseline, f"{row.candidate_fails}/{row.candidate_runs} runs failed", row.verdict)
        for row in shown
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    changes = [
        f"  {row.cell.id}: {row.baseline_failure} -> {row.candidate_failure}"
        for row in shown
        if row.verdict == "changed failure"
    ]
    if changes:
        lines += ["", "changed failures (baseline -> candidate):", *changes]
    harness = [f"  {row.cell.id}: {row.baseline_harness_change}" for row in rows if row.baseline_harness_change]
    if harness:
        lines += [
            "",
            "baseline verdicts that changed with the harness commit at the same versions (a harness "
            "change, not flakiness; the newer harness's verdict is the baseline):",
            *harness,
        ]
    counts = {verdict: sum(row.verdict == verdict for row in rows) for verdict in VERDICTS}
    summary = ", ".join(f"{count} {verdict}" for verdict, count in counts.items() if count)
    regressions, changed, missing = counts["regression"], counts["changed failure"], counts["missing"]
    if regressions or (block_changed and changed) or (missing and not allow_missing):
        reasons = (
            [f"{regressions} cell(s) pass in the baseline and failed in ≥{confirmations} candidate run(s)"]
            if regressions
            else []
        )
        reasons += (
            [
                f"{missing} cell(s) with a verdict in the baseline have none in the candidate (skipped, not run or "
                "renamed; --allow-missing lists them without blocking)"
            ]
            if missing and not allow_missing
            else []
        )
        reasons += (
            [f"{changed} cell(s) fail in another class or signature (--block-changed)"]
            if block_changed and changed
            else []
        )
        decision = "FAIL: " + "; ".join(reasons)
    else:
        decision = "OK: no cell that passes in the baseline fails in the candidate" + (
            f" ({changed} failure(s) changed; --block-changed makes that block)" if changed else ""
        )
    return "\n".join([*(lines if shown else []), "", summary, decision])

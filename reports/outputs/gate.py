"""The release gate's table: each cell's verdict against the baseline and the decision, as `python -m reports
gate` prints it."""

from __future__ import annotations

from reports.analysis import VERDICTS, GateRow


def format_table(rows: list[GateRow], confirmations: int, block_changed: bool = False) -> str:
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
    regressions, changed = counts["regression"], counts["changed failure"]
    if regressions or (block_changed and changed):
        reasons = (
            [f"{regressions} cell(s) pass in the baseline and failed in ≥{confirmations} candidate run(s)"]
            if regressions
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

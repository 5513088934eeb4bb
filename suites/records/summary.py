"""The table printed at the end of a session: model × tp, outcome or failure class, key metric."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from matrix.config_values import UNREADABLE_CONFIG
from matrix.json_records import read_record
from suites.records.run_records import launcher_command
from suites.verdicts.mechanism import WHOSE, AutoTPRecord, class_and_finding

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

    from suites.records.run_records import CellRecord

STYLE = {"pass": "green", "fail": "red", "skip": "yellow", "unsupported": "yellow"}


def _cell_text(record: CellRecord) -> str:
    if record["outcome"] == "pass":
        return f"[green]pass[/] {record['metrics'].get('logits_max_abs', 0):.1e}"
    if record["outcome"] in ("skip", "unsupported"):
        return f"[yellow]{record['outcome']}[/]"
    return f"[red]{record['failure_class']}[/]"


def summary_table(records: list[CellRecord]) -> Table:
    tps = sorted({int(r["cell"]["tp"]) for r in records})
    table = Table(title="AutoTP cells (pass: max |Δlogit| vs unsharded)", show_lines=False)
    table.add_column("model")
    table.add_column("variant")
    table.add_column("dtype")
    for tp in tps:
        table.add_column(f"tp{tp}")
    rows: dict[tuple[str, str, str], dict[int, str]] = {}
    for record in records:
        cell = record["cell"]
        rows.setdefault((cell["model"], cell["variant"], cell["dtype"]), {})[int(cell["tp"])] = _cell_text(record)
    for key, by_tp in rows.items():
        table.add_row(*key, *(by_tp.get(tp, "") for tp in tps))
    return table


def counts_line(records: list[CellRecord]) -> str:
    counts = Counter(r["failure_class"] if r["outcome"] == "fail" else r["outcome"] for r in records)
    return ", ".join(f"{name}: {count}" for name, count in counts.most_common())


def unreadable_config_lines(records: list[CellRecord]) -> list[str]:
    """One line per model skipped because a reader of the harness could not read its config (matrix/config_values.py):
    the reason names the reader and the key, so the next reader to teach is in the summary, not only the records."""
    tps: dict[tuple[str, str], list[str]] = {}
    for record in records:
        if record["outcome"] == "skip" and UNREADABLE_CONFIG in record["message"]:
            tps.setdefault((record["cell"]["model"], record["message"]), []).append(f"tp{record['cell']['tp']}")
    return [f"skip {model} ({', '.join(sorted(set(at)))}): {message}" for (model, message), at in tps.items()]


def print_summary(records: list[CellRecord], terminalreporter: TerminalReporter) -> None:
    console = Console(file=terminalreporter._tw._file, width=max(terminalreporter._tw.fullwidth, 100))
    console.print(summary_table(records))
    console.print(f"{len(records)} cells — {counts_line(records)}")
    for line in unreadable_config_lines(records):
        console.print(f"[yellow]⊘[/] {line}", highlight=False, soft_wrap=True)
    # Every failure is read again where the run ends, grouped into causes (`python -m reports render`, one line each):
    # here only `nox -s repro`'s cell says its own.
    for record in records:
        if "repro" in record:
            if record["outcome"] == "fail":
                console.print(
                    f"[red]✗[/] {record['cell']['id']}: "
                    f"{class_and_finding(record['failure_class'], record['signature'])}",
                    highlight=False,
                    soft_wrap=True,
                )
            console.print(
                f"repro for {record['cell']['id']}: {launcher_command(int(record['cell']['tp']), record['repro'])}",
                highlight=False,
                soft_wrap=True,
            )
            for line in repro_details(record):
                console.print(line, highlight=False, soft_wrap=True, markup=False)


def repro_details(record: CellRecord) -> list[str]:
    """What `nox -s repro` adds for its cell: the cause with whose bug it is, and what AutoTP did."""
    lines: list[str] = []
    if cause := record.get("cause"):
        lines.append(f"cause ({WHOSE[cause['whose']]}): {cause['words']}")
    if autotp := record.get("autotp"):
        lines += ["what AutoTP did:", *(f"  {line}" for line in read_record(AutoTPRecord, autotp).text().splitlines())]
    return lines

"""The atlas's history, read from the results archive alone (no store): every archived run's results, grouped per
point as they are read (an entry at a time, never every result in memory), analysed like every report's history
(reports.analysis: statuses, flaky points, harness changes, transitions along each axis with the archived answers)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from reports.analysis import History, analyse_aggregates
from reports.store import (
    Aggregates,
    Bisection,
    CellKey,
    CellResult,
    DamagedEntry,
    ResultGrouping,
    ResultsArchive,
    Run,
    TriageAttempt,
    started_order,
)


@dataclass(frozen=True)
class SessionCounts:
    """What the archive holds of one session: `python -m reports atlas done` prints these for `nox -s atlas`."""

    runs: int
    cells: int
    install: int
    """Cells recorded as `install` failures (the environment could not be installed)."""


@dataclass(frozen=True)
class ArchiveHistory:
    history: History
    checkpoints: Mapping[CellKey, tuple[str, ...]]
    """The hub ids each faithful cell stands for, from its newest record that names any."""
    runs: int
    newest_started: str
    """When the newest archived run started: the atlas's date (the same archive, the same bytes)."""


class AtlasReader:
    """Runs added one at a time (an archive's entries, or a benchmark's synthetic nights), then analysed once."""

    def __init__(self) -> None:
        self._grouping = ResultGrouping(keep_metrics=False)
        self._checkpoints: dict[CellKey, tuple[tuple[str, str], tuple[str, ...]]] = {}
        self._runs: set[str] = set()
        self._newest = ""
        self.sessions: dict[str, list[int]] = {}

    def add(self, run: Run, results: Iterable[CellResult]) -> None:
        results = list(results)
        self._grouping.add(run, results)
        counts = self.sessions.setdefault(run.session, [0, 0, 0])
        if run.run_id not in self._runs:
            self._runs.add(run.run_id)
            counts[0] += 1
        self._newest = max(self._newest, run.started)
        counts[1] += len(results)
        counts[2] += sum(result.failure_class == "install" for result in results)
        order = started_order(run)
        for result in results:
            if result.checkpoints:
                known = self._checkpoints.get(result.cell)
                if known is None or order >= known[0]:
                    self._checkpoints[result.cell] = (order, result.checkpoints)

    def session_counts(self) -> dict[str, SessionCounts]:
        return {name: SessionCounts(*counts) for name, counts in sorted(self.sessions.items())}

    def history(self, answers: Iterable[Bisection | TriageAttempt] = ()) -> ArchiveHistory:
        answers = list(answers)
        aggregates = Aggregates(self._grouping.groups(), {}, [])
        bisections = [answer for answer in answers if isinstance(answer, Bisection)]
        attempts = [answer for answer in answers if isinstance(answer, TriageAttempt)]
        return ArchiveHistory(
            history=analyse_aggregates(aggregates, None, bisections, attempts),
            checkpoints={cell: hub_ids for cell, (_, hub_ids) in self._checkpoints.items()},
            runs=len(self._runs),
            newest_started=self._newest,
        )


def read_archive(root: Path) -> tuple[AtlasReader, ResultsArchive]:
    """Every run of the archive at `root`, in its (session, run id, attempt) order, validated as merge's door does; an
    entry that is not a regular file, is listed under two names, does not open or is not valid is skipped with a line
    naming it (`python -m reports verify` fails on it), never the end of the atlas."""
    archive = ResultsArchive(root)
    reader = AtlasReader()
    listing = archive.listing()
    for refused in listing.refused:
        print(f"skipped {refused}", file=sys.stderr)
    earlier: tuple[str, dict[CellKey, tuple[str, str, str]]] = ("", {})  # the run read last: its cells' verdicts
    for entry in listing.entries:
        try:
            records = archive.read(entry)
        except DamagedEntry as exc:
            print(f"skipped {exc}", file=sys.stderr)
            continue
        if records.run.remedied:  # a remedy's run (archived before merge refused to): never DeepSpeed's state
            continue
        if earlier[0] != records.run.run_id:
            earlier = (records.run.run_id, {})
        verdicts = earlier[1]
        changed = [r.cell.id for r in records.results if verdicts.get(r.cell, _verdict(r)) != _verdict(r)]
        if changed:  # a later attempt that contradicts an earlier one: as rebuild, nothing of it is read
            print(
                f"skipped {entry.path}: run {records.run.run_id!r} gives other verdicts than its earlier attempt for "
                f"{len(changed)} cell(s) ({'; '.join(changed[:3])}); a run id names one run, nothing of it was read",
                file=sys.stderr,
            )
            continue
        new = [result for result in records.results if result.cell not in verdicts]
        verdicts.update((result.cell, _verdict(result)) for result in new)
        reader.add(records.run, new)
    return reader, archive


def _verdict(result: CellResult) -> tuple[str, str, str]:
    return result.outcome, result.failure_class, result.signature

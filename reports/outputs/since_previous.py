"""What changed between each session's previous and newest run, grouped into causes: the report's "Since the previous
run" section, as a record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reports.analysis import (
    DELTA_KINDS,
    CauseGroup,
    SessionDeltas,
    cause_id,
    delta_causes,
    group_apart,
    group_in_place,
    named,
)
from reports.store import JSONObject


@dataclass(frozen=True)
class SinceSession:
    """One session's newest run and the previous one it is compared with."""

    session: str
    newest_run: str
    newest_versions: str
    previous_run: str | None  # None: its first run, nothing to compare with
    previous_versions: str | None
    changed: tuple[str, ...]  # "deepspeed 0.19.7 → 0.19.8", one per axis that changed


@dataclass(frozen=True)
class SinceCause:
    """The cells of one kind of change (reports.analysis.causes.DELTA_KINDS) with one failure class and cause."""

    id: str
    kind: str
    group: CauseGroup
    sessions: tuple[str, ...]
    no_previous_verdict: tuple[str, ...]  # new failures that did not run in the previous run
    root_causes: tuple[str, ...]  # the ids of the root causes whose transitions place the change
    name: str = ""
    """Its name with its classes (reports.analysis.cause_names): the report's failing-now one where the cause fails
    at the latest versions, else its own cells'; "" in a report.json written before causes had one."""

    def json_shape(self, written: JSONObject) -> JSONObject:
        """Its group's fields in its place; no `name` where it has none, as report.json was written before."""
        return {key: value for key, value in group_in_place(written).items() if key != "name" or value}

    @staticmethod
    def own_shape(stored: JSONObject) -> JSONObject:
        return group_apart(stored)


@dataclass(frozen=True)
class SincePreviousRun:
    """What changed between the previous and the newest run of each session, grouped into causes."""

    sessions: tuple[SinceSession, ...]
    counts: dict[str, dict[str, int]]  # {kind: {"cells": n, "causes": n}}; flaky cells are counted, not grouped
    causes: tuple[SinceCause, ...]
    flaky: tuple[str, ...]


def since_previous_run(sessions: list[SessionDeltas], names: Mapping[str, str] | None = None) -> SincePreviousRun:
    """What changed between the previous and the newest run of each session, grouped into causes; `names`: the
    failing-now names of causes, by id, which name them here too."""
    named_now = names or {}
    causes = delta_causes(sessions)
    flaky = sorted({d.cell.id for s in sessions for d in s.deltas if d.kind == "flaky"})
    return SincePreviousRun(
        sessions=tuple(
            SinceSession(
                session=s.session,
                newest_run=s.newest.run_id,
                newest_versions=s.newest.versions.describe(),
                previous_run=s.previous.run_id if s.previous else None,
                previous_versions=s.previous.versions.describe() if s.previous else None,
                changed=tuple(s.change_text(axis) for axis in s.changed),
            )
            for s in sessions
        ),
        counts={
            kind: {
                "cells": sum(len(c.cells) for c in causes if c.kind == kind),
                "causes": sum(1 for c in causes if c.kind == kind),
            }
            for kind in DELTA_KINDS
            if kind != "flaky"
        }
        | {"flaky": {"cells": len(flaky)}},
        causes=tuple(
            SinceCause(
                id=c.id,
                kind=c.kind,
                group=c.group,
                sessions=tuple(s.session for s in c.sessions),
                no_previous_verdict=tuple(
                    sorted({d.cell.id for _, d in c.deltas if c.kind == "new failure" and not d.regression})
                ),
                root_causes=tuple(sorted({cause_id(*t.cause_key) for _, d in c.deltas for t in d.transitions})),
                name=named_now.get(c.id) or named(c.failure_class, c.title),
            )
            for c in causes
        ),
        flaky=tuple(flaky),
    )

"""Root causes: what a maintainer reads as one thing, instead of one line per cell.

Transitions with the same `Transition.cause_key` (reports/analysis/history.py: kind, axis, range, the failing end's
failure class and cause, the signature with numbers and the length of number lists masked, so tp2's `[N, N]`
and tp3's `[N, N, N]` read the same) are one root cause: one entry in report.md/.html, the step summary and
the PR comment.

What changed since the previous run of each session (new failures, fixes, flaky cells) is grouped the same
way, by failure class and cause: publish opens one regression issue per such cause, not per cell.

Root causes are grouped from the typed transitions and point into report.json's lists of them (reports.outputs.model),
so every output says the same."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from matrix.json_records import read_record
from reports import ReportsError
from reports.analysis.answers import Link, TransitionEntry, answer_words, plain_link
from reports.analysis.cause_groups import CauseGroup, cause_group, group_apart, group_in_place
from reports.analysis.cause_names import cause_title, located_sentence, named
from reports.analysis.comparison import compare
from reports.analysis.history import History, Transition
from reports.analysis.signatures import failure_key, mask_signature
from reports.analysis.statuses import CellStatus
from reports.analysis.trust import without_since_when
from reports.store import (
    AXES,
    CellKey,
    CellResult,
    JSONObject,
    Observation,
    Pins,
    Run,
    TransitionKind,
    Versions,
    parse_pins,
    pins_text,
)
from suites.verdicts.cause import Cause

# Where report.json keeps the transitions of each kind; a root cause's members index into that list.
TRANSITION_LISTS = {"broke": "regressions", "fixed": "fixes", "class-change": "class_changes"}


def cause_id(*key: object) -> str:
    """A short name that stays the same for the same cause across renders: HTML anchors, issue markers."""
    return hashlib.sha1("\n".join(map(str, key)).encode()).hexdigest()[:12]


def failure_cause_id(failure_class: str, signature: str, mechanism: Cause | None) -> str:
    """The id of the cause a failure belongs to, as the report's "failing now" names it: of the cause the harness
    recorded (reports.analysis.signatures.failure_key), or of its class and masked signature where none was kept."""
    key = failure_key(failure_class, signature, mechanism)
    return cause_id(key) if mechanism is not None else cause_id(failure_class, mask_signature(signature))


# ---- Compact cell lists ------------------------------------------------------------------------------------------


def count_text(count: int, noun: str, plural: str = "") -> str:
    """ "1 cell", "2 cells" ("1 fix", "2 fixes" with plural given)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


# ---- Root causes of transitions ----------------------------------------------------------------------------------


def of_kind(transitions: list[Transition], kind: str) -> list[Transition]:
    """The transitions of one kind, in the order of report.json's list of them (`TRANSITION_LISTS`)."""
    return [t for t in transitions if t.kind == kind]


@dataclass(frozen=True)
class CauseAnswer:
    """One distinct answer among a root cause's transitions (answers.answer_words) and the cells it answers."""

    answer: str
    cells: tuple[str, ...]


@dataclass(frozen=True)
class RootCause:
    """Transitions with one `Transition.cause_key`: one entry of report.json "root_causes"."""

    id: str
    kind: TransitionKind
    axis: str
    before: str
    after: str
    group: CauseGroup
    held_fixed: tuple[Pins, ...]  # the other axes of its transitions, each distinct set once
    members: tuple[int, ...]  # indices into report.json's list of its kind (TRANSITION_LISTS)
    answers: tuple[CauseAnswer, ...]
    # Of each held_fixed, the pins other than the latest versions (which a report states once), where any differ:
    # what the cause was seen at besides them. Not in report.json; derived again from held_fixed when read back.
    elsewhere: tuple[Pins, ...]
    name: str = ""
    """Its failing end's cause named with its class (reports.analysis.cause_names): the failing-now name where that
    cause fails at the latest versions (reports.outputs.model), else from its own cells; "" in an older report.json."""

    def json_shape(self, written: JSONObject) -> JSONObject:
        """The report.json form (write_record): the held-fixed pins as text, `elsewhere` left out (from_json
        derives it again)."""
        shaped = {**group_in_place(written), "held_fixed": [pins_text(pins) for pins in self.held_fixed]}
        del shaped["elsewhere"]
        return shaped

    @classmethod
    def from_json(cls, entry: JSONObject, latest: Versions) -> RootCause:
        held_fixed = tuple(parse_pins(text) for text in entry["held_fixed"])
        whole = {**group_apart(entry), "held_fixed": held_fixed, "elsewhere": seen_elsewhere(held_fixed, latest)}
        return read_record(cls, whole)


def seen_elsewhere(held_fixed: tuple[Pins, ...], latest: Versions) -> tuple[Pins, ...]:
    """Of each held-fixed set, the pins that differ from the latest versions, where any do."""
    latest_pins = set(latest.pins())
    elsewhere = (tuple(pin for pin in pins if pin not in latest_pins) for pins in held_fixed)
    return tuple(pins for pins in elsewhere if pins)


def root_causes(
    listed_of: Mapping[str, Sequence[TransitionEntry]], transitions: list[Transition], latest: Versions
) -> tuple[RootCause, ...]:
    """The root causes of `transitions`, whose report's form `listed_of` gives per kind (report.json's
    "regressions", "fixes" and "class_changes"): regressions first, then fixes, then class changes, the most cells
    first. `members` index into the kind's list."""
    of_each_kind = by_kind(transitions)
    grouped: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for of_this_kind in of_each_kind.values():
        for index, t in enumerate(of_this_kind):
            grouped[t.cause_key].append(index)
    found = []
    for key, members in grouped.items():
        kind, axis, before, after, failure_class, _ = key
        listed = [listed_of[kind][i] for i in members]
        typed = [of_each_kind[kind][i] for i in members]
        cells = list({t.cell for t in listed})
        held_fixed = tuple(dict.fromkeys(t.held_fixed for t in typed))
        found.append(
            RootCause(
                id=cause_id(*key),
                kind=kind,  # type: ignore[arg-type]  # cause_key's first part is the transition's kind
                axis=axis,
                before=before,
                after=after,
                group=cause_group(failure_class, mask_signature(typed[0].failing_end.signature), cells),
                held_fixed=held_fixed,
                members=tuple(members),
                answers=tuple(
                    CauseAnswer(text, tuple(answered)) for text, answered in shared_answers(listed, plain_link)
                ),
                elsewhere=seen_elsewhere(held_fixed, latest),
                name=named(failure_class, _failing_title(typed)),
            )
        )
    kinds = list(TRANSITION_LISTS)
    return tuple(
        sorted(
            found,
            key=lambda c: (
                kinds.index(c.kind),
                -c.group.count,
                c.axis,
                c.group.failure_class,
                c.group.masked_signature,
            ),
        )
    )


def _failing_title(transitions: Sequence[Transition]) -> str:
    """The title of the cause the transitions' failing ends share (cause_names), from their own words."""
    first = transitions[0].failing_end
    key = failure_key(first.failure_class, first.signature, first.cause)
    text = mask_signature(first.signature)
    words = [t.failing_end.cause.words for t in transitions if t.failing_end.cause]
    return cause_title(first.failure_class, text, key, located_sentence(key, words, text))


def by_kind(transitions: list[Transition]) -> dict[str, list[Transition]]:
    """The transitions of each kind (`of_kind`), for looking up many root causes' members (`typed_members`)."""
    return {kind: of_kind(transitions, kind) for kind in TRANSITION_LISTS}


def typed_members(of_each_kind: Mapping[str, list[Transition]], root_cause: RootCause) -> list[Transition]:
    """A root cause's transitions as the history has them (as the report states them: Report.members), from the
    history's transitions of each kind (`by_kind`)."""
    same_kind = of_each_kind[root_cause.kind]
    return [same_kind[i] for i in root_cause.members]


def shared_answers(transitions: Sequence[TransitionEntry], link: Link) -> list[tuple[str, list[str]]]:
    """Each distinct answer among the transitions (answers.answer_words) with the cells it answers, the most
    cells first: one line for a cause that one bisection answered and the others confirmed."""
    by_answer: dict[str, list[TransitionEntry]] = defaultdict(list)
    for t in transitions:
        by_answer[answer_words(t, plain_link)].append(t)  # compared as plain text: a link may number its targets
    found = [
        (answer_words(answered[0], link), list(dict.fromkeys(t.cell.id for t in answered)))
        for answered in by_answer.values()
    ]
    return sorted(found, key=lambda item: -len(item[1]))


# ---- Since the previous run of each session ----------------------------------------------------------------------

# Order of the sections of the PR comment and the first screen; a cell is in exactly one.
DELTA_KINDS = ("new failure", "fixed", "flaky", "still failing")


@dataclass(frozen=True)
class Delta:
    kind: str  # one of DELTA_KINDS
    cell: CellKey
    result: CellResult  # the cell's result in the newest run
    previous: CellResult | None  # its result in the previous run, if it ran there
    regression: bool  # new failure that passed in the previous run: gets an issue
    flaky: CellStatus | None  # the tally at the newest versions, for flaky cells
    # The history's transitions of this cell into the newest versions that place the change: "broke" ones for a
    # regression, "fixed" ones for a fix (with commits and any bisection answer).
    transitions: tuple[Transition, ...] = ()

    @property
    def failure(self) -> CellResult:
        """The result whose failure this delta is about: the previous one for a fix, else the newest."""
        return self.previous if self.kind == "fixed" and self.previous else self.result


@dataclass(frozen=True)
class SessionDeltas:
    session: str
    newest: Run
    previous: Run | None  # None: the first run of this session, nothing to compare with
    deltas: tuple[Delta, ...]
    changed: tuple[str, ...]  # the version axes whose values differ between the two runs

    def change_text(self, axis: str) -> str:
        """ "deepspeed 0.19.7 → 0.19.8": an axis that changed between the previous and the newest run."""
        if self.previous is None:
            raise ValueError(f"session {self.session} has one run: nothing changed between runs")
        return f"{axis} {self.previous.versions.label(axis)} → {self.newest.versions.label(axis)}"


def session_deltas(observations: list[Observation], history: History, session: str) -> SessionDeltas:
    """The newest run of a session compared with its previous run, cell by cell (reports.analysis.comparison.compare);
    flakiness comes from the whole history."""
    runs = sorted({obs.run for obs in observations if obs.run.session == session}, key=lambda r: (r.started, r.run_id))
    if not runs:
        known = sorted({obs.run.session for obs in observations})
        raise ReportsError(f"--session {session!r}: no stored run of this session; stored sessions: {', '.join(known)}")
    newest = runs[-1]
    if len(runs) == 1:
        return SessionDeltas(session, newest, None, (), ())  # its first run: nothing to compare with
    previous = runs[-2]
    of_newest = [obs for obs in observations if obs.run == newest]
    of_previous = [obs for obs in observations if obs.run == previous]
    newest_results = {obs.cell: obs.result for obs in of_newest}
    previous_results = {obs.cell: obs.result for obs in of_previous}
    rows = compare(of_previous, of_newest, confirmations=1)
    deltas = []
    for row in rows:
        if row.cell not in newest_results:
            continue  # not run this time: nothing new to say about it
        status = history.statuses[row.cell, newest.versions]
        kind = _delta_kind(row.verdict, status.status == "flaky")
        if not kind:
            continue
        regression = kind == "new failure" and row.verdict == "regression"
        placing = {"new failure": "broke", "fixed": "fixed"}.get(kind) if regression or kind == "fixed" else None
        transitions = (
            tuple(
                t
                for t in history.transitions
                if t.kind == placing and t.cell == row.cell and t.after == newest.versions
            )
            if placing
            else ()  # still failing, flaky: nothing to place
        )
        deltas.append(
            Delta(
                kind=kind,
                cell=row.cell,
                result=newest_results[row.cell],
                previous=previous_results.get(row.cell),
                regression=regression,
                flaky=status if kind == "flaky" else None,
                transitions=transitions,
            )
        )
    changed = tuple(axis for axis in AXES if previous.versions.label(axis) != newest.versions.label(axis))
    return SessionDeltas(session, newest, previous, tuple(deltas), changed)


def all_session_deltas(observations: list[Observation], history: History) -> list[SessionDeltas]:
    """Each session's newest run against its previous one; since-when runs are no session's (reports.analysis.trust)."""
    by_session: dict[str, list[Observation]] = defaultdict(list)
    for obs in without_since_when(observations):
        by_session[obs.run.session].append(obs)  # one pass: a store holds many sessions' runs
    return [session_deltas(by_session[name], history, name) for name in sorted(by_session)]


def _delta_kind(verdict: str, flaky_at_newest: bool) -> str:
    """Map a gate verdict (newest run vs the previous one) to a delta kind; "" for cells not mentioned."""
    if flaky_at_newest:
        return "flaky"  # passed and failed at these exact versions: neither a regression nor a fix
    return {
        "regression": "new failure",
        "new failure": "new failure",
        "baseline flaky": "flaky",
        "fixed": "fixed",
        "known": "still failing",
    }.get(verdict, "")


@dataclass(frozen=True)
class DeltaCause:
    """The cells of one delta kind that fail (or failed, for fixes) with one cause
    (reports.analysis.signatures.failure_key)."""

    kind: str
    failure_class: str  # its first cell's (a cause keyed by mechanism may hold cells of two classes)
    masked_signature: str  # its first cell's signature, numbers masked
    deltas: tuple[tuple[SessionDeltas, Delta], ...]
    mechanism_key: str = ""  # of the cause the harness recorded (suites/verdicts/cause.py); "" for failures before

    @property
    def id(self) -> str:
        """The id failing now gives the same cause (reports.analysis.failing_now), which publish's issues carry."""
        return (
            cause_id(self.mechanism_key) if self.mechanism_key else cause_id(self.failure_class, self.masked_signature)
        )

    @property
    def cells(self) -> list[CellKey]:
        return sorted({delta.cell for _, delta in self.deltas})

    @property
    def title(self) -> str:
        """Its name from its own cells (reports.analysis.cause_names); an output that has the report's failing-now
        section names a cause failing now by that section's title instead, which all its cells give."""
        words = [delta.failure.cause.words for _, delta in self.deltas if delta.failure.cause]
        sentence = located_sentence(self.mechanism_key, words, self.masked_signature)
        return cause_title(self.failure_class, self.masked_signature, self.mechanism_key, sentence)

    @property
    def group(self) -> CauseGroup:
        return cause_group(self.failure_class, self.masked_signature, self.cells)

    @property
    def sessions(self) -> list[SessionDeltas]:
        return list({session.session: session for session, _ in self.deltas}.values())


def delta_causes(sessions: list[SessionDeltas]) -> list[DeltaCause]:
    """New failures, fixes and cells still failing, grouped by kind, failure class and cause (flaky cells are
    counted, not grouped: their failure is not a cause); per kind, the most cells first."""
    grouped: dict[tuple[str, str], list[tuple[SessionDeltas, Delta]]] = defaultdict(list)
    for session in sessions:
        for delta in session.deltas:
            if delta.kind != "flaky":
                failure = delta.failure
                key = failure_key(failure.failure_class, failure.signature, failure.cause)
                grouped[delta.kind, key].append((session, delta))
    found = []
    for (kind, _), deltas in grouped.items():
        first = deltas[0][1].failure
        mechanism = first.cause.mechanism_key if first.cause else ""
        found.append(DeltaCause(kind, first.failure_class, mask_signature(first.signature), tuple(deltas), mechanism))
    return sorted(found, key=lambda c: (DELTA_KINDS.index(c.kind), -len(c.cells), c.failure_class, c.masked_signature))

"""What a PR run did: each failure of the candidate classified against its base, like PyTorch's Dr.CI.

- flaky: the history says the cell is flaky (pass and fail at the candidate's or the base's versions);
- known: the base fails the same way (class and cause) or has no verdict, and an entry of
  matrix/known_failures.toml covers the failure at the candidate's versions;
- broken trunk ("already failing on the base"): the base fails the same way, and no known failure covers it;
- new: everything else — the base passes (a known failure the PR brought back is still the PR's), or fails
  another way (a new failure may hide behind the old one), or has no verdict and nothing covers it.

The first line of a PR comment (reports.outputs.publish) and of `python -m reports gate` is the count ("1 new failure,
93 already failing on the base, 0 flaky, 2 known"), then the causes, new ones first."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from matrix.known_failures import KnownFailure
from matrix.remedies import RemedyResult
from reports.analysis import (
    NO_VERDICT_STATUSES,
    CellStatus,
    History,
    Link,
    cause_statement,
    cause_title,
    cells_text,
    code,
    count_text,
    failure_cause_id,
    failure_key,
    mask_signature,
    one_line,
    reason,
    summarise,
    upstream_label,
)
from reports.outputs.markdown_safety import markdown_link
from reports.store import AXES, CellKey, CellResult, Observation

PR_KINDS = ("new", "broken trunk", "flaky", "known")  # listed in this order


@dataclass(frozen=True)
class PrFailure:
    """One cell failing in the candidate, classified against its base."""

    cell: CellKey
    kind: str
    """One of PR_KINDS."""
    failure_class: str
    cause: str
    """reports.analysis.signatures.mask_signature of the candidate's failure (numbers masked)."""
    base: str
    """The cell on the base: pass | fail | flaky | skip | not run."""
    base_failure: str = ""
    """ "class `cause`" where the base fails another way."""
    known: KnownFailure | None = None
    """The known failure covering it (also on a new one the PR brought back)."""
    key: str = ""
    """What groups it with others (reports.analysis.signatures.failure_key)."""
    cause_id: str = ""
    """The id the report's "failing now" gives its cause (reports.analysis.causes.failure_cause_id)."""
    words: str = ""
    """The cause in the report's words: the mechanism the harness recorded, else the class and cause's reason."""
    detail: str = ""
    """The failure as raised or judged, with its numbers (the cause masks them): the message's last line, else the
    signature."""


def classify(
    base: list[Observation],
    candidate: list[Observation],
    history: History,
    known: dict[str, KnownFailure],
    remedies: Sequence[RemedyResult] = (),
) -> list[PrFailure]:
    """Every cell that fails in the candidate, classified against the base, each cause in the report's one sentence
    (`remedies`: what `nox -s remedy` found, which states a cause proven); new ones first."""
    by_cell: dict[str, dict[CellKey, list[Observation]]] = {"base": defaultdict(list), "candidate": defaultdict(list)}
    for side, observations in (("base", base), ("candidate", candidate)):
        for obs in observations:
            by_cell[side][obs.cell].append(obs)
    found = []
    statuses: dict[CellKey, CellStatus] = {}
    for cell, observations in sorted(by_cell["candidate"].items()):
        status = summarise(observations)
        if not status.fails:
            continue
        statuses[cell] = status
        before = summarise(by_cell["base"][cell]) if cell in by_cell["base"] else None
        text = mask_signature(status.signature)
        newest = max(observations, key=lambda o: (o.run.started, o.run.run_id)).versions
        versions = {obs.versions for obs in [*observations, *by_cell["base"].get(cell, [])]}
        match = next(
            (
                entry
                for entry in known.values()
                if entry.covers(
                    status.failure_class, text, cell.model, cell.variant, {a: getattr(newest, a) for a in AXES}
                )
            ),
            None,
        )
        base_status = before.status if before else "not run"
        same = _failure(before) == _failure(status)
        flaky = status.status == "flaky" or any(
            (point := history.statuses.get((cell, v))) is not None and point.status == "flaky" for v in versions
        )
        if flaky:
            kind = "flaky"
        elif match and (same or base_status in (*NO_VERDICT_STATUSES, "not run")):
            kind = "known"
        elif same:
            kind = "broken trunk"
        else:
            kind = "new"
        other = (
            f"{before.failure_class} {code(mask_signature(before.signature))}"
            if before and before.fails and not same
            else ""
        )
        failing = [obs for obs in observations if obs.result.outcome == "fail"]
        found.append(
            PrFailure(
                cell=cell,
                kind=kind,
                failure_class=status.failure_class,
                cause=text,
                base=base_status,
                base_failure=other,
                known=match,
                key=_failure(status) or "",
                cause_id=failure_cause_id(status.failure_class, status.signature, status.cause),
                detail=_detail(max(failing, key=lambda o: (o.run.started, o.run.run_id)).result) if failing else "",
            )
        )
    members: dict[str, list[PrFailure]] = defaultdict(list)
    for failure in found:
        members[failure.cause_id].append(failure)
    words = {
        cause_id: cause_words(
            {f.cell: statuses[f.cell] for f in group},
            remedies,
            refused_by_design=all(f.known is not None and f.known.state == "unsupported" for f in group),
        )
        for cause_id, group in members.items()
    }
    found = [replace(f, words=words[f.cause_id]) for f in found]
    return sorted(found, key=lambda f: (PR_KINDS.index(f.kind), f.cell))


def cause_words(
    statuses: dict[CellKey, CellStatus], remedies: Sequence[RemedyResult] = (), refused_by_design: bool = False
) -> str:
    """The failing cells of one cause by the report's name for it (reports.analysis.cause_names `cause_title`), then
    its one sentence (reports.analysis.failing_now `cause_statement`: its mechanism, stated as proven only by a remedy
    verified on every one of them), else the class and cause's reason."""
    first = next(iter(statuses.values()))
    text = mask_signature(first.signature)
    key = failure_key(first.failure_class, first.signature, first.cause)
    cells = [cell.id for cell in statuses]
    sentence = cause_statement(key, list(statuses.values()), text, cells, remedies, refused_by_design)
    title = cause_title(first.failure_class, text, key, sentence)
    return f"{title} — {sentence or reason(first.failure_class, text).sentence}"


def _detail(result: CellResult) -> str:
    """The message's last line (the failure with its numbers, which the recorded signature masks), else the
    signature."""
    lines = [line.strip() for line in result.message.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if not line.startswith(("logs:", "("))), "")
    return one_line(last or result.signature)


def _failure(status: CellStatus | None) -> str | None:
    """The cause a status fails with (reports.analysis.signatures.failure_key), None where it does not fail."""
    return failure_key(status.failure_class, status.signature, status.cause) if status and status.fails else None


def summary_line(failures: list[PrFailure], fixed: int = 0, missing: int = 0) -> str:
    """ "1 new failure, 93 already failing on the base, 0 flaky, 2 known; 1 fixed, 0 missing": the failures of the
    candidate by kind, then the base's failures it passes and the base's verdicts it has none for."""
    counts = {kind: sum(f.kind == kind for f in failures) for kind in PR_KINDS}
    return (
        f"{count_text(counts['new'], 'new failure')}, {counts['broken trunk']} already failing on the base, "
        f"{counts['flaky']} flaky, {counts['known']} known; {fixed} fixed, {missing} missing"
    )


def cause_lines(failures: list[PrFailure], link: Link = markdown_link) -> list[str]:
    """One line per kind and cause (the report's cause id and words): its cells, new ones first, the most cells
    first; under a new cause, each of its cells' failure with its numbers."""
    grouped: dict[tuple[str, str], list[PrFailure]] = defaultdict(list)
    for f in failures:
        grouped[f.kind, f.cause_id].append(f)
    lines = []
    for (kind, cause_id), members in sorted(
        grouped.items(), key=lambda item: (PR_KINDS.index(item[0][0]), -len(item[1]), item[0][1])
    ):
        first = members[0]
        notes = sorted({f.base_failure for f in members if f.base_failure})
        notes = [f"the base fails another way: {note}" for note in notes]
        if kind == "new":
            bases = sorted({f.base for f in members if not f.base_failure})
            notes += [f"{'/'.join(bases)} on the base"] if bases else []
        known = next((f.known for f in members if f.known), None)
        if known:
            notes.append(f"known: {link(upstream_label(known.upstream), known.upstream)}")
        note = f" ({'; '.join(notes)})" if notes else ""
        lines.append(
            f"- {kind} cause {cause_id}: {first.failure_class}: {first.words} — {count_text(len(members), 'cell')}: "
            f"{cells_text([f.cell for f in members])}{note}"
        )
        if kind == "new":  # each new failure as raised or judged, with its numbers, as the PR comment shows it
            lines += [f"  - {f.cell.id}: {f.detail}" for f in members]
    return lines

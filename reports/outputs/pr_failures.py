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
from dataclasses import dataclass

from matrix.registry import KnownFailure
from reports.analysis import (
    CellStatus,
    History,
    Link,
    cause,
    cells_text,
    code,
    count_text,
    failure_key,
    summarise,
    upstream_label,
)
from reports.outputs.markdown_safety import markdown_link
from reports.store import AXES, CellKey, Observation

PR_KINDS = ("new", "broken trunk", "flaky", "known")  # listed in this order


@dataclass(frozen=True)
class PrFailure:
    cell: CellKey
    kind: str  # one of PR_KINDS
    failure_class: str
    cause: str  # reports.analysis.signatures.cause of the candidate's failure
    base: str  # the cell on the base: pass | fail | flaky | skip | not run
    base_failure: str = ""  # "class `cause`" where the base fails another way
    known: KnownFailure | None = None  # the known failure covering it (also on a new one the PR brought back)
    key: str = ""  # what groups it with others (reports.analysis.signatures.failure_key)


def classify(
    base: list[Observation], candidate: list[Observation], history: History, known: dict[str, KnownFailure]
) -> list[PrFailure]:
    """Every cell that fails in the candidate, classified against the base; new ones first."""
    by_cell: dict[str, dict[CellKey, list[Observation]]] = {"base": defaultdict(list), "candidate": defaultdict(list)}
    for side, observations in (("base", base), ("candidate", candidate)):
        for obs in observations:
            by_cell[side][obs.cell].append(obs)
    found = []
    for cell, observations in sorted(by_cell["candidate"].items()):
        status = summarise(observations)
        if not status.fails:
            continue
        before = summarise(by_cell["base"][cell]) if cell in by_cell["base"] else None
        text = cause(status.signature)
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
        elif match and (same or base_status in ("skip", "not run")):
            kind = "known"
        elif same:
            kind = "broken trunk"
        else:
            kind = "new"
        other = (
            f"{before.failure_class} {code(cause(before.signature))}" if before and before.fails and not same else ""
        )
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
            )
        )
    return sorted(found, key=lambda f: (PR_KINDS.index(f.kind), f.cell))


def _failure(status: CellStatus | None) -> str | None:
    """The cause a status fails with (reports.analysis.signatures.failure_key), None where it does not fail."""
    return failure_key(status.failure_class, status.signature, status.cause) if status and status.fails else None


def summary_line(failures: list[PrFailure]) -> str:
    """ "1 new failure, 93 already failing on the base, 0 flaky, 2 known"."""
    counts = {kind: sum(f.kind == kind for f in failures) for kind in PR_KINDS}
    return (
        f"{count_text(counts['new'], 'new failure')}, {counts['broken trunk']} already failing on the base, "
        f"{counts['flaky']} flaky, {counts['known']} known"
    )


def cause_lines(failures: list[PrFailure], link: Link = markdown_link) -> list[str]:
    """One line per kind, failure class, cause (and base failure, known failure): its cells, new ones first."""
    grouped: dict[tuple[str, str, str, str], list[PrFailure]] = defaultdict(list)
    for f in failures:
        grouped[f.kind, f.key, f.base_failure, f.known.name if f.known else ""].append(f)
    lines = []
    for (kind, _, base_failure, _), members in sorted(
        grouped.items(), key=lambda item: (PR_KINDS.index(item[0][0]), -len(item[1]), item[0][1:])
    ):
        first = members[0]
        failure_class, text = first.failure_class, first.cause
        notes = []
        if base_failure:
            notes.append(f"the base fails another way: {base_failure}")
        elif kind == "new":
            bases = sorted({f.base for f in members})
            notes.append(f"{'/'.join(bases)} on the base")
        if first.known:
            notes.append(f"known: {link(upstream_label(first.known.upstream), first.known.upstream)}")
        note = f" ({'; '.join(notes)})" if notes else ""
        lines.append(
            f"- **{kind}** {failure_class} {code(text)} — {count_text(len(members), 'cell')}: "
            f"{cells_text([f.cell for f in members])}{note}"
        )
    return lines

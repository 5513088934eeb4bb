"""Known failures (matrix/known_failures.toml) against the history: which covers a cause's cells at the latest
versions (known upstream, or by design: unsupported upstream), and which open ones the latest versions fixed."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass

from matrix.known_failures import KnownFailure
from reports.analysis.cause_groups import cells_text
from reports.analysis.history import History
from reports.analysis.signatures import mask_signature
from reports.analysis.statuses import CellStatus
from reports.store import AXES, Aggregates, CellKey, Versions, release

_UPSTREAM = re.compile(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)")
_PAGE = re.compile(r"https://github\.com/([^/]+/[^/]+)/blob/[0-9a-f]+/(?:[^#]+/)?([^/#]+)\.md(?:#.*)?")
_SOURCE = re.compile(r"https://github\.com/([^/]+/[^/]+)/blob/([^/]+)/(?:[^#]+/)?([^/#]+)(#L\d+(?:-L\d+)?)?")


def upstream_label(url: str) -> str:
    """ "deepspeedai/DeepSpeed#8185" for an issue or pull request URL; "deepspeedai/DeepSpeed v0.19.8 auto_tp.py#L293"
    for a line of its source, "deepspeedai/DeepSpeed automatic-tensor-parallelism page" for a documentation page (the
    two upstreams of a failure known by design)."""
    if match := _UPSTREAM.fullmatch(url):
        return f"{match[1]}#{match[2]}"
    if match := _PAGE.fullmatch(url):
        return f"{match[1]} {match[2]} page"
    if match := _SOURCE.fullmatch(url):
        return f"{match[1]} {match[2]} {match[3]}{match[4] or ''}"
    return url


@dataclass(frozen=True)
class KnownMatch:
    """The known failure (matrix/known_failures.toml) that covers cells of a cause, and which of them."""

    name: str
    upstream: str
    label: str  # "deepspeedai/DeepSpeed#8185"
    state: str
    fixed_in: str
    note: str
    cells: tuple[str, ...]
    # A fix upstream that the latest versions include, yet the cells fail: the issue needs reopening.
    fails_after_fix: bool


@dataclass(frozen=True)
class FixedKnown:
    """An open known failure whose cells pass at the latest versions: the upstream issue can be closed."""

    name: str
    upstream: str
    label: str
    state: str
    fixed_in: str
    note: str
    cells: tuple[str, ...]
    fails_after_fix: bool
    cells_text: str
    failure_class: str
    fixed_at: str  # "deepspeed 0.19.6": where the fix transitions land (the bisected release when triaged)
    last_failing: str  # "" where no transition places it
    bisected: bool


def versions_of(versions: Versions) -> dict[str, str]:
    return {axis: getattr(versions, axis) for axis in AXES}


def known_match(entry: KnownFailure, cells: list[CellKey], latest: dict[str, str]) -> KnownMatch:
    axis, _, fixed_version = entry.fixed_in.partition(" ")
    here = release(latest.get(axis, "")) if entry.fixed_in else None
    return KnownMatch(
        name=entry.name,
        upstream=entry.upstream,
        label=upstream_label(entry.upstream),
        state=entry.state,
        fixed_in=entry.fixed_in,
        note=entry.note,
        cells=tuple(cell.id for cell in cells),
        fails_after_fix=bool(here is not None and (fixed := release(fixed_version)) is not None and here >= fixed),
    )


def known_for(
    known: dict[str, KnownFailure], members: list[tuple[CellKey, CellStatus]], latest: dict[str, str]
) -> KnownMatch | None:
    """The known failure that covers the most of these cells (each with its own class and masked signature) at the
    latest versions, or None: a new cause."""
    covered = {
        entry.name: [
            c
            for c, status in members
            if entry.covers(status.failure_class, mask_signature(status.signature), c.model, c.variant, latest)
        ]
        for entry in known.values()
    }
    best = max(covered, key=lambda name: len(covered[name]), default=None)
    return known_match(known[best], covered[best], latest) if best and covered[best] else None


def fixed_known(history: History, aggregates: Aggregates, known: dict[str, KnownFailure]) -> list[FixedKnown]:
    """Open known failures seen in the history whose cells all pass where they ran at the latest versions: fixed at
    the version where their cells' fix transitions land (the bisected release when triage answered), or at the
    latest versions when no transition places it. A cell that fails there in any way keeps the entry open."""
    latest = history.latest
    fixed = []
    for entry in known.values():
        if entry.state != "open":
            continue
        seen = sorted(
            {
                group.cell
                for group in aggregates.groups
                if group.outcome == "fail"
                and entry.covers(
                    group.failure_class,
                    mask_signature(group.signature),
                    group.cell.model,
                    group.cell.variant,
                    versions_of(group.versions),
                )
            }
        )
        now = [history.statuses.get((cell, latest)) for cell in seen]
        if not seen or any(s is not None and s.status in ("fail", "flaky") for s in now):
            continue
        passing = [cell for cell, s in zip(seen, now) if s is not None and s.status == "pass"]
        if not passing:
            continue  # not run at the latest versions: nothing says it is fixed
        places: Counter[tuple[str, str, bool]] = Counter()
        for t in history.transitions:
            if t.kind == "fixed" and t.cell in passing and t.after == latest:
                b = t.bisection
                places[
                    (f"{b.axis} {b.after}", f"{b.axis} {b.before}", True)
                    if b
                    else (f"{t.axis} {t.after.label(t.axis)}", f"{t.axis} {t.before.label(t.axis)}", False)
                ] += 1
        (fixed_at, last_failing, bisected), _ = (
            places.most_common(1)[0] if places else ((latest.describe(), "", False), 0)
        )
        fixed.append(
            FixedKnown(
                **asdict(known_match(entry, passing, versions_of(latest))),
                cells_text=cells_text(passing),
                failure_class=entry.failure_class,
                fixed_at=fixed_at,
                last_failing=last_failing,
                bisected=bisected,
            )
        )
    return fixed

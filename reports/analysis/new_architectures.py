"""Architectures new since the previous transformers release, and their first verdicts.

`nox -s coverage` runs every causal-LM architecture of the installed transformers (the nightly runs it at the latest
releases, .github/workflows/autotp.yml). The architectures its runs recorded at the newest transformers release it
covered, less those recorded at the previous release it covered, are the ones that release brought; each one's first
verdicts are the earliest results of its cells there. Only coverage runs are compared: a run of a selection (the
registry's matrix) says nothing about which architectures a release has.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from packaging.version import Version

from reports.analysis.answers import code
from reports.analysis.checkpoints import shape_of
from reports.store import ResultGroup, release, started_order

COVERAGE_SESSION = "coverage"
"""The session of `nox -s coverage` (its runs' `session`)."""


@dataclass(frozen=True)
class FirstVerdict:
    """A cell's earliest result at the release that brought its architecture."""

    cell: str  # the cell's id
    model: str
    variant: str
    dtype: str
    tp: int
    outcome: str  # pass, fail or skip
    failure_class: str
    signature: str


@dataclass(frozen=True)
class NewArchitecture:
    name: str  # the model coordinate without its shape (`deepseek_v4` for `deepseek_v4.faithful`)
    verdicts: tuple[FirstVerdict, ...]


@dataclass(frozen=True)
class NewArchitectures:
    """The architectures coverage ran at `release` and not at `previous`, with their first verdicts. `previous` is ""
    when coverage ran at one release only (nothing to compare with), `release` too when it never ran."""

    release: str
    previous: str
    architectures: tuple[NewArchitecture, ...]


def architecture(model: str) -> str:
    """The architecture a cell's model coordinate belongs to: its registry or derived entry, without the shape."""
    return shape_of(model)[0]


def architectures_new_in_release(groups: list[ResultGroup]) -> NewArchitectures:
    """What the coverage runs among `groups` (the store's aggregates) say a transformers release brought."""
    by_release: dict[Version, list[ResultGroup]] = defaultdict(list)
    for group in groups:
        version = release(group.versions.transformers)
        if version is not None and COVERAGE_SESSION in (group.earliest.session, group.newest.session):
            by_release[version].append(group)
    covered = sorted(by_release)
    if len(covered) < 2:
        return NewArchitectures(str(covered[-1]) if covered else "", "", ())
    newest, previous = covered[-1], covered[-2]
    new = {architecture(g.cell.model) for g in by_release[newest]} - {
        architecture(g.cell.model) for g in by_release[previous]
    }
    first: dict[str, ResultGroup] = {}
    for group in by_release[newest]:
        known = first.get(group.cell.id)
        if architecture(group.cell.model) in new and (
            known is None or started_order(group.earliest) < started_order(known.earliest)
        ):
            first[group.cell.id] = group
    verdicts: dict[str, list[FirstVerdict]] = defaultdict(list)
    for cell_id, group in sorted(first.items(), key=lambda item: (item[1].cell.model, item[1].cell.tp, item[0])):
        cell = group.cell
        verdicts[architecture(cell.model)].append(
            FirstVerdict(
                cell=cell_id,
                model=cell.model,
                variant=cell.variant,
                dtype=cell.dtype,
                tp=cell.tp,
                outcome=group.outcome,
                failure_class=group.failure_class,
                signature=group.signature,
            )
        )
    return NewArchitectures(
        str(newest),
        str(previous),
        tuple(NewArchitecture(name, tuple(verdicts[name])) for name in sorted(verdicts)),
    )


def verdicts_text(verdicts: tuple[FirstVerdict, ...]) -> str:
    """`deepseek_v4.faithful eager fp32 tp2/3/4: forward `RuntimeError: …``: cells with the same verdict together."""
    together: dict[tuple[str, str, str, str, str, str], list[int]] = defaultdict(list)
    for v in verdicts:
        together[v.model, v.variant, v.dtype, v.outcome, v.failure_class, v.signature].append(v.tp)
    return "; ".join(
        f"{model} {variant} {dtype} tp{'/'.join(map(str, tps))}: "
        + (f"{failure_class} {code(signature)}" if outcome == "fail" else outcome)
        for (model, variant, dtype, outcome, failure_class, signature), tps in together.items()
    )


def new_architecture_lines(section: NewArchitectures) -> list[str]:
    """One line per new architecture: its first verdicts, the cells with the same verdict together."""
    return [f"{new.name} — {verdicts_text(new.verdicts)}" for new in section.architectures]


def new_architectures_summary(section: NewArchitectures) -> str:
    if not section.previous:
        return (
            f"`nox -s {COVERAGE_SESSION}` has run only at transformers {section.release}: no earlier release to "
            "compare with."
        )
    count = len(section.architectures)
    return (
        f"{count or 'No'} architecture{'' if count == 1 else 's'} new in transformers {section.release} "
        f"(`nox -s {COVERAGE_SESSION}` at {section.release} against {section.previous})"
        + (", first verdicts:" if count else ".")
    )


def new_architectures_markdown(section: NewArchitectures) -> list[str]:
    """The report's section; none in a history without coverage runs (a selection of models is all it holds)."""
    if not section.release:
        return []
    return [
        "## New architectures since the previous transformers release",
        "",
        new_architectures_summary(section),
        "",
        *[f"- {line}" for line in new_architecture_lines(section)],
        *([""] if section.architectures else []),
    ]

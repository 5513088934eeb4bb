"""Verdicts per real checkpoint and per architecture, shown apart.

A faithful cell (`qwen2.faithful-…`, matrix/shapes.py) splits exactly like the hub ids it stands for, which its
record carries (`CellResult.checkpoints`), so its verdict is stated per checkpoint: "Qwen/Qwen2-7B tp 3: ❌
forward …". A stress cell (plain id) exercises deliberately odd splits of the architecture: "qwen2 architecture
under stress shapes: …". A faithful cell that stands for no recorded checkpoint (its sizes are the config class
defaults) speaks for the architecture at those sizes. report.json "checkpoints", report.md/html, the
supported-models page and the PR comment all read this one section.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from markupsafe import Markup

from matrix.registry import RegistryError, load_models
from matrix.shapes import SHAPE_SEPARATOR, base_shape
from reports.analysis.answers import code, code_html, one_line
from reports.analysis.cause_names import named, shortened
from reports.analysis.history import History
from reports.store import Aggregates, CellKey, Run, started_order

ICONS = {"pass": "✅", "fail": "❌", "flaky": "⚠️", "skip": "⏭️", "unsupported": "🚫"}
MAX_CAUSE = 160
"""Characters of a failure's signature a verdict line keeps where no cause names it (report.json keeps it whole)."""


@dataclass(frozen=True)
class NamedCause:
    """The failing-now cause a cell fails with, as its verdict names it."""

    number: int
    """Its place in the failing-now list (1 the first)."""
    id: str
    title: str
    """Its name (reports.analysis.cause_names `cause_title`)."""


def shape_of(model: str) -> tuple[str, str]:
    """(registry entry, `faithful` or `stress`) of a cell's model coordinate (matrix.shapes.shaped_name spells it)."""
    entry, _, shape = model.partition(SHAPE_SEPARATOR)
    return entry, base_shape(shape) if shape else "stress"


def cell_checkpoints(aggregates: Aggregates, history: History) -> dict[CellKey, tuple[str, ...]]:
    """The hub ids each cell stands for at the latest versions (its newest record there)."""
    newest: dict[CellKey, Run] = {}
    for group in aggregates.groups:
        known = newest.get(group.cell)
        if group.versions == history.latest and (known is None or started_order(group.newest) > started_order(known)):
            newest[group.cell] = group.newest
    return {cell: aggregates.checkpoints.get((run.run_id, cell), ()) for cell, run in newest.items()}


@dataclass(frozen=True)
class CheckpointVerdict:
    """One cell's verdict at the latest versions, as the checkpoints section states it."""

    cell: str  # the cell's id
    model: str  # its model coordinate: registry entry and shape (qwen2.faithful)
    tp: int
    variant: str
    dtype: str
    status: str  # pass, fail, flaky or skip
    failure_class: str  # "" unless it fails
    cause: str  # a failing cell's signature, else ""
    mechanism: str = ""
    """What AutoTP did where this cell broke, in its own words (suites/verdicts/cause.py Cause.words), else ""."""
    cause_title: str = ""
    """The name of the cause it fails with, as every output names it (reports.analysis.cause_names), else ""."""
    cause_number: int = 0
    """That cause's place in the report's failing-now list (1 the first), 0 where it is in none."""
    cause_id: str = ""
    """That cause's id (reports.analysis.causes.failure_cause_id), "" where it is in no failing-now list."""

    @property
    def key(self) -> CellKey:
        return CellKey(self.model, self.variant, self.dtype, self.tp)


@dataclass(frozen=True)
class CheckpointEntry:
    """A real checkpoint and the verdicts of the faithful cells standing for it."""

    checkpoint: str  # its hub id
    architecture: str  # the registry entry of its cells
    verdicts: tuple[CheckpointVerdict, ...]


@dataclass(frozen=True)
class ArchitectureEntry:
    """An architecture (registry entry) and the verdicts of its cells of one kind (class-default or stress sizes)."""

    architecture: str
    verdicts: tuple[CheckpointVerdict, ...]


@dataclass(frozen=True)
class CheckpointVerdicts:
    """report.json "checkpoints": the verdicts at the latest versions per real checkpoint and per architecture."""

    faithful: tuple[CheckpointEntry, ...]  # per hub id (case-insensitive order), its faithful cells
    class_defaults: tuple[ArchitectureEntry, ...]  # per architecture, faithful cells sized by config-class defaults
    stress: tuple[ArchitectureEntry, ...]  # per architecture, its stress cells

    def real(self) -> CheckpointVerdicts:
        """The section without its stress cells: what it says of real checkpoints and class-default sizes."""
        return replace(self, stress=())

    def stress_only(self) -> CheckpointVerdicts:
        return CheckpointVerdicts(faithful=(), class_defaults=(), stress=self.stress)


def checkpoint_verdicts(
    history: History, checkpoints: dict[CellKey, tuple[str, ...]], causes: Mapping[str, NamedCause] | None = None
) -> CheckpointVerdicts:
    """report.json "checkpoints": `faithful` (per hub id, the verdicts of the faithful cells standing for it),
    `class_defaults` (per architecture, faithful cells sized by config-class defaults) and `stress` (per
    architecture, its stress cells); `causes`: the failing-now cause of each failing cell (by cell id), which its
    verdict names."""
    by_cell = causes or {}
    faithful: dict[str, list[CheckpointVerdict]] = defaultdict(list)
    architectures: dict[tuple[str, str], list[CheckpointVerdict]] = defaultdict(list)  # (kind, entry) -> verdicts
    for cell in sorted(history.cells, key=lambda c: (c.tp, c.variant, c.dtype, c.model)):
        status = history.statuses.get((cell, history.latest))
        if status is None:
            continue
        entry, shape = shape_of(cell.model)
        verdict = CheckpointVerdict(
            cell=cell.id,
            model=cell.model,
            tp=cell.tp,
            variant=cell.variant,
            dtype=cell.dtype,
            status=status.status,
            failure_class=status.failure_class,
            cause=status.signature if status.status == "fail" else "",
            mechanism=status.cause.words if status.status == "fail" and status.cause else "",
        )
        cause = by_cell.get(cell.id) if status.status == "fail" else None
        if cause:
            verdict = replace(verdict, cause_title=cause.title, cause_number=cause.number, cause_id=cause.id)
        hub_ids = checkpoints.get(cell, ())
        if shape == "faithful" and hub_ids:
            for hub_id in hub_ids:
                faithful[hub_id].append(verdict)
        else:
            architectures["class_defaults" if shape == "faithful" else "stress", entry].append(verdict)
    return CheckpointVerdicts(
        faithful=tuple(
            CheckpointEntry(hub_id, shape_of(verdicts[0].model)[0], tuple(verdicts))
            for hub_id, verdicts in sorted(faithful.items(), key=lambda item: item[0].lower())
        ),
        class_defaults=tuple(
            ArchitectureEntry(entry, tuple(verdicts))
            for (kind, entry), verdicts in sorted(architectures.items())
            if kind == "class_defaults"
        ),
        stress=tuple(
            ArchitectureEntry(entry, tuple(verdicts))
            for (kind, entry), verdicts in sorted(architectures.items())
            if kind == "stress"
        ),
    )


def has_faithful(section: CheckpointVerdicts) -> bool:
    """Whether any faithful cell ran at the latest versions (else the section is left out of every output)."""
    return bool(section.faithful or section.class_defaults)


def verdicts_text(verdicts: tuple[CheckpointVerdict, ...], numbered: bool = False) -> str:
    """ "tp 2: ✅ · tp 3: ❌ forward: <its cause's name> (cause 3)"; variant and dtype named where the verdicts have
    several. A failure is named by its cause (`numbered`: with its place in the report's failing-now list), else by its
    signature cut at a word boundary."""
    several = len({(v.variant, v.dtype) for v in verdicts}) > 1
    parts = []
    for verdict in verdicts:
        where = f"tp {verdict.tp}" + (f" {verdict.variant}/{verdict.dtype}" if several else "")
        # The word after the icon is its text fallback: a reader without an emoji font sees an empty box.
        said = failure_text(verdict, numbered) if verdict.status == "fail" else verdict.status
        parts.append(f"{where}: {' '.join(filter(None, (ICONS.get(verdict.status), said)))}")
    return " · ".join(parts)


def failure_text(verdict: CheckpointVerdict, numbered: bool = False) -> str:
    """ "forward: <its cause's name> (cause 3)", else "forward `<signature, cut at a word boundary>`"."""
    if verdict.cause_title:
        number = f" (cause {verdict.cause_number})" if numbered and verdict.cause_number else ""
        return f"{named(verdict.failure_class, verdict.cause_title)}{number}"
    return f"{verdict.failure_class} {code(shortened(one_line(verdict.cause), MAX_CAUSE))}"


def registry_hub_ids() -> dict[str, tuple[str, ...]]:
    """Each registry entry's hub ids ({} where the registry cannot be read: then no entry ranks above another)."""
    try:
        return {name: entry.hub_ids for name, entry in load_models().items()}
    except RegistryError:
        return {}


def family_names() -> dict[str, str]:
    """Each registry entry's family as DeepSpeed's automatic-tensor-parallelism page names it (ModelEntry.docs_family:
    `starcode` for gpt_bigcode, `gpt-neox` for gpt_neox), the name the supported-models lists use; {} where the
    registry cannot be read (then entries are named as they are)."""
    try:
        return {name: entry.docs_family for name, entry in load_models().items()}
    except RegistryError:
        return {}


def family_label(architecture: str, families: dict[str, str]) -> str:
    """The family by DeepSpeed's name: "starcode" for the gpt_bigcode entry; an entry that shares its family with
    another (llama_large beside llama) adds itself, "llama (llama_large)", so two lines never read alike."""
    family = families.get(architecture, architecture)
    shared = sum(1 for other in families.values() if other == family) > 1
    return f"{family} ({architecture})" if shared and family != architecture else family


def checkpoint_lines(section: CheckpointVerdicts, numbered: bool = False) -> list[str]:
    """One line per real checkpoint, then one per architecture: Markdown list items without the leading "- ". A
    family is named as the supported-models lists name it (family_label); `numbered`: each failure's cause with its
    place in the report's failing-now list (verdicts_text)."""
    families = family_names()
    return [
        *(
            f"{code(entry.checkpoint)} ({family_label(entry.architecture, families)}, faithful shapes) "
            f"{verdicts_text(entry.verdicts, numbered)}"
            for entry in section.faithful
        ),
        *(
            f"{family_label(entry.architecture, families)} architecture at its config-class default sizes (no "
            f"checkpoint recorded): {verdicts_text(entry.verdicts, numbered)}"
            for entry in section.class_defaults
        ),
        *(
            f"{family_label(entry.architecture, families)} architecture under stress shapes: "
            f"{verdicts_text(entry.verdicts, numbered)}"
            for entry in section.stress
        ),
    ]


def checkpoints_markdown(section: CheckpointVerdicts) -> list[str]:
    """The report's section: real checkpoints (faithful cells) and architectures (stress cells) apart; none for a
    history of stress cells only (the cells stored before shapes existed: no checkpoint to name)."""
    if not has_faithful(section):
        return []
    real = [f"- {line}" for line in checkpoint_lines(replace(section, class_defaults=(), stress=()), numbered=True)]
    defaults = [f"- {line}" for line in checkpoint_lines(replace(section, faithful=(), stress=()), numbered=True)]
    stress = [f"- {line}" for line in checkpoint_lines(section.stress_only(), numbered=True)]
    return [
        "## Verdicts per checkpoint at the latest versions",
        "",
        "Faithful cells split exactly like the checkpoints named; stress cells exercise deliberately odd splits of "
        "the architecture (uneven grains, fewer kv heads than ranks) and say nothing about a checkpoint.",
        "",
        "### Real checkpoints",
        "",
        *(real or ["None run."]),
        "",
        *(["### Architectures at their config-class default sizes", "", *defaults, ""] if defaults else []),
        "### Architectures under stress shapes",
        "",
        *(stress or ["None run."]),
        "",
    ]


def checkpoints_html(section: CheckpointVerdicts) -> dict[str, list[Markup]]:
    """The same lines for report.html: `real` (checkpoints, then class-default architectures) and `stress`, the
    text escaped and its code spans as <code>."""

    def html(lines: list[str]) -> list[Markup]:
        return [code_html(line) for line in lines]

    if not has_faithful(section):
        return {"real": [], "stress": []}
    return {
        "real": html(checkpoint_lines(section.real(), numbered=True)),
        "stress": html(checkpoint_lines(section.stress_only(), numbered=True)),
    }

"""What the supported-models page says of each model family (report.json "supported_models"), in three levels:

- works: every tested checkpoint of the family (every cell with a verdict) passes at every tp size;
- runs correctly but saves no memory: its only failures are `memory` (e.g. MoE experts left whole on every rank,
  logits right);
- fails: any other failure at any tp size, or a flaky cell (what works where is still said in words).

Families are DeepSpeed's own names (matrix/registry.py ModelEntry.docs_family: `gpt-neox`, `qwen2-moe`, `openai`),
so the page and its diff read like DeepSpeed's; a model the registry does not name is its own family. Each failure
is said by its cause's name (reports.analysis.cause_names, as every output names it), never as an error string. A
family with faithful cells (split like its real checkpoints) is judged by them; stress cells judge it only without
them. A `setup` or `install` failure is the harness's or the environment's: no verdict (a family with nothing else is
"not tested").
The page states what it was tested at: the versions, the accelerator, the dtypes and tp sizes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from matrix.json_records import split_keys
from matrix.known_failures import NO_VERDICT_CLASSES
from matrix.registry import MODELS_FILE, RegistryError, load_models
from reports import ReportsError
from reports.analysis import NO_VERDICT_STATUSES, CellStatus, FailingNow, History, reason, shape_of
from reports.store import AXES, Aggregates, CellKey, JSONObject

LEVELS = ("works", "no memory saved", "fails")
"""A family's level: the worst of its cells' (a flaky cell is no pass, so it fails)."""


def model_families(models_file: Path = MODELS_FILE) -> dict[str, str]:
    """Registry entry → the family DeepSpeed's page lists it under (`llama_large` → `llama`, `gptj` → `gpt-j`)."""
    try:
        return {name: entry.docs_family for name, entry in load_models(models_file).items()}
    except RegistryError as error:
        raise ReportsError(str(error)) from None


def entry_name(model: str) -> str:
    """The registry entry of a cell's model coordinate (`qwen2.faithful` → `qwen2`)."""
    return shape_of(model)[0]


def family_of(model: str, families: dict[str, str]) -> str:
    return families.get(entry_name(model), entry_name(model))


def _verdicts(history: History, families: dict[str, str]) -> dict[str, list[tuple[CellKey, CellStatus]]]:
    """Per family, its cells with a verdict on AutoTP (pass, fail, flaky) at the latest versions: neither skipped nor
    failed by the harness or its environment (NO_VERDICT_CLASSES); only its faithful cells where it has any."""
    found: dict[str, list[tuple[CellKey, CellStatus]]] = defaultdict(list)
    for cell in history.cells:
        status = history.statuses.get((cell, history.latest))
        if (
            status is not None
            and status.status not in NO_VERDICT_STATUSES
            and not (status.status == "fail" and status.failure_class in NO_VERDICT_CLASSES)
        ):
            found[family_of(cell.model, families)].append((cell, status))
    return {
        family: [(cell, status) for cell, status in cells if shape_of(cell.model)[1] == "faithful"] or cells
        for family, cells in sorted(found.items())
    }


@dataclass(frozen=True)
class Part:
    """Cells of a family alike at some tp sizes: the same level and the same reason."""

    members: tuple[str, ...]
    """What the cells stand for: checkpoints' short names (faithful cells), else registry entries."""
    variants: str
    """`eager fp32`."""
    tps: tuple[int, ...]
    state: str
    """`works`, `no memory saved`, `fails` or `flaky`."""
    reason: str
    """The failure in words ("" where it works)."""
    causes: tuple[str, ...]
    """The failing-now causes (ids) said by `reason` (none where it works or is flaky)."""
    known: Tracked | None
    """The known failure tracking it upstream."""


@dataclass(frozen=True)
class Tracked:
    """A known failure as the supported-models page links it."""

    label: str
    upstream: str  # the issue or PR tracking it upstream


@dataclass(frozen=True)
class FamilySupport:
    """What the page says of one model family."""

    family: str  # DeepSpeed's name of it (ModelEntry.docs_family)
    level: str  # one of LEVELS
    models: tuple[str, ...]  # the model coordinates of its cells
    parts: tuple[Part, ...]  # what works where, what fails where and why


@dataclass(frozen=True)
class TestedAt:
    """What the page was measured at."""

    versions: dict[str, str]  # each axis's label at the latest versions (report.json puts them first, by axis)
    accelerators: tuple[str, ...]  # "cpu (gloo)", those the runs had
    dtypes: tuple[str, ...]
    variants: tuple[str, ...]
    tps: tuple[int, ...]
    date: str  # the day of the newest run at the latest versions

    def json_shape(self, written: JSONObject) -> JSONObject:
        return {**written["versions"], **{name: item for name, item in written.items() if name != "versions"}}

    @staticmethod
    def own_shape(entry: JSONObject) -> JSONObject:
        versions, tested_at = split_keys(entry, AXES)
        return {**tested_at, "versions": versions}


@dataclass(frozen=True)
class SupportedModels:
    """report.json "supported_models": the families at each level, what the page was tested at, and per family its
    parts."""

    tested_at: TestedAt
    levels: dict[str, tuple[str, ...]]  # per level (LEVELS' order) its families; report.json has each at the top
    not_tested: tuple[str, ...]  # families whose cells only skipped or failed in the harness or its environment
    families: tuple[FamilySupport, ...]

    def json_shape(self, written: JSONObject) -> JSONObject:
        supported = {name: item for name, item in written.items() if name != "levels"}
        return {"tested_at": supported.pop("tested_at"), **written["levels"], **supported}

    @staticmethod
    def own_shape(section: JSONObject) -> JSONObject:
        levels, supported = split_keys(section, LEVELS)
        return {**supported, "levels": levels}


def _member(cell: CellKey, checkpoints: dict[CellKey, tuple[str, ...]]) -> str:
    hub_ids = checkpoints.get(cell, ())
    return ", ".join(hub_id.rsplit("/", 1)[-1] for hub_id in hub_ids) if hub_ids else entry_name(cell.model)


def _state(status: CellStatus) -> str:
    if status.status == "pass":
        return "works"
    if status.status == "flaky":
        return "flaky"
    return "no memory saved" if status.failure_class == "memory" else "fails"


def family_parts(
    cells: list[tuple[CellKey, CellStatus]], failing_now: FailingNow, checkpoints: dict[CellKey, tuple[str, ...]]
) -> list[Part]:
    """A family's cells grouped by what they stand for, variant and tp, then by level and reason."""
    causes = {cell: cause for cause in failing_now.causes for cell in cause.group.cells}
    per_cell: dict[tuple[str, str, int], list[tuple[str, str, str, Tracked | None]]] = defaultdict(list)
    for cell, status in cells:
        state, words, cause_id, known = _state(status), "", "", None
        if status.status == "fail":
            cause = causes.get(cell.id)
            words = cause.title if cause and cause.title else reason(status.failure_class, status.signature).short
            cause_id = cause.id if cause else ""
            if cause and cause.known and cell.id in cause.known.cells and cause.known.state != "unsupported":
                known = Tracked(cause.known.label, cause.known.upstream)
        per_cell[_member(cell, checkpoints), f"{cell.variant} {cell.dtype}", cell.tp].append(
            (state, words, cause_id, known)
        )
    # (member, variants, state, reason, known) -> (tp, cause id) of each of its tp sizes
    grouped: dict[tuple[str, str, str, str, Tracked | None], list[tuple[int, str]]] = defaultdict(list)
    for (member, variants, tp), states in sorted(per_cell.items()):
        # Several cells alike at one tp (a family's entries): the worst of them says what that tp does.
        state, words, cause_id, known = max(
            states, key=lambda s: ("works", "flaky", "no memory saved", "fails").index(s[0])
        )
        grouped[member, variants, state, words, known].append((tp, cause_id))
    parts = [
        Part(
            members=(member,),
            variants=variants,
            tps=tuple(sorted({tp for tp, _ in at})),
            state=state,
            reason=words,
            causes=tuple(sorted({cause for _, cause in at if cause})),
            known=known,
        )
        for (member, variants, state, words, known), at in grouped.items()
    ]
    return _merge_members(parts)


def _merge_members(parts: list[Part]) -> list[Part]:
    """Members whose parts are all alike become one member list (a family's checkpoints that behave the same)."""
    by_member: dict[str, list[Part]] = defaultdict(list)
    for part in parts:
        by_member[part.members[0]].append(part)
    signature_of = {
        member: tuple((p.variants, p.tps, p.state, p.reason) for p in sorted(group, key=lambda p: (p.variants, p.tps)))
        for member, group in by_member.items()
    }
    merged: list[Part] = []
    for signature in dict.fromkeys(signature_of.values()):
        members = tuple(sorted(m for m, s in signature_of.items() if s == signature))
        for part in by_member[members[0]]:
            merged.append(
                Part(
                    members=members,
                    variants=part.variants,
                    tps=part.tps,
                    state=part.state,
                    reason=part.reason,
                    causes=part.causes,
                    known=part.known,
                )
            )
    return merged


def family_level(parts: list[Part]) -> str:
    """ "works" only where every part works: one failing checkpoint or tp size is a documented limit."""
    states = {part.state for part in parts}
    return "works" if states == {"works"} else "no memory saved" if states <= {"works", "no memory saved"} else "fails"


def tested_at(history: History, aggregates: Aggregates) -> TestedAt:
    """What the page was measured at: the latest versions, the accelerators the runs had, dtypes, tp sizes."""
    latest = history.latest
    runs = [group.newest for group in aggregates.groups if group.versions == latest]
    cells = [cell for cell, versions in history.statuses if versions == latest]
    return TestedAt(
        versions={axis: latest.label(axis) for axis in AXES},
        accelerators=tuple(sorted({f"{run.accelerator or 'unknown'} ({run.backend or 'unknown'})" for run in runs})),
        dtypes=tuple(sorted({cell.dtype for cell in cells})),
        variants=tuple(sorted({cell.variant for cell in cells})),
        tps=tuple(sorted({cell.tp for cell in cells})),
        date=max((run.started[:10] for run in runs), default=""),
    )


def supported_models(
    history: History,
    failing_now: FailingNow,
    families: dict[str, str],
    aggregates: Aggregates,
    checkpoints: dict[CellKey, tuple[str, ...]],
) -> SupportedModels:
    """report.json "supported_models": the families at each level, what the page was tested at, and per family its
    parts (what works where, what fails where and why)."""
    entries: list[FamilySupport] = []
    for family, cells in _verdicts(history, families).items():
        parts = family_parts(cells, failing_now, checkpoints)
        entries.append(
            FamilySupport(
                family=family,
                level=family_level(parts),
                models=tuple(sorted({cell.model for cell, _ in cells})),
                parts=tuple(parts),
            )
        )
    ran = {family_of(cell.model, families) for cell in history.cells if (cell, history.latest) in history.statuses}
    return SupportedModels(
        tested_at=tested_at(history, aggregates),
        levels={level: tuple(e.family for e in entries if e.level == level) for level in LEVELS},
        not_tested=tuple(sorted(ran - {e.family for e in entries})),
        families=tuple(entries),
    )


def model_support(history: History, families: dict[str, str]) -> dict[str, bool]:
    """Per family at the latest versions: True when every cell with a verdict passes (family_level "works"), what
    DeepSpeed's "Supported Models" list says of it."""
    return {
        family: all(status.status == "pass" for _, status in cells)
        for family, cells in _verdicts(history, families).items()
    }

"""The files a results folder holds beside its report for the cells failing at the latest versions: each cell's
rank logs (kept by the run, suites/engine/rank_group.py), its standalone repro script and each DeepSpeed cause's
draft issue (written here, by `python -m reports render`), so the report links a file only when it is there.

A repro script needs the cell rebuilt as it ran (matrix.cells.resolve_cell): a faithful or derived shape needs
transformers' config classes, and the transformers the cells ran, so render writes scripts only where that
transformers is installed (the combination's environment `nox -s matrix` renders in) and says why not elsewhere."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from matrix.cells import Cell, expand, replay_name, resolve_cell
from matrix.registry import RegistryError
from matrix.remedies import RemedyResult
from reports.analysis import History, ResultFiles, draft_file, log_folder, repro_file
from reports.outputs.draft_issue import Inert, installed_transformers, not_deepspeeds, write_cause_draft, write_script
from reports.outputs.model import Report
from reports.outputs.render_cache import ScriptRequest, cached_script
from reports.store import Aggregates, CellKey, Observation, ResultGroup


def failing_groups(history: History, aggregates: Aggregates) -> dict[str, ResultGroup]:
    """The newest failing result of each cell failing at the latest versions, by cell id."""
    failing = {
        cell
        for (cell, versions), status in history.statuses.items()
        if versions == history.latest and status.status == "fail"
    }
    newest: dict[str, ResultGroup] = {}
    for group in aggregates.groups:
        if group.cell in failing and group.versions == history.latest and group.outcome == "fail":
            known = newest.get(group.cell.id)
            if known is None or (group.newest.started, group.newest.run_id) > (
                known.newest.started,
                known.newest.run_id,
            ):
                newest[group.cell.id] = group
    return newest


def write_repro_scripts(
    history: History, aggregates: Aggregates, out_dir: Path, log: Callable[[str], None]
) -> set[str]:
    """A repro script per cell failing at the latest versions, under out_dir (repro_file); the cells written."""
    groups = failing_groups(history, aggregates)
    if not groups:
        return set()
    wanted = history.latest.transformers
    installed = installed_transformers()
    if installed != wanted:
        log(
            f"repro scripts: not written (the cells ran transformers {wanted}, this environment has "
            f"{installed or 'none'}: their tiny configs come from its config classes); `nox -s draft-issue -- "
            "--cause <id>` writes a cause's script"
        )
        return set()
    requests = {
        cell_id: ScriptRequest.of(group.cell, group.newest, group.failure_class, group.signature)
        for cell_id, group in sorted(groups.items())
    }
    folders = {cell_id: out_dir / Path(repro_file(cell_id)).parent for cell_id in requests}
    written = {cell_id for cell_id, request in requests.items() if cached_script(request, folders[cell_id])}
    missing = [request for cell_id, request in requests.items() if cell_id not in written]
    cells = resolve_cells([request.cell for request in missing]) if missing else {}
    for request in missing:
        cell = cells[request.cell.id]
        if isinstance(cell, RegistryError):
            log(f"repro script for {request.cell.id}: not written ({cell})")
            continue
        write_script(cell, request, folders[request.cell.id])
        written.add(request.cell.id)
    return written


def resolve_cells(keys: Iterable[CellKey]) -> dict[str, Cell | RegistryError]:
    """Each recorded cell as the Cell it names (matrix.cells.resolve_cell), or why it cannot be built, by cell id.
    The cells of one model are built by one expansion: a model the registry lacks is derived from transformers'
    config classes, which derives every architecture (seconds), once for all of its cells rather than once each. An
    expansion that fails is the reason for each of its cells; a cell it does not build is asked for alone."""
    by_model: dict[str, list[CellKey]] = defaultdict(list)
    for key in keys:
        by_model[key.model].append(key)
    resolved: dict[str, Cell | RegistryError] = {}
    for model, cells in by_model.items():
        try:
            built = {
                cell.id: cell
                for cell in expand(
                    replay_name(model),
                    ",".join(sorted({key.variant for key in cells})),
                    ",".join(sorted({key.dtype for key in cells})),
                    ",".join(sorted({str(key.tp) for key in cells})),
                )
            }
        except RegistryError as error:
            resolved.update(dict.fromkeys((key.id for key in cells), error))
            continue
        for key in cells:
            try:
                resolved[key.id] = built.get(key.id) or resolve_cell(key.model, key.variant, key.dtype, key.tp)
            except RegistryError as error:
                resolved[key.id] = error
    return resolved


def result_files(out_dir: Path, history: History, stage: Path, remedies: tuple[RemedyResult, ...] = ()) -> ResultFiles:
    """What out_dir holds for the cells failing at the latest versions: the logs their run kept, their repro
    scripts (written by this render into `stage`, the folder its outputs move into out_dir from, or by the run's own
    render: CI gathers the cell jobs' into the report's), with `remedies`, what `nox -s remedy` found (the store's,
    HistoryStore.remedy_results: a proof lives with the history, not in a results folder)."""
    failing = {
        cell.id
        for (cell, versions), status in history.statuses.items()
        if versions == history.latest and status.status == "fail"
    }
    return ResultFiles(
        logs=frozenset(cell for cell in failing if any((out_dir / log_folder(cell)).glob("*"))),
        repro=frozenset(
            cell for cell in failing if any((folder / repro_file(cell)).is_file() for folder in (out_dir, stage))
        ),
        remedies=remedies,
    )


def draft_runs(report: Report, history: History, aggregates: Aggregates) -> set[str]:
    """The runs whose results the draft issues read: each cause's example cell's newest failing run."""
    groups = failing_groups(history, aggregates)
    return {groups[c.repro.cell].newest.run_id for c in report.failing_now.causes if c.repro.cell in groups}


def write_drafts(
    report: Report, history: History, observations: list[Observation], out_dir: Path, inert: Inert
) -> Report:
    """A draft issue per cause that is DeepSpeed's to fix and not documented as unsupported (where its example
    cell's script could be written), under out_dir (draft_file); the report naming each. `observations`: the
    example cells' newest failing results (draft_runs)."""
    drafted = {}
    for entry in report.failing_now.causes:
        if entry.repro.script and not not_deepspeeds(entry) and entry.status != "unsupported":
            write_cause_draft(entry, report, history, observations, out_dir=out_dir, inert=inert)
            drafted[entry.id] = draft_file(entry.group.failure_class, entry.id)
    if not drafted:
        return report
    causes = tuple(replace(c, draft=drafted.get(c.id, c.draft)) for c in report.failing_now.causes)
    return replace(report, failing_now=replace(report.failing_now, causes=causes))

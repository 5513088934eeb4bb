"""The atlas as a static site: index.html, checkpoint/<row>.html, cause/<id>.html, deepspeed/<release>.html and
atlas.json, every URL stable (a row's slug, a cause's id, a release's version), every link relative. The same
atlas gives the same bytes: nothing here reads a clock or the machine. Written into a folder beside OUT and moved
into place at the end, so a failed render leaves the previous site whole."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from reports import ReportsError
from reports.analysis import cells_text, count_text
from reports.atlas.model import Atlas, AtlasCause, AtlasTransition, Row, atlas_json, cause_repro
from reports.atlas.views import (
    STATE_CODES,
    Grid,
    channel,
    grids,
    heatmap_data,
    newest_verdicts,
    release_slug,
    release_text,
    releases,
    transition_groups,
    version_key,
)
from reports.outputs import visible_html
from reports.store import CellKey

ATLAS_FILE = "atlas.json"
KIND_TEXT = {
    "checkpoint": "a real checkpoint: its faithful cells split exactly as it does",
    "architecture": "an architecture at its config class's default sizes (no real checkpoint recorded)",
    "stress": "an architecture under the registry's stress shapes (odd splits on purpose)",
}


def site_pages(atlas: Atlas) -> Iterator[tuple[str, str]]:
    """(path relative to the site, content) of every page, atlas.json first."""
    environment = Environment(
        loader=PackageLoader("reports.atlas"),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        finalize=visible_html,  # bidirectional and zero-width characters from the results shown by name
    )
    common = {
        "atlas": atlas,
        "channel": channel,
        "codes": STATE_CODES,
        "count_text": count_text,
        "release_slug": release_slug,
    }
    yield ATLAS_FILE, json.dumps(atlas_json(atlas), indent=1, sort_keys=True) + "\n"
    all_releases = releases(atlas)
    families = atlas.rows_of_family()
    yield (
        "index.html",
        environment.get_template("index.html.j2").render(
            **common,
            root="",
            families=families,
            newest={family: _newest_counts(atlas, rows) for family, rows in families.items()},
            deepspeed=list(dict.fromkeys(vs.deepspeed for vs in atlas.version_sets)),
            transformers=sorted({vs.transformers for vs in atlas.version_sets}, key=version_key),
            tps=sorted({cell.tp for row in atlas.rows for cell in row.cells}),
            variants=sorted({cell.variant for row in atlas.rows for cell in row.cells}),
            heatmap=heatmap_data(atlas),
            releases=all_releases,
            release_text=release_text,
            causes=sorted(atlas.causes.values(), key=lambda c: (-len(c.cells), c.failure_class, c.masked_signature)),
        ),
    )
    all_grids = grids(atlas.version_sets)
    yield from _checkpoint_pages(environment, common, atlas, families, all_grids)
    yield from _cause_pages(environment, common, atlas, all_grids)
    release_page = environment.get_template("release.html.j2")
    for index, release in enumerate(all_releases):
        yield (
            f"deepspeed/{release.slug}.html",
            release_page.render(
                **common,
                root="../",
                release=release,
                previous=all_releases[index - 1] if index else None,
                following=all_releases[index + 1] if index + 1 < len(all_releases) else None,
                release_text=release_text,
                causes=atlas.causes,
            ),
        )


def _checkpoint_pages(
    environment: Environment,
    common: dict[str, Any],
    atlas: Atlas,
    families: dict[str, list[Row]],
    all_grids: list[Grid],
) -> Iterator[tuple[str, str]]:
    """A page per row (a checkpoint, an architecture or a stress shape): its verdicts, transitions and causes."""
    by_cell: dict[CellKey, list[AtlasTransition]] = defaultdict(list)
    for transition in atlas.transitions:
        by_cell[transition.cell].append(transition)
    checkpoint = environment.get_template("checkpoint.html.j2")
    for row in atlas.rows:
        groups, more = transition_groups([t for cell in row.cells for t in by_cell[cell]], atlas)
        yield (
            f"checkpoint/{row.slug}.html",
            checkpoint.render(
                **common,
                root="../",
                row=row,
                kind_text=KIND_TEXT,
                siblings=[other for other in families[row.family] if other != row],
                since=newest_verdicts(atlas, row),
                grids=all_grids,
                channels=[channel(cell) for cell in row.cells],
                verdicts=atlas.verdicts,
                groups=groups,
                more=more,
                causes=atlas.causes,
                row_causes=_row_causes(atlas, row),
            ),
        )


def _cause_pages(
    environment: Environment, common: dict[str, Any], atlas: Atlas, all_grids: list[Grid]
) -> Iterator[tuple[str, str]]:
    """A page per cause: its cells, how to run its example alone, its transitions."""
    titles = {row.slug: row.title for row in atlas.rows}
    by_cause: dict[str, list[AtlasTransition]] = defaultdict(list)
    for transition in atlas.transitions:
        by_cause[transition.cause].append(transition)
    failing = _failing_counts(atlas)
    cause_page = environment.get_template("cause.html.j2")
    for cause in atlas.causes.values():
        groups, more = transition_groups(by_cause[cause.id], atlas)
        sets = {vs.id: vs for vs in atlas.version_sets}
        yield (
            f"cause/{cause.id}.html",
            cause_page.render(
                **common,
                root="../",
                cause=cause,
                cells_text=cells_text(list(cause.cells)),
                repro=cause_repro(cause.example, sets[cause.example_at]),
                titles=titles,
                grids=all_grids,
                counts=failing[cause.id],
                groups=groups,
                more=more,
            ),
        )


def _newest_counts(atlas: Atlas, rows: list[Row]) -> list[tuple[str, int]]:
    counts = Counter(since.verdict.status for row in rows for since in newest_verdicts(atlas, row))
    return [(status, counts[status]) for status in ("pass", "fail", "flaky", "unsupported", "skip") if counts[status]]


def _row_causes(atlas: Atlas, row: Row) -> list[tuple[AtlasCause, int]]:
    counts = Counter(
        verdict.cause
        for cell in row.cells
        for vs in atlas.version_sets
        if (verdict := atlas.verdicts.get((cell, vs.id))) is not None and verdict.cause
    )
    return [
        (atlas.causes[cause], count) for cause, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]


def _failing_counts(atlas: Atlas) -> dict[str, Counter[str]]:
    """Per cause, how many cells fail that way at each version set."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for (_, vs_id), verdict in atlas.verdicts.items():
        if verdict.cause:
            counts[verdict.cause][vs_id] += 1
    return counts


def write_site(atlas: Atlas, out: Path) -> list[Path]:
    """Render every page into a folder beside `out`, then put it in `out`'s place; the pages written."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / ATLAS_FILE).exists())):
        raise ReportsError(f"{out}: not an atlas site (no {ATLAS_FILE}); give an empty or new folder for --out")
    staging = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    written = []
    try:
        for name, content in site_pages(atlas):
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            written.append(out / name)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except OSError as error:
        raise ReportsError(f"{out}: cannot write the atlas ({error}); check the folder and free space") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written

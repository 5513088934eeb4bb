"""The report model as report.html (templates/report.html.j2): the page's data, its trend plot and timeline, and
links made real anchors."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import groupby
from typing import TypedDict

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from reports.analysis import (
    MAX_CAUSE,
    CheckpointVerdict,
    CheckpointVerdicts,
    answer_text,
    cause_sentence_text,
    checkpoints_html,
    code_html,
    count_text,
    failing_now_html,
    new_architecture_lines,
    new_architectures_summary,
    one_line,
    shortened,
)
from reports.outputs.links import checkpoint_page, code_spans, hub_url, linked_html, verdict_html
from reports.outputs.markdown import (
    ROOT_CAUSE_SECTIONS,
    answer_lines,
    cell_text,
    counts_text,
    flaky_text,
    harness_text,
    seen_at,
    since_previous_run_summary,
)
from reports.outputs.markdown_safety import visible_html
from reports.outputs.model import DETAILS_FILE, Report
from reports.outputs.report_parts import CombinationMatrix, Timeline, TimelineCell

PLOT_WIDTH, PLOT_HEIGHT, PLOT_MARGIN = 900, 300, 60
HTML_MATRICES = 12
HTML_TIMELINE_SETS = 40
SERIES_COLOURS = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#116329", "#953800")


class TrendSeries(TypedDict):
    cell: str  # the cell's id
    colour: str
    points: list[tuple[float, float, float]]  # x, y, the metric's value
    path: str  # the polyline's points


class Tick(TypedDict):
    y: float
    label: str


class Trend(TypedDict, total=False):
    """The trend plot as the template draws it (`x` only where there is a series)."""

    series: list[TrendSeries]
    ticks: list[Tick]
    x: list[tuple[float, str]]  # each column's x and label


def _trend_plot(timeline: Timeline) -> Trend:
    """SVG coordinates for the key metric of each cell across the timeline's columns, on a log scale."""
    columns = timeline.columns
    values = [v for cell in timeline.cells for v in cell.key_metric if v is not None and v > 0]
    if not values:
        return {"series": [], "ticks": []}
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    high = max(high, low + 1)

    def x(position: int) -> float:
        return PLOT_MARGIN + (position + 0.5) * (PLOT_WIDTH - 2 * PLOT_MARGIN) / len(columns)

    def y(value: float) -> float:
        return PLOT_HEIGHT - PLOT_MARGIN / 2 - (math.log10(value) - low) / (high - low) * (PLOT_HEIGHT - PLOT_MARGIN)

    series: list[TrendSeries] = []
    for cell in timeline.cells:
        shown = [(position, cell.key_metric[column.index]) for position, column in enumerate(columns)]
        points = [(x(position), y(v), v) for position, v in shown if v is not None and v > 0]
        if points:
            colour = SERIES_COLOURS[len(series) % len(SERIES_COLOURS)]
            series.append(
                TrendSeries(
                    cell=cell.cell.id,
                    colour=colour,
                    points=points,
                    path=" ".join(f"{px:.1f},{py:.1f}" for px, py, _ in points),
                )
            )
    ticks = [Tick(y=y(10.0**e), label=f"1e{e}") for e in range(low, high + 1)]
    return {
        "series": series,
        "ticks": ticks,
        "x": [(x(position), column.label) for position, column in enumerate(columns)],
    }


def _point_title(timeline: Timeline, cell: TimelineCell, index: int) -> str:
    """What hovering a timeline point shows: the cell, the versions, the outcome, the failure and the run."""
    status = cell.statuses[index]
    where = f"{cell.cell.id} at {timeline.version_sets[index]}"
    if status is None:
        return f"{where}: not run"
    failure = f" — {cell.failure_classes[index]}: {one_line(cell.signatures[index])}" if cell.signatures[index] else ""
    newest, count = cell.newest_runs[index], cell.run_counts[index]
    more = f" (+{count - 1} more)" if count > 1 else ""
    return f"{where}: {status}{failure} — run {newest}{more}" if newest else f"{where}: {status}{failure}"


class TimelinePoint(TypedDict):
    status: str  # pass, fail, flaky, skip, or none where the cell did not run
    text: str  # what the point says: a failure class, flaky, skip, or nothing
    title: str  # what hovering it shows (_point_title)


class TimelineRow(TypedDict):
    label: str  # "tp2 eager fp32"
    changed: bool
    points: list[TimelinePoint]  # one per column shown


class TimelineModel(TypedDict):
    model: str
    changed: bool  # some row of it changed
    rows: list[TimelineRow]


class TimelineView(TypedDict):
    """The timeline as the HTML table draws it."""

    groups: list[tuple[str, int]]  # header groups and their spans; none when the columns have no group
    models: list[TimelineModel]
    rows: int  # every cell's row
    changed: int  # the rows whose outcome changed


def _timeline_view(timeline: Timeline) -> TimelineView:
    """The timeline as the HTML table draws it: header groups, and rows grouped by model with a sub-row per
    tp × variant × dtype; rows whose outcome never changed are marked steady (hidden until asked for)."""
    columns = timeline.columns
    models = []
    for model, cells in groupby(timeline.cells, key=lambda cell: cell.cell.model):
        rows = [
            TimelineRow(
                label=f"tp{cell.cell.tp} {cell.cell.variant} {cell.cell.dtype}",
                changed=cell.changed,
                points=[
                    TimelinePoint(
                        status=cell.statuses[c.index] or "none",
                        text=_point_text(cell, c.index),
                        title=_point_title(timeline, cell, c.index),
                    )
                    for c in columns
                ],
            )
            for cell in cells
        ]
        models.append(TimelineModel(model=model, changed=any(row["changed"] for row in rows), rows=rows))
    groups = [(group, len(list(members))) for group, members in groupby(c.group for c in columns)]
    changed = sum(cell.changed for cell in timeline.cells)
    return TimelineView(
        groups=groups if any(group for group, _ in groups) else [],
        models=models,
        rows=len(timeline.cells),
        changed=changed,
    )


def _point_text(cell: TimelineCell, index: int) -> str:
    status = cell.statuses[index]
    return cell.failure_classes[index] if status == "fail" else "" if status in (None, "pass") else status or ""


def newest_timeline(timeline: Timeline, sets: int) -> Timeline:
    """The timeline with only the columns of its `sets` newest version sets (version_sets run oldest to newest), in
    the order the columns are shown; each cell's lists stay indexed by version set, as the columns refer to them."""
    kept = set(range(len(timeline.version_sets))[-sets:])
    return replace(timeline, columns=tuple(column for column in timeline.columns if column.index in kept))


class Paging(TypedDict):
    """What report.html draws of the matrices and the timeline, and what it leaves to report-details.json."""

    matrices: tuple[CombinationMatrix, ...]  # the newest HTML_MATRICES
    older_matrices: int  # combinations not drawn
    older_sets: int  # version sets left out of the timeline
    details_file: str


def html_paging(report: Report) -> Paging:
    """What report.html leaves to report-details.json: how many combinations' heatmaps and version sets it omits."""
    return Paging(
        matrices=report.matrices[:HTML_MATRICES],
        older_matrices=max(0, len(report.matrices) - HTML_MATRICES),
        older_sets=max(0, len(report.timeline.version_sets) - HTML_TIMELINE_SETS),
        details_file=DETAILS_FILE,
    )


def checkpoint_links(hub_id: str) -> Markup:
    """A checkpoint as report.html names it: its atlas page, and its model card on the hub."""
    card = hub_url(hub_id)
    return Markup('<a href="{}">{}</a>').format(checkpoint_page(hub_id), hub_id) + (
        Markup(' (<a href="{}">model card</a>)').format(card) if card else Markup("")
    )


def verdicts_html(verdicts: tuple[CheckpointVerdict, ...]) -> Markup:
    """ "tp 2: ✅ pass · tp 3: ❌ forward `…`", each icon with its word."""
    several = len({(v.variant, v.dtype) for v in verdicts}) > 1
    parts = []
    for verdict in verdicts:
        where = f"tp {verdict.tp}" + (f" {verdict.variant}/{verdict.dtype}" if several else "")
        parts.append(
            Markup("{}: {}{}").format(where, verdict_html(verdict.status, verdict.failure_class), _cause(verdict))
        )
    return Markup(" · ").join(parts)


def _cause(verdict: CheckpointVerdict) -> Markup:
    """A failing verdict's cause: its name linked to its failing-now entry, else its signature cut at a word
    boundary (reports.analysis.cause_names)."""
    if verdict.cause_title:
        return Markup(': {} (<a href="#failing-{}">cause {}</a>)').format(
            code_spans(verdict.cause_title), verdict.cause_id, verdict.cause_number
        )
    if not verdict.cause:
        return Markup("")
    return Markup(" <code>{}</code>").format(shortened(one_line(verdict.cause), MAX_CAUSE))


def checkpoint_list(section: CheckpointVerdicts) -> list[Markup]:
    """The real checkpoints with their links and verdicts."""
    return [
        Markup("{} — {}, faithful shapes: {}").format(
            checkpoint_links(entry.checkpoint), entry.architecture, verdicts_html(entry.verdicts)
        )
        for entry in section.faithful
    ]


def class_default_list(section: CheckpointVerdicts) -> list[Markup]:
    """The architectures whose faithful cells stand for no recorded checkpoint (config-class default sizes), apart
    from the real checkpoints."""
    return [
        Markup("{}: {}").format(entry.architecture, verdicts_html(entry.verdicts)) for entry in section.class_defaults
    ]


def report_html(report: Report) -> str:
    environment = Environment(
        loader=PackageLoader("reports.outputs"), autoescape=True, undefined=StrictUndefined, finalize=visible_html
    )
    template = environment.get_template("report.html.j2")
    timeline = newest_timeline(report.timeline, HTML_TIMELINE_SETS)
    return template.render(
        report=report,
        paging=html_paging(report),
        shown_timeline=timeline,
        sections=ROOT_CAUSE_SECTIONS,
        cell_text=cell_text,
        counts_text=counts_text,
        count_text=count_text,
        trend=_trend_plot(timeline),
        timeline=_timeline_view(timeline),
        plot={"width": PLOT_WIDTH, "height": PLOT_HEIGHT, "margin": PLOT_MARGIN},
        summary=since_previous_run_summary(report.since_previous_run),
        seen_at=seen_at,
        answers=lambda c: linked_html(lambda link: answer_lines(report.members(c), link)),
        root_cause_by_id={c.id: c for c in report.root_causes},
        details=linked_html(lambda link: [answer_text(t, link) for c in report.root_causes for t in report.members(c)]),
        flaky_text=flaky_text,
        harness_text=harness_text,
        failing_now=failing_now_html(report, linked_html),
        checkpoints=checkpoints_html(report.checkpoints),
        new_architectures={
            "summary": code_html(new_architectures_summary(report.new_architectures)),
            "lines": [code_html(line) for line in new_architecture_lines(report.new_architectures)],
        },
        checkpoint_list=checkpoint_list(report.checkpoints),
        class_default_list=class_default_list(report.checkpoints),
        checkpoint_links=checkpoint_links,
        code_spans=code_spans,
        sentence=lambda cause: code_spans(cause_sentence_text(cause)),
        cause_of_cell={cell: cause.id for cause in report.failing_now.causes for cell in cause.group.cells},
    )

"""A bug report for DeepSpeed's tracker, ready to file: `python -m reports draft-issue --cause <id>` (an id of
report.json "failing_now", which `nox -s draft-issue` passes on) or `--cell <cell id>`.

The report follows DeepSpeed's bug template: what fails and how many cells share the cause, the standalone
repro script inlined (suites/records/repro.py writes it: the same seeded tiny checkpoint the matrix ran, no
harness needed), the expected behaviour of the check that failed and the actual one with its numbers, where the
history places it (the first bad version or PR when triaged), the versions of the failing run, and the end of
its log. Every text passes matrix.redaction.redact. Written to <out>/draft-issue/ and printed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Protocol

from matrix.cells import Cell
from matrix.redaction import redact
from matrix.registry import DEFAULT_TOLERANCES, KnownFailure, load_models, load_variants
from reports import ReportsError
from reports.analysis import (
    FailingCause,
    History,
    cause_answer_text,
    whose_text,
    code,
    count_text,
    markdown_link,
    one_line,
    repro_command,
)
from reports.store import AXES, CellKey, Observation, aggregate
from reports.outputs.markdown_safety import fence
from reports.outputs.staging import staged
from reports.outputs.model import Report, build_report
from suites.outcome import FAILURE_CLASSES
from suites.records.repro import write_repro
from suites.records.run_records import RunInfo

LOG_LINES = 40  # the end of the failing cell's message: the traceback's last frames, the rank logs' tail
MAX_TITLE_CAUSE = 90
NOT_DEEPSPEEDS = ("setup", "install")  # the harness or the environment failed: nothing to report upstream
EXPECTED = {
    "shard": "`deepspeed.init_inference` shards the model without raising, as it does the unsharded model's layers.",
    "forward": "The sharded model runs its forward pass, generation and loss like the unsharded one.",
    "numerics": "Every rank's logits and perplexity match the unsharded model within the tolerance (fp32: "
    f"{DEFAULT_TOLERANCES['fp32'].logits_rel:.2g}·max|logit|), and all ranks agree.",
    "generation": "Greedy generation gives the unsharded model's tokens, single and padded batch.",
    "memory": "Each rank holds at most (1 + 1/tp)/2 of the attention/MLP linears and MoE experts: AutoTP splits them.",
    "timeout": "Every rank finishes within the cell's time limit (no collective waits forever).",
    "crash": "Every rank process stays alive.",
}
FRAME = "<details><summary>{name} ({lines} lines)</summary>"  # the script folds away on GitHub
FRAME_END = "</details>"
# A traceback's file paths up to site-packages say where this runner keeps its environments, nothing upstream needs.
_SITE_PACKAGES = re.compile(r'(File )"[^"]*/site-packages/')
METRIC_PREFIXES = {
    "numerics": ("logits_", "ppl_", "rank_", "acc_", "train_", "grad_", "update_"),
    "generation": ("gen_",),
    "memory": ("linear_", "expert_", "embedding_", "rest_", "shard_ratio", "rank_param_bytes"),
}


class Inert(Protocol):
    def __call__(self, markdown: str, *, title: bool = False) -> str: ...


@dataclass(frozen=True)
class Draft:
    title: str
    body: str
    file: Path


def write_draft(
    history: History,
    observations: list[Observation],
    known: dict[str, KnownFailure],
    *,
    cause: str | None,
    cell: str | None,
    out_dir: Path,
    inert: Inert,
) -> Draft:
    """The report for one cause of the cells failing at the latest versions (or the cause of one failing cell)."""
    report = build_report(history, aggregate(observations), None, known)
    causes = report.failing_now.causes
    entry = next((c for c in causes if c.id == cause or cell in c.cells), None)
    if entry is None:
        listed = (
            "; ".join(f"{c.id} ({c.failure_class}, {count_text(c.count, 'cell')}, e.g. {c.repro.cell})" for c in causes)
            or "none: no cell fails at the latest versions"
        )
        asked = f"--cause {cause}" if cause else f"--cell {cell}"
        raise ReportsError(f"{asked}: no cause failing at the latest versions has it; failing causes: {listed}")
    reason = not_deepspeeds(entry)
    if reason:
        raise ReportsError(reason)
    name = Path("draft-issue") / f"{entry.failure_class.split(', ')[0]}-{entry.id}.md"
    with staged(out_dir) as stage:  # the report and its repro script moved into place together
        title, body = draft_text(entry, report, history, observations, stage / name.parent, inert, cell=cell)
        (stage / name).write_text(f"# {title}\n\n{body}", encoding="utf-8")
    return Draft(title, body, out_dir / name)


def not_deepspeeds(entry: FailingCause) -> str | None:
    """Why a cause is not DeepSpeed's to fix (the harness or its environment failed, or a class from an older
    store that no check writes), None when it is."""
    classes = entry.failure_class.split(", ")
    unknown = [failure_class for failure_class in classes if failure_class not in FAILURE_CLASSES]
    if unknown:
        return (
            f"cause {entry.id} has the failure class {unknown[0]!r}, which no check writes (an older store): "
            "run the cell again to get a report"
        )
    failure_class = next((c for c in classes if c in NOT_DEEPSPEEDS), "")
    if failure_class:
        return (
            f"cause {entry.id} is a {failure_class} failure ({FAILURE_CLASSES[failure_class]}): "
            "the harness or its environment failed, not DeepSpeed; fix it here instead of filing it"
        )
    return None


def draft_text(
    entry: FailingCause,
    report: Report,
    history: History,
    observations: list[Observation],
    folder: Path,
    inert: Inert,
    *,
    cell: str | None = None,
) -> tuple[str, str]:
    """(title, body) of the report for one entry of report.json "failing_now" causes, shown on `cell` (default its
    representative), redacted; its repro script is written to `folder`. `inert` neutralises the text built from
    the history (reports.outputs.publish.inert); the <details> frame around the script is ours."""
    failure = _latest_failure(observations, history, cell or entry.repro.cell)
    folder.mkdir(parents=True, exist_ok=True)
    title, body = _markdown(entry, report, failure, _repro_script(failure, folder), inert)
    return redact(inert(title, title=True)), redact(body)


def _latest_failure(observations: list[Observation], history: History, cell_id: str) -> Observation:
    failing = [
        obs
        for obs in observations
        if obs.cell.id == cell_id and obs.versions == history.latest and obs.result.outcome == "fail"
    ]
    return max(failing, key=lambda obs: obs.run.started)


def _repro_script(failure: Observation, folder: Path) -> tuple[str, str] | None:
    """(file name, text) of the standalone script for a registry model; None for a model outside the registry
    (derived tiny configs need transformers to build: `nox -s repro` writes its script)."""
    models, variants = load_models(), load_variants()
    key: CellKey = failure.cell
    if key.model not in models or key.variant not in variants:
        return None
    run = failure.run
    info = RunInfo(
        session=run.session,
        started=run.started,
        host=run.host,
        accelerator=run.accelerator,
        backend=run.backend,
        harness_git=run.harness_git,
    )
    versions = {**{axis: getattr(run.versions, axis) for axis in AXES}, "deepspeed_git": run.versions.deepspeed_git}
    verdict = f"fail {failure.result.failure_class} {failure.result.signature}"
    script = write_repro(
        Cell(models[key.model], variants[key.variant], key.dtype, key.tp), "tiny", folder, info, versions, verdict
    )
    return script.name, script.read_text(encoding="utf-8")


def _title(entry: FailingCause, failure: Observation) -> str:
    text = one_line(entry.mechanism.partition("; ")[0].replace("`", "") if entry.mechanism else entry.cause)
    short = text if len(text) <= MAX_TITLE_CAUSE else text[: MAX_TITLE_CAUSE - 1] + "…"
    cell = failure.cell
    more = f" and {count_text(entry.count - 1, 'more cell', 'more cells')}" if entry.count > 1 else ""
    return f"[BUG] AutoTP {entry.failure_class}: {short} ({cell.model} tp{cell.tp}{more})"


def _mechanism_lines(entry: FailingCause, result) -> list[str]:
    """What AutoTP did and where it broke, whose bug it is, and the record the ranks wrote (suites/mechanism.py)."""
    if not entry.mechanism:
        return []
    lines = ["**What AutoTP did, where it broke**", "", entry.mechanism, "", f"Whose: {whose_text(entry)}.", ""]
    if result.autotp is not None:
        lines += ["```text", result.autotp.text(), "```", ""]
    return lines


def _message_line(result) -> list[str]:
    """The failure as it was raised or judged, with its numbers (the signature masks them), when it says more."""
    lines = [line.strip() for line in result.message.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if not line.startswith(("logs:", "("))), "")
    return [f"With its numbers: {code(last)}"] if last and last not in result.signature else []


def _metrics_lines(failure: Observation) -> list[str]:
    prefixes = METRIC_PREFIXES.get(failure.result.failure_class, ())
    shown = {name: value for name, value in sorted(failure.result.metrics.items()) if name.startswith(prefixes)}
    return [f"- `{name}` = {value:.4g}" for name, value in shown.items()]


def _markdown(
    entry: FailingCause, report: Report, failure: Observation, script: tuple[str, str] | None, inert: Inert
) -> tuple[str, str]:
    cell, result, run = failure.cell, failure.result, failure.run
    known = entry.known
    lines = []
    if known and known.state == "by design":
        lines += [
            f"> DeepSpeed refuses this on purpose: {markdown_link(known.label, known.upstream)}"
            f"{' (' + known.note + ')' if known.note else ''}; file it only to ask for support.",
            "",
        ]
    elif known:
        lines += [
            f"> Already tracked upstream: {markdown_link(known.label, known.upstream)}"
            f"{' (' + known.note + ')' if known.note else ''}; add to it rather than filing this.",
            "",
        ]
    lines += [
        "**Describe the bug**",
        "",
        f'AutoTP (`deepspeed.init_inference(model, tensor_parallel={{"tp_size": {cell.tp}}}, '
        f"replace_with_kernel_inject=False)`) on `{cell.model}` at tp {cell.tp} ({cell.variant}, {cell.dtype}): "
        f"{FAILURE_CLASSES[result.failure_class]}.",
        f"{count_text(entry.count, 'cell')} of the autotp-matrix run at these versions "
        f"{'fails' if entry.count == 1 else 'fail'} with the same cause: {entry.cells_text}.",
        "",
        *_mechanism_lines(entry, result),
        "**To Reproduce**",
        "",
    ]
    frame: set[int] = set()  # the indices of the lines folding the script away: ours, the only ones not made inert
    if script:
        name, text = script
        lines += [
            f"Save as `{name}` and run `deepspeed --num_gpus {cell.tp} {name}` (torch, deepspeed and "
            "transformers only; it writes the same seeded tiny checkpoint the matrix ran, computes the unsharded "
            "reference, shards with AutoTP and prints `RESULT: MATCH` or `MISMATCH`):",
            "",
        ]
        frame.add(len(lines))
        lines += [FRAME.format(name=name, lines=len(text.splitlines())), "", *fence(text.rstrip("\n"), "python"), ""]
        frame.add(len(lines))
        lines += [FRAME_END, ""]
    lines += [f"With the autotp-matrix harness: `{repro_command(cell)}`", ""]
    lines += [
        "**Expected behavior**",
        "",
        EXPECTED.get(result.failure_class, "The cell passes."),
        "",
        "**Actual behavior**",
        "",
        f"{result.failure_class}: {code(result.signature)}",
        *_message_line(result),
        *_metrics_lines(failure),
        "",
    ]
    placed = cause_answer_text(entry, report, markdown_link)
    lines += [
        "**First bad version**",
        "",
        f"{entry.since.text.capitalize()}"
        + (f"; {placed}." if placed else ": the history has no passing version to bisect from."),
        "",
    ]
    lines += [
        "**System info**",
        "",
        *[f"- {axis}: {run.versions.label(axis)}" for axis in AXES],
        f"- accelerator: {run.accelerator or 'unknown'}, backend: {run.backend or 'unknown'}",
        *([f"- autotp-matrix harness: {run.harness_git}"] if run.harness_git else []),
        f"- run: `{run.run_id}`",
        "",
    ]
    log = [
        _SITE_PACKAGES.sub(r'\1".../site-packages/', line)
        for line in result.message.rstrip("\n").splitlines()[-LOG_LINES:]
    ]
    if log:
        lines += [
            "**Log excerpt** (the end of the cell's message; secrets redacted)",
            "",
            *fence("\n".join(log), "text"),
            "",
        ]
    # Each stretch between the frame's lines is made inert whole, so a fence (the script, the log) stays one block.
    stretches = []
    for framing, group in groupby(enumerate(lines), key=lambda item: item[0] in frame):
        stretch = "\n".join(line for _, line in group)
        stretches.append(stretch if framing else inert(stretch))
    text = "\n".join(stretches)
    return _title(entry, failure), text.rstrip("\n") + "\n"

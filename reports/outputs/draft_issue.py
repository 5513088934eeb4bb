"""A bug report for DeepSpeed's tracker, ready to file: `python -m reports draft-issue --cause <id>` (an id of
report.json "failing_now", which `nox -s draft-issue` passes on) or `--cell <cell id>`.

The report follows DeepSpeed's inference bug template. Its title is what a maintainer would write: the model users
run, what goes wrong in words, at which tp sizes. It is shown on the cause's example cell (the one standing for the
checkpoint users run most, reports.analysis.failing_now.example_cell) and names the real checkpoints that cell
stands for; the standalone script (suites/records/repro.py) for that cell is inlined — any cell the harness can run:
faithful, stress or derived shapes, every variant, built through the one reader of recorded cells
(matrix.cells.resolve_cell) — which builds the same tiny checkpoint (or `--checkpoint <hub id>` loads the real
one), runs the same probes and prints the same verdict. Then the expected and the actual behaviour with the check's
numbers, what AutoTP chose and where it broke (reports.outputs.diagnosis, when the cell's record carries it), where the history
places it, the versions as `ds_report` gives them, and the end of the cell's log. Every text passes
matrix.redaction.redact. Written to <out>/draft-issue/ and printed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from itertools import groupby
from pathlib import Path
from typing import Protocol

from matrix.cells import Cell, resolve_cell
from matrix.redaction import redact
from matrix.registry import DEFAULT_TOLERANCES, KnownFailure, RegistryError
from reports import ReportsError
from reports.analysis import (
    FailingCause,
    History,
    cause_answer_text,
    code,
    count_text,
    draft_file,
    one_line,
    reason,
    repro_command,
    status_text,
    whose_text,
)
from reports.outputs.diagnosis import Diagnosis, diagnosis_lines, diagnosis_of
from reports.outputs.markdown_safety import fence, markdown_link
from reports.outputs.model import Report, build_report
from reports.outputs.staging import staged
from reports.store import AXES, CellResult, Observation, Run, aggregate
from suites.outcome import FAILURE_CLASSES
from suites.records.run_records import RunInfo

MAX_TITLE_MECHANISM = 60  # characters of the mechanism in a title; the body has all of it

LOG_LINES = 40  # the end of the failing cell's message: the traceback's last frames, the rank logs' tail
NOT_DEEPSPEEDS = ("setup", "install")  # the harness or the environment failed: nothing to report upstream
EXPECTED = {
    "shard": "`deepspeed.init_inference` shards the model without raising, as it does the unsharded model's layers.",
    "forward": "The sharded model runs its forward pass, generation and loss like the unsharded one.",
    "numerics": "Every rank's logits and loss match the unsharded model within the tolerance (fp32: "
    f"{DEFAULT_TOLERANCES['fp32'].logits_rel:.2g}·max|logit|), and all ranks agree.",
    "generation": "Greedy generation gives the unsharded model's tokens, single and padded batch.",
    "memory": "Each rank holds its share of every attention/MLP weight and MoE expert (at most ceil(u/tp)/u of it, u "
    "the heads or 64-wide grains it splits into): AutoTP splits them, so tp ranks need about 1/tp of the memory.",
    "timeout": "Every rank finishes within the cell's time limit (no collective waits forever).",
    "crash": "Every rank process stays alive.",
}
SCRIPT_SAYS = {
    "shard": "`RESULT: RAISED shard {type}` (init_inference raised)",
    "forward": "`RESULT: RAISED forward {type}` (the sharded model raised)",
    "numerics": "`FAIL logits …` and `RESULT: MISMATCH`",
    "generation": "`FAIL generation …` and `RESULT: MISMATCH`",
    "memory": "`FAIL memory: … left whole on every rank …` and `RESULT: MISMATCH` (the logits match)",
}
FRAME = "<details><summary>{name} ({lines} lines)</summary>"  # the script folds away on GitHub
FRAME_END = "</details>"
# A traceback's file paths up to site-packages say where this runner keeps its environments, nothing upstream needs.
_SITE_PACKAGES = re.compile(r'(File )"[^"]*/site-packages/')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Warning)):")
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
    reason_not = not_deepspeeds(entry)
    if reason_not:
        raise ReportsError(reason_not)
    return write_cause_draft(entry, report, history, observations, out_dir=out_dir, inert=inert, cell=cell)


def write_cause_draft(
    entry: FailingCause,
    report: Report,
    history: History,
    observations: list[Observation],
    *,
    out_dir: Path,
    inert: Inert,
    cell: str | None = None,
) -> Draft:
    """draft_text written to <out_dir>/draft-issue/<class>-<id>.md, its repro script beside it, moved into place
    together."""
    name = Path(draft_file(entry.failure_class, entry.id))
    with staged(out_dir) as stage:
        folder = stage / name.parent
        title, body = draft_text(entry, report, history, observations, folder=folder, inert=inert, cell=cell)
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
    *,
    folder: Path,
    inert: Inert,
    cell: str | None = None,
    diagnosis: Diagnosis | None = None,
) -> tuple[str, str]:
    """(title, body) of the report for one entry of report.json "failing_now" causes, shown on `cell` (default its
    example cell), redacted; its repro script is written to `folder`. `inert` neutralises the text built from
    the history (reports.outputs.publish.inert); the <details> frame around the script is ours."""
    failure = _latest_failure(observations, history, cell or entry.repro.cell)
    diagnosis = diagnosis or diagnosis_of(entry, failure.result)
    folder.mkdir(parents=True, exist_ok=True)
    resolved = _resolved(failure)
    script = write_cell_repro(resolved, failure, folder) if isinstance(resolved, Cell) else None
    title = _title(entry, failure, resolved if isinstance(resolved, Cell) else None, diagnosis)
    body = _markdown(entry, report, failure, cell=resolved, script=script, inert=inert, diagnosis=diagnosis)
    return redact(inert(title, title=True)), redact(body)


def _latest_failure(observations: list[Observation], history: History, cell_id: str) -> Observation:
    failing = [
        obs
        for obs in observations
        if obs.cell.id == cell_id and obs.versions == history.latest and obs.result.outcome == "fail"
    ]
    return max(failing, key=lambda obs: obs.run.started)


def _resolved(failure: Observation) -> Cell | str:
    """The Cell the failure's coordinates name, or why there is none here (an entry no longer in the registry,
    transformers missing where a faithful or derived shape needs its config classes)."""
    key = failure.cell
    try:
        return resolve_cell(key.model, key.variant, key.dtype, key.tp)
    except (RegistryError, ImportError) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def installed_transformers() -> str:
    """The transformers a cell is rebuilt with here ("" where none is installed)."""
    try:
        return version("transformers")
    except PackageNotFoundError:
        return ""


def run_info(run: Run) -> RunInfo:
    return RunInfo(
        session=run.session,
        started=run.started,
        host=run.host,
        accelerator=run.accelerator,
        backend=run.backend,
        harness_git=run.harness_git,
    )


def write_cell_repro(cell: Cell, failure: Observation, folder: Path) -> tuple[str, str]:
    """(file name, text) of the standalone script of a failing cell, written to `folder`."""
    from suites.records.repro import write_repro  # imports torch (220 MB): only where a script is written

    run = failure.run
    versions = {**{axis: getattr(run.versions, axis) for axis in AXES}, "deepspeed_git": run.versions.deepspeed_git}
    verdict = f"fail {failure.result.failure_class} {failure.result.signature}"
    script = write_repro(cell, "tiny", folder, run=run_info(run), versions=versions, outcome_line=verdict)
    return script.name, script.read_text(encoding="utf-8")


def _short_name(hub_id: str) -> str:
    return hub_id.rsplit("/", 1)[-1]


def _title(entry: FailingCause, failure: Observation, cell: Cell | None, diagnosis: Diagnosis | None) -> str:
    """ "AutoTP: Phi-3-mini-4k-instruct: a sharded layer raises RuntimeError at tp 2/3/4 (and 2 more models)"."""
    model = failure.cell.model
    checkpoints = failure.result.checkpoints or (cell.model.checkpoints if cell else ())
    name = _short_name(checkpoints[0]) if checkpoints else (cell.model.model_type if cell else model.split(".")[0])
    tps = sorted({int(c.rsplit("-tp", 1)[1]) for c in entry.cells if c.startswith(f"{model}-")})
    others = {c.rsplit("-", 3)[0] for c in entry.cells} - {model}
    what = _short(diagnosis.mechanism) if diagnosis else reason(entry.failure_class, entry.cause).short
    more = f" (and {count_text(len(others), 'more model')})" if others else ""
    return f"AutoTP: {name}: {what} at tp {'/'.join(map(str, tps))}{more}"


def _short(mechanism: str) -> str:
    """A mechanism's first clause, cut to a title's length (the body has all of it)."""
    text = one_line(mechanism.partition("; ")[0])
    return text if len(text) <= MAX_TITLE_MECHANISM else text[: MAX_TITLE_MECHANISM - 1] + "…"


def _mechanism_lines(entry: FailingCause, result: CellResult) -> list[str]:
    """What AutoTP did and where it broke, whose bug it is, and the record the ranks wrote (suites/mechanism.py)."""
    if not entry.mechanism:
        return []
    lines = ["**What AutoTP did, where it broke**", "", entry.mechanism, "", f"Whose: {whose_text(entry)}.", ""]
    if result.autotp is not None:
        lines += ["```text", result.autotp.text(), "```", ""]
    return lines


def _message_line(result: CellResult) -> list[str]:
    """The failure as it was raised or judged, with its numbers (the signature masks them), when it says more."""
    lines = [line.strip() for line in result.message.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if not line.startswith(("logs:", "("))), "")
    return [f"With its numbers: {code(last)}"] if last and last not in result.signature else []


def _metrics_lines(failure: Observation) -> list[str]:
    prefixes = METRIC_PREFIXES.get(failure.result.failure_class, ())
    shown = {name: value for name, value in sorted(failure.result.metrics.items()) if name.startswith(prefixes)}
    return [f"- `{name}` = {value:.4g}" for name, value in shown.items()]


def _stands_for(cell: Cell | str, failure: Observation) -> str:
    """What real checkpoints the cell's verdict is about, in words."""
    if not isinstance(cell, Cell):
        return "(the registry cannot rebuild this cell here, so which checkpoints it stands for is not known)"
    checkpoints = cell.model.checkpoints or failure.result.checkpoints
    if checkpoints:
        named = ", ".join(markdown_link(hub_id, f"https://huggingface.co/{hub_id}") for hub_id in checkpoints)
        return (
            f"a tiny random model that splits exactly like {named} at tp 2, 3 and 4 (the same head, kv-head and "
            "64-wide grain counts, mod each tp): the verdict holds for "
            + ("that checkpoint" if len(checkpoints) == 1 else "those checkpoints")
        )
    if "." in failure.cell.model:
        return (
            f"a tiny random model at the {cell.model.model_type} config class's default sizes (no real checkpoint "
            "of it is recorded, so the verdict is about the architecture)"
        )
    return (
        f"a tiny random {cell.model.model_type} model with deliberately odd splits (the registry's stress shape: "
        "uneven grains, fewer kv heads than ranks); it stands for no real checkpoint"
    )


def _ds_report(run: Run, tp: int) -> list[str]:
    """The `ds_report` lines the run recorded (DeepSpeed general environment info), the others' versions."""
    versions = run.versions
    rows = [
        ("torch version", versions.torch),
        ("deepspeed info", f"{versions.deepspeed}, {versions.deepspeed_git or 'unknown'}, unknown"),
        ("accelerator", f"{run.accelerator or 'unknown'} (backend {run.backend or 'unknown'})"),
    ]
    return [
        "```text",
        "DeepSpeed general environment info:",
        *(f"{name} {'.' * (33 - len(name))} {value}" for name, value in rows),
        "```",
        "",
        *[f"- {axis}: {versions.label(axis)}" for axis in AXES if axis not in ("deepspeed", "torch")],
        f"- {tp} ranks on one host ({run.accelerator or 'unknown'} accelerator, launched like `deepspeed --num_gpus {tp}`)",
        *([f"- autotp-matrix harness: {run.harness_git}"] if run.harness_git else []),
        f"- run: `{run.run_id}`",
    ]


def _markdown(
    entry: FailingCause,
    report: Report,
    failure: Observation,
    *,
    cell: Cell | str,
    script: tuple[str, str] | None,
    inert: Inert,
    diagnosis: Diagnosis | None,
) -> str:
    key, result, run = failure.cell, failure.result, failure.run
    known = entry.known
    lines = []
    if known and known.state == "unsupported":
        lines += [
            f"> DeepSpeed documents this model as not supported by AutoTP ({status_text(entry, markdown_link)})"
            f"{': ' + known.note if known.note else ''}; file this only to ask for support.",
            "",
        ]
    elif known:
        lines += [
            f"> Already tracked upstream: {markdown_link(known.label, known.upstream)}"
            f"{' (' + known.note + ')' if known.note else ''}; add to it rather than filing this.",
            "",
        ]
    words = diagnosis.mechanism if diagnosis else reason(entry.failure_class, entry.cause).sentence
    lines += [
        "**Describe the bug**",
        "",
        f'AutoTP (`deepspeed.init_inference(model, tensor_parallel={{"tp_size": {key.tp}}}, '
        f"replace_with_kernel_inject=False)`) on `{key.model}` at tp {key.tp} ({key.variant}, {key.dtype}): "
        f"{FAILURE_CLASSES[result.failure_class]}. {words}",
        "",
        f"The model is {_stands_for(cell, failure)}. "
        f"{count_text(entry.count, 'cell')} of the autotp-matrix run at these versions "
        f"{'fails' if entry.count == 1 else 'fail'} with the same cause: {entry.cells_text}.",
        "",
        *diagnosis_lines(diagnosis),
        "**To Reproduce**",
        "",
    ]
    frame: set[int] = set()  # the indices of the lines folding the script away: ours, the only ones not made inert
    if script:
        name, text = script
        checkpoints = cell.model.checkpoints if isinstance(cell, Cell) else ()
        lines += [
            f"Save as `{name}` and run `deepspeed --num_gpus {key.tp} {name}` (torch, deepspeed and transformers "
            "only; a CPU-only machine works: DeepSpeed's CPU accelerator with gloo). It writes the same seeded tiny "
            "checkpoint the matrix ran, computes the unsharded reference, shards with AutoTP, runs the same probes "
            f"and prints {SCRIPT_SAYS.get(result.failure_class, '`RESULT: MISMATCH`').format(type=_exception(result.signature))}"
            + (f"; `--checkpoint {checkpoints[0]}` runs the real checkpoint instead." if checkpoints else "."),
            *_rebuilt_elsewhere(run),
            "",
        ]
        frame.add(len(lines))
        lines += [FRAME.format(name=name, lines=len(text.splitlines())), "", *fence(text.rstrip("\n"), "python"), ""]
        frame.add(len(lines))
        lines += [FRAME_END, ""]
    else:
        lines += [f"No standalone script here ({cell}); `nox -s draft-issue` in the harness writes it.", ""]
    lines += [f"With the autotp-matrix harness: `{repro_command(key)}`", ""]
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
    lines += ["**ds_report output** (the parts the run recorded)", "", *_ds_report(run, key.tp), ""]
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
    return "\n".join(stretches).rstrip("\n") + "\n"


def _rebuilt_elsewhere(run: Run) -> list[str]:
    """A note where the script's tiny config was computed with another transformers than the cell ran with (a
    faithful or derived shape reads config-class defaults, which releases change)."""
    here = installed_transformers()
    if here == run.versions.transformers:
        return []
    return [
        f"(This script's tiny config was computed with transformers {here or 'none'}; the cell ran with "
        f"{run.versions.transformers}: `nox -s draft-issue` in that release's environment writes the same one.)"
    ]


def _exception(signature: str) -> str:
    match = _EXCEPTION.match(signature)
    return match[1] if match else "…"

"""A bug report for DeepSpeed's tracker, ready to file: `python -m reports draft-issue --cause <id>` (an id of
report.json "failing_now", which `nox -s draft-issue` passes on) or `--cell <cell id>`.

The report follows DeepSpeed's inference bug template. Its title is what a maintainer writes: "[BUG] AutoTP: <mechanism>
(<HF class>, tp N, DeepSpeed x, transformers y)", whole: the cause's name (reports.analysis.cause_names). It is shown on
the cause's example cell (the one standing for the checkpoint users run most, reports.analysis.failing_now.example_cell)
and names the real checkpoints that cell stands for. To reproduce: a minimal script generated for the cause
(reports.outputs.minimal_script: at most 40 lines, its last line shows the symptom), inlined, and the cell's full
standalone script (suites/records/repro.py: the same checkpoint, every probe) written beside the draft as an attachment.
Then the expected and the actual behaviour in words and numbers, what AutoTP chose and where it broke and whose it is
with its evidence (reports.outputs.diagnosis), what the history knows of since when (never a version it did not run),
the versions as `ds_report` gives them, and the rank's traceback with only the installed packages' frames, their paths
from the package (`library_trace`). Every text passes matrix.redaction.redact. Written to <out>/draft-issue/ and
printed."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Protocol

from matrix.cells import Cell, resolve_cell
from matrix.known_failures import KnownFailure
from matrix.redaction import redact
from matrix.registry import RegistryError
from matrix.remedies import RemedyResult
from reports import ReportsError
from reports.analysis import (
    FailingCause,
    History,
    ResultFiles,
    cause_answer_text,
    code,
    count_text,
    draft_file,
    one_line,
    reason,
    status_text,
)
from reports.outputs.diagnosis import Diagnosis, diagnosis_lines, diagnosis_of
from reports.outputs.draft_words import (
    TRAINING_SYMPTOMS,
    expected_behavior,
    training_script_lines,
    training_script_name,
    what_ran,
)
from reports.outputs.library_trace import library_trace, trace_tail
from reports.outputs.markdown import actions_run_url, found_by
from reports.outputs.markdown_safety import fence, markdown_link
from reports.outputs.minimal_script import MinimalScript, last_error_line, minimal_script
from reports.outputs.model import Report, build_report
from reports.outputs.remedy_claims import remedy_sections
from reports.outputs.render_cache import ScriptRequest, cached_script, keep_script, remembered
from reports.outputs.staging import staged
from reports.store import AXES, CellResult, Observation, Run, aggregate
from suites.records.run_records import launcher_command
from suites.verdicts.vocabulary import FAILURE_CLASSES

NOT_DEEPSPEEDS = ("setup", "install")  # the harness or the environment failed: nothing to report upstream
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
    remedies: tuple[RemedyResult, ...] = (),
) -> Draft:
    """The report for one cause of the cells failing at the latest versions (or the cause of one failing cell), with
    what `nox -s remedy` verified (`remedies`: the store's, HistoryStore.remedy_results)."""
    report = build_report(history, aggregate(observations), None, known, ResultFiles(remedies=remedies))
    causes = report.failing_now.causes
    entry = next((c for c in causes if c.id == cause or cell in c.group.cells), None)
    if entry is None:
        listed = (
            "; ".join(
                f"{c.id} ({c.group.failure_class}, {count_text(c.group.count, 'cell')}, e.g. {c.repro.cell})"
                for c in causes
            )
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
    name = Path(draft_file(entry.group.failure_class, entry.id))
    with staged(out_dir) as stage:
        folder = stage / name.parent
        title, body = draft_text(entry, report, history, observations, folder=folder, inert=inert, cell=cell)
        (stage / name).write_text(f"# {title}\n\n{body}", encoding="utf-8")
    return Draft(title, body, out_dir / name)


def not_deepspeeds(entry: FailingCause) -> str | None:
    """Why a cause is not DeepSpeed's to fix (the harness or its environment failed, or a class from an older
    store that no check writes), None when it is."""
    classes = entry.group.failure_class.split(", ")
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
    title = _title(entry, failure, resolved if isinstance(resolved, Cell) else None)
    scripts: tuple[MinimalScript | None, str] | None = None
    if isinstance(resolved, Cell) and resolved.variant.training:  # an inference script would reproduce nothing
        scripts = (None, write_cell_repro(resolved, failure, folder, training_script_name(resolved))[0])
    elif isinstance(resolved, Cell):
        minimal = minimal_script(resolved, failure.result, title)
        (folder / minimal.name).write_text(minimal.text, encoding="utf-8")
        full = minimal.name.removesuffix(".py") + "-full.py"
        scripts = (minimal, write_cell_repro(resolved, failure, folder, full)[0])
    body = _markdown(entry, report, failure, cell=resolved, scripts=scripts, inert=inert, diagnosis=diagnosis)
    body += remedy_sections(entry.proven_by, failure.cell.tp, failure.cell.dtype)
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


def write_cell_repro(cell: Cell, failure: Observation, folder: Path, name: str | None = None) -> tuple[str, str]:
    """(file name, text) of the standalone script of a failing cell, written to `folder` (as `name`, default the
    results folder's `repro_<cell>.py`)."""
    request = ScriptRequest.of(failure.cell, failure.run, failure.result.failure_class, failure.result.signature, name)
    script = cached_script(request, folder) or write_script(cell, request, folder)
    return script.name, script.read_text(encoding="utf-8")


def write_script(cell: Cell, request: ScriptRequest, folder: Path) -> Path:
    """The script (and its environment file) written by suites.records.repro.write_repro, and kept in the render
    cache (reports.outputs.render_cache) for the next render."""
    from suites.records.repro import write_repro  # lazily: imports torch (220 MB), only where a script is written

    versions = dict(request.versions)
    script = write_repro(
        cell, "tiny", folder, run=request.run, versions=versions, outcome_line=request.verdict, name=request.name
    )
    keep_script(request, script)
    return script


def _causal_lm_classes() -> dict[str, str]:
    try:  # lazily: `python -m reports` runs without transformers (the model type stands in for the class)
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return {}
    return {str(model_type): str(name) for model_type, name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}


@functools.cache
def causal_lm_class_names() -> dict[str, str]:
    """The installed transformers' causal-LM class by model type (none without transformers), from the render
    cache where the same packages were read before."""
    return dict(remembered("causal-lm-classes", _causal_lm_classes))


def hf_class(model_type: str) -> str:
    """The class users load for a model type (`BloomForCausalLM`), or the model type where transformers lacks it."""
    return causal_lm_class_names().get(model_type, model_type)


def _model_type(cell: Cell | None, model: str) -> str:
    return cell.model.model_type if cell else model.split(".")[0]


def _tps(entry: FailingCause, model: str) -> list[int]:
    return sorted({int(c.rsplit("-tp", 1)[1]) for c in entry.group.cells if c.startswith(f"{model}-")})


def _title(entry: FailingCause, failure: Observation, cell: Cell | None) -> str:
    """ "[BUG] AutoTP: <mechanism> (<HF class>, tp 2/3/4, DeepSpeed 0.19.8, transformers 5.25.0)", whole."""
    key, versions = failure.cell, failure.run.versions
    what = entry.title or reason(entry.group.failure_class, entry.group.masked_signature).short
    tps = "/".join(map(str, _tps(entry, key.model)))
    return (
        f"[BUG] AutoTP: {one_line(what)} ({hf_class(_model_type(cell, key.model))}, tp {tps}, "
        f"DeepSpeed {versions.deepspeed}, transformers {versions.transformers})"
    )


def _affected(entry: FailingCause) -> str:
    """The model types and tp sizes the cause fails at, in a reader's words (`bloom tp 2, 3, 4; phi3 tp 2`)."""
    by_model: dict[str, list[int]] = {}
    for cell_id in entry.group.cells:
        model, tp = cell_id.rsplit("-tp", 1)
        by_model.setdefault(model.split("-", 1)[0].split(".", 1)[0], []).append(int(tp))
    return "; ".join(f"{model} tp {', '.join(map(str, sorted(set(tps))))}" for model, tps in sorted(by_model.items()))


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
        f"- {tp} ranks on one host ({run.accelerator or 'unknown'} accelerator, launched like `deepspeed --num_gpus "
        f"{tp}`)",
    ]


def _markdown(
    entry: FailingCause,
    report: Report,
    failure: Observation,
    *,
    cell: Cell | str,
    scripts: tuple[MinimalScript | None, str] | None,
    inert: Inert,
    diagnosis: Diagnosis | None,
) -> str:
    key, result, run = failure.cell, failure.result, failure.run
    model_class = hf_class(_model_type(cell if isinstance(cell, Cell) else None, key.model))
    trained = cell if isinstance(cell, Cell) and cell.variant.training else None
    lines = [*_known_lines(entry)]
    words = "" if diagnosis else f" {reason(entry.group.failure_class, entry.group.masked_signature).sentence}"
    symptom = TRAINING_SYMPTOMS.get(result.failure_class, "") if trained else ""
    lines += [
        "**Describe the bug**",
        "",
        f"{what_ran(trained, key.tp)} on `{model_class}` at tp {key.tp} ({key.dtype}): "
        f"{symptom or FAILURE_CLASSES[result.failure_class]}.{words}",
        "",
        f"The model is {_stands_for(cell, failure)}. The same cause fails at: {_affected(entry)}.",
        "",
        *diagnosis_lines(diagnosis),
        "**To Reproduce**",
        "",
    ]
    minimal, full = scripts or (None, "")
    if scripts and minimal is None:
        lines += [*training_script_lines(full, key.tp, result.failure_class), *_rebuilt_elsewhere(run), ""]
    elif minimal is not None:
        lines += [
            f"Save as `{minimal.name}` and run `{launcher_command(key.tp, minimal.name)}` (torch, deepspeed and "
            "transformers only; a CPU-only machine works: DeepSpeed's CPU accelerator with gloo):",
            "",
            *fence(minimal.text.rstrip("\n"), "python"),
            "",
            f"Attached: `{full}`, the full check of the same model: the same weights with its norms randomised, "
            "the unsharded reference, logits with and without the attention mask, ranks agree, greedy generation, "
            f"loss and memory; `{launcher_command(key.tp, full)}` prints `RESULT: MATCH` or `RESULT: MISMATCH`.",
            *_rebuilt_elsewhere(run),
            "",
        ]
    else:
        lines += [f"No script here ({cell}).", ""]
    lines += [
        "**Expected behavior**",
        "",
        expected_behavior(result.failure_class, training=trained is not None),
        "",
        "**Actual behavior**",
        "",
        _actual(result),
        *_metrics_lines(failure),
        "",
        "**Regression?**",
        "",
        _regression(entry, report),
        "",
        *found_by(actions_run_url(os.environ)),
        "**ds_report output** (the parts the run recorded)",
        "",
        *_ds_report(run, key.tp),
        "",
    ]
    log = library_trace(result.message)
    if log:
        lines += [
            "**Log excerpt** (rank 0, DeepSpeed's, transformers' and torch's frames, paths inside their packages)",
            "",
            *fence("\n".join(trace_tail(log)), "text"),
            "",
        ]
    return inert("\n".join(lines).rstrip("\n")) + "\n"


def _known_lines(entry: FailingCause) -> list[str]:
    known = entry.known
    if known and known.state == "unsupported":
        return [
            f"> DeepSpeed documents this model as not supported by AutoTP ({status_text(entry, markdown_link)})"
            f"{': ' + known.note if known.note else ''}; file this only to ask for support.",
            "",
        ]
    if known:
        return [
            f"> Already tracked upstream: {markdown_link(known.label, known.upstream)}"
            f"{' (' + known.note + ')' if known.note else ''}; add to it rather than filing this.",
            "",
        ]
    return []


def _actual(result: CellResult) -> str:
    """The failure in words and numbers: the exception as raised, or the check's findings with their figures."""
    if result.failure_class in ("shard", "forward"):
        stage = "`init_inference` raises" if result.failure_class == "shard" else "the sharded forward raises"
        return f"{stage}: {code(last_error_line(result.message) or result.signature)}"
    findings = [
        line.strip()
        for line in result.message.splitlines()
        if line.strip() and not line.startswith(("logs:", "first divergence at", f"{result.failure_class}: "))
    ]
    shown = findings[:3] or [result.signature]
    return f"{FAILURE_CLASSES[result.failure_class]}:\n\n" + "\n".join(f"- {code(finding)}" for finding in shown)


def _regression(entry: FailingCause, report: Report) -> str:
    """Since when, as far as the history knows; never a version it did not run. Where the example cell ran at
    earlier releases (`nox -s since-when`, a backfill), what it did there: "Works at DeepSpeed 0.18.9 / transformers
    4.57.6; fails from transformers 5.25.0, the next release tried", or the release a bisection found."""
    placed = cause_answer_text(entry, report, markdown_link)
    if entry.since.tried:
        bisected = f" ({placed})" if placed and "not yet triaged" not in placed else ""
        return f"{entry.since.text[:1].upper()}{entry.since.text[1:]}{bisected}."
    if placed:
        return f"{entry.since.text.capitalize()}; {placed}."
    if report.failing_now.backfill:
        return (
            "Not known yet: every run so far was at these versions, so no earlier DeepSpeed or transformers release "
            "has been tried for it."
        )
    return f"{entry.since.text.capitalize()}; no earlier passing version is recorded to bisect from."


def _rebuilt_elsewhere(run: Run) -> list[str]:
    """A note where the script's tiny config was computed with another transformers than the cell ran with (a
    faithful or derived shape reads config-class defaults, which releases change)."""
    here = installed_transformers()
    if here == run.versions.transformers:
        return []
    return [
        f"(This script's tiny config was computed with transformers {here or 'none'}; the cell ran with "
        f"{run.versions.transformers}, whose config defaults may differ.)"
    ]

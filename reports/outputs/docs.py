"""The supported-models page as DeepSpeed's automatic-tensor-parallelism tutorial should read, drift against a copy
of that page, and the unified diff that turns the copy into it.

Cells are named by registry entry; the page lists model families (transformers `model_type`, ModelEntry.model_type),
so `llama_large`, a size variant, is tested under llama. A family is supported when every cell with a verdict at
the latest versions passes; each bullet says which tp sizes and variants pass, and an unsupported family says why
each failing cell fails (failure class and cause as "Failing now, by cause" groups them, with the known-failure
link when matrix/known_failures.toml tracks it upstream). A family with faithful cells (matrix/shapes.py: split like
its real checkpoints) is judged by them; stress cells (deliberately odd splits) judge a family only without them.
After the two lists, the page states each real checkpoint's verdicts apart from the stress shapes'
(reports.analysis.checkpoints). Works on the report model (reports.outputs.model.Report)."""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from matrix.registry import MODELS_FILE, RegistryError, load_models
from reports import ReportsError
from reports.analysis import (
    CellStatus,
    FailingNow,
    History,
    checkpoint_lines,
    code,
    has_faithful,
    markdown_link,
    one_line,
    shape_of,
)
from reports.store import CellKey


class ReportView(Protocol):
    """What the supported-models page reads of the report model (reports.outputs.model.Report, which builds this module's
    section and so cannot be imported here)."""

    @property
    def supported_models(self) -> dict[str, Any]: ...

    @property
    def checkpoints(self) -> dict[str, Any]: ...


# Same wording as docs/_tutorials/automatic-tensor-parallelism.md, so the output can be pasted in.
SUPPORTED_INTRO = (
    "The following model families have been successfully tested with automatic tensor parallelism. "
    "Other models may work but have not been tested yet."
)
UNSUPPORTED_INTRO = (
    "The following models are not currently supported with automatic tensor parallelism. "
    "They may still be compatible with other DeepSpeed features (e.g., kernel injection for Bloom):"
)
UNTESTED_INTRO = (
    "No cell of these models has a verdict here: each was skipped or the harness failed (setup, install); "
    "each cell's reason (e.g. remote code only) is in results/cells.jsonl."
)
CHECKPOINTS_INTRO = (
    "Each checkpoint's verdicts come from tiny models that split exactly like it at every tp "
    "(heads, kv heads, 64-wide grains); the stress shapes below exercise deliberately odd splits of each "
    "architecture and say nothing about a checkpoint."
)
# Failures that say nothing about AutoTP: the harness or the environment failed before AutoTP was judged.
NO_VERDICT_CLASSES = ("setup", "install")
DOCS_PAGE = "docs/_tutorials/automatic-tensor-parallelism.md"  # the page's path in DeepSpeed's repository
SECTIONS = ("supported models", "unsupported models")  # the page's two lists, as their headings read (any case)
MAX_REASON = 80  # characters of a failure's message on the page; the location after " @ " is always kept
_HEADING = re.compile(r"^\s*#+\s*(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^\s*[-*+]\s+(.+?)\s*$")
_TABLE_SEPARATOR = re.compile(r"^\s*\|\s*:?-{3,}")  # needs the pipe: a bare "---" is a rule
_LINK_TEXT = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_NOTE = re.compile(r"\s+—\s.*$")  # the note this page adds after a family's name


@dataclass(frozen=True)
class Drift:
    docs_path: str
    listed_but_failing: list[str]  # docs list the family as supported; a cell fails here at the latest versions
    passing_but_unlisted: list[str]  # every cell passes here; the docs do not list the family


def normalise_model_name(name: str) -> str:
    """Tolerant key: case, dashes/underscores/dots and an org prefix do not matter ("gpt-neox" == "GPT_NeoX")."""
    return re.sub(r"[^a-z0-9]", "", name.strip().lower().rsplit("/", 1)[-1])


def model_families(models_file: Path = MODELS_FILE) -> dict[str, str]:
    """Registry entry → its family, the transformers model_type (`llama_large` → `llama`). A model the registry
    does not name (a derived architecture, an old run) is its own family."""
    try:
        return {name: entry.model_type for name, entry in load_models(models_file).items()}
    except RegistryError as error:
        raise ReportsError(str(error)) from None


def entry_name(model: str) -> str:
    """The registry entry of a cell's model coordinate (`qwen2.faithful` → `qwen2`)."""
    return shape_of(model)[0]


def _verdicts(history: History, families: dict[str, str]) -> dict[str, list[tuple[CellKey, CellStatus]]]:
    """Per family, its cells with a verdict on AutoTP (pass, fail, flaky) at the latest versions: neither skipped nor
    failed by the harness or its environment (NO_VERDICT_CLASSES); only its faithful cells where it has any."""
    found: dict[str, list[tuple[CellKey, CellStatus]]] = defaultdict(list)
    for cell in history.cells:
        status = history.statuses.get((cell, history.latest))
        if (
            status is not None
            and status.status != "skip"
            and not (status.status == "fail" and status.failure_class in NO_VERDICT_CLASSES)
        ):
            found[families.get(entry_name(cell.model), entry_name(cell.model))].append((cell, status))
    return {
        family: [(cell, status) for cell, status in cells if shape_of(cell.model)[1] == "faithful"] or cells
        for family, cells in sorted(found.items())
    }


def model_support(history: History, families: dict[str, str]) -> dict[str, bool]:
    """Per family at the latest versions: True when every cell with a verdict passes, False when any fails or is
    flaky."""
    return {family: all(s.status == "pass" for _, s in cells) for family, cells in _verdicts(history, families).items()}


# ---- JSON-ready --------------------------------------------------------------------------------------------------


def tp_text(cells: list[CellKey], family: str) -> str:
    """ "tp 2, 3, 4 (eager fp32)" for the family's cells; when its registry entries differ, each entry other than the
    family itself is named: "tp 2, 3 (eager fp32) and llama_large tp 2 (eager fp32)"."""
    tps: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for cell in cells:
        tps[entry_name(cell.model), cell.variant, cell.dtype].add(cell.tp)
    grouped: dict[str, dict[tuple[int, ...], list[str]]] = defaultdict(lambda: defaultdict(list))
    for (model, variant, dtype), sizes in sorted(tps.items(), key=lambda item: (item[0][0] != family, item[0])):
        grouped[model][tuple(sorted(sizes))].append(f"{variant} {dtype}")
    texts = {
        model: ", ".join(f"tp {', '.join(map(str, sizes))} ({', '.join(kinds)})" for sizes, kinds in by_tps.items())
        for model, by_tps in grouped.items()
    }
    if list(texts) == [family] or (len(texts) > 1 and len(set(texts.values())) == 1):
        return next(iter(texts.values()))  # the family itself, or every entry alike: the family's result
    return " and ".join(f"{'' if model == family else model + ' '}{text}" for model, text in texts.items())


def supported_models(history: History, failing_now: FailingNow, families: dict[str, str]) -> dict:
    """report.json "supported_models": the supported and unsupported families and, per family, the entries tested
    under it, what passes and each failure (grouped by the cause of report.json "failing_now")."""
    causes = {cell: cause for cause in failing_now.causes for cell in cause.cells}
    verdicts = _verdicts(history, families)
    entries = []
    for family, cells in verdicts.items():
        passing = [cell for cell, s in cells if s.status == "pass"]
        flaky = [cell for cell, s in cells if s.status == "flaky"]
        failing: dict[tuple[str, bool], list[CellKey]] = defaultdict(list)  # by cause and the known failure covering
        for cell, status in cells:
            if status.status == "fail":
                cause = causes[cell.id]
                covered = cause.known is not None and cell.id in cause.known.cells
                failing[cause.id, covered].append(cell)
        failures: list[dict[str, Any]] = []
        for (cause_id, covered), failed in failing.items():
            cause = causes[failed[0].id]
            known = {"label": cause.known.label, "upstream": cause.known.upstream} if covered and cause.known else None
            failures.append(
                {
                    "id": cause_id,
                    "failure_class": cause.failure_class,
                    "cause": cause.cause,
                    "cells": [cell.id for cell in failed],
                    "cells_text": tp_text(failed, family),
                    "known": known,
                }
            )
        entries.append(
            {
                "family": family,
                "models": sorted({cell.model for cell, _ in cells}),
                "supported": len(passing) == len(cells),
                "passing": [cell.id for cell in passing],
                "passing_text": tp_text(passing, family),
                "flaky": [cell.id for cell in flaky],
                "flaky_text": tp_text(flaky, family),
                "failing": sorted(failures, key=lambda f: (-len(f["cells"]), f["failure_class"], f["cause"])),
            }
        )
    # Run at the latest versions, yet without a verdict: every cell was skipped or failed in setup/install.
    ran = {
        families.get(entry_name(cell.model), entry_name(cell.model))
        for cell in history.cells
        if (cell, history.latest) in history.statuses
    }
    return {
        "supported": [e["family"] for e in entries if e["supported"]],
        "unsupported": [e["family"] for e in entries if not e["supported"]],
        "not_tested": sorted(ran - set(verdicts)),
        "families": entries,
    }


# ---- Markdown ----------------------------------------------------------------------------------------------------


def reason_text(cause: str) -> str:
    """A cause short enough for a bullet: the message cut at MAX_REASON characters, its location kept."""
    message, at, where = one_line(cause).partition(" @ ")
    short = message if len(message) <= MAX_REASON else message[: MAX_REASON - 1] + "…"
    return f"{short}{at}{where}"


def family_bullet(entry: dict, name: str) -> str:
    """ "- llama — passes tp 2, 3, 4 (eager fp32)", or for an unsupported family each failure with its reason and
    known-failure link, then what is flaky and what passes."""
    if entry["supported"]:
        return f"- {name} — passes {entry['passing_text']}"
    parts = []
    for failure in entry["failing"]:
        known = failure["known"]
        tracked = f" (known: {markdown_link(known['label'], known['upstream'])})" if known else ""
        parts.append(
            f"fails {failure['cells_text']}: {failure['failure_class']} {code(reason_text(failure['cause']))}{tracked}"
        )
    if entry["flaky"]:
        parts.append(f"flaky {entry['flaky_text']}")
    if entry["passing"]:
        parts.append(f"passes {entry['passing_text']}")
    return f"- {name} — " + "; ".join(parts)


def supported_models_markdown(report: ReportView, history: History, names: dict[str, str] | None = None) -> str:
    """The two sections of DeepSpeed's page (plus "Not Tested" when a family was only skipped), a bullet per family.
    `names`: family → the spelling a docs copy already uses for it."""
    section = report.supported_models
    names = names or {}

    def bullets(supported: bool) -> str:
        return (
            "\n".join(
                family_bullet(e, names.get(e["family"], e["family"]))
                for e in section["families"]
                if e["supported"] == supported
            )
            or "- (none)"
        )

    untested = "\n".join(f"- {family}" for family in section["not_tested"])
    return (
        f"<!-- generated by `python -m reports render` at {history.latest.describe()}: {len(section['supported'])} "
        f"supported, {len(section['unsupported'])} unsupported, {len(section['not_tested'])} not tested "
        "(report.md has every cell) -->\n\n"
        f"# Supported Models\n\n{SUPPORTED_INTRO}\n\n{bullets(True)}\n\n"
        f"# Unsupported Models\n\n{UNSUPPORTED_INTRO}\n\n{bullets(False)}\n"
        + (f"\n# Not Tested\n\n{UNTESTED_INTRO}\n\n{untested}\n" if untested else "")
        + _checkpoints_section(report.checkpoints)
    )


def _checkpoints_section(section: dict) -> str:
    """Each real checkpoint's verdicts (faithful cells), then each architecture's under stress shapes, apart."""
    if not has_faithful(section):
        return ""
    real = checkpoint_lines({**section, "stress": []})
    stress = checkpoint_lines({"faithful": [], "class_defaults": [], "stress": section["stress"]})
    return (
        "\n# Verdicts per checkpoint\n\n"
        + CHECKPOINTS_INTRO
        + "\n\n"
        + "\n".join(f"- {line}" for line in real or ["None run."])
        + "\n\n## Architectures under stress shapes\n\n"
        + "\n".join(f"- {line}" for line in stress or ["None run."])
        + "\n"
    )


# ---- A copy of DeepSpeed's page ----------------------------------------------------------------------------------


def read_docs(path: Path) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ReportsError(f"--docs {path}: cannot read it ({exc.strerror}); pass DeepSpeed's {DOCS_PAGE}") from None
    except UnicodeDecodeError as exc:
        raise ReportsError(
            f"--docs {path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); pass DeepSpeed's {DOCS_PAGE}"
        ) from None


def read_docs_supported(path: Path) -> list[str]:
    """Model names under the docs' "Supported Models" heading, written as a bullet list or a table."""
    names: list[str] = []
    in_section = found_section = False
    for line in read_docs(path):
        heading = _HEADING.match(line)
        if heading:
            in_section = heading.group(1).lower() == "supported models"
            found_section |= in_section
            continue
        if not in_section:
            continue
        if _TABLE_SEPARATOR.match(line):
            names.pop()  # the row just read was the table header
        elif line.strip().startswith("|"):
            names.append(line.strip().strip("|").split("|")[0])
        elif bullet := _BULLET.match(line):
            names.append(bullet.group(1))
    if not found_section:
        raise ReportsError(f"--docs {path}: no '# Supported Models' heading found; is this the AutoTP tutorial?")
    return [_bullet_name(name) for name in names if _bullet_name(name)]


def _bullet_name(text: str) -> str:
    """The family a bullet names: its link text, without code marks and without a note this page added."""
    return _NOTE.sub("", _LINK_TEXT.sub(r"\1", text)).strip("` *")


def check_drift(support: dict[str, bool], docs_path: Path) -> Drift:
    listed = {normalise_model_name(name): name for name in read_docs_supported(docs_path)}
    return Drift(
        docs_path=str(docs_path),
        listed_but_failing=[m for m, ok in support.items() if not ok and normalise_model_name(m) in listed],
        passing_but_unlisted=[m for m, ok in support.items() if ok and normalise_model_name(m) not in listed],
    )


def _bullet_blocks(path: Path, lines: list[str]) -> dict[str, tuple[int, int]]:
    """Per section of SECTIONS, the first and past-the-last line of its bullet list."""
    blocks: dict[str, tuple[int, int]] = {}
    for index, line in enumerate(lines):
        heading = _HEADING.match(line)
        if not heading or heading.group(1).lower() not in SECTIONS:
            continue
        start = index + 1
        while start < len(lines) and not _BULLET.match(lines[start]) and not _HEADING.match(lines[start]):
            start += 1
        end = start
        while end < len(lines) and _BULLET.match(lines[end]):
            end += 1
        if end == start:
            raise ReportsError(
                f"--docs {path}:{index + 1}: '{line.strip()}' has no bullet list under it; the page "
                "is rewritten only where its models are a '- name' list"
            )
        blocks[heading.group(1).lower()] = (start, end)
    missing = [f"'# {name.title()}'" for name in SECTIONS if name not in blocks]
    if missing:
        raise ReportsError(f"--docs {path}: no {' or '.join(missing)} heading found; is this the AutoTP tutorial?")
    return blocks


def docs_names(report: ReportView, docs_path: Path) -> dict[str, str]:
    """Family → the spelling the docs copy uses for it ("gpt_neox" → "gpt-neox"), for families it lists."""
    lines = read_docs(docs_path)
    listed = {
        normalise_model_name(_bullet_name(match.group(1))): _bullet_name(match.group(1))
        for start, end in _bullet_blocks(docs_path, lines).values()
        for line in lines[start:end]
        if (match := _BULLET.match(line))
    }
    return {
        e["family"]: listed[normalise_model_name(e["family"])]
        for e in report.supported_models["families"]
        if normalise_model_name(e["family"]) in listed
    }


def docs_page(report: ReportView, docs_path: Path) -> str:
    """The copy with its two lists rewritten: every family tested here in the section its cells put it in, with its
    note; a family the copy lists that was not tested here stays where it is, as it is. New bullets go in
    alphabetical place among the kept ones, so the diff shows only what changed."""
    lines = read_docs(docs_path)
    blocks = _bullet_blocks(docs_path, lines)
    names = docs_names(report, docs_path)
    tested = {normalise_model_name(e["family"]): e for e in report.supported_models["families"]}
    rewritten = {}
    for section, (start, end) in blocks.items():
        listed = [
            (normalise_model_name(_bullet_name(match.group(1))), line)
            for line in lines[start:end]
            if (match := _BULLET.match(line))
        ]  # every line of a block is a bullet (_bullet_blocks)
        kept = [(key, line) for key, line in listed if key not in tested]
        for key, entry in sorted(tested.items()):
            if entry["supported"] == (section == "supported models"):
                bullet = family_bullet(entry, names.get(entry["family"], entry["family"]))
                place = next((i for i, (other, _) in enumerate(kept) if other > key), len(kept))
                kept.insert(place, (key, bullet))
        rewritten[section] = [line for _, line in kept]
    out = list(lines)
    for section, (start, end) in sorted(blocks.items(), key=lambda item: -item[1][0]):  # bottom up: indices hold
        out[start:end] = rewritten[section]
    return "\n".join(out) + "\n"


def docs_diff(report: ReportView, docs_path: Path) -> str:
    """A unified diff from the copy to docs_page, with DeepSpeed's path: `git apply` it in a DeepSpeed clone."""
    before = "\n".join(read_docs(docs_path)) + "\n"
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            docs_page(report, docs_path).splitlines(keepends=True),
            fromfile=f"a/{DOCS_PAGE}",
            tofile=f"b/{DOCS_PAGE}",
        )
    )

"""The supported-models page as DeepSpeed's automatic-tensor-parallelism tutorial should read, drift against a copy
of that page, and the unified diff that turns the copy into it.

The page has DeepSpeed's two lists and, between them, the families that run correctly but save no memory
(reports.outputs.support: three levels, DeepSpeed's family names, reasons in words); a line after the intro says what
the tested entries were tested at. After the lists, the page states each real checkpoint's verdicts apart from the
stress shapes' (reports.analysis.checkpoints). Works on the report model (reports.outputs.model.Report)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from reports import ReportsError
from reports.analysis import CheckpointVerdicts, FailingNow, checkpoint_lines, has_faithful
from reports.outputs.markdown_safety import markdown_link, our_html, unmarked
from reports.outputs.support import LEVELS, FamilySupport, Part, SupportedModels, TestedAt


class ReportView(Protocol):
    """What the supported-models page reads of the report model (reports.outputs.model.Report, which builds this
    module's section and so cannot be imported here)."""

    @property
    def supported_models(self) -> SupportedModels: ...

    @property
    def checkpoints(self) -> CheckpointVerdicts: ...

    @property
    def failing_now(self) -> FailingNow: ...


# Same wording as docs/_tutorials/automatic-tensor-parallelism.md, so the output can be pasted in.
SUPPORTED_INTRO = (
    "The following model families have been successfully tested with automatic tensor parallelism. "
    "Other models may work but have not been tested yet."
)
UNSUPPORTED_INTRO = (
    "The following models are not currently supported with automatic tensor parallelism. "
    "They may still be compatible with other DeepSpeed features (e.g., kernel injection for Bloom):"
)
MEMORY_HEADING = "Supported Without Memory Savings"
MEMORY_INTRO = (
    "These models give the same outputs with automatic tensor parallelism as without, but some of their weights "
    "stay whole on every rank, so the ranks do not share that memory:"
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
HARNESS = "autotp-matrix"
DOCS_PAGE = "docs/_tutorials/automatic-tensor-parallelism.md"  # the page's path in DeepSpeed's repository
SECTIONS = {"supported models": "works", MEMORY_HEADING.lower(): "no memory saved", "unsupported models": "fails"}
"""The page's lists, as their headings read (any case), and the level each holds; the middle one is this page's own
and is inserted after the supported list where a copy lacks it."""
_HEADING = re.compile(r"^\s*#+\s*(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^\s*[-*+]\s+(.+?)\s*$")
_TABLE_SEPARATOR = re.compile(r"^\s*\|\s*:?-{3,}")  # needs the pipe: a bare "---" is a rule
_LINK_TEXT = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_NOTE = re.compile(r"\s+—\s.*$")  # the note this page adds after a family's name
_TESTED_AT = "Tested with "  # how the line stating the versions starts (a copy's own is replaced)


@dataclass(frozen=True)
class Drift:
    docs_path: str
    """The docs page's file name: a report is read elsewhere, so this host's folder of it is left out."""
    listed_but_failing: list[str]  # docs list the family as supported; a cell of it fails here at the latest versions
    passing_but_unlisted: list[str]  # every cell of it passes here; the docs do not list the family


def normalise_model_name(name: str) -> str:
    """Tolerant key: case, dashes/underscores/dots and an org prefix do not matter ("gpt-neox" == "GPT_NeoX")."""
    return re.sub(r"[^a-z0-9]", "", name.strip().lower().rsplit("/", 1)[-1])


# ---- Markdown ----------------------------------------------------------------------------------------------------


def _tps(tps: Sequence[int]) -> str:
    return ", ".join(map(str, tps))


@dataclass(frozen=True)
class Evidence:
    """What a demotion rests on, said on its bullet: where it was seen and the issue (upstream, else the draft for
    DeepSpeed's tracker) that says more."""

    seen_at: str
    """ "DeepSpeed 0.19.8, transformers 5.25.0, torch 2.13.0+cpu on cpu (gloo)": the versions and hardware."""
    drafts: dict[str, str]
    """Cause id → its draft issue's path beside the page (reports.analysis.draft_file), where one was written."""

    def of(self, part: Part) -> str:
        """ "seen at …, eager fp32; tracked: <link>" (or "; draft issue: <link>")."""
        if part.known:
            issue = f"; tracked: {markdown_link(part.known.label, part.known.upstream)}"
        else:
            drafts = [self.drafts[cause] for cause in part.causes if cause in self.drafts]
            issue = f"; draft issue: {', '.join(markdown_link(path, path) for path in drafts)}" if drafts else ""
        return f" (seen at {self.seen_at}, {part.variants}{issue})"


def evidence(report: ReportView) -> Evidence:
    at = report.supported_models.tested_at
    versions = at.versions
    return Evidence(
        seen_at=f"DeepSpeed {versions['deepspeed']}, transformers {versions['transformers']}, torch "
        f"{versions['torch']} on {' and '.join(at.accelerators)}",
        drafts={cause.id: cause.draft for cause in report.failing_now.causes if cause.draft},
    )


def _part_text(part: Part, several_variants: bool, seen: Evidence) -> str:
    """ "works at tp 2, 3, 4", "fails at tp 3: the fused qkv split rejects its head counts (seen at …; draft issue:
    …)"."""
    where = f"tp {_tps(part.tps)}" + (f" ({part.variants})" if several_variants else "")
    if part.state == "works":
        return f"works at {where}"
    if part.state == "flaky":
        return f"is flaky at {where}{seen.of(part)}"
    if part.state == "no memory saved":
        return f"runs correctly at {where}, but {part.reason}{seen.of(part)}"
    return f"fails at {where}: {part.reason}{seen.of(part)}"


def family_bullet(entry: FamilySupport, name: str, seen: Evidence) -> str:
    """ "- codegen — works at tp 2, 4, fails at tp 3: the fused qkv split rejects its head counts"; where
    what the family's cells stand for behaves differently, each says its own: "- falcon — falcon-40b works at tp 2,
    3, 4; falcon-7b fails at tp 2, 3, 4: …"."""
    parts = entry.parts
    several = len({part.variants for part in parts}) > 1
    order = {"works": 0, "no memory saved": 1, "flaky": 2, "fails": 3}
    by_members: dict[tuple[str, ...], list[Part]] = {}
    for part in sorted(parts, key=lambda p: (order[p.state], p.tps)):
        by_members.setdefault(part.members, []).append(part)
    named = len(by_members) > 1
    # What works everywhere it ran first, then by name: "llama works …; llama_large works …, fails …"
    groups = sorted(by_members.items(), key=lambda item: (max(order[p.state] for p in item[1]), item[0]))
    texts = [
        (f"{', '.join(members)} " if named else "") + ", ".join(_part_text(part, several, seen) for part in group)
        for members, group in groups
    ]
    return f"- {name} — " + "; ".join(texts)


def tested_at_line(section: SupportedModels) -> str:
    """ "Tested with DeepSpeed 0.19.8, transformers 5.25.0 and torch 2.13.0+cpu on cpu (gloo), fp32, at tp 2, 3
    and 4 …": what the entries with a note were measured at."""
    at = section.tested_at
    tps = at.tps
    sizes = f"{_tps(tps[:-1])} and {tps[-1]}" if len(tps) > 1 else _tps(tps)
    versions = at.versions
    return (
        f"{_TESTED_AT}DeepSpeed {versions['deepspeed']}, transformers {versions['transformers']} and torch "
        f"{versions['torch']} on {' and '.join(at.accelerators)}, {', '.join(at.dtypes)}, at tp {sizes} ({at.date}, by "
        f"{HARNESS}: "
        "tiny random models that split like each family's real checkpoints): the families with a note below. "
        f"The others are listed from earlier tests. Not tested here: {', '.join(not_tested(at))}."
    )


def not_tested(at: TestedAt) -> list[str]:
    """What the notes do not cover, said once: GPUs where only CPUs ran, the dtypes not run, real sizes."""
    gpu = [] if any(not name.startswith("cpu") for name in at.accelerators) else ["GPUs"]
    dtypes = [dtype for dtype in ("fp16", "bf16", "fp32") if dtype not in at.dtypes]
    return [*gpu, *dtypes, "real-size weights"]


def _bullets(report: ReportView, level: str, names: dict[str, str]) -> list[str]:
    seen = evidence(report)
    return [
        family_bullet(e, names.get(e.family, e.family), seen)
        for e in report.supported_models.families
        if e.level == level
    ]


def supported_models_markdown(report: ReportView, history: Any, names: dict[str, str] | None = None) -> str:
    """The page's three lists (plus "Not Tested" when a family was only skipped), a bullet per family.
    `names`: family → the spelling a docs copy already uses for it."""
    section = report.supported_models
    names = names or {}
    counts = ", ".join(f"{len(section.levels[level])} {level}" for level in LEVELS)
    untested = "\n".join(f"- {family}" for family in section.not_tested)
    return (
        our_html(
            f"<!-- generated by `python -m reports render` at {history.latest.describe()}: {counts}, "
            f"{len(section.not_tested)} not tested (report.md has every cell) -->"
        )
        + f"\n\n# Supported Models\n\n{SUPPORTED_INTRO}\n\n{tested_at_line(section)}\n\n"
        + "\n".join(_bullets(report, "works", names) or ["- (none)"])
        + f"\n\n## {MEMORY_HEADING}\n\n{MEMORY_INTRO}\n\n"
        + "\n".join(_bullets(report, "no memory saved", names) or ["- (none)"])
        + f"\n\n# Unsupported Models\n\n{UNSUPPORTED_INTRO}\n\n"
        + "\n".join(_bullets(report, "fails", names) or ["- (none)"])
        + "\n"
        + (f"\n# Not Tested\n\n{UNTESTED_INTRO}\n\n{untested}\n" if untested else "")
        + _checkpoints_section(report.checkpoints)
    )


def _checkpoints_section(section: CheckpointVerdicts) -> str:
    """Each real checkpoint's verdicts (faithful cells), then each architecture's under stress shapes, apart."""
    if not has_faithful(section):
        return ""
    real = checkpoint_lines(replace(section, class_defaults=(), stress=()))
    defaults = checkpoint_lines(replace(section, faithful=(), stress=()))
    stress = checkpoint_lines(section.stress_only())
    return (
        "\n# Verdicts per checkpoint\n\n"
        + CHECKPOINTS_INTRO
        + "\n\n"
        + "\n".join(f"- {line}" for line in real or ["None run."])
        + ("\n\n## Architectures at their config-class default sizes\n\n" if defaults else "")
        + "\n".join(f"- {line}" for line in defaults)
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
        docs_path=docs_path.name,
        listed_but_failing=[m for m, ok in support.items() if not ok and normalise_model_name(m) in listed],
        passing_but_unlisted=[m for m, ok in support.items() if ok and normalise_model_name(m) not in listed],
    )


def _bullet_blocks(path: Path, lines: list[str]) -> dict[str, tuple[int, int]]:
    """Per section of SECTIONS the copy has, the first and past-the-last line of its bullet list (the supported and
    unsupported lists must be there; the middle one is this page's own)."""
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
    missing = [
        f"'# {name.title()}'" for name, level in SECTIONS.items() if level != "no memory saved" and name not in blocks
    ]
    if missing:
        raise ReportsError(f"--docs {path}: no {' or '.join(missing)} heading found; is this the AutoTP tutorial?")
    return blocks


def _listed(lines: list[str], blocks: dict[str, tuple[int, int]]) -> dict[str, str]:
    """Every family the copy's lists name: its key (normalise_model_name) → its spelling there."""
    return {
        normalise_model_name(_bullet_name(match.group(1))): _bullet_name(match.group(1))
        for start, end in blocks.values()
        for line in lines[start:end]
        if (match := _BULLET.match(line))
    }


def docs_names(report: ReportView, docs_path: Path) -> dict[str, str]:
    """Family → the spelling the docs copy uses for it ("gpt_neox" → "gpt-neox"), for families it lists."""
    lines = read_docs(docs_path)
    listed = _listed(lines, _bullet_blocks(docs_path, lines))
    return {
        e.family: listed[normalise_model_name(e.family)]
        for e in report.supported_models.families
        if normalise_model_name(e.family) in listed
    }


def docs_page(report: ReportView, docs_path: Path) -> str:
    """The copy with its lists rewritten: every family tested here in the list of its level, with its note; a family
    the copy lists that was not tested here stays where it is, as it is. New bullets go in alphabetical place among
    the kept ones, so the diff shows only what changed. The tested-at line goes after the supported list's intro,
    and the no-memory-saved list (with its heading and intro) after the supported list where the copy lacks it."""
    lines = read_docs(docs_path)
    blocks = _bullet_blocks(docs_path, lines)
    names = docs_names(report, docs_path)
    section = report.supported_models
    seen = evidence(report)
    tested = {normalise_model_name(e.family): e for e in section.families}
    rewritten = {}
    for heading, level in SECTIONS.items():
        start, end = blocks.get(heading, (0, 0))
        listed = [
            (normalise_model_name(_bullet_name(match.group(1))), line)
            for line in lines[start:end]
            if (match := _BULLET.match(line))
        ]  # every line of a block is a bullet (_bullet_blocks)
        # A family already in this list keeps its place (the diff shows its line changed); one tested here is
        # dropped from a list its level does not put it in, and added in alphabetical place to its own.
        kept = [
            (
                key,
                family_bullet(tested[key], names.get(tested[key].family, tested[key].family), seen)
                if key in tested
                else line,
            )
            for key, line in listed
            if key not in tested or tested[key].level == level
        ]
        present = {key for key, _ in kept}
        for key, entry in sorted(tested.items()):
            if entry.level == level and key not in present:
                bullet = family_bullet(entry, names.get(entry.family, entry.family), seen)
                place = next((i for i, (other, _) in enumerate(kept) if other > key), len(kept))
                kept.insert(place, (key, bullet))
        rewritten[heading] = [line for _, line in kept]
    out = list(lines)
    memory = MEMORY_HEADING.lower()
    supported_start, supported_end = blocks["supported models"]
    edits = {heading: blocks[heading] for heading in blocks}
    if memory not in blocks and rewritten[memory]:  # inserted after the supported list, before what follows it
        edits[memory] = (supported_end, supported_end)
        rewritten[memory] = ["", f"## {MEMORY_HEADING}", "", MEMORY_INTRO, "", *rewritten[memory]]
    for heading, (start, end) in sorted(edits.items(), key=lambda item: (-item[1][0], item[0] != memory)):
        out[start:end] = rewritten[heading]  # bottom up: the indices above stay valid
    return unmarked("\n".join(_with_tested_at(out, supported_start, tested_at_line(section))) + "\n")


def _with_tested_at(lines: list[str], supported_start: int, line: str) -> list[str]:
    """The lines with the tested-at line as the paragraph just before the supported list (replacing the copy's)."""
    before = lines[:supported_start]
    while before and not before[-1].strip():
        before.pop()
    if before and before[-1].startswith(_TESTED_AT):
        before.pop()
        while before and not before[-1].strip():
            before.pop()
    return [*before, "", line, "", *lines[supported_start:]]


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

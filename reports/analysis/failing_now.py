"""Failing now, by cause: the first section of every report when cells fail at the latest versions.

The failing cells at the latest versions are grouped by cause (reports.analysis.signatures.failure_key: the cause the
harness recorded, what AutoTP did where it broke, suites/verdicts/mechanism.py; for a failure recorded before causes
were kept, its class and signature with every number masked). Each cause says its mechanism in words, whose bug it is
(AutoTP's wherever the exception surfaced, the unsharded model passing the same probes; the frame is "surfaced in"),
since when it fails (the oldest version set in the history where the same cause appears, or "since the first run"), the
answer triage found for the transitions that brought it into the latest versions, whether it is known (matrix/
known_failures.toml: "known" with the upstream link, "unsupported upstream" — known by design — with the page or line of
DeepSpeed that says so, else "new"), and its example cell (the one standing for the checkpoint users run most) with the
command that runs it alone and the files the results folder keeps for it. An open known failure whose cells pass at the
latest versions is listed as "fixed at <version>: close <link>"; a fixed one that fails again at or after its fix as
"reopen".

Built into the report model (reports.outputs.model.build_report) as report.json's form of the section, and rendered from
the Report, so report.md, report.html and the step summary say the same; `cause_id` is the one publish's issues
carry for the same class and cause."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from matrix.cells import replay_name
from matrix.json_records import renamed
from matrix.known_failures import KnownFailure
from matrix.registry import RegistryError, load_popularity
from matrix.remedies import RemedyResult
from reports.analysis.cause_groups import CauseGroup, cause_group, group_apart, group_in_place
from reports.analysis.cause_names import cause_title
from reports.analysis.causes import RootCause, by_kind, count_text, failure_cause_id, typed_members
from reports.analysis.checkpoints import cell_checkpoints, registry_hub_ids
from reports.analysis.history import History, Transition
from reports.analysis.known import FixedKnown, KnownMatch, fixed_known, known_for, versions_of
from reports.analysis.signatures import failure_key, mask_signature, surfaced_in
from reports.analysis.since_when import AXIS_NAMES, since_when
from reports.analysis.statuses import CellStatus
from reports.store import AXES, Aggregates, CellKey, JSONObject, ResultGroup, Versions, started_order
from suites.verdicts.mechanism import cause_sentence, whose
from suites.verdicts.outcome import log_folder
from suites.verdicts.statements import Proof, proof_of, stated

STATUS_ORDER = ("new", "known", "unsupported")
"""A cause's status: no known failure covers it, an upstream issue tracks it, or it is known by design — DeepSpeed
documents the model as unsupported by AutoTP or refuses it on purpose (matrix/known_failures.py KnownFailureState):
listed in this order."""


def repro_file(cell: str) -> str:
    """Where a results folder keeps a failing cell's standalone repro script, relative to it."""
    return f"repro/repro_{cell}.py"


def draft_file(failure_class: str, cause: str) -> str:
    """Where a cause's draft issue for DeepSpeed's tracker is written, relative to the results folder: a slug
    (`memory-forward-<id>.md` for the classes "memory, forward"), so a Markdown link to it needs no escaping."""
    return f"draft-issue/{'-'.join(re.findall(r'[a-z0-9]+', failure_class.lower()))}-{cause}.md"


@dataclass(frozen=True)
class ResultFiles:
    """What the results folder the report is written to holds for the cells failing at the latest versions
    (log_folder, repro_file, draft_file): a report names a file only when it is there."""

    logs: frozenset[str] = frozenset()
    """Cells whose rank logs are kept."""
    repro: frozenset[str] = frozenset()
    """Cells whose repro script is written."""
    remedies: tuple[RemedyResult, ...] = ()
    """What `nox -s remedy` found (merged into the history store, HistoryStore.remedy_results): a cause's
    sentence is stated as proven by a remedy verified on every one of its cells (suites/verdicts/statements.py
    `proof_of`)."""

    def log(self, cell: str) -> str:
        return log_folder(cell) if cell in self.logs else ""

    def script(self, cell: str) -> str:
        return repro_file(cell) if cell in self.repro else ""


NO_RESULT_FILES = ResultFiles()
"""A results folder that holds no logs or scripts (a report written elsewhere names none)."""


def example_cell(
    cells: list[CellKey], checkpoints: dict[CellKey, tuple[str, ...]], popularity: tuple[str, ...]
) -> CellKey:
    """The cell a cause is shown on: the one standing for the checkpoint users run most (the registry's
    popularity order), then one whose architecture's checkpoints rank highest, then the smallest tp."""
    ranked = popularity_rank(checkpoints, popularity)
    return min(cells, key=lambda c: (*ranked(c), c.tp, c.model, c.variant, c.dtype))


def popularity_rank(
    checkpoints: dict[CellKey, tuple[str, ...]], popularity: tuple[str, ...]
) -> Callable[[CellKey], tuple[int, int]]:
    """How popular a cell is (smaller first): the best place in the registry's popularity order of the checkpoints it
    stands for, then of its architecture's checkpoints."""
    rank = {hub_id: place for place, hub_id in enumerate(popularity)}
    hub_ids = registry_hub_ids()

    def best(ids: tuple[str, ...]) -> int:
        return min((rank.get(hub_id, len(rank)) for hub_id in ids), default=len(rank) + 1)

    return lambda cell: (best(checkpoints.get(cell, ())), best(hub_ids.get(cell.model.split(".", 1)[0], ())))


SEVERITY = (("numerics", "generation", "forward", "crash", "timeout"), ("shard",), ("memory",))
"""The order causes are listed in: wrong output or a crash, then AutoTP refusing the model, then memory only; any
other class (the harness's `setup`, the environment's `install`) after them."""


def severity(failure_classes: Iterable[str]) -> int:
    """The place in SEVERITY of a cause's worst class."""
    return min(
        (
            next((place for place, tier in enumerate(SEVERITY) if name in tier), len(SEVERITY))
            for name in failure_classes
        ),
        default=len(SEVERITY),
    )


def repro_command(cell: CellKey) -> str:
    """The one command that runs this cell alone, with its verdict and a standalone repro script."""
    return (
        f"nox -s repro -- --models {replay_name(cell.model)} --variants {cell.variant} --dtypes {cell.dtype} "
        f"--tp {cell.tp}"
    )


# ---- The section (report.json "failing_now": asdict of FailingNow) ------------------------------------------------


@dataclass(frozen=True)
class FirstSeen:
    """Since when a cause fails: the text a report prints, and the run and versions where it was first seen."""

    text: str
    run: str
    started: str
    versions: str
    moved: tuple[str, ...] = ()
    """Where the text is read from the example cell's earlier points (reports/analysis/since_when.py): the axes on
    which it works at an earlier release, so the change that broke it lies there; () otherwise."""
    tried: bool = False
    """The text says how the example cell did at earlier points of one axis (since_when), not when it was first seen."""


@dataclass(frozen=True)
class Repro:
    """The cell a cause is shown on (example_cell), the command that runs it alone, and its files in the results
    folder (ResultFiles; "" where it holds none)."""

    cell: str
    command: str
    logs: str
    """Its rank logs' folder, relative to the report."""
    script: str = ""
    """Its standalone repro script, relative to the report."""
    checkpoints: tuple[str, ...] = ()
    """The real checkpoints it stands for (faithful shapes; none for stress or config-default sizes)."""


@dataclass(frozen=True)
class CellFiles:
    """One failing cell of a cause with what the results folder holds for it (relative to the report; "" none)."""

    cell: str
    logs: str
    script: str
    checkpoints: tuple[str, ...]
    """The real checkpoints it stands for."""


@dataclass(frozen=True)
class FailingCause:
    """The cells failing at the latest versions with one cause."""

    id: str
    group: CauseGroup
    """Its cells; its failure class names every class among them, its masked signature is the example cell's."""
    since: FirstSeen
    root_causes: tuple[str, ...]  # the ids of the root causes that brought these cells into the latest versions
    status: str  # one of STATUS_ORDER: "known"/"unsupported" when a known failure covers some of its cells
    known: KnownMatch | None
    repro: Repro
    members: tuple[CellFiles, ...] = ()
    """Each of its cells with its files (cells's order)."""
    draft: str = ""
    """Its draft issue for DeepSpeed's tracker, relative to the report ("" where none is written: render writes one
    per cause DeepSpeed can fix, reports.outputs.cell_files)."""
    mechanism_key: str = ""
    """What groups its cells (reports.analysis.signatures.failure_key); report.json's `key`."""
    mechanism: str = ""
    """The mechanism in words (suites/verdicts/cause.py Cause.words); "" for results recorded before causes were
    kept."""
    whose: str = ""
    """Whose it is: a key of suites.verdicts.mechanism.WHOSE ("unsupported" where a known failure says DeepSpeed refuses
    the model by design)."""
    evidence: str = ""
    """The line that makes it `whose`'s: the source line a cause's owner rests on, or the known failure's upstream
    page or assert for "unsupported"; "" for AutoTP bugs located by what AutoTP did."""
    surfaced_in: str = ""
    """The frame its example's exception surfaced in."""
    proven_by: tuple[RemedyResult, ...] = ()
    """The remedies verified on every one of its cells, whose mechanism its sentence states (a draft carries each as
    a workaround or a proposed fix); () where none is."""

    @property
    def title(self) -> str:
        """Its name in a few whole words (reports.analysis.cause_names), the one every output names it by."""
        return cause_title(self.group.failure_class, self.group.masked_signature, self.mechanism_key, self.mechanism)

    def json_shape(self, written: JSONObject) -> JSONObject:
        return renamed(group_in_place(written), {"mechanism_key": "key"}) | {"title": self.title}

    @staticmethod
    def own_shape(stored: JSONObject) -> JSONObject:
        return group_apart(renamed({k: v for k, v in stored.items() if k != "title"}, {"key": "mechanism_key"}))


@dataclass(frozen=True)
class FailingNow:
    cells: int
    causes: tuple[FailingCause, ...]  # the most severe first (SEVERITY), then the most popular, then the most cells
    fixed_known: tuple[FixedKnown, ...]
    backfill: str = ""
    """On a first night (one version set, every cause since the first run): the command that gives the history
    since when each cause fails and which change broke it, for the cells this run had; "" otherwise."""
    moved: str = ""
    """Where causes' example cells were run at earlier points (since_when) and work at some: which axis moved for
    how many causes, and the command that finds the release each broke at; "" otherwise."""


def build_failing_now(
    root_causes: tuple[RootCause, ...],
    history: History,
    aggregates: Aggregates,
    known: dict[str, KnownFailure],
    files: ResultFiles = NO_RESULT_FILES,
) -> FailingNow:
    """report.json "failing_now": the causes of the cells failing at the latest versions (the most severe first, then
    the most popular checkpoint's, then the most cells) and the open known failures whose cells pass there now; `files`:
    what the results folder holds for them."""
    latest = history.latest
    failing = _failing_at_latest(history)
    first_seen = _first_seen(aggregates, history)
    transitions = by_kind(history.transitions)
    first_run = aggregates.first_run.run_id
    at_latest = versions_of(latest)
    causes: list[FailingCause] = []
    checkpoints = cell_checkpoints(aggregates, history)
    popularity = _popularity()
    examples: dict[str, CellKey] = {}
    for key, members in failing.items():
        members.sort(key=lambda member: member[0])
        cells = [cell for cell, _ in members]
        representative = examples[key] = example_cell(cells, checkpoints, popularity)
        shown = dict(members)[representative]
        classes = Counter(status.failure_class for _, status in members)
        text = mask_signature(shown.signature)
        match = known_for(known, members, at_latest)
        cause_status = _status(match, len(cells))
        owner = shown.cause.whose if shown.cause else whose(shown.failure_class)
        # every cell refused by design: DeepSpeed's, but not a bug (a cause with other cells too stays AutoTP's)
        unsupported = f"{match.note} ({match.upstream})" if match and cause_status == "unsupported" else ""
        proof = proof_of(key, [cell.id for cell in cells], files.remedies, latest.deepspeed)
        causes.append(
            FailingCause(
                # a cause recorded before causes were kept keeps the id it had (publish's issues carry it)
                id=failure_cause_id(shown.failure_class, shown.signature, shown.cause),
                group=cause_group(", ".join(name for name, _ in classes.most_common()), text, cells),
                since=_cause_since(history, aggregates, representative, key, first_seen[key]),
                root_causes=tuple(_root_causes(root_causes, transitions, latest, key, set(cells))),
                status=cause_status,
                known=match,
                repro=_repro(representative, files, checkpoints),
                members=tuple(
                    CellFiles(cell.id, files.log(cell.id), files.script(cell.id), checkpoints.get(cell, ()))
                    for cell in cells
                ),
                mechanism_key=key,
                mechanism=_mechanism(key, [status for _, status in members], text, bool(unsupported), proof),
                whose="unsupported" if unsupported else owner,
                evidence=unsupported or (shown.cause.evidence if shown.cause else ""),
                surfaced_in=surfaced_in(shown.signature),
                proven_by=proof.by,
            )
        )
    ranked = popularity_rank(checkpoints, popularity)
    causes.sort(
        key=lambda c: (
            severity(c.group.failure_class.split(", ")),
            ranked(examples[c.mechanism_key]),
            -c.group.count,
            c.group.failure_class,
            c.group.masked_signature,
        )
    )
    first_night = len(history.version_sets) == 1 and all(c.since.run == first_run for c in causes)
    return FailingNow(
        cells=sum(c.group.count for c in causes),
        causes=tuple(causes),
        fixed_known=tuple(fixed_known(history, aggregates, known)),
        backfill=backfill_command([cell for cell, versions in history.statuses if versions == latest])
        if first_night and causes
        else "",
        moved=moved_text(causes),
    )


def _failing_at_latest(history: History) -> dict[str, list[tuple[CellKey, CellStatus]]]:
    """The cells failing at the latest versions, with their statuses, by failure key (one cause each)."""
    failing: dict[str, list[tuple[CellKey, CellStatus]]] = defaultdict(list)
    for (cell, versions), status in history.statuses.items():
        if versions == history.latest and status.status == "fail":
            failing[failure_key(status.failure_class, status.signature, status.cause)].append((cell, status))
    return failing


def _repro(cell: CellKey, files: ResultFiles, checkpoints: Mapping[CellKey, tuple[str, ...]]) -> Repro:
    """How to run a cause's example cell alone, and the files the results folder holds for it."""
    return Repro(
        cell=cell.id,
        command=repro_command(cell),
        logs=files.log(cell.id),
        script=files.script(cell.id),
        checkpoints=checkpoints.get(cell, ()),
    )


def _cause_since(history: History, aggregates: Aggregates, cell: CellKey, key: str, first: ResultGroup) -> FirstSeen:
    """Since when a cause fails. Where the history began at the latest versions and every earlier version set was run
    after it (`nox -s since-when`, a backfill after a first night), what its example cell did there (since_when);
    else when the cause was first seen (a nightly's history keeps "since deepspeed 0.19.7 (first seen …)")."""
    latest = history.latest
    first_seen = _since(first, aggregates.first_run.run_id, latest)
    if aggregates.first_run.versions != latest or len(history.version_sets) == 1:
        return first_seen
    tried = since_when(history, cell, key)
    return replace(first_seen, text=tried.text, moved=tried.moved, tried=True) if tried.text else first_seen


def moved_text(causes: Iterable[FailingCause]) -> str:
    """ "transformers moved for 5 causes (1, 2, 4, 7, 9) and DeepSpeed for 2 (3, 6): `nox -s triage` finds the
    release each broke at (with --deepspeed-repo/--transformers-repo the commit and PR)"; "" where no cause works at an
    earlier point. Causes are named by their place in the list, as every output numbers them."""
    places: dict[str, list[int]] = defaultdict(list)
    for number, entry in enumerate(causes, start=1):
        for axis in entry.since.moved:
            places[axis].append(number)
    if not places:
        return ""
    moved = [
        f"{AXIS_NAMES.get(axis, axis)} for {count_text(len(numbers), 'cause')} ({', '.join(map(str, numbers))})"
        for axis, numbers in sorted(places.items(), key=lambda item: -len(item[1]))
    ]
    return (
        f"The axis that moved (the example cell works at an earlier release of it): {' and '.join(moved)}; "
        "`nox -s triage` finds the release each broke at (with `--deepspeed-repo`/`--transformers-repo` clones, the "
        "commit and PR)"
    )


BACKFILL_AXIS = "deepspeed"


def backfill_command(cells: list[CellKey]) -> str:
    """`nox -s backfill` for these cells along DeepSpeed from its oldest supported release (matrix/versions.toml
    `min`): the selection options name what differs from the default matrix's (every registry entry, faithful
    shapes, eager fp32), the tp sizes always."""
    from matrix.version_axes import load_config  # the axes' rules live with the version axes

    rule = load_config().axes[BACKFILL_AXIS]
    entries = sorted({cell.model.split(".", 1)[0] for cell in cells})
    shapes = sorted({"faithful" if "." in cell.model else "stress" for cell in cells})
    variants, dtypes = sorted({cell.variant for cell in cells}), sorted({cell.dtype for cell in cells})
    options = [f"--axis {BACKFILL_AXIS}", f"--since {rule.min}" if rule.min else ""]
    registry = set(registry_hub_ids())
    options.append("" if registry and set(entries) == registry else f"--models {','.join(entries)}")
    options.append("" if shapes == ["faithful"] else f"--shapes {','.join(shapes)}")
    options.append("" if variants == ["eager"] else f"--variants {','.join(variants)}")
    options.append("" if dtypes == ["fp32"] else f"--dtypes {','.join(dtypes)}")
    options.append(f"--tp {','.join(map(str, sorted({cell.tp for cell in cells})))}")
    return "nox -s backfill -- " + " ".join(option for option in options if option)


def cause_statement(
    key: str,
    statuses: Sequence[CellStatus],
    text: str,
    cells: Collection[str],
    remedies: Sequence[RemedyResult] = (),
    refused_by_design: bool = False,
) -> str:
    """The one sentence of a cause, as every output says it (report, console, step summary, checkpoint pages, drafts,
    gate and PR comment): `cells` its cells, `text` its example's masked signature, `remedies` what `nox -s remedy`
    found; "" where nothing was located (the signature then stands for it)."""
    return _mechanism(key, statuses, text, refused_by_design, proof_of(key, cells, remedies))


def _mechanism(key: str, statuses: Sequence[CellStatus], text: str, refused_by_design: bool, proof: Proof) -> str:
    """The sentence that holds for every cell of a cause (suites/verdicts/mechanism.py `cause_sentence`), stated as
    proven only by a verified remedy (suites/verdicts/statements.py `stated`: a verified remedy's sentence whatever was
    located; a refusal DeepSpeed documents is its own proof); "" for results recorded before causes were kept, and where
    it only repeats the example's signature (nothing was located)."""
    if proof.by:
        return stated("", proof)
    words = [status.cause.words for status in statuses if status.cause]
    if not words:
        return ""
    sentence = cause_sentence(key, words)
    if sentence == text:
        return ""
    return sentence if refused_by_design else stated(sentence, proof)


def _status(match: KnownMatch | None, cells: int) -> str:
    """new, known (an upstream issue covers some of the cells) or unsupported (DeepSpeed documents every one of its
    models as unsupported; a cause with other cells too is new for them)."""
    if match is None:
        return "new"
    if match.state != "unsupported":
        return "known"
    return "unsupported" if len(match.cells) == cells else "new"


def _popularity() -> tuple[str, ...]:
    try:
        return load_popularity()
    except RegistryError:  # the example is then the smallest tp's cell
        return ()


def _first_seen(aggregates: Aggregates, history: History) -> dict[str, ResultGroup]:
    """Per cause, its failures at the oldest version set of the history (in the history's version order) that hold
    the earliest run there (of two as early, the smaller run id, then the first cell)."""
    order = {versions: index for index, versions in enumerate(history.version_sets)}
    first: dict[str, tuple[tuple[int, str, str, CellKey], ResultGroup]] = {}
    for group in aggregates.groups:
        if group.outcome != "fail":
            continue
        key = failure_key(group.failure_class, group.signature, group.cause)
        rank = order[group.versions], *started_order(group.earliest), group.cell
        known = first.get(key)
        if known is None or rank < known[0]:
            first[key] = rank, group
    return {key: group for key, (_, group) in first.items()}


def _since(first: ResultGroup, first_run: str, latest: Versions) -> FirstSeen:
    """Since when a cause fails: "the first run", the versions where it first appears where they differ from the
    latest ones, or the day it first appeared at the latest versions."""
    run = first.earliest
    if run.run_id == first_run:
        text = "since the first run"
    elif first.versions != latest:
        changed = [
            f"{axis} {first.versions.label(axis)}" for axis in AXES if first.versions.label(axis) != latest.label(axis)
        ]
        text = f"since {', '.join(changed)} (first seen {run.started[:10]})"
    else:
        text = f"since {run.started[:10]} (session {run.session})"
    return FirstSeen(text=text, run=run.run_id, started=run.started, versions=first.versions.describe())


def _root_causes(
    root_causes: tuple[RootCause, ...],
    transitions: dict[str, list[Transition]],
    latest: Versions,
    key: str,
    cells: set[CellKey],
) -> list[str]:
    """The root causes (reports.analysis.causes) whose transitions (`transitions`: the history's, by kind) brought these
    cells into the latest versions failing this way: broke, or changed failure class, on one axis with the others at the
    latest versions."""
    ids = []
    for root in root_causes:
        if root.kind == "fixed":
            continue
        for t in typed_members(transitions, root):
            failing = t.failing_end
            if (
                t.cell in cells
                and failure_key(failing.failure_class, failing.signature, failing.cause) == key
                and t.after.label(t.axis) == latest.label(t.axis)
                and t.held_fixed == latest.pins(tuple(a for a in AXES if a != t.axis))
            ):
                ids.append(root.id)
                break
    return ids

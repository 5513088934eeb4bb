"""`nox -s remedy`: each remedy of matrix/remedies.toml applied and verified.

For one remedy: its cause models' cells run without it and with it (its cause cells: those that fail without it); only
when they all pass with it does its whole scope run without and with it. It is **verified** when every cause cell passes
with it and no other cell of its scope changes verdict. A workaround's scope is every default-matrix cell of its cause
models' architectures (an `injection_policy` names that architecture's block classes; another model has none of them); a
patch's scope is the whole default matrix, run with it only once its cause cells all pass. A patch is applied to the
PyPI sdist of its DeepSpeed release, unpacked into the harness cache, committed and pinned as a local checkout
(`deepspeed@<path>`, matrix/versions.py + sessions/checkouts.py), like any DeepSpeed commit.

Every run lands in the results folder's store; a remedied run (matrix/remedies.py `remedied`: its session names its
remedies) is merged as untrusted and left out of everything the store gives a reader (reports/store), so it is never
a report's state of DeepSpeed, a gate's baseline, a newer run's previous one or a bisection's verdict.
The typed results (matrix/remedies.py `RemedyResult`) go to `<results>/remedies.json`."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from matrix import cache_root
from matrix.harness_cache import used
from matrix.json_records import write_record
from matrix.redaction import redact
from matrix.registry import load_models
from matrix.remedies import (
    NOT_TAKEN,
    REMEDIES_FILE,
    RESULTS_NAME,
    WITHOUT_SESSION,
    Remedy,
    RemedyResult,
    RemedyStatus,
    TakenAt,
    load_remedies,
    remedies_for,
    remedy_session,
    required_patches,
)
from matrix.shapes import split_shaped_name
from suites.base.git import GitFailed, git_output, run_git
from suites.records.run_records import read_records


class PatchError(RuntimeError):
    """A patch that cannot be applied to its release (the message names the patch, the release and git's words)."""


# ---- Verdicts ---------------------------------------------------------------------------------------------------


def verdicts(results: Path) -> dict[str, str]:
    """Each cell's verdict in a results folder (`pass`, `fail numerics`, `skip`): its last record."""
    found: dict[str, str] = {}
    for record in read_records(results):
        found[record["cell"]["id"]] = " ".join(filter(None, (record["outcome"], record.get("failure_class", ""))))
    return found


def cause_cells(remedy: Remedy, without: dict[str, str]) -> tuple[str, ...]:
    """The cells of the remedy's cause models that fail without it (a skipped or `unsupported` cell is no cause
    cell: nothing of it failed)."""
    prefixes = tuple(f"{model}-" for model in remedy.cause_models)
    return tuple(
        sorted(cell for cell, verdict in without.items() if cell.startswith(prefixes) and verdict.startswith("fail"))
    )


def judge(
    remedy: Remedy,
    without: dict[str, str],
    with_it: dict[str, str],
    seconds: float,
    how: str,
    problem: str = "",
    required: tuple[Remedy, ...] = (),
    taken_at: TakenAt = NOT_TAKEN,
) -> RemedyResult:
    """The remedy's result from its scope's verdicts without and with it (a cell it did not run counts as changed
    when the cause cells all passed: the scope was to be run); `required`: the patches both runs had; `taken_at`:
    the versions and harness of the runs without it (`taken_at`)."""
    causes = cause_cells(remedy, without)
    fixed = tuple(cell for cell in causes if with_it.get(cell) == "pass")
    all_fixed = bool(causes) and len(fixed) == len(causes)
    others = [cell for cell in sorted(without) if cell not in causes]
    changed = tuple(
        f"{cell}: {without[cell]} -> {with_it.get(cell, 'not run')}"
        for cell in others
        if all_fixed and with_it.get(cell) != without[cell]
    )
    status: RemedyStatus = "verified" if all_fixed and not changed else "unverified"
    if problem:
        status = "not applied"
    if not causes and not problem:
        problem = f"no cell of {', '.join(remedy.cause_models)} fails without it: nothing to remedy"
    return RemedyResult(
        remedy=remedy.name,
        kind=remedy.kind,
        cause_models=remedy.cause_models,
        summary=remedy.summary,
        mechanism=remedy.mechanism,
        how=how,
        status=status,
        cause_cells=causes,
        fixed=fixed,
        changed=changed,
        others_compared=len(others) if all_fixed else 0,
        seconds=round(seconds, 1),
        # pip's and git's own words: a credential in an index URL never reaches the file (nox's own interpreter runs
        # this: run_suites gave it the redactor's library, sessions/installers.py redaction_library)
        problem=redact(problem),
        arguments=remedy.arguments,
        requires=tuple(patch.name for patch in required),
        taken_at=taken_at,
    )


def taken_at(folder: Path) -> TakenAt:
    """Where the runs of a results folder were taken (its first record: every run of a baseline folder shares one
    harness and one version set); NOT_TAKEN when it holds none. `python -m reports merge` reads a legacy results
    file's from its `remedy/without` folder the same way (and validates what it finds)."""
    for record in read_records(folder):
        versions, run = record.get("versions", {}), record.get("run", {})
        if isinstance(versions, dict) and isinstance(run, dict):
            return TakenAt(
                deepspeed=str(versions.get("deepspeed", "")),
                deepspeed_git=str(versions.get("deepspeed_git", "")),
                transformers=str(versions.get("transformers", "")),
                harness_git=str(run.get("harness_git", "")),
                recorded_at=str(run.get("started", "")),
            )
    return NOT_TAKEN


def progress_line(result: RemedyResult) -> str:
    line = (
        f"remedy {result.remedy} ({result.kind}): {result.status}: {len(result.fixed)} of {len(result.cause_cells)} "
        f"cause cells pass, {len(result.changed)} of {result.others_compared} other verdicts changed; "
        f"{result.seconds:.0f} s"
    )
    if result.requires:
        line += f" (with {', '.join(result.requires)} applied to both runs)"
    return line + (f" ({result.problem})" if result.problem else "")


def write_results(path: Path, results: list[RemedyResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([write_record(result) for result in results], indent=1) + "\n")


# ---- Scope ------------------------------------------------------------------------------------------------------


def scope_models(remedy: Remedy) -> str:
    """The `--models` of the remedy's scope: its cause models' architectures (workaround) or the registry (patch)."""
    if remedy.kind == "patch":
        return REGISTRY
    registry = load_models()
    model_types = {registry[split_shaped_name(model)[0]].model_type for model in remedy.cause_models}
    return ",".join(name for name, entry in registry.items() if entry.model_type in model_types)


REGISTRY = "registry"
"""The `--models` of the whole default matrix (every registry entry)."""


def cause_models_selection(remedy: Remedy) -> str:
    return ",".join(remedy.cause_models)


# ---- Patches ----------------------------------------------------------------------------------------------------


def sdist(release: str, cache: Path, download: Callable[[str, Path], None]) -> Path:
    """The PyPI sdist of DeepSpeed `release`, downloaded once into `cache` (`pip download --no-deps --no-binary`)."""
    folder = used(cache / "sdists" / f"deepspeed-{release}")
    found = sorted(folder.glob("deepspeed-*.tar.gz"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        download(release, folder)
        found = sorted(folder.glob("deepspeed-*.tar.gz"))
    if not found:
        raise PatchError(f"no sdist of deepspeed {release} was downloaded into {folder}")
    return found[0]


def pip_download(release: str, folder: Path) -> None:
    done = subprocess.run(
        [
            "python3",
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"deepspeed=={release}",
            "-d",
            str(folder),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise PatchError(f"pip download deepspeed=={release} failed: {done.stderr.strip()[-600:]}")


def patched_checkout(
    patches: tuple[Remedy, ...],
    root: Path,
    cache: Path | None = None,
    download: Callable[[str, Path], None] = pip_download,
) -> Path:
    """The release's sdist unpacked and committed (a git checkout, as the `deepspeed@<path>` axis needs), with each
    patch's diff applied and committed on top, in order (a remedy after the patches it requires); the same patches
    give the same folder again."""
    cache, release = cache or cache_root() / "remedies", patches[-1].deepspeed
    texts = [f"{patch.name}\n{patch.patch_path(root).read_text()}" for patch in patches]
    checkout = used(cache / "checkouts" / f"{'+'.join(patch.name for patch in patches)}-{release}")
    applied = checkout.with_name(f"{checkout.name}.applied.diff")  # beside the tree: the checkout stays clean
    if checkout.is_dir() and applied.exists() and applied.read_text() == "".join(texts):
        return checkout
    shutil.rmtree(checkout, ignore_errors=True)
    checkout.parent.mkdir(parents=True, exist_ok=True)
    # A folder of its own: two sessions building different stacks at once never unpack into each other's tree.
    unpacking = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=checkout.parent))
    with tarfile.open(sdist(release, cache, download)) as archive:
        top = archive.getnames()[0].split("/")[0]
        archive.extractall(unpacking, filter="data")
    (unpacking / top).rename(checkout)
    shutil.rmtree(unpacking)
    _commit(checkout, f"deepspeed {release}", ("init", "-q"))
    for index, patch in enumerate(patches):
        diff = patch.patch_path(root)
        try:
            check = run_git("apply", "--check", str(diff), folder=checkout)
        except GitFailed as failed:
            raise PatchError(str(failed)) from None
        if check.returncode:
            onto = f" with {', '.join(done.name for done in patches[:index])} applied" if index else ""
            raise PatchError(
                f"{patch.patch} does not apply to deepspeed {release}{onto} (git apply --check): {check.stderr.strip()}"
            )
        _commit(checkout, patch.name, ("apply", str(diff)))
    applied.write_text("".join(texts))
    return checkout


def _commit(checkout: Path, message: str, first: tuple[str, ...]) -> None:
    """`git <first>`, then everything in `checkout` committed as `message` by the harness; PatchError naming the
    command and git's words when one fails."""
    identity = ("-c", "user.name=autotp-matrix", "-c", "user.email=autotp@localhost")
    try:
        for args in (first, ("add", "-A"), (*identity, "commit", "-qm", message)):
            git_output(*args, folder=checkout)
    except GitFailed as failed:
        raise PatchError(str(failed)) from None


def how_text(remedy: Remedy, root: Path) -> str:
    """What a user passes (workaround) or the diff (patch), as a draft issue quotes it."""
    if remedy.kind == "patch":
        return remedy.patch_path(root).read_text()
    return remedy.arguments.describe()


# ---- The command ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Runs:
    """How the session runs one selection of cells into a folder (the nox glue, sessions/nox_sessions.py): `pins`
    are AUTOTP_PINS-style axis overrides (a patched DeepSpeed), `remedy` the --remedy name ("" for none)."""

    run: Callable[[Path, str, str, dict[str, str], str], None]
    """(results folder, --models, --remedy, pins, session name) -> None, cells recorded in the folder."""
    extra: tuple[str, ...] = ()


def remedy_options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="nox -s remedy --", allow_abbrev=False)
    parser.add_argument(
        "--cause",
        help="remedy names or causes' model ids (ctrl.faithful, ctrl), comma-separated (one invocation shares one "
        "baseline); all when left out",
    )
    parser.add_argument("--results", default="results")
    return parser.parse_known_args(argv)


@dataclass(frozen=True)
class Baseline:
    """The cells without any remedy, shared by every remedy of one `nox -s remedy` (same harness, same versions):
    each selection is run once into one folder, and once the whole default matrix (`registry`) has run, every
    selection's verdicts are read from it, so verifying several patches runs the matrix without them once."""

    runs: Runs
    folder: Path
    """Where every run without a remedy records (`<results>/remedy/without`), emptied when the invocation starts."""
    ran: set[str] = field(default_factory=set)
    """The `--models` selections run so far."""
    spent: list[float] = field(default_factory=list)
    """Each run's wall seconds."""
    pins: dict[str, str] = field(default_factory=dict)
    """Axis pins of every run (a stacked remedy's required patches); none for the release itself."""
    name: str = WITHOUT_SESSION
    """The runs' session name in the history."""

    def verdicts(self, models: str, log: Callable[[str], None]) -> dict[str, str]:
        """The verdicts of the cells `--models <models>` selects, without any remedy (run now unless already run)."""
        if models not in self.ran and REGISTRY not in self.ran:
            started = time.monotonic()
            self.runs.run(self.folder, models, "", self.pins, self.name)
            self.spent.append(time.monotonic() - started)
            self.ran.add(models)
            shared = " (once, shared by every remedy)" if models == REGISTRY else ""
            log(f"without any remedy: {models} run{shared}; {self.spent[-1]:.0f} s")
        return {cell: verdict for cell, verdict in verdicts(self.folder).items() if selects(models, cell)}

    def rerun(self, models: str, log: Callable[[str], None]) -> None:
        """The cells `--models <models>` selects once more without any remedy; their new records are the ones read."""
        started = time.monotonic()
        self.runs.run(self.folder, models, "", self.pins, self.name)
        self.spent.append(time.monotonic() - started)
        log(f"without any remedy: {models} run again; {self.spent[-1]:.0f} s")


def one_sided_skips(without: dict[str, str], with_it: dict[str, str]) -> str:
    """The `--models` selection of the cells that skipped, or have no record, in one of the two runs only: the memory
    plan skips a cell when the machine is short of free RAM at that moment (suites/reference/memory_plan.py), so such a
    change says nothing about the remedy until the cell runs again ("" when there is none)."""
    cells = {
        cell
        for cell in without.keys() | with_it.keys()
        if (without.get(cell, "skip") == "skip") != (with_it.get(cell, "skip") == "skip")
    }
    return ",".join(sorted({cell.rsplit("-", 3)[0] for cell in cells}))


def selects(models: str, cell: str) -> bool:
    """Whether `--models <models>` runs `cell`: `registry` every cell; a model id (`ctrl.faithful`) its cells; an
    entry name (`ctrl`, no shape) its cells at every shape (entry names hold no `.` or `-`)."""
    if models == REGISTRY:
        return True
    entry = re.match(r"[^.-]+", cell)
    return any(
        cell.startswith(f"{model}-") or (entry is not None and "." not in model and entry[0] == model)
        for model in models.split(",")
    )


def verify(
    remedy: Remedy,
    runs: Runs,
    baseline: Baseline,
    results: Path,
    root: Path,
    log: Callable[[str], None],
    sdists: Path | None = None,
    download: Callable[[str, Path], None] = pip_download,
    required: tuple[Remedy, ...] = (),
) -> RemedyResult:
    """One remedy: its cause models' cells without it (`baseline`) and with it; only when every cause cell passes
    with it, the whole scope without (`baseline`, run once for every remedy) and with it (a remedy that does not fix
    its cause costs one small run); judged by `judge`. Its seconds leave out the shared baseline's runs. A patch's
    sdist comes from `sdists` (default: the harness cache's), fetched by `download` when missing. `required`: the
    patches it requires (matrix/remedies.py `required_patches`), applied to both runs: "without it" is then the
    release with them (a baseline of its own, its seconds counted) and "with it" the release with them and it."""
    started, shared_before, shared = time.monotonic(), sum(baseline.spent), baseline
    folder, scope, causes_selection = (
        results / "remedy" / remedy.name,
        scope_models(remedy),
        cause_models_selection(remedy),
    )

    def own_seconds() -> float:
        return time.monotonic() - started - (sum(shared.spent) - shared_before)

    with_remedy = remedy.name if remedy.kind == "workaround" else ""
    stack = (*required, remedy) if remedy.kind == "patch" else required
    required_names = tuple(r.name for r in required)
    name, base = remedy_session((*required_names, remedy.name)), "+".join(required_names)
    try:
        how = how_text(remedy, root)
        pins = {"deepspeed": f"deepspeed@{patched_checkout(stack, root, sdists, download)}"} if stack else {}
        if required:
            base_pins = {"deepspeed": f"deepspeed@{patched_checkout(required, root, sdists, download)}"}
            baseline = Baseline(runs, folder / "without", pins=base_pins, name=remedy_session(required_names))
    except PatchError as error:  # nothing runs: no cell of an unpatched DeepSpeed is taken for a patched one's
        return judge(remedy, {}, {}, own_seconds(), "", str(error), required)
    log(
        f"remedy {remedy.name}: its cause models ({causes_selection}) without it"
        + (f" ({base} applied)" if base else "")
    )
    without = baseline.verdicts(causes_selection, log)
    causes = cause_cells(remedy, without)
    log(f"remedy {remedy.name}: its cause cells ({', '.join(causes) or 'none'}) with it")
    runs.run(folder / "with", causes_selection, with_remedy, pins, name)
    with_it = verdicts(folder / "with")
    if causes and all(with_it.get(cell) == "pass" for cell in causes):
        log(f"remedy {remedy.name}: every cause cell passes; its whole scope ({scope}) without and with it")
        without = baseline.verdicts(scope, log)
        runs.run(folder / "with", scope, with_remedy, pins, name)
        with_it = verdicts(folder / "with")
        if again := one_sided_skips(without, with_it):
            log(
                f"remedy {remedy.name}: cells skipped or not recorded in one run only (a machine short of memory"
                f" skips a cell; a remedy does not): their models ({again}) once more without and with it"
            )
            baseline.rerun(again, log)
            runs.run(folder / "with", again, with_remedy, pins, name)
            without, with_it = baseline.verdicts(scope, log), verdicts(folder / "with")
    return judge(remedy, without, with_it, own_seconds(), how, required=required, taken_at=taken_at(baseline.folder))


def run_all(argv: list[str], runs: Runs, root: Path, log: Callable[[str], None]) -> list[RemedyResult]:
    args, _ = remedy_options(argv)
    remedies = load_remedies(REMEDIES_FILE, root)
    chosen = {
        remedy.name for cause in (args.cause or "").split(",") if cause for remedy in remedies_for(cause, remedies)
    }
    picked = [remedy for remedy in remedies if remedy.name in chosen] if args.cause else remedies
    baseline = Baseline(runs, Path(args.results) / "remedy" / "without")
    shutil.rmtree(baseline.folder, ignore_errors=True)  # this invocation's harness and versions, never an older one's
    results: list[RemedyResult] = []
    for index, remedy in enumerate(picked, 1):
        log(f"remedy {index} of {len(picked)}: {remedy.name}")
        required = required_patches(remedy, remedies)
        results.append(verify(remedy, runs, baseline, Path(args.results), root, log, required=required))
        log(progress_line(results[-1]))
        write_results(Path(args.results) / RESULTS_NAME, results)
    if baseline.spent:
        log(
            f"runs without any remedy: {len(baseline.spent)}, {sum(baseline.spent):.0f} s in all, shared by every "
            f"remedy"
        )
    return results

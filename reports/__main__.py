"""Command line: `python -m reports {merge,rebuild,verify,render,gate,publish,draft-issue} ...` (see --help of each)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from matrix.redaction import redact
from matrix.registry import KNOWN_FAILURES_FILE, RegistryError, load_known_failures
from reports import ReportsError
from reports.answers import plain_link
from reports.archive import ArchiveConflict, ResultsArchive, answer_key, default_archive, needed_paths
from reports.records import Bisection, CellResult, Run
from reports.docs import check_drift, model_families, model_support
from reports.draft_issue import draft_issue as write_draft
from reports.failing_now import failing_now_markdown
from reports.gate import blocking, compare, format_table, select
from reports.git import GitRepo
from reports.history import analyse, analyse_aggregates
from reports.junit import find_junit_files, read_junit
from reports.pr_failures import cause_lines, classify, summary_line
from reports.publish import inert
from reports.publish import publish as publish_deltas
from reports.model import build_report
from reports.render import write_outputs, writing_to
from reports.store import DEFAULT_STORE, KEEP_RECENT_RUNS, HistoryStore, StoreConflict
from suites.outcome import FAILURE_CLASSES


def _run_count(text: str) -> int:
    """--keep-recent-runs: a whole number of runs, at least 1 (publish and draft-issue read the newest run's detail)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs; give a whole number of 1 or more")
    return int(text)


def merge(args: argparse.Namespace) -> int:
    """Exit 0 only when something usable was read and nothing contradicts the archive or the store: a folder of
    truncated files must not look like a night whose results were all known already."""
    files = find_junit_files(args.inputs)
    archive = ResultsArchive(args.archive or default_archive(args.store))
    readable, skipped = [], []
    for path in files:
        try:
            readable.append((path, read_junit(path)))
        except ReportsError as exc:  # one bad file must not stop the others
            skipped.append(str(exc))
    for reason in skipped:
        print(f"skipped {reason}", file=sys.stderr)
    if not readable:
        found = f"all {len(files)} file(s) were skipped (above)" if files else "no JUnit (*.xml) file in them"
        raise ReportsError(
            f"nothing to import from {' '.join(map(str, args.inputs))}: {found}; {args.store} is "
            "unchanged — pass the session's junit/ folder or the downloaded artifacts"
        )
    runs = results = imported = archived = 0
    conflicts = []
    with HistoryStore(args.store, create=True) as store:
        for path, file_runs in readable:
            try:
                archived += len(archive.add(path, file_runs))  # first: the archive is what the store is rebuilt from
                counts = store.import_runs(file_runs, source=path)
            except (ArchiveConflict, StoreConflict) as exc:
                conflicts.append(str(exc))
                continue
            imported += 1
            runs += counts.new_runs
            results += counts.new_results
        answers = archive.add_answers([*store.bisections(), *store.triage_attempts()])  # bisect/triage since
        store.compact(args.keep_recent_runs)  # old results keep their verdict only (reports/README.md "Compaction")
    for conflict in conflicts:
        print(f"conflict {conflict}", file=sys.stderr)
    print(f"{args.store}: {runs} new run(s), {results} new result(s) from {imported} file(s); {len(skipped)} skipped")
    print(f"{archive.root}: {archived} new archive entr{'y' if archived == 1 else 'ies'}, {answers} new answer(s)")
    if conflicts:
        raise ReportsError(
            f"{len(conflicts)} file(s) contradict runs already in {args.store} or its archive (above) "
            "and were not imported"
        )
    return 0


def rebuild(args: argparse.Namespace) -> int:
    """Import every archive entry the store lacks: a new store gets the whole history, a stale one (an older
    cache) the runs merged since. A first attempt whose run is stored is skipped unread (all-or-nothing imports)."""
    archive = ResultsArchive(args.archive or default_archive(args.store))
    entries = archive.entries()
    runs = results = read = 0
    with HistoryStore(args.store, create=True) as store:
        stored = {run.run_id for run in store.runs()}
        for entry in entries:
            if entry.attempt == 1 and entry.run_id in stored:
                continue
            counts = store.import_runs([archive.read(entry)], source=entry.path)
            read += 1
            runs += counts.new_runs
            results += counts.new_results
        known = {answer_key(answer) for answer in [*store.bisections(), *store.triage_attempts()]}
        answers = [answer for answer in archive.answers() if answer_key(answer) not in known]
        for answer in answers:
            (store.add_bisection if isinstance(answer, Bisection) else store.add_triage_attempt)(answer)
        store.compact(args.keep_recent_runs)
    print(
        f"{args.store}: {runs} new run(s), {results} new result(s) from {read} of {len(entries)} archive "
        f"entries in {archive.root}, {len(answers)} new answer(s)"
    )
    return 0


def archive_needs(args: argparse.Namespace) -> int:
    """Print the archive entries (of the names listed in --names) that merging INPUTS into the store needs read:
    the data branch is then checked out sparsely (.github/scripts/results-archive.sh fetch STORE INPUTS)."""
    try:
        names = args.names.read_text().split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportsError(
            f"{args.names}: cannot read the archive's entry names ({exc}); pass `git ls-tree` output"
        ) from None
    incoming = {run.run_id for path in find_junit_files(args.inputs) for run, _ in _readable_runs(path)}
    with HistoryStore(args.store, create=False, read_only=True) as store:
        stored = {run.run_id for run in store.runs()}
    print("".join(f"{name}\n" for name in needed_paths(names, stored, incoming)), end="")
    return 0


def _readable_runs(path: Path) -> list[tuple[Run, list[CellResult]]]:
    """The runs of a JUnit file, none when merge would skip it (it says why then)."""
    try:
        return read_junit(path)
    except ReportsError:
        return []


def verify(args: argparse.Namespace) -> int:
    """Exit 1 when the store holds a run or an answer the archive lacks: a lost store would lose it."""
    archive = ResultsArchive(args.archive or default_archive(args.store))
    archived_runs = {entry.run_id for entry in archive.entries()}
    archived_answers = {answer_key(answer) for answer in archive.answers()}
    with HistoryStore(args.store, create=False, read_only=True) as store:
        runs = [run.run_id for run in store.runs()]
        answers = [answer_key(answer) for answer in [*store.bisections(), *store.triage_attempts()]]
    missing_runs = [run_id for run_id in runs if run_id not in archived_runs]
    missing_answers = [key for key in answers if key not in archived_answers]
    if missing_runs or missing_answers:
        shown = ", ".join(missing_runs[:3]) + (", ..." if len(missing_runs) > 3 else "")
        print(
            f"error: {args.store}: {len(missing_runs)} run(s) ({shown}) and {len(missing_answers)} answer(s) are "
            f"not in the archive {archive.root}, so a lost store would lose them; merge the runs' JUnit files "
            f"again with `python -m reports merge FILES --store {args.store}` (it archives them and the answers)",
            file=sys.stderr,
        )
        return 1
    print(f"{args.store}: all {len(runs)} run(s) and {len(answers)} answer(s) are in the archive {archive.root}")
    return 0


@contextmanager
def without_cycle_collection():
    """Render builds its objects (~1 M at a year: groups, statuses, the report's dicts) to keep them until it ends,
    and makes next to no reference cycles; the cycle collector's full passes walk every one of them again as they
    grow, ~0.7 s of render's CPU at a year for nothing (peak memory the same). Reference counting still frees what
    is dropped."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def render(args: argparse.Namespace) -> int:
    with without_cycle_collection():
        return _render(args)


def _render(args: argparse.Namespace) -> int:
    repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    with HistoryStore(args.store, create=False, read_only=True) as store:
        aggregates = store.aggregates()
        history = analyse_aggregates(aggregates, repo, store.bisections(), store.triage_attempts())
    drift = check_drift(model_support(history, model_families()), args.docs) if args.docs else None
    report = build_report(history, aggregates, drift, known_failures(args.known_failures))
    for path in write_outputs(report, history, drift, args.out):
        print(f"wrote {path}")
    # The first section, where a run ends (`nox -s matrix`), from the report just written (not read back from its
    # 23 MB of JSON at a year), redacted as the files are.
    print(redact("\n".join(failing_now_markdown(report, plain_link))), end="")
    if drift:
        print(
            f"docs drift: {len(drift.listed_but_failing)} listed but failing, "
            f"{len(drift.passing_but_unlisted)} passing but unlisted"
        )
    return 0


def draft_issue(args: argparse.Namespace) -> int:
    repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    with HistoryStore(args.store, create=False, read_only=True) as store:
        observations = store.observations()
        history = analyse(observations, repo, store.bisections(), store.triage_attempts())
    with writing_to(args.out):
        draft = write_draft(
            history,
            observations,
            known_failures(args.known_failures),
            cause=args.cause,
            cell=args.cell,
            out_dir=args.out,
            inert=inert,
        )
    print(f"# {draft.title}\n\n{draft.body}")
    print(f"wrote {draft.file}", file=sys.stderr)
    return 0


def known_failures(path: Path):
    try:
        return load_known_failures(FAILURE_CLASSES, path)
    except RegistryError as error:
        raise ReportsError(str(error)) from None


def gate(args: argparse.Namespace) -> int:
    with HistoryStore(args.store, create=False, read_only=True) as store:
        observations = store.observations()
    if not observations:
        raise ReportsError(
            f"{args.store}: the history store holds no results, so there is nothing to gate on; "
            "import the baseline's and the candidate's runs with `python -m reports merge` first"
        )
    baseline, candidate = (
        select(observations, args.baseline, "--baseline"),
        select(observations, args.candidate, "--candidate"),
    )
    rows = compare(baseline, candidate, args.confirmations)
    # What the candidate did, like Dr.CI: the count first, then its failures by cause, new ones first.
    failures = classify(baseline, candidate, analyse(observations), known_failures(args.known_failures))
    print(redact("\n".join([summary_line(failures), *cause_lines(failures, plain_link), ""])))
    print(redact(format_table(rows, args.confirmations, args.block_changed)))
    return 1 if blocking(rows, args.block_changed) else 0


def publish(args: argparse.Namespace) -> int:
    repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    with HistoryStore(args.store, create=False, read_only=True) as store:
        observations, bisections, attempts = store.observations(), store.bisections(), store.triage_attempts()
    known = known_failures(args.known_failures) if args.base or args.upstream else {}
    for path in publish_deltas(
        observations,
        bisections,
        attempts,
        args.session,
        args.out,
        repo=args.repo,
        pr=args.pr,
        deepspeed_repo=repo,
        base=args.base,
        known=known,
        upstream=args.upstream,
    ):
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reports", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    store_option: dict[str, Any] = {
        "type": Path,
        "default": DEFAULT_STORE,
        "help": f"history store (default {DEFAULT_STORE})",
    }
    archive_help = "results archive, every merged run's raw results (default: archive/ next to --store)"
    keep_option: dict[str, Any] = {
        "type": _run_count,
        "default": KEEP_RECENT_RUNS,
        "metavar": "N",
        "help": f"keep messages and metrics of each session's newest N runs (default {KEEP_RECENT_RUNS}); "
        "older results keep their verdict and signature, and their detail where a report reads it",
    }

    merge_parser = commands.add_parser(
        "merge", help="import JUnit files into the history store and the results archive"
    )
    merge_parser.add_argument("inputs", nargs="+", type=Path, help="JUnit files, results/ or artifact folders")
    merge_parser.add_argument("--store", **store_option)
    merge_parser.add_argument("--archive", type=Path, help=archive_help)
    merge_parser.add_argument("--keep-recent-runs", **keep_option)
    merge_parser.set_defaults(handler=merge)

    needs_parser = commands.add_parser(
        "archive-needs",
        help="the archive entries merging INPUTS into --store reads (for a sparse checkout of the data branch)",
    )
    needs_parser.add_argument("inputs", nargs="+", type=Path, help="JUnit files, results/ or artifact folders")
    needs_parser.add_argument(
        "--names", type=Path, required=True, help="the archive's file names, one a line (git ls-tree -r --name-only)"
    )
    needs_parser.add_argument("--store", **store_option)
    needs_parser.set_defaults(handler=archive_needs)

    rebuild_parser = commands.add_parser(
        "rebuild", help="recreate the history store (or bring a stale one up to date) from the results archive"
    )
    rebuild_parser.add_argument("--archive", type=Path, help=archive_help)
    rebuild_parser.add_argument("--store", **store_option)
    rebuild_parser.add_argument("--keep-recent-runs", **keep_option)
    rebuild_parser.set_defaults(handler=rebuild)

    verify_parser = commands.add_parser(
        "verify", help="exit 1 when the store holds a run or answer the results archive lacks (it could not be rebuilt)"
    )
    verify_parser.add_argument("--archive", type=Path, help=archive_help)
    verify_parser.add_argument("--store", **store_option)
    verify_parser.set_defaults(handler=verify)

    render_parser = commands.add_parser("render", help="write report.md/.json/.html, supported-models.md, summary")
    render_parser.add_argument("--store", **store_option)
    render_parser.add_argument("--out", type=Path, default=Path("results"), help="output folder (default results/)")
    render_parser.add_argument(
        "--docs",
        type=Path,
        help="a copy of DeepSpeed's automatic-tensor-parallelism.md: report drift, "
        "write supported-models.diff against it",
    )
    render_parser.add_argument("--deepspeed-repo", type=Path, help="local DeepSpeed clone: commit order and PRs")
    render_parser.add_argument(
        "--known-failures",
        type=Path,
        default=KNOWN_FAILURES_FILE,
        help="failures known upstream (default matrix/known_failures.toml)",
    )
    render_parser.set_defaults(handler=render)

    gate_parser = commands.add_parser("gate", help="exit 1 if cells passing in the baseline fail in the candidate")
    gate_parser.add_argument("--baseline", required=True, help="run id, or version set like deepspeed=0.19.7")
    gate_parser.add_argument("--candidate", required=True, help="run id, or version set like deepspeed=0.19.8")
    gate_parser.add_argument(
        "--confirmations",
        type=int,
        default=1,
        help="a cell blocks only if it failed in this many candidate runs (default 1)",
    )
    gate_parser.add_argument(
        "--block-changed",
        action="store_true",
        help="also exit 1 when a cell failing in both fails in another class or signature "
        "(default: listed as 'changed failure', not blocking)",
    )
    gate_parser.add_argument(
        "--known-failures",
        type=Path,
        default=KNOWN_FAILURES_FILE,
        help="failures known upstream (default matrix/known_failures.toml)",
    )
    gate_parser.add_argument("--store", **store_option)
    gate_parser.set_defaults(handler=gate)

    publish_parser = commands.add_parser(
        "publish", help="PR comment and regression issues from the newest run vs the last nightly ($GITHUB_TOKEN)"
    )
    publish_parser.add_argument("--store", **store_option)
    publish_parser.add_argument(
        "--out", type=Path, default=Path("results"), help="output folder; texts go to OUT/publish/ (default results/)"
    )
    publish_parser.add_argument(
        "--session", action="append", help="session to compare with its previous run (repeatable; default all stored)"
    )
    publish_parser.add_argument(
        "--repo", default=os.environ.get("GITHUB_REPOSITORY"), help="OWNER/NAME to post to (default $GITHUB_REPOSITORY)"
    )
    publish_parser.add_argument("--pr", type=int, help="pull request (or issue) number that gets the comment")
    publish_parser.add_argument("--deepspeed-repo", type=Path, help="local DeepSpeed clone: list the commits in range")
    publish_parser.add_argument(
        "--base",
        help="a PR run's base (run id, or version set like deepspeed=0.19.8): the "
        "comment starts with the newest runs' failures classified against it",
    )
    publish_parser.add_argument(
        "--known-failures",
        type=Path,
        default=KNOWN_FAILURES_FILE,
        help="with --base or --upstream: failures known upstream (default matrix/known_failures.toml)",
    )
    publish_parser.add_argument(
        "--upstream",
        metavar="OWNER/NAME",
        help="also one bug report per cause of new regressions that no known failure covers, "
        "for this repository's tracker (e.g. deepspeedai/DeepSpeed): written to "
        "OUT/publish/upstream/, opened there with $GITHUB_TOKEN (off by default)",
    )
    publish_parser.set_defaults(handler=publish)

    draft_parser = commands.add_parser(
        "draft-issue",
        help="a Markdown bug report for DeepSpeed's tracker, for one cause failing at the latest versions",
    )
    which = draft_parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--cause", help="a cause id of report.json failing_now (the report lists them)")
    which.add_argument("--cell", help="a failing cell id at the latest versions, e.g. bloom-eager-fp32-tp2")
    draft_parser.add_argument("--store", **store_option)
    draft_parser.add_argument(
        "--out",
        type=Path,
        default=Path("results"),
        help="output folder; the report and its repro script go to OUT/draft-issue/",
    )
    draft_parser.add_argument(
        "--known-failures",
        type=Path,
        default=KNOWN_FAILURES_FILE,
        help="failures known upstream (default matrix/known_failures.toml)",
    )
    draft_parser.add_argument("--deepspeed-repo", type=Path, help="local DeepSpeed clone: commit order and PRs")
    draft_parser.set_defaults(handler=draft_issue)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ReportsError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""`python -m reports gate`: exit 1 if cells passing in the baseline fail in the candidate, or if the candidate has no
verdict for a cell the baseline has one for (what the gate never saw cannot pass it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from reports import ReportsError
from reports.analysis import baseline_lines, select, select_baseline, without_since_when
from reports.clones import GitRepo
from reports.commands.interface import Command
from reports.commands.options import add_known_failures, add_store, known_failures
from reports.outputs import check, check_history, commit_sha, commits_base_text, gate_text, select_commits
from reports.store import HistoryStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", help="run id, or version set like deepspeed=0.19.7 (a release gate)")
    parser.add_argument("--candidate", help="run id, or version set like deepspeed=0.19.8 (a release gate)")
    parser.add_argument(
        "--head",
        help="a pull request's check: its head commit (40 hex digits); the candidate is the runs that tested it",
    )
    parser.add_argument(
        "--merge-base",
        help="with --head: the merge base (40 hex digits); the baseline is the trusted runs (the nightly) of it",
    )
    parser.add_argument(
        "--deepspeed-repo",
        type=Path,
        help="with --merge-base: a DeepSpeed clone, so the merge base's nearest ancestor a trusted run tested is the "
        "baseline where no trusted run tested the merge base itself",
    )
    parser.add_argument(
        "--confirmations",
        type=int,
        default=1,
        help="a cell blocks only if it failed in this many candidate runs (default 1)",
    )
    parser.add_argument(
        "--block-changed",
        action="store_true",
        help="also exit 1 when a cell failing in both fails in another class or signature "
        "(default: listed as 'changed failure', not blocking)",
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="a baseline cell the candidate has no verdict for (skipped, not run, renamed) is named in one line "
        "instead of blocking",
    )
    add_known_failures(parser)
    add_store(parser)


def run(args: argparse.Namespace) -> int:
    commit_args, selector_args = (args.head, args.merge_base), (args.baseline, args.candidate)
    by_commits = all(commit_args) and not any(selector_args)
    if not by_commits and not (all(selector_args) and not any(commit_args)):
        raise ReportsError(
            "gate: pass --baseline and --candidate (a release gate), or --head and --merge-base (a pull request's "
            "check), not a mix"
        )
    with HistoryStore(args.store, create=False, read_only=True) as store:
        # A since-when run is one earlier point's example cells: never a side of a gate (reports.analysis.trust).
        observations = without_since_when(store.observations())
        remedies = store.remedy_results()
    if not observations:
        raise ReportsError(
            f"{args.store}: the history store holds no results, so there is nothing to gate on; "
            "import the baseline's and the candidate's runs with `python -m reports merge` first"
        )
    # The baseline comes from trusted runs only (reports.analysis.trust): a pull request's JUnit could label a run
    # with the baseline's versions. The candidate may be untrusted (a pull request's run is what is gated).
    commits = None
    if by_commits:
        repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
        head, merge_base = commit_sha(args.head, "--head"), commit_sha(args.merge_base, "--merge-base")
        baseline, candidate, commits = select_commits(observations, head, merge_base, repo)
        ignored: list[str] = []
        base_text = commits_base_text(commits, baseline)
    else:
        baseline, ignored_runs = select_baseline(observations, args.baseline, "--baseline")
        candidate = select(observations, args.candidate, "--candidate")
        ignored = baseline_lines(args.baseline, baseline, ignored_runs)[1:]
        base_text = baseline_lines(args.baseline, baseline, [])[0]
    pr = check(
        baseline,
        candidate,
        check_history(observations, candidate),
        known_failures(args.known_failures),
        base_text=base_text,
        commits=commits,
        confirmations=args.confirmations,
        # what `nox -s remedy` verified, merged into the store: a cause it proved is stated so here too
        remedies=remedies,
    )
    text, blocks = gate_text(
        pr, args.confirmations, block_changed=args.block_changed, allow_missing=args.allow_missing, ignored=ignored
    )
    print(text)
    return 1 if blocks else 0


COMMAND = Command("gate", "exit 1 if cells passing in the baseline fail in the candidate", add_arguments, run)

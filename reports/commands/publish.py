"""`python -m reports publish`: the PR comment and regression issues from the newest run vs the last nightly."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from reports import ReportsError
from reports.clones import GitRepo
from reports.commands.interface import Command
from reports.commands.options import add_known_failures, add_store, known_failures
from reports.outputs import MAX_ISSUES, commit_sha, publish_deltas, run_links
from reports.store import HistoryStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_store(parser)
    parser.add_argument(
        "--out", type=Path, default=Path("results"), help="output folder; texts go to OUT/publish/ (default results/)"
    )
    parser.add_argument(
        "--session", action="append", help="session to compare with its previous run (repeatable; default all stored)"
    )
    parser.add_argument(
        "--repo", default=os.environ.get("GITHUB_REPOSITORY"), help="OWNER/NAME to post to (default $GITHUB_REPOSITORY)"
    )
    parser.add_argument("--pr", type=int, help="pull request (or issue) number that gets the comment")
    parser.add_argument("--deepspeed-repo", type=Path, help="local DeepSpeed clone: list the commits in range")
    parser.add_argument(
        "--base",
        help="a PR run's base (run id, or version set like deepspeed=0.19.8): the "
        "comment starts with the newest runs' failures classified against it",
    )
    parser.add_argument(
        "--head",
        help="a pull request's check: its head commit (40 hex digits), with --merge-base; the comment says what the "
        "gate says (the runs of the head against the trusted runs of the merge base)",
    )
    parser.add_argument("--merge-base", help="with --head: the merge base (40 hex digits)")
    parser.add_argument(
        "--report-url",
        default="",
        help="the page of this workflow run's report artifact (report.html, every failing cell's logs), linked "
        "from the comment",
    )
    add_known_failures(parser, "with --base, --head or --upstream: ")
    parser.add_argument(
        "--upstream",
        metavar="OWNER/NAME",
        help="also one bug report per cause of new regressions that no known failure covers, "
        "for this repository's tracker (e.g. deepspeedai/DeepSpeed): written to "
        "OUT/publish/upstream/, opened there with $GITHUB_TOKEN (off by default)",
    )
    parser.add_argument(
        "--max-issues",
        type=_issue_count,
        default=MAX_ISSUES,
        metavar="N",
        help=f"issues one run opens or edits, regression issues then upstream reports (default {MAX_ISSUES}); the "
        "causes past N are listed in one summary issue",
    )


def _issue_count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of issues; give a whole number, 0 or more")
    return int(text)


def run(args: argparse.Namespace) -> int:
    repo = GitRepo(args.deepspeed_repo) if args.deepspeed_repo else None
    with HistoryStore(args.store, create=False, read_only=True) as store:
        observations, bisections, attempts = store.observations(), store.bisections(), store.triage_attempts()
        remedies = tuple(store.remedy_results())
    if bool(args.head) != bool(args.merge_base) or (args.head and args.base):
        raise ReportsError("publish: pass --head with --merge-base (a pull request's check), or --base, not a mix")
    commits = (commit_sha(args.head, "--head"), commit_sha(args.merge_base, "--merge-base")) if args.head else None
    known = known_failures(args.known_failures) if args.base or args.head or args.upstream else {}
    for path in publish_deltas(
        observations,
        bisections,
        attempts,
        sessions=args.session,
        out_dir=args.out,
        repo=args.repo,
        pr=args.pr,
        deepspeed_repo=repo,
        base=args.base,
        commits=commits,
        known=known,
        upstream=args.upstream,
        max_issues=args.max_issues,
        links=run_links(os.environ, args.report_url),
        remedies=remedies,
    ):
        print(f"wrote {path}")
    return 0


COMMAND = Command(
    "publish",
    "PR comment and regression issues from the newest run vs the last nightly ($GITHUB_TOKEN)",
    add_arguments,
    run,
)

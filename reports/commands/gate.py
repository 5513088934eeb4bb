"""`python -m reports gate`: exit 1 if cells passing in the baseline fail in the candidate."""

from __future__ import annotations

import argparse

from reports import ReportsError
from reports.analysis import analyse, baseline_lines, blocking, compare, plain_link, select, select_baseline
from reports.commands.interface import Command
from reports.commands.options import add_known_failures, add_store, known_failures
from reports.outputs import cause_lines, classify, format_table, summary_line
from reports.store import HistoryStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", required=True, help="run id, or version set like deepspeed=0.19.7")
    parser.add_argument("--candidate", required=True, help="run id, or version set like deepspeed=0.19.8")
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
    add_known_failures(parser)
    add_store(parser)


def run(args: argparse.Namespace) -> int:
    with HistoryStore(args.store, create=False, read_only=True) as store:
        observations = store.observations()
    if not observations:
        raise ReportsError(
            f"{args.store}: the history store holds no results, so there is nothing to gate on; "
            "import the baseline's and the candidate's runs with `python -m reports merge` first"
        )
    # The baseline comes from trusted runs only (reports.analysis.trust): a pull request's JUnit could label a run
    # with the baseline's versions. The candidate may be untrusted (a pull request's run is what is gated).
    baseline, ignored = select_baseline(observations, args.baseline, "--baseline")
    candidate = select(observations, args.candidate, "--candidate")
    rows = compare(baseline, candidate, args.confirmations)
    # What the candidate did, like Dr.CI: the count first, then its failures by cause, new ones first; the history
    # that says what is flaky is the trusted runs' and the candidate's.
    candidate_runs = {obs.run for obs in candidate}
    history = analyse([obs for obs in observations if obs.run.trusted or obs.run in candidate_runs])
    failures = classify(baseline, candidate, history, known_failures(args.known_failures))
    print("\n".join([summary_line(failures), *baseline_lines(args.baseline, baseline, ignored)]))
    print("\n".join([*cause_lines(failures, plain_link), ""]))
    print(format_table(rows, args.confirmations, args.block_changed))
    return 1 if blocking(rows, args.block_changed) else 0


COMMAND = Command("gate", "exit 1 if cells passing in the baseline fail in the candidate", add_arguments, run)

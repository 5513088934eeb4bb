"""Command line: `python -m reports <verb> ...` — merge, archive-needs, rebuild, verify, render, gate, publish,
draft-issue, bisect, triage (see --help of each; reports/commands/ has one module per verb)."""

from __future__ import annotations

import argparse
import sys

from matrix.redaction import redact
from matrix.versions import ReleaseDataUnavailable
from reports import ReportsError
from reports.commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reports", description=__doc__)
    verbs = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        verb = verbs.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(verb)
        verb.set_defaults(handler=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (ReportsError, ReleaseDataUnavailable) as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

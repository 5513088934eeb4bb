"""Command line: `python -m reports <verb> ...` — merge, archive-needs, rebuild, verify, render, gate, publish,
draft-issue, bisect, triage (see --help of each; reports/commands/ has one module per verb).

Several verbs run in one process when `--then` separates them, each only after the one before exited 0 (as `&&`
would): `python -m reports merge results/junit --then render --out results`. Each is parsed before any runs (a
usage error stops them all first), and the process starts, imports the reports and loads the redaction library
once, not once a verb: `nox -s matrix` merges and renders this way."""

from __future__ import annotations

import argparse
import io
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from matrix.disk_space import disk_full_at, disk_full_line
from matrix.redaction import Redactor
from matrix.releases import ReleaseDataUnavailable
from reports import ReportsError
from reports.commands import COMMANDS
from reports.outputs import visible


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


class _Redacting(io.TextIOBase):
    """A text stream that passes what is written through the redactor before the stream it wraps, its bidirectional
    and zero-width characters shown by name (a CI log is read too)."""

    def __init__(self, stream: TextIO, redactor: Redactor) -> None:
        self._stream = stream
        self._redact = redactor

    def write(self, text: str) -> int:
        self._stream.write(visible(self._redact(text)))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


@contextmanager
def redacted_output() -> Iterator[None]:
    """Everything a command prints (its own lines, messages naming values of the results, what it quotes) leaves
    through the redactor of this environment: one door for every verb's output. print() writes each argument
    whole, so a secret is never split between two writes."""
    redactor = Redactor()
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Redacting(sys.stdout, redactor), _Redacting(sys.stderr, redactor)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


THEN = "--then"
"""The word between two verbs run in one process."""


def verbs(argv: list[str]) -> list[list[str]]:
    """The command line cut at each `--then` into the verbs' own arguments."""
    cut = [index for index, word in enumerate(argv) if word == THEN]
    return [argv[start + 1 : end] for start, end in zip([-1, *cut], [*cut, len(argv)])]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    commands = [parser.parse_args(words) for words in verbs(sys.argv[1:] if argv is None else argv)]
    with redacted_output():
        for args in commands:
            if status := run_command(args):
                return status
    return 0


def run_command(args: argparse.Namespace) -> int:
    """One verb, its ReportsError (and a full disk) said in a line with exit 2."""
    try:
        return int(args.handler(args))
    except (ReportsError, ReleaseDataUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error) as exc:  # a full disk is the machine's, said in a line, not a traceback
        if (full := disk_full_at(exc)) is None:
            raise
        then = "run the same command again (the store rolled its last transaction back; the archive keeps whole files)"
        print(f"error: {disk_full_line(full, then)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

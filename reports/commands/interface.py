"""What a verb of `python -m reports` is: its name, its help, the arguments it registers and what it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    """The verb on the command line: `python -m reports <name>`."""
    help: str
    """One line in `python -m reports --help`."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Registers the verb's own options on its subparser."""
    run: Callable[[argparse.Namespace], int]
    """Does the work; returns the exit status. A ReportsError it raises becomes `error: …` and exit 2."""
    description: str = ""
    """The long text of `python -m reports <name> --help` (default: help)."""

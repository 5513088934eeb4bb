"""History, attribution and reports for autotp-matrix results.

Consumes the JUnit files described in README.md "Results", keeps every run in an
append-only SQLite history store and renders support matrices, regressions and gates.
"""

from collections.abc import Callable

Log = Callable[[str], None]
"""Where a command says what it did, a line at a time (print, or a test's list.append)."""


class ReportsError(Exception):
    """A user-facing error: the message names the file or value and what to do."""

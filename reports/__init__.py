"""History, attribution and reports for autotp-matrix results.

Consumes the JUnit files described in README.md "Results", keeps every run in an
append-only SQLite history store and renders support matrices, regressions and gates.
"""


class ReportsError(Exception):
    """A user-facing error: the message names the file or value and what to do."""

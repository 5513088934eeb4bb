"""Which runs may speak for the history: a pull request's runs (`merge --untrusted`) are its own results, never a
baseline, never the previous run a newer one is compared with, never a flaky verdict at versions it does not run.
A pull request's code writes its own JUnit, so it could label a run as the baseline's versions or as another session:
only trusted runs (scheduled and dispatched runs on the default branch, or a person's own merge) are history.

A since-when run (`nox -s since-when`) is trusted history too, but of another kind: one earlier point, the new causes'
example cells only. It says since when a cause fails (reports.analysis.since_when) and is never compared: not the
previous run of a nightly, not a session of "Since the previous run" or of the step summary, not a gate's baseline
or candidate, not the base of a pull request's check."""

from __future__ import annotations

from collections.abc import Collection

from reports import ReportsError
from reports.analysis.comparison import select
from reports.store import Observation, Run

SINCE_WHEN_SESSION = "since-when"
"""The session a since-when run is recorded under (reports.search.since_when)."""


def without_since_when(observations: list[Observation]) -> list[Observation]:
    """The observations of every run but since-when's: what a comparison between runs may use."""
    return [obs for obs in observations if obs.run.session != SINCE_WHEN_SESSION]


def select_baseline(observations: list[Observation], selector: str, option: str) -> tuple[list[Observation], list[Run]]:
    """The baseline's observations, of trusted runs only, and the untrusted runs the selector also matched (left
    out, and named where the baseline is). A run id of an untrusted run is refused."""
    untrusted = [obs for obs in observations if not obs.run.trusted]
    if any(obs.run.run_id == selector for obs in untrusted):
        raise ReportsError(
            f"{option} {selector!r}: a pull request's run (merged --untrusted) is never a baseline; pass a trusted "
            "run or a version set"
        )
    baseline = select([obs for obs in observations if obs.run.trusted], selector, option)
    matched = set()
    if "=" in selector:
        try:
            matched = {obs.run for obs in select(untrusted, selector, option)}
        except ReportsError:
            pass  # no untrusted run at these versions
    return baseline, sorted(matched, key=lambda run: (run.started, run.run_id))


def trusted_history(observations: list[Observation], sessions: Collection[str] | None) -> list[Observation]:
    """The observations a comparison of each session's newest run with its previous one may use: every trusted run,
    and the newest run of each of these sessions (all sessions when None) where that one is untrusted (a pull
    request's run, the one being reported on). Older untrusted runs are left out, so a newest run is never compared
    with a pull request's run, nor judged flaky by one."""
    newest: dict[str, Run] = {}
    for obs in observations:
        if sessions is None or obs.run.session in sessions:
            known = newest.get(obs.run.session)
            if known is None or (obs.run.started, obs.run.run_id) > (known.started, known.run_id):
                newest[obs.run.session] = obs.run
    reported = {run for run in newest.values() if not run.trusted}
    return [obs for obs in observations if obs.run.trusted or obs.run in reported]


def baseline_lines(selector: str, baseline: list[Observation], ignored: list[Run]) -> list[str]:
    """Which runs the baseline is, and which runs at its versions were left out as untrusted."""
    runs = sorted({obs.run for obs in baseline}, key=lambda run: (run.started, run.run_id))
    lines = [f"baseline {selector}: {len(runs)} trusted run(s): {', '.join(run.run_id for run in runs)}"]
    if ignored:
        lines.append(
            f"left out of the baseline: {len(ignored)} untrusted run(s) at these versions (a pull request's): "
            + ", ".join(run.run_id for run in ignored)
        )
    return lines

"""Which release, commit and PR changed a cell: bisection of one cell, triage of every open transition.

Other rooms import these names from here; modules inside the room import each other directly."""

from reports.search.bisect import (
    BisectRequest,
    bisect_cell,
)
from reports.search.since_when import (
    SinceWhenPlan,
    plan_since_when,
    run_since_when,
)
from reports.search.steps import (
    END_REPEATS,
)
from reports.search.triage import (
    DEEPSPEED_REPO_ENV,
    TRANSFORMERS_REPO_ENV,
    Budget,
    Triage,
    real_installer,
)

__all__ = [
    "BisectRequest",
    "Budget",
    "SinceWhenPlan",
    "DEEPSPEED_REPO_ENV",
    "END_REPEATS",
    "TRANSFORMERS_REPO_ENV",
    "Triage",
    "bisect_cell",
    "plan_since_when",
    "real_installer",
    "run_since_when",
]

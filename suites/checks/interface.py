"""What a check is: a function of one `CheckInputs` record (everything rank 0 holds when it judges a cell) that returns
its results, and the `Check` entry that says when it applies. `suites/checks/judge.py` `CHECKS` lists every entry, in
the order a cell's first failing check decides its class; inference, variant and training checks alike go through it,
so a new check is its module, its line in `CHECKS` and its name in suites/verdicts/check_names.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from matrix.registry import Tolerance

if TYPE_CHECKING:
    import torch

    from suites.checks.contracts import RankSummary, UnshardedSteps
    from suites.checks.probes import Observations, SplitCounts
    from suites.checks.result import CheckResult
    from suites.verdicts.check_names import CheckName


@dataclass(frozen=True)
class CheckInputs:
    """What rank 0 holds when it judges a cell, gathered once (suites/engine/cell_runner.py `_judge`)."""

    tolerance: Tolerance
    """The cell's dtype's tolerance (matrix/registry.py `DEFAULT_TOLERANCES`, or the model's own)."""
    ranks: tuple[RankSummary, ...]
    """What every rank handed rank 0, in rank order."""
    reference: Observations | None = None
    """An inference cell's unsharded observations (a quantized variant's: the quantized reference); None: training."""
    sharded: Observations | None = None
    """Rank 0's observations of the sharded model; None: training."""
    perplexity_skipped: str = ""
    """Why the model cannot run the perplexity probe ("" when it ran)."""
    real_counts: SplitCounts | None = None
    """A faithful cell's real checkpoint's counts, which the memory check's allowance is made of."""
    meta_load: bool = False
    """A meta variant: init_inference loaded a checkpoint json (older releases then split the output head), and the
    load's peak is checked against the model's size."""
    deepspeed_release: tuple[int, ...] | None = None
    """The DeepSpeed release an inference cell sharded with, whose design decides whether the output head splits
    (None: no output-head rule)."""
    load_peak_growth: float = 0.0
    """The largest rank's peak RSS growth from before loading to the end of sharding, in bytes."""
    baseline: Observations | None = None
    """A quantized variant's fp32 unsharded observations, which the relaxed checks compare with."""
    accuracy_reference: tuple[bool, ...] | None = None
    """An accuracy task's unsharded answers (right or wrong per item); None: the cell runs no task."""
    task_correct: tuple[bool, ...] | None = None
    """Rank 0's answers to the same items."""
    unsharded_steps: tuple[UnshardedSteps, ...] = ()
    """A training cell's unsharded steps per trained model (the cell's own first); empty: inference."""

    def inference(self) -> tuple[Observations, Observations]:
        """The reference's and rank 0's observations, which an inference check compares."""
        if self.reference is None or self.sharded is None:
            raise ValueError("an inference check was given no reference or no observations (a harness bug)")
        return self.reference, self.sharded

    def last_logits(self) -> list[torch.Tensor]:
        """Every rank's last-position logits of an inference cell."""
        found = [rank.last_logits for rank in self.ranks if rank.last_logits is not None]
        if len(found) != len(self.ranks):
            raise ValueError("a rank of an inference cell handed rank 0 no last_logits (a harness bug)")
        return found

    def bytes_by_name(self) -> list[dict[str, int]]:
        """The bytes every rank holds of each tensor of an inference cell."""
        found = [rank.bytes_by_name for rank in self.ranks if rank.bytes_by_name is not None]
        if len(found) != len(self.ranks):
            raise ValueError("a rank of an inference cell handed rank 0 no bytes_by_name (a harness bug)")
        return found


class CheckFunction(Protocol):
    def __call__(self, inputs: CheckInputs) -> list[CheckResult]: ...


Role = Literal["gate", "compare", "variant"]
"""`gate`: when it fails nothing else can be compared (a NaN reference, outputs of the wrong shape), so the `compare`
checks after it do not run; `compare`: compares the sharded model's outputs with the reference's; `variant`: a
variant's own check, run whenever it applies."""


@dataclass(frozen=True)
class Check:
    names: tuple[CheckName, ...]
    """The names its results carry (suites/verdicts/check_names.py), in the order it returns them."""
    role: Role
    applies: Callable[[CheckInputs], bool]
    """Whether the cell is one this check judges."""
    run: CheckFunction


def inference(inputs: CheckInputs) -> bool:
    return not inputs.unsharded_steps

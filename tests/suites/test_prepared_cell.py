"""A cell is prepared once (#41): a trace of real cells, with counting wrappers around what resolves a checkpoint,
hashes its files and plans memory, shows each cell's checkpoint resolved once (its identity read then, never again
from its path), each checkpoint's files hashed at most once per matrix (a checkpoint the run writes is hashed while
its manifest is written, never read back), and each cell planned once (its reference offloaded by that plan)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from matrix import checkpoints
from matrix.cells import Cell, expand
from suites.engine.rank_group import RankGroupPool
from suites.reference import memory_plan
from suites.run import driver
from suites.run.driver import RunOptions, memory_plan_lines, run_cell

pytestmark = pytest.mark.autotp


class Trace:
    """Calls counted by what they were about: a model's checkpoint resolved, a file hashed, a cell planned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.resolved: Counter[str] = Counter()
        self.hashed: Counter[str] = Counter()
        self.planned: Counter[str] = Counter()
        self.references_planned: Counter[str] = Counter()
        self.runners_detected = 0
        self._wrap(
            monkeypatch, checkpoints, "tiny_checkpoint", lambda entry, *_, **__: self.resolved.update([entry.name])
        )
        self._wrap(monkeypatch, checkpoints, "_sha256", lambda path: self.hashed.update([_file_name(path)]))
        self._wrap(
            monkeypatch, driver, "plan_cell", lambda size, dtype, **plan: self.planned.update([_plan_name(dtype, plan)])
        )
        self._wrap(
            monkeypatch,
            memory_plan,
            "plan_reference",
            lambda size, dtype, runner: self.references_planned.update([dtype]),
        )
        detect = memory_plan.Runner.detect

        def detected(cls: type[memory_plan.Runner], *held: int) -> memory_plan.Runner:
            self.runners_detected += 1
            return detect(*held)

        monkeypatch.setattr(memory_plan.Runner, "detect", classmethod(detected))

    def __repr__(self) -> str:
        return (
            f"resolved {dict(self.resolved)}, hashed {dict(self.hashed)}, planned {dict(self.planned)}, "
            f"references planned {dict(self.references_planned)}, runners detected {self.runners_detected}"
        )

    @staticmethod
    def _wrap(monkeypatch: pytest.MonkeyPatch, module: object, name: str, count: Callable[..., object]) -> None:
        original = getattr(module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            count(*args, **kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


def _file_name(path: Path) -> str:
    """`<model>/<file>`, written (in a staging folder, `.<model>-<key>-<random>`) or read (`<model>-<key>`)."""
    return f"{path.parent.name.lstrip('.').split('-')[0]}/{path.name}"


def _plan_name(dtype: str, plan: dict[str, Any]) -> str:
    return f"{dtype} tp{plan['tp']} {plan['load']}"


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Trace]:
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))  # empty: the cells write their checkpoints
    monkeypatch.setattr(checkpoints, "_HASHED", {})  # this process has hashed nothing yet: a new matrix
    yield Trace(monkeypatch)


CELLS = expand("llama,gpt2", "eager", "fp32,bf16", "2")
"""Two models, two cells each (one rank group: its launch is not what is traced)."""


def _weights(trace: Trace) -> Counter[str]:
    return Counter({name: count for name, count in trace.hashed.items() if not name.endswith(checkpoints.MANIFEST)})


def _run(cells: list[Cell], pool: RankGroupPool) -> None:
    """The cells' verdicts are the checks' (gpt2's stress shape fails one at tp 2): none is a failure to prepare."""
    outcomes = {cell.id: run_cell(cell, pool, RunOptions()) for cell in cells}
    assert not [outcome.message for outcome in outcomes.values() if outcome.failure_class == "setup"]
    assert not [outcome.message for outcome in outcomes.values() if outcome.outcome == "skip"]


def test_a_matrix_resolves_each_cell_once_hashes_each_checkpoint_once_and_plans_each_cell_once(
    trace: Trace, rank_pool: RankGroupPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(CELLS, rank_pool)  # cold: each model's first cell writes its checkpoint and computes its reference
    per_model = Counter(cell.model.name for cell in CELLS)
    assert trace.resolved == per_model, trace  # once per cell
    assert trace.planned == Counter(f"{cell.dtype} tp2 eager" for cell in CELLS)  # once per cell
    assert trace.references_planned == Counter(cell.dtype for cell in CELLS)  # in its cell's plan, never again
    assert trace.runners_detected == len(CELLS)
    written = _weights(trace)
    assert written and set(written.values()) == {1}, written  # hashed writing the manifest, never read back
    # A checkpoint's identity is its manifest's hash, taken when its cell resolves it (not again for the reference).
    identities = Counter({name: count for name, count in trace.hashed.items() if name.endswith(checkpoints.MANIFEST)})
    assert identities == Counter(f"{cell.model.name}/{checkpoints.MANIFEST}" for cell in CELLS), identities

    # The next matrix (a new process: nothing hashed yet) on the warm cache: the plan before the first cell plans
    # each cell once and hashes each checkpoint's files once; the cells hash nothing again.
    monkeypatch.setattr(checkpoints, "_HASHED", {})
    before = _weights(trace)
    trace.planned.clear()
    memory_plan_lines(CELLS, RunOptions())
    assert trace.planned == Counter(f"{cell.dtype} tp2 eager" for cell in CELLS)
    _run(CELLS, rank_pool)
    assert _weights(trace) - before == written, _weights(trace) - before  # each file once in this matrix

"""Test helpers: the one JUnit writer (exactly README.md "Results") and CLI shortcuts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from junitparser import Failure, Skipped
from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

from reports.__main__ import main


@dataclass
class Cell:
    model: str
    outcome: str = "pass"
    failure_class: str = ""
    signature: str = ""
    tp: int = 2
    variant: str = "eager"
    dtype: str = "fp32"
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.model}-{self.variant}-{self.dtype}-tp{self.tp}"


def fail(model: str, failure_class: str, signature: str = "", **kwargs) -> Cell:
    return Cell(model, "fail", failure_class, signature or f"{failure_class.title()}Error: broken", **kwargs)


def write_junit(path: Path, cells: list[Cell], *, run_id: str, started: str, host: str = "runner-1",
                deepspeed: str = "0.14.2", deepspeed_git: str = "", transformers: str = "4.44.0",
                torch: str = "2.4.0", python: str = "3.11.7", harness_git: str | None = "") -> Path:
    """harness_git None: a file from before run.harness_git was recorded (the property is absent)."""
    suite = TestSuite("pytest")
    for cell in cells:
        case = TestCase(f"test_cell[{cell.id}]", classname="suites.test_autotp")
        properties = {
            "cell.id": cell.id, "cell.model": cell.model, "cell.variant": cell.variant, "cell.dtype": cell.dtype,
            "cell.tp": str(cell.tp), "outcome": cell.outcome, "failure_class": cell.failure_class,
            "signature": cell.signature, "version.deepspeed": deepspeed, "version.transformers": transformers,
            "version.torch": torch, "version.python": python, "version.deepspeed_git": deepspeed_git,
            "run.id": run_id, "run.session": run_id.split("@")[0], "run.host": host, "run.started": started,
            "run.accelerator": "cpu", "run.backend": "gloo",
            **({"run.harness_git": harness_git} if harness_git is not None else {}),
            **{f"metric.{name}": repr(value) for name, value in cell.metrics.items()},
        }
        for name, value in properties.items():
            case.add_property(name, value)
        if cell.outcome == "fail":
            failure = Failure(f"{cell.failure_class}: {cell.signature}")
            failure.text = f"Traceback ...\n{cell.signature}"
            case.result = [failure]
        elif cell.outcome == "skip":
            case.result = [Skipped("needs 4 ranks")]
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    xml.write(str(path), pretty=True)
    return path


# The versions write_junit holds fixed by default, as report lines print them for a DeepSpeed transition.
CONTEXT = "transformers 4.44.0, torch 2.4.0, python 3.11.7"


def render(junit_dir, tmp_path, *extra):
    """merge junit_dir into a fresh store, render it, and return the output folder."""
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(junit_dir), "--store", str(store)]) == 0
    assert main(["render", "--store", str(store), "--out", str(out), *extra]) == 0
    return out


def section(markdown: str, title: str) -> list[str]:
    """The lines of one '## title' section, without the heading and blank lines."""
    lines = markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    return [line for line in lines if line]

"""Multiple-choice task probe: which choice a model finds most likely, item by item.

Scored like lm-evaluation-harness's `acc` for multiple_choice tasks: the summed log-likelihood of
each choice's tokens after the context, context and choice tokenised together and split at the
context's length. The probe is a pure function of the model, the tokenizer and the task file, so
every rank of a TP group runs the same forwards in the same order (its collectives line up) and the
reference process gets the same token ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from suites.checks.task_scoring import TaskError, continuation_loglikelihoods

if TYPE_CHECKING:
    from suites.base.model_types import CausalLM, Device, Tokenizer

TASKS_DIR = Path(__file__).resolve().parent.parent / "data" / "tasks"


@dataclass(frozen=True)
class Item:
    context: str
    choices: tuple[str, ...]
    answer: int  # index into choices


@dataclass(frozen=True)
class Task:
    name: str
    path: Path
    items: tuple[Item, ...]


LM_EVAL_PREFIX = "lm_eval:"


def task_path(name: str) -> Path:
    return TASKS_DIR / f"{name}.jsonl"


@dataclass(frozen=True)
class AccuracyTask:
    """What `--accuracy-task` names: a shipped task (`world-facts`), a task file (`path/to/task.jsonl`),
    both scored by this probe, or an lm-evaluation-harness task (`lm_eval:<name or YAML file>`, needs
    the `accuracy` extra)."""

    spec: str
    fingerprint: str
    """Identifies the task's content (file hash, or lm-eval's version and config): part of the reference's cache key."""

    @property
    def uses_lm_eval(self) -> bool:
        return self.spec.startswith(LM_EVAL_PREFIX)


def resolve_task(spec: str) -> AccuracyTask:
    """Checks the task exists and is well-formed (TaskError naming file and line otherwise)."""
    if spec.startswith(LM_EVAL_PREFIX):
        try:  # lm-eval is optional (pyproject's `accuracy` group): only its tasks import it
            from suites.checks import lm_eval_tasks
        except ImportError:
            raise TaskError(
                f"{spec}: lm-eval tasks need lm-evaluation-harness: pip install --group accuracy (pyproject.toml); "
                "nox installs it for you"
            ) from None
        return AccuracyTask(spec, lm_eval_tasks.fingerprint(spec.removeprefix(LM_EVAL_PREFIX)))
    path = Path(spec) if spec.endswith(".jsonl") else task_path(spec)
    load_task(path)
    return AccuracyTask(str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest())


def answer_correctness(task: AccuracyTask, model: CausalLM, tokenizer: Tokenizer, device: Device) -> list[bool]:
    """Whether the model answers each item right, in the task's item order. Every rank of a TP group
    calls this with the same task, so their forwards line up."""
    if task.uses_lm_eval:
        from suites.checks import lm_eval_tasks  # optional: resolve_task said how to install it

        return lm_eval_tasks.correctness(task.spec.removeprefix(LM_EVAL_PREFIX), model, tokenizer, device)
    loaded = load_task(Path(task.spec))
    return correctness(loaded, predict(model, tokenizer, loaded, device))


def load_task(path: Path) -> Task:
    """One JSON object a line: {"context": str, "choices": [str, ...], "answer": index}."""
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in TASKS_DIR.glob("*.jsonl")))
        raise TaskError(f"{path}: no such task file; shipped tasks: {shipped}")
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            items.append(_item(line, f"{path}:{number}"))
    if not items:
        raise TaskError(f"{path}: no items; write one JSON object per line")
    return Task(path.stem, path, tuple(items))


def _item(line: str, where: str) -> Item:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or set(data) != {"context", "choices", "answer"}:
        raise TaskError(f"{where}: must be an object with exactly the keys context, choices, answer")
    context, choices, answer = data["context"], data["choices"], data["answer"]
    if not isinstance(context, str) or not context.strip():
        raise TaskError(f"{where}: context must be a non-empty string")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise TaskError(f"{where}: choices must be a list of at least two non-empty strings")
    if len(set(choices)) != len(choices):
        raise TaskError(f"{where}: choices must differ from each other")
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
        raise TaskError(f"{where}: answer must be an index into choices (0..{len(choices) - 1}), got {answer!r}")
    return Item(context, tuple(choices), answer)


def choice_loglikelihoods(model: CausalLM, tokenizer: Tokenizer, item: Item, device: Device) -> list[float]:
    """One forward per item, its choices batched."""
    return [
        score
        for score, _ in continuation_loglikelihoods(model, tokenizer, [(item.context, c) for c in item.choices], device)
    ]


def predict(model: CausalLM, tokenizer: Tokenizer, task: Task, device: Device) -> list[int]:
    """The chosen index for each item (ties go to the first choice, as argmax does)."""
    predictions = []
    for item in task.items:
        scores = choice_loglikelihoods(model, tokenizer, item, device)
        predictions.append(max(range(len(scores)), key=scores.__getitem__))
    return predictions


def correctness(task: Task, predictions: list[int]) -> list[bool]:
    return [prediction == item.answer for item, prediction in zip(task.items, predictions, strict=True)]

"""Multiple-choice task probe: which choice a model finds most likely, item by item.

Scored like lm-evaluation-harness's `acc` for multiple_choice tasks: the summed log-likelihood of
each choice's tokens after the context, context and choice tokenised together and split at the
context's length. The probe is a pure function of the model, the tokenizer and the task file, so
every rank of a TP group runs the same forwards in the same order (its collectives line up) and the
reference process gets the same token ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

TASKS_DIR = Path(__file__).resolve().parent / "data" / "tasks"


class TaskError(ValueError):
    """A task file that cannot be used; the message names the file, the line and the field."""


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


def task_path(name: str) -> Path:
    return TASKS_DIR / f"{name}.jsonl"


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


def _split(tokenizer, context: str, choice: str) -> tuple[list[int], list[int]]:
    """Context and continuation ids, lm-eval's way: trailing context spaces move to the continuation."""
    stripped = context.rstrip(" ")
    choice = context[len(stripped):] + choice
    context_ids = list(tokenizer.encode(stripped))
    whole = list(tokenizer.encode(stripped + choice))
    return whole[:len(context_ids)], whole[len(context_ids):]


@torch.no_grad()
def choice_loglikelihoods(model, tokenizer, item: Item, device) -> list[float]:
    """One forward per item: the choices are right-padded into one batch. Padding sits after every
    scored position, so a causal model's scores do not depend on it and no attention mask is needed."""
    pairs = [_split(tokenizer, item.context, choice) for choice in item.choices]
    for choice, (context_ids, continuation) in zip(item.choices, pairs):
        if not context_ids or not continuation:
            raise TaskError(f"{item.context!r} + {choice!r}: the tokenizer leaves no context or no choice tokens")
    width = max(len(c) + len(k) for c, k in pairs)
    ids = torch.tensor([c + k + [0] * (width - len(c) - len(k)) for c, k in pairs], device=device)
    log_probs = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    scores = []
    for row, (context_ids, continuation) in enumerate(pairs):
        positions = torch.arange(len(context_ids) - 1, len(context_ids) + len(continuation) - 1)
        targets = torch.tensor(continuation)
        scores.append(log_probs[row, positions.to(log_probs.device), targets.to(log_probs.device)].sum().item())
    return scores


def predict(model, tokenizer, task: Task, device) -> list[int]:
    """The chosen index for each item (ties go to the first choice, as argmax does)."""
    predictions = []
    for item in task.items:
        scores = choice_loglikelihoods(model, tokenizer, item, device)
        predictions.append(max(range(len(scores)), key=scores.__getitem__))
    return predictions


def correctness(task: Task, predictions: list[int]) -> list[bool]:
    return [prediction == item.answer for item, prediction in zip(task.items, predictions, strict=True)]

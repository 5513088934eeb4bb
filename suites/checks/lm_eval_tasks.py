"""lm-evaluation-harness tasks as an accuracy probe (the `accuracy` extra).

lm-eval builds the requests of a task and scores the answers; the model under test answers through
`ShardedModelLM`, a log-likelihood-only adapter. Every rank of a TP group answers every request: the
adapter tells lm-eval it is rank 0 of 1, or lm-eval would split the requests across the ranks as it
does for data parallelism, and the ranks' collectives would no longer line up. Rank 0's per-document
`acc` is what the cell reports.

`lm_eval:<name>` names a task of lm-eval's registry (hub datasets: runners with a warm HF cache);
`lm_eval:<file.yaml>` a task config; relative `data_files` in it are read from the YAML's folder, so
the shipped `suites/data/tasks/lm_eval/*.yaml` work offline anywhere.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lm_eval
import lm_eval.evaluator
import lm_eval.tasks
import yaml
from lm_eval.api.model import LM

from suites.checks.task_scoring import TaskError, continuation_loglikelihoods

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from suites.base.model_types import CausalLM, Device, Tokenizer

LM_EVAL_TASKS_DIR = Path(__file__).resolve().parent.parent / "data" / "tasks" / "lm_eval"
BATCH = 8
"""Requests answered per forward."""
SCORED_OUTPUT_TYPES = ("multiple_choice", "loglikelihood")


def _yaml_path(spec: str) -> Path | None:
    if not spec.endswith((".yaml", ".yml")):
        return None
    path = Path(spec) if Path(spec).is_absolute() or Path(spec).exists() else LM_EVAL_TASKS_DIR / spec
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in LM_EVAL_TASKS_DIR.glob("*.yaml")))
        raise TaskError(f"lm_eval:{spec}: no such task file; shipped lm-eval tasks: {shipped}")
    return path


def task_config(spec: str) -> str | dict[str, Any]:
    """A registry task name, or the YAML's config with its data files made absolute."""
    path = _yaml_path(spec)
    if path is None:
        return spec
    try:
        config = yaml.safe_load(path.read_text())  # type: ignore[no-untyped-call]  # PyYAML ships no types
    except yaml.YAMLError as error:
        raise TaskError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(config, dict) or not isinstance(config.get("task"), str):
        raise TaskError(f"{path}: an lm-eval task config needs a `task:` name")
    files = config.get("dataset_kwargs", {}).get("data_files")
    if isinstance(files, dict):
        config["dataset_kwargs"]["data_files"] = {
            split: str((path.parent / name).resolve()) for split, name in files.items()
        }
    return config


def _data_files(config: str | dict[str, Any]) -> list[Path]:
    files = config.get("dataset_kwargs", {}).get("data_files", {}) if isinstance(config, dict) else {}
    return [Path(name) for name in files.values()]


def fingerprint(spec: str) -> str:
    """lm-eval's version, the task config and its local data files; checks the task loads and is scored
    by log-likelihood (the only request type the adapter answers)."""
    config = task_config(spec)
    (task,) = _load(config)["tasks"].values()
    if task.OUTPUT_TYPE not in SCORED_OUTPUT_TYPES:
        raise TaskError(
            f"lm_eval:{spec} is a {task.OUTPUT_TYPE} task; only {', '.join(SCORED_OUTPUT_TYPES)} tasks can be gated"
        )
    identity = hashlib.sha256(json.dumps({"lm_eval": lm_eval.__version__, "config": config}, sort_keys=True).encode())
    for data_file in _data_files(config):
        identity.update(data_file.read_bytes())
    return identity.hexdigest()


def _load(config: str | dict[str, Any]) -> dict[str, Any]:
    """lm-eval's task dict for exactly one task."""
    try:
        loaded: dict[str, Any] = lm_eval.tasks.TaskManager().load([config])
    except Exception as error:  # lm-eval raises many kinds for an unknown or broken task
        name = config if isinstance(config, str) else config["task"]
        raise TaskError(f"lm_eval:{name}: lm-eval could not load the task: {error}") from None
    if len(loaded["tasks"]) != 1:
        raise TaskError(f"lm_eval:{config}: a group of {len(loaded['tasks'])} tasks; name one task")
    return loaded


def correctness(spec: str, model: CausalLM, tokenizer: Tokenizer, device: Device) -> list[bool]:
    """Per document, in document order: lm-eval's `acc` for this model."""
    results = lm_eval.evaluator.evaluate(
        lm=ShardedModelLM(model, tokenizer, device),
        task_dict=_load(task_config(spec)),
        log_samples=True,
        bootstrap_iters=0,
    )
    (samples,) = results["samples"].values()
    return [bool(sample["acc"]) for sample in sorted(samples, key=lambda sample: sample["doc_id"])]


class ShardedModelLM(LM):  # type: ignore[misc]  # lm-eval ships no types (no py.typed): LM is Any to mypy
    def __init__(self, model: CausalLM, tokenizer: Tokenizer, device: Device) -> None:
        super().__init__()
        self.model, self.tokenizer, self.model_device = model, tokenizer, device

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = True) -> list[tuple[float, bool]]:
        pairs = [request.args for request in requests]
        answers: list[tuple[float, bool]] = []
        for start in range(0, len(pairs), BATCH):
            answers += continuation_loglikelihoods(
                self.model, self.tokenizer, pairs[start : start + BATCH], self.model_device
            )
        return answers

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = True) -> list[float]:
        raise TaskError("the AutoTP accuracy gate answers log-likelihood requests only (multiple_choice tasks)")

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = True) -> list[str]:
        raise TaskError("the AutoTP accuracy gate answers log-likelihood requests only (multiple_choice tasks)")

"""The accuracy gate (exact McNemar + Wilson on known numbers), task files, and the gate inside a real
cell (`--accuracy-task`): a healthy shard passes, a shard whose lm_head all-reduce is skipped in the
task's forwards only is reported by the accuracy check."""

import json

import pytest
import torch

from matrix.cells import expand
from matrix.checkpoints import tiny_checkpoint
from matrix.registry import load_models
from suites.checks.accuracy import check, mcnemar_exact, paired_accuracy, wilson_interval
from suites.checks.inputs import load_tokenizer
from suites.checks.lm_eval_tasks import LM_EVAL_TASKS_DIR
from suites.checks.task_probe import (
    Item,
    Task,
    TaskError,
    answer_correctness,
    choice_loglikelihoods,
    load_task,
    predict,
    resolve_task,
    task_path,
)
from suites.run.driver import RunOptions, run_cell
from suites.variants.loading import load_model


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        # Newcombe (1998), Statistics in Medicine 17:857, table I, method 3 (score, no continuity correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    assert wilson_interval(successes, trials) == pytest.approx((low, high), abs=5e-5)


@pytest.mark.parametrize(
    ("lost", "gained", "p"),
    [
        (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
        (0, 5, 2 / 32),
        (2, 10, 2 * 79 / 4096),  # 79 = C(12,0) + C(12,1) + C(12,2)
        (3, 3, 1.0),
        (0, 0, 1.0),
        (0, 2000, 0.0),  # far below float range as a probability, but no overflow or crash
    ],
)
def test_mcnemar_exact_on_known_counts(lost, gained, p):
    assert mcnemar_exact(lost, gained) == pytest.approx(p, rel=1e-12, abs=0)
    assert mcnemar_exact(gained, lost) == mcnemar_exact(lost, gained)


def test_gate_fails_only_when_the_shard_is_significantly_worse():
    reference = [True] * 30 + [False] * 10
    assert check(reference, reference).passed
    lost_ten = [False] * 10 + [True] * 20 + [False] * 10
    verdict = check(reference, lost_ten)
    assert not verdict.passed and verdict.failure_class == "numerics"
    assert verdict.metrics["acc_ref_only"] == 10 and verdict.metrics["acc_mcnemar_p"] == pytest.approx(2 / 1024)
    assert verdict.reason.startswith(
        "accuracy 0.500 [0.352, 0.648] vs reference 0.750 [0.598, 0.858] on 40 items: "
        "10 lost, 0 gained, exact McNemar p=0.002 < 0.01"
    )
    lost_two = [False] * 2 + [True] * 28 + [False] * 10  # two flips are within chance
    assert check(reference, lost_two).passed
    assert check(lost_ten, reference).passed  # better than the reference is not a TP bug
    with pytest.raises(ValueError, match="same non-zero number of items"):
        paired_accuracy(reference, reference[:-1])


@pytest.mark.parametrize(("name", "items"), [("world-facts", 40), ("small-sums", 81)])
def test_shipped_tasks_load(name, items):
    task = load_task(task_path(name))
    assert len(task.items) == items
    assert sorted({item.answer for item in task.items}) == [0, 1, 2, 3]  # no position bias to exploit


@pytest.fixture(scope="module")
def tiny_llama():
    return str(tiny_checkpoint(load_models()["llama"]))


def test_batched_choices_score_like_one_sequence_each(tiny_llama):
    model, tokenizer = load_model(tiny_llama, "fp32", False), load_tokenizer(None)
    item = load_task(task_path("small-sums")).items[0]
    alone = []
    for choice in item.choices:
        ids = tokenizer.encode(item.context + choice)
        context_length = len(tokenizer.encode(item.context))
        log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        alone.append(sum(log_probs[i - 1, ids[i]].item() for i in range(context_length, len(ids))))
    assert choice_loglikelihoods(model, tokenizer, item, "cpu") == pytest.approx(alone, abs=1e-4)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("{not json", "not JSON"),
        (
            '{"context": "a", "choices": [" b", " c"]}',
            "must be an object with exactly the keys context, choices, answer",
        ),
        (
            '{"context": "a", "choices": [" b"], "answer": 0}',
            "choices must be a list of at least two non-empty strings",
        ),
        ('{"context": "a", "choices": [" b", " b"], "answer": 0}', "choices must differ from each other"),
        (
            '{"context": "a", "choices": [" b", " c"], "answer": 2}',
            r"answer must be an index into choices \(0..1\), got 2",
        ),
        ('{"context": " ", "choices": [" b", " c"], "answer": 0}', "context must be a non-empty string"),
    ],
)
def test_malformed_task_lines_are_named(tmp_path, line, error):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"context": "ok", "choices": [" x", " y"], "answer": 1}\n' + line + "\n")
    with pytest.raises(TaskError, match=f"{path}:2: {error}"):
        load_task(path)
    with pytest.raises(TaskError, match="no such task file; shipped tasks: small-sums, world-facts"):
        load_task(tmp_path / "missing.jsonl")


def _letters_task(tmp_path, checkpoint: str, kind: str) -> str:
    """Tiny random models answer at chance and score a choice mostly by its length (about -log(vocab) a
    byte), so the task asks equally long choices (" a" .. " h") after the shipped contexts, with the
    reference's own picks as the answers: the reference then scores 100 % and any damage the shard does
    to the task's logits shows as lost items. `kind`: a task file for the built-in probe, or an lm-eval
    YAML over the same file."""
    # Every shipped context, eight choices each: enough discordant items for the test to have power on any
    # seeded weights (measured: with 40 contexts and four choices, one seed lost only 2 items to the fault).
    contexts = [item.context for name in ("world-facts", "small-sums") for item in load_task(task_path(name)).items]
    letters = Task(
        "letters",
        task_path("world-facts"),
        tuple(Item(context, tuple(f" {letter}" for letter in "abcdefgh"), 0) for context in contexts),
    )
    picks = predict(load_model(checkpoint, "fp32", False), load_tokenizer(None), letters, "cpu")
    assert len(set(picks)) > 1, "the reference picks one letter everywhere: the test would have no power"
    task_file = tmp_path / "letters.jsonl"
    task_file.write_text(
        "".join(
            json.dumps({"context": i.context, "choices": list(i.choices), "answer": pick}) + "\n"
            for i, pick in zip(letters.items, picks)
        )
    )
    if kind == "builtin":
        return str(task_file)
    config = (LM_EVAL_TASKS_DIR / "autotp_world_facts.yaml").read_text()
    config = config.replace("autotp_world_facts", "autotp_letters").replace("../world-facts.jsonl", str(task_file))
    (tmp_path / "letters.yaml").write_text(config)
    return f"lm_eval:{tmp_path / 'letters.yaml'}"


@pytest.mark.autotp
@pytest.mark.parametrize("kind", ["builtin", "lm_eval"])
def test_accuracy_gate_in_a_cell_reports_a_fault_only_the_task_sees(tmp_path, rank_pool, kind):
    cell = expand("llama", tp="2")[0]
    task = resolve_task(_letters_task(tmp_path, str(tiny_checkpoint(cell.model)), kind))

    healthy = run_cell(cell, rank_pool, RunOptions(accuracy_task=task))
    assert healthy.outcome == "pass", healthy.message
    assert healthy.metrics["acc_ref"] == healthy.metrics["acc_tp"] == 1.0 and healthy.metrics["acc_items"] == 121

    faulty = run_cell(
        cell, rank_pool, RunOptions(accuracy_task=task, faults=("tests.faults:skip_lm_head_allreduce_on_task_items",))
    )
    assert (faulty.outcome, faulty.failure_class) == ("fail", "numerics"), {
        k: v for k, v in faulty.metrics.items() if k.startswith("acc")
    }
    assert faulty.signature.startswith("accuracy:"), faulty.signature
    assert faulty.metrics["acc_mcnemar_p"] < 0.01 and faulty.metrics["acc_tp_only"] == 0
    assert faulty.metrics["logits_max_abs"] == healthy.metrics["logits_max_abs"]  # the standard probes saw nothing


def test_lm_eval_scores_the_shipped_task_like_the_builtin_probe(tiny_llama):
    model, tokenizer = load_model(tiny_llama, "fp32", False), load_tokenizer(None)
    through_lm_eval = answer_correctness(resolve_task("lm_eval:autotp_world_facts.yaml"), model, tokenizer, "cpu")
    assert through_lm_eval == answer_correctness(resolve_task("world-facts"), model, tokenizer, "cpu")
    assert len(through_lm_eval) == 40


def test_accuracy_task_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "ok", "choices": [" x", " y"], "answer": 5}\n')
    with pytest.raises(TaskError, match=f"{bad}:1: answer must be an index"):
        resolve_task(str(bad))
    with pytest.raises(TaskError, match="no such task file; shipped tasks: small-sums, world-facts"):
        resolve_task("world-fact")
    assert resolve_task("world-facts").fingerprint != resolve_task("small-sums").fingerprint

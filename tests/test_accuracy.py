"""The accuracy gate (exact McNemar + Wilson on known numbers), task files, and the task probe run on
a real AutoTP rank group: a healthy shard passes, a shard whose all-reduce is skipped is reported."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from dataclasses import replace

import pytest
import torch

from matrix.checkpoints import tiny_checkpoint
from matrix.registry import load_models
from suites.checks.accuracy import check, mcnemar_exact, paired_accuracy, wilson_interval
from suites.inputs import load_tokenizer
from suites.loading import load_model
from suites.rank_group import PROJECT_ROOT, free_port, launch_environment
from suites.task_probe import Item, Task, TaskError, choice_loglikelihoods, correctness, load_task, predict, task_path

RANKS_TIMEOUT_S = 900  # 2 x 40 forwards per rank take ~1 min on 2 idle cores; shared machines are far slower


@pytest.mark.parametrize(("successes", "trials", "low", "high"), [
    # Newcombe (1998), Statistics in Medicine 17:857, table I, method 3 (score, no continuity correction)
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718),
])
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    assert wilson_interval(successes, trials) == pytest.approx((low, high), abs=5e-5)


@pytest.mark.parametrize(("lost", "gained", "p"), [
    (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
    (0, 5, 2 / 32),
    (2, 10, 2 * 79 / 4096),  # 79 = C(12,0) + C(12,1) + C(12,2)
    (3, 3, 1.0), (0, 0, 1.0),
    (0, 2000, 0.0),  # far below float range as a probability, but no overflow or crash
])
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
    assert verdict.reason.startswith("accuracy 0.500 [0.352, 0.648] vs reference 0.750 [0.598, 0.858] on 40 items: "
                                     "10 lost, 0 gained, exact McNemar p=0.002 < 0.01")
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


@pytest.mark.parametrize(("line", "error"), [
    ("{not json", "not JSON"),
    ('{"context": "a", "choices": [" b", " c"]}', "must be an object with exactly the keys context, choices, answer"),
    ('{"context": "a", "choices": [" b"], "answer": 0}', "choices must be a list of at least two non-empty strings"),
    ('{"context": "a", "choices": [" b", " b"], "answer": 0}', "choices must differ from each other"),
    ('{"context": "a", "choices": [" b", " c"], "answer": 2}', r"answer must be an index into choices \(0..1\), got 2"),
    ('{"context": " ", "choices": [" b", " c"], "answer": 0}', "context must be a non-empty string"),
])
def test_malformed_task_lines_are_named(tmp_path, line, error):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"context": "ok", "choices": [" x", " y"], "answer": 1}\n' + line + "\n")
    with pytest.raises(TaskError, match=f"{path}:2: {error}"):
        load_task(path)
    with pytest.raises(TaskError, match="no such task file; shipped tasks: small-sums, world-facts"):
        load_task(tmp_path / "missing.jsonl")


@pytest.mark.autotp
def test_probe_on_a_rank_group_reports_a_skipped_lm_head_allreduce(tmp_path, tiny_llama):
    """Tiny random models answer at chance and score a choice mostly by its length (about -log(vocab) a
    byte), so the test asks equally long choices (" a" .. " d") after the shipped contexts, with the
    reference's own picks as the answers: the reference then scores 100 % and any damage the shard does
    to the logits shows as lost items."""
    checkpoint = tiny_llama
    letters = Task("letters", task_path("world-facts"), tuple(
        Item(item.context, (" a", " b", " c", " d"), 0) for item in load_task(task_path("world-facts")).items))
    reference = predict(load_model(checkpoint, "fp32", False), load_tokenizer(None), letters, "cpu")
    assert len(set(reference)) > 1, "the reference picks one letter everywhere: the test would have no power"
    task = replace(letters, items=tuple(replace(item, answer=pick) for item, pick in zip(letters.items, reference)))
    task_file = tmp_path / "answers.jsonl"
    task_file.write_text("".join(json.dumps({"context": i.context, "choices": list(i.choices), "answer": i.answer}) + "\n"
                                 for i in task.items))
    out = tmp_path / "predictions.json"
    log = tmp_path / "ranks.log"
    port = free_port()
    with log.open("w") as sink:  # its own session, so a timeout ends the ranks too, not just the launcher
        launcher = subprocess.Popen(
            [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(port),
             str(PROJECT_ROOT / "tests" / "accuracy_ranks.py"), checkpoint, str(task_file), str(out)],
            env=launch_environment(), cwd=PROJECT_ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = launcher.wait(timeout=RANKS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
            code = "timeout"
    for buffer in Path("/dev/shm").glob(f"deepspeed_*_{port}_*"):  # DeepSpeed never unlinks its all-reduce buffers
        buffer.unlink()
    assert code == 0, f"rank group exit {code}:\n{log.read_text()[-4000:]}"
    predictions = json.loads(out.read_text())
    reference_correct = correctness(task, reference)
    healthy = check(reference_correct, correctness(task, predictions["healthy"]))
    assert healthy.passed and healthy.metrics["acc_tp"] == 1.0, healthy.metrics
    faulty = check(reference_correct, correctness(task, predictions["faulty"]))
    assert not faulty.passed, faulty.metrics
    assert faulty.metrics["acc_mcnemar_p"] < 0.01 and faulty.metrics["acc_tp_only"] == 0

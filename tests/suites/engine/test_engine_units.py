"""Units of the cell engine that need no rank group: signatures, redaction, the reference guard,
the checkpoint cache's corruption detection, and the checks on hand-made observations."""

import json

import pytest
import torch
import transformers

from matrix.cells import expand
from matrix.registry import DEFAULT_TOLERANCES
from suites.outcome import exception_signature, mask_numbers


def test_signature_masks_numbers_and_names_the_deepest_library_frame():
    namespace = {}
    code = compile("def shard(n):\n    raise RuntimeError(f'shape [{n}, 16] is invalid for input of size {n*16}')\n",
                   "/site-packages/deepspeed/module_inject/tp_shard.py", "exec")
    exec(code, namespace)
    signatures = set()
    for size in (3, 5):
        try:
            namespace["shard"](size)
        except RuntimeError as error:
            signatures.add(exception_signature(error))
    assert signatures == {"RuntimeError: shape [N, N] is invalid for input of size N @ deepspeed/module_inject/tp_shard.py:shard"}
    assert mask_numbers("0x7f3a at 1.5e-3") == "N at N"


def test_planted_token_never_reaches_records_or_repro(tmp_path, monkeypatch):
    from suites.outcome import failed
    from suites.records.run_records import CellRecorder, RunInfo
    from suites.records.repro import write_repro

    token = "hf_plantedSecretValue123"
    monkeypatch.setenv("HF_TOKEN", token)
    cell = expand("llama", tp="2")[0]
    recorder = CellRecorder(tmp_path, RunInfo("unit"), {"deepspeed": "0.19.8"})
    properties = {}
    recorder.record(cell, failed("forward", f"OSError: 401 for token {token}", f"Authorization: Bearer {token}"),
                    lambda key, value: properties.__setitem__(key, value))
    write_repro(cell, "tiny", tmp_path / "repro", recorder.run, {"deepspeed": "0.19.8"}, f"fail forward {token}")
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file()) + json.dumps(properties)
    assert token not in written
    assert "***" in written


def _repro_module(cell, tmp_path, monkeypatch):
    """The repro script written for `cell`, imported in this process (one rank, no process group)."""
    import importlib.util

    from suites.records.run_records import RunInfo
    from suites.records.repro import write_repro

    script = write_repro(cell, "tiny", tmp_path / "repro", RunInfo("unit", accelerator="cpu", backend="gloo"),
                         {"deepspeed": "0.19.8"}, "fail numerics")
    spec = importlib.util.spec_from_file_location(f"repro_{cell.variant.name}_under_test", script)
    repro = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repro)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.distributed, "barrier", lambda: None)
    return repro


def test_repro_script_builds_the_weights_of_the_cell_it_reproduces(tmp_path, monkeypatch):
    """The repro makes its tiny checkpoint itself; with other weights than the harness's (e.g. biases left
    at 0) it would say MATCH for a bias bug the harness reported."""
    from safetensors.torch import load_file

    from matrix.checkpoints import tiny_checkpoint

    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    cell = expand("qwen2", tp="2")[0]  # q/k/v biases
    folder = tmp_path / _repro_module(cell, tmp_path, monkeypatch).checkpoint_folder()
    built = load_file(folder / "model.safetensors")
    harness = load_file(tiny_checkpoint(cell.model) / "model.safetensors")
    assert built.keys() == harness.keys()
    assert all(torch.equal(built[name], harness[name]) for name in harness)


def test_meta_repro_loads_through_the_meta_path(tmp_path, monkeypatch):
    cell = expand("llama", "meta", tp="2")[0]
    repro = _repro_module(cell, tmp_path, monkeypatch)
    folder = repro.checkpoint_folder()
    model, options = repro.meta_model(folder)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    listed = json.loads((tmp_path / options["checkpoint"]).read_text())["checkpoints"]
    assert len(listed) >= 2 and all(name.endswith(".safetensors") for name in listed)  # split like the cell's


def test_reference_is_refused_in_a_process_that_sharded(monkeypatch):
    from suites import reference
    from suites.variants import loading

    monkeypatch.setattr(loading, "_process_sharded", False)
    loading.mark_process_sharded()
    with pytest.raises(loading.ContaminatedProcessError):
        reference.compute_reference("unused", None, "fp32", reference.ProbeSpec())


def test_corrupt_tiny_checkpoint_is_detected_and_rebuilt(tmp_path, monkeypatch):
    from matrix.checkpoints import tiny_checkpoint

    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    entry = expand("llama", tp="2")[0].model
    folder = tiny_checkpoint(entry)
    weights = folder / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[: len(original) // 2])
    messages = []
    assert tiny_checkpoint(entry, log=messages.append) == folder
    assert "model.safetensors has" in messages[0] and "truncated" in messages[0]
    assert weights.read_bytes() == original  # seeded: the rebuild is bit-identical


def _observations(**changes):
    from suites.checks.probes import Observations

    torch.manual_seed(0)
    base = dict(logits_masked=torch.randn(44, 16), logits_plain=torch.randn(1, 24, 16),
                gen_tokens=torch.tensor([1, 2, 3, 4]), gen_logits=torch.randn(4, 16), nll_sum=100.0, nll_tokens=50,
                forward_seconds=0.1, param_bytes=1000, bytes_by_name={"w": 800, "n": 200}, kinds={"w": "linears", "n": "rest"})
    base["gen_tokens"] = base["gen_logits"].argmax(-1)
    base["gen_padded_logits"] = torch.randn(2, 4, 16)
    base["gen_padded_tokens"] = base["gen_padded_logits"].argmax(-1)
    base.update(changes)
    return Observations(**base)


def test_generation_divergence_passes_only_on_a_genuine_near_tie():
    from suites.checks import generation

    reference = _observations()
    tolerance = DEFAULT_TOLERANCES["fp32"]
    step_logits = reference.gen_logits.clone()
    runner_up = step_logits[2].topk(2).indices[1]
    tied = step_logits.clone()
    tied[2, runner_up] = tied[2].max()  # an exact tie: the sharded side may pick either token
    near_tie = generation.check(_observations(gen_logits=tied), _observations(
        gen_tokens=torch.cat([reference.gen_tokens[:2], runner_up.view(1), reference.gen_tokens[3:]]),
        gen_logits=tied), tolerance)
    assert near_tie.passed and "near-tie at token 2" in near_tie.reason
    wrong = generation.check(reference, _observations(
        gen_tokens=torch.cat([reference.gen_tokens[:2], runner_up.view(1), reference.gen_tokens[3:]])), tolerance)
    assert not wrong.passed and wrong.metrics["gen_first_divergence"] == 2


def test_generation_of_the_left_padded_row_is_judged_too():
    from suites.checks import generation

    reference = _observations()
    drifted = reference.gen_padded_logits.clone()
    drifted[1, 2] += 1.0  # only the left-padded row's third decode step is off
    result = generation.check(reference, _observations(gen_padded_logits=drifted), DEFAULT_TOLERANCES["fp32"])
    assert not result.passed and result.reason.startswith("batched decoding row 1, left-padded: decode-step logits")
    assert result.metrics["gen_padded0_logits_max_abs"] == 0.0


def test_generation_fails_on_nan_decode_logits_even_when_the_tokens_match():
    from suites.checks import generation

    reference = _observations()
    nan_step = reference.gen_logits.clone()
    nan_step[1, 0] = float("nan")
    result = generation.check(reference, _observations(gen_logits=nan_step, gen_tokens=reference.gen_tokens),
                              DEFAULT_TOLERANCES["fp32"])
    assert not result.passed and result.failure_class == "generation", result.reason


def test_tensor_kinds_come_from_the_modules_and_buffers_are_never_split_kinds():
    from suites.checks.probes import tensor_kinds

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.q, self.norm = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)
            self.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
            self.fused_experts = torch.nn.Parameter(torch.zeros(2, 4, 4))  # transformers >= 5 layout
            self.register_buffer("causal_mask", torch.ones(1, 1, 4, 4))  # 4-D, but not a weight (gpt_neo)

    assert tensor_kinds(Toy()) == {
        "causal_mask": "rest", "fused_experts": "experts", "embed.weight": "embeddings", "q.weight": "linears",
        "q.bias": "linears", "norm.weight": "rest", "norm.bias": "rest", "experts.0.weight": "experts",
        "experts.0.bias": "experts"}


def test_memory_is_judged_by_kind_and_names_the_kind_left_whole():
    from suites.checks import memory

    kinds = {"embed.weight": "embeddings", "q.weight": "linears", "moe.experts.up": "experts", "norm.weight": "rest"}
    full = {"embed.weight": 200 << 10, "q.weight": 400 << 10, "moe.experts.up": 32 << 20, "norm.weight": 8 << 10}
    reference = _observations(param_bytes=sum(full.values()), bytes_by_name=full, kinds=kinds)
    split = {**full, "q.weight": 200 << 10, "moe.experts.up": 16 << 20}
    assert memory.check(reference, [split, split]).passed
    linears_whole = memory.check(reference, [{**split, "q.weight": 400 << 10}, split])
    assert not linears_whole.passed and linears_whole.metrics["linear_shard_ratio"] == 1.0
    assert linears_whole.reason.startswith("linears not sharded: rank 0 holds")
    experts_whole = memory.check(reference, [split, {**split, "moe.experts.up": (32 << 20) - (512 << 10)}])
    assert not experts_whole.passed
    assert experts_whole.reason.startswith("experts not sharded: rank 1 holds 31.5 of 32 MiB (98%")


def test_a_build_lock_left_by_an_interrupted_build_is_removed_at_once_and_starts_take_turns(tmp_path):
    import subprocess
    import sys

    from suites.engine.rank_group import BUILD_GUARD, jit_build_guard

    left = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    left.parent.mkdir(parents=True)
    left.write_text("")  # as torch leaves it when its build is killed: fresh, but nobody builds
    messages = []
    with jit_build_guard(tmp_path, log=messages.append):
        assert not left.exists() and str(left) in messages[0]
        # Another start (another process) waits while this one holds the guard...
        other = subprocess.Popen([sys.executable, "-c", f"import fcntl; f = open({str(tmp_path / BUILD_GUARD)!r}, 'w'); "
                                  "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)"], stderr=subprocess.PIPE, text=True)
        assert other.wait(timeout=30) != 0 and "BlockingIOError" in other.stderr.read()
    # ...and gets it once this one is done.
    assert subprocess.run([sys.executable, "-c", f"import fcntl; f = open({str(tmp_path / BUILD_GUARD)!r}, 'w'); "
                           "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)"], timeout=30).returncode == 0


def test_orphaned_shared_memory_buffer_is_removed_and_a_mapped_one_kept(tmp_path):
    import mmap
    import os
    import time
    from pathlib import Path

    from suites.engine.rank_group import release_orphaned_shared_memory

    orphan, live = Path("/dev/shm/deepspeed_allreduce_buffer_0_test_1_0"), Path("/dev/shm/deepspeed_allreduce_buffer_0_test_2_0")
    for buffer in (orphan, live):
        buffer.write_bytes(b"\0" * 4096)
        os.utime(buffer, (time.time() - 3600, time.time() - 3600))
    with live.open("r+b") as stream, mmap.mmap(stream.fileno(), 4096):  # a live rank still maps it
        release_orphaned_shared_memory(log=lambda message: None)
        assert not orphan.exists() and live.exists()
    live.unlink()


def test_editing_the_corpus_gives_a_new_reference(tmp_path, monkeypatch):
    """A cached reference keyed without the probe inputs would be read back after the corpus changed and
    turn every cell into a false `numerics`; the key holds the corpus and the probe code."""
    from matrix.checkpoints import tiny_checkpoint
    from suites.checks import inputs
    from suites.reference import cached_reference, reference_path

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(inputs.CORPUS_FILE.read_text())
    monkeypatch.setattr(inputs, "CORPUS_FILE", corpus)
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path / "cache"))
    checkpoint = str(tiny_checkpoint(expand("llama", tp="2")[0].model))
    spec = inputs.ProbeSpec()
    before = cached_reference(checkpoint, None, "fp32", spec)
    corpus.write_text("Another opening sentence. " + corpus.read_text())
    after = reference_path(checkpoint, None, "fp32", spec)
    assert after != before and not after.exists()
    assert not torch.equal(torch.load(cached_reference(checkpoint, None, "fp32", spec))["logits_plain"],
                           torch.load(before)["logits_plain"])


def test_no_saved_floating_tensor_of_any_registry_architecture_is_constant(tmp_path, monkeypatch):
    """A constant bias or norm weight hides every bug in how AutoTP shards it (see checkpoints.py)."""
    from safetensors import safe_open

    from matrix.checkpoints import tiny_checkpoint
    from matrix.registry import load_models

    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    constant = []
    for entry in load_models().values():
        if entry.skip_reason or entry.trust_remote_code or entry.version_skip_reason(transformers.__version__):
            continue
        for weights in tiny_checkpoint(entry, log=lambda line: None).glob("*.safetensors"):
            with safe_open(weights, "pt") as tensors:
                for name in tensors.keys():
                    tensor = tensors.get_tensor(name)
                    if tensor.is_floating_point() and tensor.numel() > 1 and bool((tensor == tensor.view(-1)[0]).all()):
                        constant.append(f"{entry.name}: {name}")
    assert constant == []

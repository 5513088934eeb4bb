"""Tiny checkpoints (matrix/checkpoints.py): a corrupt one is detected and rebuilt bit-identical, and no
saved floating tensor is constant (a constant bias or norm would hide AutoTP's bias and norm bugs)."""

from pathlib import Path

import transformers

from matrix.cells import expand


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


CONCURRENT_DRIVER = """
import sys, time
from pathlib import Path
from transformers import AutoModelForCausalLM
from matrix.cells import expand
from matrix.checkpoints import tiny_checkpoint

build = AutoModelForCausalLM.from_config
def counted(*args, **kwargs):
    print("building the tiny model", flush=True)
    return build(*args, **kwargs)
AutoModelForCausalLM.from_config = counted
entry = expand("llama", tp="2")[0].model
go = Path(sys.argv[1])
(go.parent / f"ready-{sys.argv[2]}").touch()
while not go.exists():  # every driver is imported and ready before any of them looks at the cache
    time.sleep(0.01)
print(tiny_checkpoint(entry), flush=True)
"""


def test_a_missing_tiny_checkpoint_is_written_once_while_parallel_drivers_wait_for_it(tmp_path):
    """pytest-xdist workers whose cells need the same checkpoint at the same moment: the first writes it, the
    others wait and load that one (no second write, no half-written folder), and no per-save progress bar."""
    import os
    import subprocess
    import sys
    import time

    from matrix import PROJECT_ROOT

    go = tmp_path / "go"
    env = {**os.environ, "AUTOTP_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(PROJECT_ROOT)}
    drivers = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_DRIVER, str(go), str(number)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for number in range(3)
    ]
    deadline = time.monotonic() + 300
    while (
        len(list(tmp_path.glob("ready-*"))) < 3
        and time.monotonic() < deadline
        and all(d.poll() is None for d in drivers)
    ):
        time.sleep(0.05)  # imports (torch, transformers) take seconds; then all of them spin on `go` together
    go.touch()
    outputs = [driver.communicate(timeout=300) for driver in drivers]
    assert all(driver.returncode == 0 for driver in drivers), [err[-2000:] for _, err in outputs]
    stdouts = [out.splitlines() for out, _ in outputs]
    assert sum(lines.count("building the tiny model") for lines in stdouts) == 1, stdouts
    folders = {lines[-1] for lines in stdouts}
    assert len(folders) == 1, folders
    assert not any("Writing model shards" in err for _, err in outputs)  # transformers' bar, silenced while writing
    from matrix.checkpoints import MANIFEST

    written = [path.name for path in (tmp_path / "cache" / "tiny").iterdir() if not path.name.startswith(".")]
    assert written == [Path(folders.pop()).name] and (tmp_path / "cache" / "tiny" / written[0] / MANIFEST).is_file()


def test_the_plan_before_the_first_cell_writes_no_tiny_checkpoint_and_the_cell_writes_its_own(tmp_path, monkeypatch):
    """Planning ~70 models up front used to write all their checkpoints before the first cell (~50 s cold)."""
    from matrix.checkpoints import cached_tiny_checkpoint
    from suites.run.driver import RunOptions, memory_plan_lines, prepare_job

    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    llama, gpt2 = expand("llama", tp="2", shapes="stress")[0], expand("gpt2", tp="2", shapes="stress")[0]
    lines = memory_plan_lines([llama, gpt2], RunOptions())
    assert not (tmp_path / "tiny").exists()
    assert lines[-1].endswith(
        f"2 models are planned once their tiny checkpoint is written, before their cells run: "
        f"{llama.model.name}, {gpt2.model.name}"
    )
    job, provenance = prepare_job(llama, RunOptions())  # the cell writes its checkpoint (and reference) itself
    assert cached_tiny_checkpoint(llama.model) is not None and cached_tiny_checkpoint(gpt2.model) is None
    assert Path(job.checkpoint) == cached_tiny_checkpoint(llama.model)
    lines = memory_plan_lines([llama, gpt2], RunOptions())
    assert lines[-2].startswith("  1 models need <") and lines[-2].endswith(f"fit: {llama.model.name}")
    assert lines[-1].endswith(
        f"1 models are planned once their tiny checkpoint is written, before their cells run: {gpt2.model.name}"
    )


def test_a_checkpoint_hashed_once_is_hashed_again_when_a_file_changes_even_at_its_size(tmp_path, monkeypatch):
    """Cells hash a tiny checkpoint once per process (not twice per cell); a file rewritten since is
    hashed again, so a same-size corruption between two cells is still rebuilt."""
    import os

    from matrix.checkpoints import tiny_checkpoint

    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    entry = expand("gpt2", tp="2", shapes="stress")[0].model
    folder = tiny_checkpoint(entry)
    assert tiny_checkpoint(entry, log=lambda line: None) == folder  # verified: hashed once
    weights = folder / "model.safetensors"
    original = weights.read_bytes()
    flipped = bytearray(original)
    flipped[-1] ^= 0xFF
    weights.write_bytes(bytes(flipped))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a coarse clock still sees a change
    messages = []
    assert tiny_checkpoint(entry, log=messages.append) == folder
    assert messages and "does not match its recorded sha256" in messages[0]
    assert weights.read_bytes() == original

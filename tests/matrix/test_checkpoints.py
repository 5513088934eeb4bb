"""Tiny checkpoints (matrix/checkpoints.py): a corrupt one is detected and rebuilt bit-identical, and no
saved floating tensor is constant (a constant bias or norm would hide AutoTP's bias and norm bugs)."""

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

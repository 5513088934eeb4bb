"""The derived architectures' build check (sessions/build_check.py): a tiny config that is too large or
cannot build is reported with the reason, a sound one passes."""

from matrix.registry import ModelEntry
from sessions.build_check import build_problem


def test_build_check_reports_a_too_large_and_a_broken_tiny_config(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTP_CACHE", str(tmp_path))
    too_large = ModelEntry(
        "big",
        "llama",
        {
            "hidden_size": 1024,
            "num_attention_heads": 8,
            "intermediate_size": 4096,
            "num_hidden_layers": 2,
            "vocab_size": 512,
        },
    )
    assert build_problem(too_large).startswith("too large")
    rotary_beyond_head_dim = ModelEntry(
        "broken",
        "gptj",
        {"n_embd": 96, "n_head": 6, "n_layer": 1, "rotary_dim": 64, "vocab_size": 512, "n_positions": 512},
    )
    assert build_problem(rotary_beyond_head_dim) is not None
    assert build_problem(ModelEntry("fine", "gptj", {**rotary_beyond_head_dim.tiny, "rotary_dim": 8})) is None

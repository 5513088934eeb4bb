"""`expand` (the driver before its first cell) needs transformers' config classes only for a tiny config it has not
checked at this transformers version before: the answer (the tiny config's sizes, or why the class refuses it) is
remembered in the harness cache, so an expansion whose configs are all known imports neither torch nor
transformers (in transformers 5.x the config classes import torch: ~10 CPU s beside the fork server's imports)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from matrix import PROJECT_ROOT

SELECTION = "llama,qwen2,gpt2,bloom,mixtral,gemma2,codegen,phi3"


def _expand_in_a_fresh_process(cache, code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env={**os.environ, "AUTOTP_CACHE": str(cache)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


EXPAND = (
    "import json, sys\n"
    "from matrix.cells import expand\n"
    f"cells = expand({SELECTION!r}, tp='2,3', shapes='faithful,stress')\n"
    "print(json.dumps({'cells': [[c.id, c.model.skip_reason, c.model.tiny_why, c.model.tiny, c.model.checkpoints] "
    "for c in cells], 'imported': [m for m in ('torch', 'transformers') if m in sys.modules]}))"
)


def test_expand_imports_neither_torch_nor_transformers_once_its_tiny_configs_are_known(tmp_path):
    first = _expand_in_a_fresh_process(tmp_path / "cache", EXPAND)
    assert first["imported"] == ["torch", "transformers"]  # a new transformers version: the config classes answer
    again = _expand_in_a_fresh_process(tmp_path / "cache", EXPAND)
    assert again["imported"] == []
    assert again["cells"] == first["cells"]  # ids, skips, sizes: the same cells


def test_a_config_the_class_refuses_is_remembered_as_refused(tmp_path):
    check = (
        "import json, sys\n"
        "from matrix.shapes import checked_tiny_shape\n"
        "answer = checked_tiny_shape('no_such_model_type', {'hidden_size': 64})\n"
        "print(json.dumps({'answer': answer, 'imported': 'transformers' in sys.modules}))"
    )
    first = _expand_in_a_fresh_process(tmp_path / "cache", check)
    assert first["imported"] and first["answer"].startswith("ValueError: ")
    again = _expand_in_a_fresh_process(tmp_path / "cache", check)
    assert again == {"answer": first["answer"], "imported": False}

"""Every config class the installed transformers ships goes through the expansion `nox -s coverage` runs before its
first cell (conftest.py: `expand` in pytest_configure, the memory plan in pytest_sessionstart), widened from the
causal-LM architectures to every model type of CONFIG_MAPPING and the text configs of the multimodal ones. The test
fails only on an exception that escapes: one architecture's config must never stop the expansion of the others
(issue 47: deepseek_v4's config stopped all ~600 cells of `nox -s coverage`). It runs here at the tests' pinned
transformers and, slow, at the oldest and the newest the matrix picks (their own environments, as the nightly
builds them).

This file uses only what the harness had before the guards existed, so it runs unchanged on older revisions
of the harness (where it fails at transformers 5.24.0 and 5.25.0: deepseek_v4's KeyError escapes).
"""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

from matrix import PROJECT_ROOT
from matrix.cells import expand

WALK = "tests/matrix/test_every_config.py::test_expanding_every_config_class_raises_nothing"


def text_model_type(model_type: str) -> str | None:
    """The model type of a composite config's text config (llava -> llama), None when it has none apart or the
    class cannot be built from its defaults (the expansion names that as the architecture's skip)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(model_type)
        text = config.get_text_config() if hasattr(config, "get_text_config") else getattr(config, "text_config", None)
    except Exception:  # the expansion itself meets the same error and names it
        return None
    return text.model_type if text is not None and text is not config else None


def every_config_model_type() -> list[str]:
    """Every model type of the installed transformers' CONFIG_MAPPING, then the model types of the text configs of
    the composite ones that are not among them."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    every = list(CONFIG_MAPPING_NAMES)
    texts = {text for model_type in every if (text := text_model_type(model_type))}
    return every + sorted(texts - set(every))


def test_expanding_every_config_class_raises_nothing(monkeypatch, capsys):
    import transformers

    from matrix import derive
    from suites.run.driver import RunOptions, memory_plan_lines

    model_types = every_config_model_type()
    monkeypatch.setattr(derive, "causal_lm_model_types", lambda: model_types)
    cells = expand("all", tp="2,3,4", shapes="faithful,stress")  # pytest_configure's step: raises nothing
    plan = memory_plan_lines(cells, RunOptions())  # pytest_sessionstart's step
    assert plan and plan[0].startswith("memory plan:")
    assert {cell.model.model_type for cell in cells} >= set(model_types), "an architecture vanished"
    outcomes = Counter(
        "setup" if getattr(cell.model, "expansion_error", None) else "skip" if cell.model.skip_reason else "runs"
        for cell in cells
    )
    with capsys.disabled():
        print(
            f"\ntransformers {transformers.__version__}: {len(model_types)} model types expanded into "
            f"{len(cells)} cells ({dict(outcomes)})"
        )


@pytest.mark.slow
@pytest.mark.parametrize("deepspeed, transformers", [("0.14.4", "4.41.2"), ("0.19.8", "5.25.0")], ids=["min", "newest"])
def test_every_config_class_expands_at_the_oldest_and_the_newest_transformers(tmp_path, deepspeed, transformers):
    """The walk above, run in the environment of the oldest and of the newest transformers release the version
    axes pick (built the way the nightly builds it, shared under .nox/envs/)."""
    from matrix.versions import combinations
    from sessions.environments import environment_variables
    from sessions.nox_sessions import prepare_harness

    fixtures = PROJECT_ROOT / "tests" / "matrix" / "fixtures"
    (combo,) = combinations(
        "latest", overrides={"deepspeed": deepspeed, "transformers": transformers}, cache_dir=fixtures
    )
    prepared = prepare_harness(combo)
    assert f"transformers: {transformers}" in prepared.versions
    walk = subprocess.run(
        [str(prepared.python), "-m", "pytest", WALK, "-q", "-p", "no:cacheprovider"],
        cwd=PROJECT_ROOT,
        env={**environment_variables(prepared.python), "AUTOTP_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(walk.stdout[-2000:])
    assert walk.returncode == 0, walk.stdout[-6000:] + walk.stderr[-3000:]
    assert f"transformers {transformers}: " in walk.stdout

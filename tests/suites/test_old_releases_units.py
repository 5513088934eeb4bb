"""The feature detection that lets the harness run at every release its axes can pick (transformers
4.41.2 .. 5.x, DeepSpeed 0.14.4 .. 0.19.x), checked here by taking the feature away from the
installed release: each test would fail if the harness compared versions or assumed the feature."""

import importlib.util
import sys

import pytest
import torch

from matrix.registry import load_models


def test_an_architecture_the_installed_transformers_lacks_is_a_named_skip(monkeypatch):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    gemma2 = load_models()["gemma2"]
    assert gemma2.version_skip_reason("4.46.3") is None
    monkeypatch.delitem(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "gemma2")  # as in transformers 4.41
    assert gemma2.version_skip_reason("4.41.2") == "gemma2: transformers 4.41.2 has no causal-LM model of type 'gemma2'"


def _config_init_before_the_dtype_rename(self, **kwargs):  # transformers < 4.56: no `dtype` field
    pass


def test_dtype_keyword_follows_the_config_field_not_the_version(monkeypatch):
    from transformers import PretrainedConfig

    from suites.variants.loading import dtype_kwargs

    assert dtype_kwargs("bf16") == {"dtype": torch.bfloat16}
    monkeypatch.setattr(PretrainedConfig, "__init__", _config_init_before_the_dtype_rename)
    assert dtype_kwargs("bf16") == {"torch_dtype": torch.bfloat16}


def test_repro_script_picks_the_dtype_keyword_the_same_way(monkeypatch):
    from transformers import PretrainedConfig

    from suites.records.repro import TEMPLATE

    spec = importlib.util.spec_from_file_location("repro_template_under_test", TEMPLATE)
    template = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(template)
    template.CELL = {"dtype": "bf16"}
    assert template.dtype_kwargs() == {"dtype": torch.bfloat16}
    monkeypatch.setattr(PretrainedConfig, "__init__", _config_init_before_the_dtype_rename)
    assert template.dtype_kwargs() == {"torch_dtype": torch.bfloat16}


def test_training_skips_where_deepspeed_has_no_autotp_training(monkeypatch):
    from deepspeed.module_inject import layers

    from suites.variants.training import version_skip_reason

    assert version_skip_reason() is None
    monkeypatch.delattr(layers, "set_autotp_mode")  # as in DeepSpeed 0.16.3 and older
    assert "needs deepspeed >= 0.16.4" in version_skip_reason()


def test_rank_start_does_not_need_masking_utils(monkeypatch):
    import gc

    import transformers.generation.utils  # noqa: F401 - at 4.53+ these import masking_utils themselves
    import transformers.modeling_utils  # noqa: F401

    from suites.engine.worker import import_cell_machinery

    monkeypatch.setitem(sys.modules, "transformers.masking_utils", None)  # unimportable, as before transformers 4.53
    monkeypatch.setattr(gc, "freeze", lambda: None)  # a rank freezes its heap; this test process must not
    import_cell_machinery()


def test_rank_start_does_not_need_a_module_it_imports_only_ahead_of_the_cells(monkeypatch):
    """processing_utils is imported at group start only to spare each reference child its import: where it cannot
    be imported (an optional dependency missing), the fork server still starts and the cells that need it meet
    the error themselves."""
    import gc
    import importlib

    from suites.engine.worker import import_cell_machinery

    real_import_module = importlib.import_module

    def import_module(name, *args):
        if name == "transformers.processing_utils":
            raise ImportError("transformers.processing_utils needs a package this machine lacks")
        return real_import_module(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    monkeypatch.setattr(gc, "freeze", lambda: None)  # a rank freezes its heap; this test process must not
    import_cell_machinery()


def test_torchao_variant_skips_with_the_reason_where_transformers_cannot_take_its_config(monkeypatch):
    pytest.importorskip("torchao")
    import transformers

    from suites.variants.quantization import QuantizationUnavailable, hf_quantization_config

    class TorchAoConfigBeforeConfigObjects:  # transformers 4.46: quant_type must name a torchao function
        def __init__(self, quant_type):
            raise ValueError(f"Requested quantization type: {quant_type} is not supported yet")

    monkeypatch.setattr(transformers, "TorchAoConfig", TorchAoConfigBeforeConfigObjects)
    with pytest.raises(QuantizationUnavailable, match="TorchAoConfig takes no torchao config object"):
        hf_quantization_config("torchao_int8")

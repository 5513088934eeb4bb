"""The types the suites annotate a loaded model, its tokenizer and a device with. Imported for type checking only
(`if TYPE_CHECKING:`): `CausalLM` exists only for the type checker (old transformers releases lack the name)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    # What AutoModelForCausalLM.from_pretrained returns: a PreTrainedModel with GenerationMixin's `generate`.
    # transformers names the pair privately; the type checker runs against the newest release only.
    from transformers.models.auto.modeling_auto import _BaseModelWithGenerate as CausalLM

__all__ = ["CausalLM", "Device", "Tokenizer"]

Device = torch.device | str
"""Where a model and its inputs live: what the accelerator names (`cpu`, `cuda:0`) or a torch.device."""


class Tokenizer(Protocol):
    """What the probes ask of a tokenizer: a Hugging Face one, or suites/checks/inputs.py ByteTokenizer."""

    def encode(self, text: str) -> list[int]: ...

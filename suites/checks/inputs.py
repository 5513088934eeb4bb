"""The inputs every cell feeds to both the unsharded and the sharded model.

Inputs are a pure function of the tokenizer and `ProbeSpec`, so every rank and the reference
process derive the same token ids without exchanging them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoTokenizer

if TYPE_CHECKING:
    from suites.base.model_types import Tokenizer

CORPUS_FILE = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"
PROBE_CODE = tuple(Path(__file__).resolve().with_name(name) for name in ("inputs.py", "probes.py", "breakpoints.py"))


def probe_fingerprint() -> str:
    """What decides a cached reference besides the model, the spec and the library versions: the corpus
    the prompts and perplexity windows come from, and the code that builds the inputs and runs the
    probes. Part of every cache key, so editing either can never leave a stale reference behind."""
    digest = hashlib.sha256()
    for path in (CORPUS_FILE, *PROBE_CODE):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ProbeSpec:
    prompt_tokens: int = 24
    """Length of the longer prompt of the batch."""
    left_pad: int = 4
    """The second prompt is this much shorter and left-padded, so the attention-mask path runs."""
    new_tokens: int = 8
    """Greedy tokens generated with the KV cache (prefill + one-token decode steps)."""
    ppl_tokens: int = 256
    """Corpus tokens scored for perplexity through the `labels=` loss path."""
    ppl_window: int = 64
    """Sliding window length (tokens) for perplexity."""
    ppl_stride: int = 32
    """Stride between windows; only the last `stride` tokens of a window are scored (HF guide)."""
    perplexity_skipped: str = ""
    """Why the model cannot run the perplexity probe (its entry's `probe_skips`), "" when it runs: the other probes
    run, and the perplexity check passes naming the reason."""


class ByteTokenizer:
    """Byte-level ids (0..255) for tiny checkpoints, which have no tokenizer files to download."""

    pad_token_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


def load_tokenizer(source: str | None, trust_remote_code: bool = False) -> Tokenizer:
    """ByteTokenizer for tiny checkpoints (source None), else the checkpoint's own tokenizer."""
    if source is None:
        return ByteTokenizer()

    return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)


def _pad_id(tokenizer: Tokenizer) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0


@dataclass
class ProbeInputs:
    batch_ids: torch.Tensor
    """[2, T] prompts; row 1 is left-padded."""
    batch_mask: torch.Tensor
    """[2, T] attention mask matching `batch_ids`."""
    corpus_ids: torch.Tensor
    """[1, N] corpus tokens for perplexity."""


def build_inputs(tokenizer: Tokenizer, spec: ProbeSpec) -> ProbeInputs:
    corpus = CORPUS_FILE.read_text()
    ids = tokenizer.encode(corpus)
    needed = max(spec.ppl_tokens, 2 * spec.prompt_tokens)
    if len(ids) < needed:
        raise ValueError(f"{CORPUS_FILE} gives {len(ids)} tokens with this tokenizer; the probes need {needed}")
    first = ids[: spec.prompt_tokens]
    second = ids[spec.prompt_tokens : 2 * spec.prompt_tokens - spec.left_pad]
    pad = _pad_id(tokenizer)
    batch_ids = torch.tensor([first, [pad] * spec.left_pad + second])
    batch_mask = torch.ones_like(batch_ids)
    batch_mask[1, : spec.left_pad] = 0
    return ProbeInputs(batch_ids=batch_ids, batch_mask=batch_mask, corpus_ids=torch.tensor([ids[: spec.ppl_tokens]]))

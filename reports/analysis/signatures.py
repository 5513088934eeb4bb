"""What a failure signature says beyond one cell: its cause with tp-dependent detail masked, and the
source files its frames name.

Signatures are recorded with numbers already masked (`suites/outcome.py`: "split_sizes=[N, N]"), but the
length of a shape or size list still follows the tp size ([N, N] at tp 2, [N, N, N] at tp 3), and so do
factors of a shape product the recording left half masked (Nx4N at tp 2, Nx3N at tp 3): the same
cause must read the same at every tp, so triage bisects it once and the report shows it once."""

from __future__ import annotations

import re
from functools import lru_cache

# A run of two or more masked numbers ("N, N", "N,N,N", "N x N"), as shapes and split sizes print.
_NUMBER_RUN = re.compile(r"N(?:\s*(?:,|x|\*)\s*N)+")
# A shape written as a product ("24x384"): the recorded signature masks only the first factor, as the others
# follow a letter, and leaves mixes like "Nx3N" (tp3) next to "Nx4N" (tp2) for one cause (torch's "mat1 and
# mat2 shapes cannot be multiplied (24x384 and 24x384)").
_PRODUCT = re.compile(r"(?<![A-Za-z_])[\dN]+(?:x[\dN]+)+(?![A-Za-z_])")
# Numbers that escaped masking (a signature recorded by an older harness, or written by hand), with any masked
# part they stick to ("3N").
_NUMBER = re.compile(r"(?<![A-Za-z_])[\dN]*\d[\dN]*(?:\.\d+)?")
# "File ".../site-packages/transformers/models/bloom/modeling_bloom.py", line 12" in a traceback, and
# "@ transformers/models/bloom/modeling_bloom.py:forward" at the end of a signature.
_TRACEBACK_FILE = re.compile(r'File "[^"]*?/((?:deepspeed|transformers)/[^"]+?\.py)"')
_SIGNATURE_FILE = re.compile(r"@ ((?:deepspeed|transformers)/\S+?\.py):")


@lru_cache(maxsize=4096)  # a year's ~75 k result groups share a few hundred signatures
def cause(signature: str) -> str:
    """The signature with numbers and the length of number lists masked: one text per cause, whatever the tp."""
    return _NUMBER_RUN.sub("N…", _NUMBER.sub("N", _PRODUCT.sub("N…", signature)))


def same_failure(failure_class: str, signature: str, other: tuple[str, str]) -> bool:
    """Whether a failure is other (failure class, signature): the same class and cause, whatever the tp."""
    return failure_class == other[0] and cause(signature) == cause(other[1])


def frame_files(signature: str, message: str = "") -> list[str]:
    """Package-relative source files (deepspeed/…, transformers/…) named by the signature's frame and by a
    traceback in the message, the raising frame first, each once."""
    found = [*_SIGNATURE_FILE.findall(signature), *reversed(_TRACEBACK_FILE.findall(message))]
    return list(dict.fromkeys(found))

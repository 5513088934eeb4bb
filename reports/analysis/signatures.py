"""What a failure signature says beyond one cell: its cause with tp-dependent detail masked, and the
source files its frames name.

Signatures are recorded with numbers already masked (`suites/verdicts/outcome.py`: "split_sizes=[N, N]"), but the
length of a shape or size list still follows the tp size ([N, N] at tp 2, [N, N, N] at tp 3), and so do
factors of a shape product the recording left half masked (Nx4N at tp 2, Nx3N at tp 3): the same
cause must read the same at every tp, so triage bisects it once and the report shows it once."""

from __future__ import annotations

import re
from functools import lru_cache

from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import failure_text

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
def mask_signature(signature: str) -> str:
    """The signature with numbers and the length of number lists masked: one text per cause, whatever the tp."""
    return _NUMBER_RUN.sub("N…", _NUMBER.sub("N", _PRODUCT.sub("N…", signature)))


def failure_key(failure_class: str, signature: str, mechanism: Cause | None) -> str:
    """What makes failures one cause: the mechanism key the harness recorded with it (suites/verdicts/mechanism.py
    `cause_of`: what AutoTP did where it broke), or, for a failure recorded before causes were kept, its class and
    masked signature."""
    return mechanism.mechanism_key if mechanism is not None else f"{failure_class}|{mask_signature(signature)}"


def surfaced_in(signature: str) -> str:
    """`transformers/models/olmo2/modeling_olmo2.py:forward`: the frame a signature's exception surfaced in ("" when
    it names none)."""
    found = re.search(r" @ (\S+)$", signature)
    return found[1] if found else ""


def same_failure(
    failure_class: str, signature: str, other: tuple[str, str], broke_at: str = "", other_at: str = ""
) -> bool:
    """Whether a failure is other (failure class, signature): the same class, exception type and masked message,
    whatever the tp and whatever the function it surfaced in is called (a release that renames the function is not
    another failure), and the same module where both name where they broke (`broke_at`, a role)."""
    same_text = mask_signature(failure_text(signature)) == mask_signature(failure_text(other[1]))
    return failure_class == other[0] and same_text and (not broke_at or not other_at or broke_at == other_at)


def frame_files(signature: str, message: str = "") -> list[str]:
    """Package-relative source files (deepspeed/…, transformers/…) named by the signature's frame and by a
    traceback in the message, the raising frame first, each once."""
    found = [*_SIGNATURE_FILE.findall(signature), *reversed(_TRACEBACK_FILE.findall(message))]
    return list(dict.fromkeys(found))

"""Secrets (HF_TOKEN, GITHUB_TOKEN, any credential-like variable) never reach a log, a record, a report
or a repro script: everything that writes text another person may read passes it through `redact`.
It sits in the lowest layer so that every layer (prefetch, records, reports) redacts the same way.

Two kinds of secret are replaced by `***`: the values of environment variables whose names look like
credentials (only values of at least MIN_SECRET_LENGTH characters: `TOKENIZERS_PARALLELISM=false` must not
blank out every "false"), and tokens recognisable by their shape wherever they come from — a failure message
recorded on a machine whose environment this process never saw (the report job has no HF_TOKEN)."""

from __future__ import annotations

import os
import re
import string
from collections.abc import Mapping
from pathlib import Path

_SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD", re.IGNORECASE)
MIN_SECRET_LENGTH = 8
REDACTED = "***"
# Replaced wherever they appear, in any letter case: tokens by shape — Hugging Face (hf_ + 34), GitHub classic
# (ghp_, gho_, ghu_, ghs_, ghr_ + 36) and fine-grained (github_pat_...), lengths as minimums so that a longer future
# format is still caught — and the credential after `Authorization:` (HTTP header, dict repr, JSON) or `Bearer`,
# the words kept (group `lead`), and a URL's user:password. Written in lowercase and matched against an ASCII-lowercased copy of the text (same
# length, so the spans carry over): every pattern starts with a literal, which large reports need — a
# case-insensitive or \b-led pattern took 1.4 s instead of 0.01 s over an 8 MB report.json.
_PATTERNS = (  # (the literal each starts with, looked for first as it is cheaper, the pattern)
    ("hf_", re.compile(r"hf_[a-z0-9]{20,}")),
    ("gh", re.compile(r"gh[pousr]_[a-z0-9]{20,}")),
    ("github_pat_", re.compile(r"github_pat_[a-z0-9_]{20,}")),
    (
        "authorization",
        re.compile(
            r"(?P<lead>authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|token|basic)\s+)?)"
            r"[^\s\"',;]{8,}"
        ),
    ),
    ("bearer", re.compile(r"(?P<lead>bearer\s+)[^\s\"',;]{8,}")),
    # The user:password of a URL (a private index in pip's configuration, handed to uv on its command line).
    ("://", re.compile(r"(?P<lead>://)[^\s/@:\"']+:[^\s/@\"']+(?=@)")),
)
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def secret_values(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Values of environment variables that look like credentials (HF_TOKEN, GITHUB_TOKEN, ...), longest first."""
    return sorted(
        {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True
    )


class Redactor:
    """The secrets of one environment, read once: for redacting many texts (a whole import) in one go."""

    def __init__(self, environ: Mapping[str, str] = os.environ):
        self._values = secret_values(environ)  # longest first: a value inside another goes too

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, REDACTED)
        lowered = _lowered(text)
        spans = sorted(
            (match.end("lead") if "lead" in pattern.groupindex else match.start(), match.end())
            for literal, pattern in _PATTERNS
            if literal in lowered
            for match in pattern.finditer(lowered)
        )
        pieces, done = [], 0
        for start, end in spans:
            if end > done:  # a token after `Authorization: token` is matched twice
                pieces += [text[done : max(start, done)], REDACTED]
                done = end
        return "".join(pieces) + text[done:]


def _lowered(text: str) -> str:
    """The text in lower case, each character where it was (the patterns' spans carry over). str.lower() is one C
    loop; it keeps every position unless a character lowers to two (only U+0130, "İ"), and then the ASCII-only
    translation is used: a per-character table lookup once the text holds any non-ASCII character (a report with
    "…" or "×"): 2.1 s CPU against lower()'s 0.28 s over a year's 42 M-character report.html. lower() also lowers
    non-ASCII letters, which only ever lets a pattern match more (a Kelvin sign "K" reads as "k"), never less."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)


def redact(text: str) -> str:
    return Redactor()(text)


def copy_redacted(source: Path, destination: Path) -> None:
    """Copy a log with its secrets replaced; bytes that are not UTF-8 (a crashed rank's output) pass unchanged."""
    text = Path(source).read_bytes().decode("utf-8", errors="surrogateescape")
    Path(destination).write_bytes(redact(text).encode("utf-8", errors="surrogateescape"))

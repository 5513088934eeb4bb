"""Secrets (HF_TOKEN, GITHUB_TOKEN, any credential-like variable) never reach a log, a record, a report
or a repro script: everything that writes text another person may read passes it through `redact`.
It sits in the lowest layer so that every layer (prefetch, records, reports) redacts the same way."""

from __future__ import annotations

import os
import re

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY", re.IGNORECASE)
REDACTED = "***"


def secret_values() -> list[str]:
    """Values of environment variables that look like credentials (HF_TOKEN, GITHUB_TOKEN, ...)."""
    return sorted({v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 6}, key=len, reverse=True)


def redact(text: str) -> str:
    for value in secret_values():
        text = text.replace(value, REDACTED)
    return text

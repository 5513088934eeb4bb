"""Answers of transformers' config classes remembered in the harness cache, per transformers version and origin (a
commit checkout's commit): the config classes import torch in transformers 5.x (~10 CPU s of the driver before its
first cell), and the same transformers gives the same answer, so an expansion whose configs are all known imports
neither."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from matrix import cache_root
from matrix.harness_cache import used
from matrix.installed import cache_identity


def remembered(folder: str, key: Mapping[str, Any], compute: Callable[[], Any]) -> Any:
    """`compute()`'s answer (JSON values) for `key`, from `folder` of the harness cache when it was asked before."""

    full_key = {**key, **cache_identity("transformers")}
    digest = hashlib.sha256(json.dumps(full_key, sort_keys=True).encode()).hexdigest()[:16]
    record = used(cache_root() / folder / f"{digest}.json")
    try:
        return json.loads(record.read_text())["answer"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not recorded yet (or unreadable): the config class answers
    from transformers.utils import logging as hf_logging

    # Configs built on the way warn about sizes they adjust (rope scaling vs positions): noise before the first cell.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    try:
        answer = compute()
    finally:
        hf_logging.set_verbosity(verbosity)
    record.parent.mkdir(parents=True, exist_ok=True)
    # Parallel drivers (pytest-xdist workers) may write the same record: each through a staging file of its own.
    staging = record.with_name(f".{record.name}.tmp{os.getpid()}")
    staging.write_text(json.dumps({"key": full_key, "answer": answer}))
    staging.replace(record)
    return answer

"""Writing matrix/real_shapes.toml (`render`, `add_record`) and its command line, `python -m matrix.shapes`."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from matrix.config_values import UnreadableConfig
from matrix.registry import MODELS_FILE, ModelEntry, RegistryError, load_models
from matrix.shapes.layer_check import layer_pattern_problems
from matrix.shapes.layer_kinds import first_appearance, real_layer_kinds
from matrix.shapes.real_shape import REQUIRED_SIZES, RealShape, defaults_source, read_shape, tiny_shape
from matrix.shapes.records import AS_WRITTEN_KEY, DEFAULTS_KEY, load_real_shapes, real_shapes_file


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def _toml_record(shape: RealShape) -> str:
    return _toml_value({k: v for k, v in asdict(shape).items() if v or k in REQUIRED_SIZES})


HEADER = """\
# Real sizes of every registry entry's checkpoints (matrix/shapes/): what a faithful tiny config splits like.
# [<entry>] "<hub id>" = { ... }: from that checkpoint's config.json (source = "hub config <hub id>"; add-model
# writes it, or type it from the published config). "defaults" = { ... }: the installed transformers' config
# class defaults, used where no hub config is recorded for the entry's first hub id (source names the release).
# `layers`: the config.json fields that decide the layer kinds (the class defaults stand for those left out; a
# config.json null is written "null": EXAONE 4's sliding_window, whose absence makes every layer rope);
# `layer_pattern`: the kinds they give, in the order they first appear, which the faithful tiny config keeps.
# Regenerate with `python -m matrix.shapes --write`; `--check` fails when this file is stale or a faithful tiny
# config's layer pattern is not its checkpoint's.
"""


def render(registry: dict[str, ModelEntry], shapes: dict[str, dict[str, RealShape]]) -> str:
    """The file: hub-config records as they are, a defaults record (from the installed transformers) for every
    entry whose first hub id has none."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)
    blocks = []
    for name, entry in registry.items():
        if entry.skip_reason or entry.trust_remote_code:
            continue
        records = {
            k: replace(v, layer_pattern=first_appearance(real_layer_kinds(entry.model_type, v.layers)))
            for k, v in shapes.get(name, {}).items()
            if k != DEFAULTS_KEY
        }
        if AS_WRITTEN_KEY in records:  # its sizes follow its tiny config
            records[AS_WRITTEN_KEY] = replace(
                tiny_shape(entry.model_type, entry.tiny), source=records[AS_WRITTEN_KEY].source
            )
        elif not (entry.hub_ids and entry.hub_ids[0] in records):
            records[DEFAULTS_KEY] = read_shape(AutoConfig.for_model(entry.model_type), defaults_source())
        blocks.append(_block(name, records))
    return HEADER + "\n" + "\n".join(blocks)


def _block(entry: str, records: dict[str, RealShape]) -> str:
    return f"[{entry}]\n" + "".join(f"{_key(k)} = {_toml_record(v)}\n" for k, v in records.items())


def _key(text: str) -> str:
    return text if text.replace("_", "").replace("-", "").isalnum() else '"' + text + '"'


def add_record(models_file: Path, entry: ModelEntry, hub_id: str | None, shape: RealShape | None) -> Path:
    """Append the real sizes of a new registry entry (add-model) to real_shapes.toml next to `models_file`: its
    checkpoint's (`hub_id`, `shape`), or without one its config class defaults. Returns the file written."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers import AutoConfig

    path = real_shapes_file(models_file)
    if path.exists() and entry.name in load_real_shapes(path):
        raise RegistryError(f"{path}: entry [{entry.name}] already has records; remove them first")
    records = (
        {hub_id: shape}
        if hub_id and shape
        else {DEFAULTS_KEY: read_shape(AutoConfig.for_model(entry.model_type), defaults_source())}
    )
    path.write_text((path.read_text() if path.exists() else HEADER) + "\n" + _block(entry.name, records))
    return path


_DEFAULTS_VERSION = re.compile(r'(source = "config-defaults transformers )[^"]*(")')


def _same_shapes(written: str, computed: str) -> bool:
    """The file says what --write would write, but for the transformers release a defaults record names as its
    source: the same shapes read from another release's config defaults are not stale (`--check` runs wherever
    the tests' transformers is, the file is written wherever the last `--write` ran)."""
    return _DEFAULTS_VERSION.sub(r"\1\2", written) == _DEFAULTS_VERSION.sub(r"\1\2", computed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check matrix/real_shapes.toml.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--write", action="store_true", help="rewrite the file (defaults records from the installed transformers)"
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the file is not what --write would write or a faithful tiny config's layer pattern is not "
        "its checkpoint's",
    )
    parser.add_argument("--models-file", type=Path, default=MODELS_FILE)
    args = parser.parse_args(argv)
    args.file = real_shapes_file(args.models_file)
    try:
        registry = load_models(args.models_file)
        shapes = load_real_shapes(args.file, registry if args.check else None) if args.file.exists() else {}
        text = render(registry, shapes)
    except (RegistryError, UnreadableConfig) as error:
        print(f"shapes: {error}", file=sys.stderr)
        return 2
    if args.write:
        args.file.write_text(text)
        print(f"wrote {args.file}")
        return 0
    if not (args.file.exists() and _same_shapes(args.file.read_text(), text)):
        print(f"{args.file} is stale: run python -m matrix.shapes --write", file=sys.stderr)
        return 1

    problems = layer_pattern_problems(registry, shapes)
    for problem in problems:
        print(f"shapes: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{args.file} is up to date; every faithful tiny config keeps its checkpoint's layer pattern")
    return 0

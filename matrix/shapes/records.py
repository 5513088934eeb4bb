"""matrix/real_shapes.toml: the recorded real shapes of every registry entry, read and checked against the registry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from matrix.registry import MATRIX_DIR, ModelEntry, RegistryError, parsed_once, read_toml
from matrix.shapes.real_shape import RealShape
from matrix.toml_tables import TableError, read_table

if TYPE_CHECKING:
    pass

REAL_SHAPES_FILE = MATRIX_DIR / "real_shapes.toml"
SHAPE_SEPARATOR = "."
DEFAULTS_KEY = "defaults"
"""The record of a registry entry's transformers config class defaults (for entries without a known hub config)."""
AS_WRITTEN_KEY = "as_written"
"""The record of an entry that stands for no checkpoint (no hub_ids; e.g. llama_large, sized for the memory
checks): its source says why, its sizes are its own tiny config's, and its faithful cells run that config."""


def _parse_record(path: Path, entry: str, checkpoint: str, raw: object) -> RealShape:
    expected = {DEFAULTS_KEY: "config-defaults transformers ", AS_WRITTEN_KEY: "as written: "}.get(
        checkpoint, f"hub config {checkpoint}"
    )

    def named_source(shape: RealShape) -> None:
        if not shape.source.startswith(expected):
            raise TableError("source", f"must start with {expected!r}, got {shape.source!r}")

    where = f"{path}: entry [{entry}] checkpoint {checkpoint!r}"
    return read_table(RealShape, raw, where=where, error=RegistryError, rules=named_source)


MISSING_HINT = "; write it with python -m matrix.shapes --write"


def _parsed_shapes(path: Path) -> dict[str, dict[str, RealShape]]:
    shapes = {}
    for entry, records in read_toml(path, MISSING_HINT).items():
        if not isinstance(records, dict) or not records:
            raise RegistryError(f"{path}: entry [{entry}] must be a table of checkpoint = {{ sizes }}, got {records!r}")
        shapes[entry] = {
            checkpoint: _parse_record(path, entry, checkpoint, record) for checkpoint, record in records.items()
        }
    return shapes


def load_real_shapes(
    path: Path = REAL_SHAPES_FILE, registry: dict[str, ModelEntry] | None = None
) -> dict[str, dict[str, RealShape]]:
    """{entry: {hub id or 'defaults': shape}}; with `registry`, every entry must have the record its faithful
    cells use (faithful_record) and name only its own hub ids. The records are parsed once per content of the file
    (every repro script and draft of a render reads them); each caller gets its own dicts of the frozen shapes."""
    parsed = parsed_once(path, _parsed_shapes, MISSING_HINT)
    shapes = {entry: dict(records) for entry, records in parsed.items()}
    if registry is not None:
        for entry, records in shapes.items():
            if entry not in registry:
                raise RegistryError(f"{path}: entry [{entry}] is not in the model registry")
            hub_ids = registry[entry].hub_ids
            strangers = set(records) - {DEFAULTS_KEY, *hub_ids, *([] if hub_ids else [AS_WRITTEN_KEY])}
            if strangers:
                raise RegistryError(
                    f"{path}: entry [{entry}] has record(s) {sorted(strangers)} that are not in its hub_ids "
                    f"{list(hub_ids)} (or {DEFAULTS_KEY!r}; {AS_WRITTEN_KEY!r} for an entry without hub_ids)"
                )
        for name, model in registry.items():
            if not (model.skip_reason or model.trust_remote_code) and faithful_record(model, shapes) is None:
                raise RegistryError(
                    f"{path}: entry [{name}] has no record for {(model.hub_ids or [DEFAULTS_KEY])[0]!r}"
                    f" nor {DEFAULTS_KEY!r}; run python -m matrix.shapes --write"
                )
    return shapes


def real_shapes_file(models_file: Path) -> Path:
    """The real shapes of a registry file's entries: real_shapes.toml next to it."""
    return Path(models_file).with_name(REAL_SHAPES_FILE.name)


def faithful_record(entry: ModelEntry, shapes: dict[str, dict[str, RealShape]]) -> RealShape | None:
    """The real shape a faithful cell of `entry` splits like: its first hub id's (what `--checkpoints hub`
    loads) when recorded, else its own config when it stands for no checkpoint, else its config class defaults."""
    records = shapes.get(entry.name.split(SHAPE_SEPARATOR)[0], {})
    if entry.hub_ids and entry.hub_ids[0] in records:
        return records[entry.hub_ids[0]]
    return records.get(AS_WRITTEN_KEY) or records.get(DEFAULTS_KEY)

"""`python -m matrix.shapes --check`'s layer pattern check: every faithful tiny config of the registry keeps one layer
of each kind its checkpoint has (real_shapes.toml `layer_pattern`), in the order they first appear, and no other."""

from __future__ import annotations

from matrix.registry import ModelEntry
from matrix.shapes.faithful_rule import faithful_tiny
from matrix.shapes.real_shape import MATRIX_TP, RealShape, tiny_shape
from matrix.shapes.records import REAL_SHAPES_FILE
from matrix.shapes.shape_axis import faithful_groups_or_why, shaped_name


def layer_pattern_problems(registry: dict[str, ModelEntry], shapes: dict[str, dict[str, RealShape]]) -> list[str]:
    """One line per faithful cell whose tiny config's layer pattern (read by layer_kinds from the config it builds)
    is not its record's: the model, both patterns and what to change."""
    problems = []
    for name, entry in registry.items():
        if entry.skip_reason or entry.trust_remote_code or entry.expansion_error:
            continue
        groups = faithful_groups_or_why(entry, shapes, MATRIX_TP)
        for shape, group in {} if isinstance(groups, str) else groups.items():
            real = group.record
            as_written = real.source.startswith("as written: ")
            tiny = entry.tiny if as_written else faithful_tiny(entry, real, MATRIX_TP)
            try:
                found = tiny_shape(entry.model_type, tiny).layer_pattern
            except Exception as error:  # the class refuses the layer fields derived: named, the other entries go on
                problems.append(
                    f"{shaped_name(name, shape)}: the config class refuses its faithful tiny config: {error}"
                )
                continue
            if found != real.layer_pattern:
                problems.append(
                    f"{shaped_name(name, shape)}: its tiny config's layers are {' | '.join(found)}, but "
                    f"{real.source}'s are {' | '.join(real.layer_pattern)} ({REAL_SHAPES_FILE.name} [{name}]). A "
                    "faithful tiny config keeps one layer of every kind of its checkpoint, in the order they first "
                    f"appear, and no other: cite the checkpoint's config.json value of each field that decides it in "
                    f"the record's `layers` (the faithful config then takes it), or drop the field from "
                    f"[models.{name}] tiny"
                )
    return problems

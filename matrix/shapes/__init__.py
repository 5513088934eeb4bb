"""Cell shapes: the sizes of a cell's tiny checkpoint, and the real checkpoints' sizes they are derived from.

A verdict is read as a statement about the checkpoints named in `hub_ids` ("qwen2 tp 3 passes" = "Qwen2-7B
works at tp 3"), so by default a tiny checkpoint must split under AutoTP exactly like its real checkpoint.
AutoTP splits attention by whole (kv-)heads and every other dim in 64-element grains (DeepSpeed's
`tp_shard.get_shard_size`): at tp N a count C of heads or grains gives C // N to every rank and one more to the
first C % N ranks. Two shapes split alike at tp N when every such count has the same remainder mod N and is
below N on both or on neither (a rank left empty), and every dim has the same sub-grain rest. DeepSpeed's
`get_shard_size` splits a non-MLP dim that divides by the kv head count in kv-head units instead of grains, so
whether the hidden and attention widths divide by the kv heads is kept too (and whether there are exactly 2 kv
heads, where DeepSpeed cuts a glm-type fused qkv apart); and an entry's `split_rules`
(matrix/models.toml: architecture-specific conditions such as codegen's kv heads % (4 x tp) == 0) hold for the
tiny config at a tp exactly where they hold for the real checkpoint.

Shapes of a cell (`SHAPES`):
- `faithful`: the registry's `tiny` overrides with every split-relevant size replaced by `faithful_sizes`: the
  smallest sizes that split like the entry's real shape (`real_shapes.toml`) at tp 2, 3, 4 and the cell's tp.
- `stress`: the registry's `tiny` overrides as written: deliberately odd splits (uneven grains, fewer kv heads
  than ranks) exercised for every architecture, whatever its checkpoints have.

`matrix/real_shapes.toml` records the real sizes of each registry entry: from a checkpoint's config.json
(`source = "hub config <hub id>"`, written by add-model or by hand from the published config) or from the
installed transformers' config class defaults (`source = "config-defaults transformers <version>"`, written by
`python -m matrix.shapes --write`; `--check` fails when the file is not what --write would make).
"""

from matrix.config_keys import HEAD_KEYS
from matrix.shapes.faithful_rule import faithful_count, faithful_dim, faithful_sizes
from matrix.shapes.real_shape import (
    EXPERT_KEYS,
    HEAD_DIM_KEYS,
    HIDDEN_KEYS,
    KV_KEYS,
    MATRIX_TP,
    MLA_KEY,
    NESTED,
    RealShape,
    checked_tiny_shape,
    read_shape,
    split_differences,
    split_pattern,
    tiny_shape,
)
from matrix.shapes.real_shapes_writer import add_record, main
from matrix.shapes.records import REAL_SHAPES_FILE, SHAPE_SEPARATOR, faithful_record, load_real_shapes, real_shapes_file
from matrix.shapes.shape_axis import (
    DEFAULT_SHAPES,
    SHAPES,
    UNMARKED_SHAPE,
    base_shape,
    faithful_groups,
    faithful_groups_or_why,
    parse_shapes,
    shaped_entries,
    shaped_entry,
    shaped_name,
    split_shaped_name,
)

__all__ = [
    "DEFAULT_SHAPES",
    "EXPERT_KEYS",
    "HEAD_DIM_KEYS",
    "HEAD_KEYS",
    "HIDDEN_KEYS",
    "KV_KEYS",
    "MATRIX_TP",
    "MLA_KEY",
    "NESTED",
    "REAL_SHAPES_FILE",
    "SHAPES",
    "SHAPE_SEPARATOR",
    "UNMARKED_SHAPE",
    "RealShape",
    "add_record",
    "base_shape",
    "checked_tiny_shape",
    "faithful_count",
    "faithful_dim",
    "faithful_groups",
    "faithful_groups_or_why",
    "faithful_record",
    "faithful_sizes",
    "load_real_shapes",
    "main",
    "parse_shapes",
    "read_shape",
    "real_shapes_file",
    "shaped_entries",
    "shaped_entry",
    "shaped_name",
    "split_differences",
    "split_pattern",
    "split_shaped_name",
    "tiny_shape",
]

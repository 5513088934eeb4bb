"""`python -m matrix.shapes`: write or check matrix/real_shapes.toml (matrix/shapes/real_shapes_writer.py)."""

from matrix.shapes.real_shapes_writer import main

raise SystemExit(main())

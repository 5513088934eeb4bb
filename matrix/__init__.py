"""What to test: the models (models.toml, derived tiny configs), the variants, the version axes and
the cells they expand into, and the checkpoints the cells load. The lowest layer: it imports no other
package of the harness, and every other package may import it."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent

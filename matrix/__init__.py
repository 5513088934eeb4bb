"""What to test: the models (models.toml, derived tiny configs), the variants, the version axes and
the cells they expand into, and the checkpoints the cells load. The lowest layer: it imports no other
package of the harness, and every other package may import it."""

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """The harness cache (AUTOTP_CACHE): tiny checkpoints, references, tiny shapes, JIT builds."""
    return Path(os.environ.get("AUTOTP_CACHE", Path.home() / ".cache" / "autotp-matrix"))

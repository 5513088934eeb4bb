"""What to test: the models (models.toml, derived tiny configs), the variants, the version axes and
the cells they expand into, and the checkpoints the cells load. The lowest layer: it imports no other
package of the harness, and every other package may import it."""

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HARNESS_PACKAGES = ("suites", "matrix", "sessions", "reports")
"""The harness's own code, by module file under the project root (never a path substring: a checkout under a
folder named `torch` or `deepspeed` must not flip the rule). tests/ is not the harness: its fault hooks stand
for library bugs."""


def is_harness_file(filename: str) -> bool:
    """Whether `filename` is a module of the harness's own packages (HARNESS_PACKAGES)."""
    path = Path(filename).resolve()
    return any(path.is_relative_to(PROJECT_ROOT / package) for package in HARNESS_PACKAGES)


def cache_root() -> Path:
    """The harness cache (AUTOTP_CACHE): tiny checkpoints, references, tiny shapes, JIT builds."""
    return Path(os.environ.get("AUTOTP_CACHE", Path.home() / ".cache" / "autotp-matrix"))

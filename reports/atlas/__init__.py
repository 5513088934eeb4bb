"""The atlas: every archived verdict by real checkpoint, cause and DeepSpeed release, as a static site and
atlas.json (`python -m reports atlas site`), read from the results archive alone; and what the archive holds per
session (`python -m reports atlas done`), which `nox -s atlas` plans its missing cells from.

Other rooms import these names from here; modules inside the room import each other directly."""

from reports.atlas.model import (
    Atlas,
    atlas_json,
    build_atlas,
)
from reports.atlas.pages import (
    ATLAS_FILE,
    site_pages,
    write_site,
)
from reports.atlas.reading import (
    AtlasReader,
    SessionCounts,
    read_archive,
)

__all__ = [
    "ATLAS_FILE",
    "Atlas",
    "AtlasReader",
    "SessionCounts",
    "atlas_json",
    "build_atlas",
    "read_archive",
    "site_pages",
    "write_site",
]

"""`python -m reports atlas`: the atlas from the results archive alone — `site` renders its pages and atlas.json,
`done` prints what the archive holds per session (what `nox -s atlas` plans the missing cells from)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from reports.atlas import build_atlas, read_archive, write_site
from reports.commands.interface import Command
from reports.commands.options import add_known_failures, known_failures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    site = actions.add_parser("site", help="render index.html, a page per checkpoint, cause and DeepSpeed release")
    site.add_argument("--out", type=Path, required=True, help="the site's folder (replaced whole when done)")
    done = actions.add_parser("done", help="print {session: {runs, cells, install}} of the archive as JSON")
    for action in (site, done):
        action.add_argument("--archive", type=Path, default=Path("results/archive"), help="the results archive")
    add_known_failures(site)


def run(args: argparse.Namespace) -> int:
    reader, archive = read_archive(args.archive)
    if args.action == "done":
        print(json.dumps({name: asdict(counts) for name, counts in reader.session_counts().items()}, sort_keys=True))
        return 0
    answers = archive.answers(lambda damage: print(f"skipped {damage}", file=sys.stderr))
    atlas = build_atlas(reader.history(answers), known_failures(args.known_failures))
    written = write_site(atlas, args.out)
    print(
        f"wrote {len(written)} files to {args.out}: {len(atlas.rows)} checkpoint and architecture pages, "
        f"{len(atlas.causes)} cause pages, {len(atlas.version_sets)} version sets, {len(atlas.verdicts)} verdicts"
    )
    return 0


COMMAND = Command(
    "atlas", "the atlas from the archive alone: `site --out DIR` (pages, atlas.json), `done`", add_arguments, run
)

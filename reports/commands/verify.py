"""`python -m reports verify`: exit 1 when the archive could not rebuild the store: an entry that does not open, has
changed since it was recorded or holds records merge would not let in, or a run or answer the archive lacks."""

from __future__ import annotations

import argparse
import sys

from reports.commands.interface import Command
from reports.commands.options import add_archive, add_store
from reports.store import DamagedEntry, HistoryStore, ResultsArchive, answer_key, default_archive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive(parser)
    add_store(parser)


def run(args: argparse.Namespace) -> int:
    """Every entry present is opened, hashed against the SHA-256 the store recorded for it and read into records that
    pass the door's rules (what rebuild needs); an entry the store recorded must still be listed; every trusted run
    and answer of the store must be archived (a lost store would lose it). Entries a sparse checkout left out (the
    data branch's index only) are checked by name. Untrusted runs (a pull request's) are never archived."""
    archive = ResultsArchive(args.archive or default_archive(args.store))
    entries = archive.entries()
    with HistoryStore(args.store, create=False, read_only=True) as store:
        runs = [run.run_id for run in store.runs() if run.trusted]
        answers = [answer_key(answer) for answer in store.answers()]
        recorded = store.entry_hashes()
    problems = []
    opened = 0
    for entry in entries:
        if not entry.path.exists():
            continue  # in the index only: its name is all a sparse checkout has
        try:
            archive.read(entry)
        except DamagedEntry as exc:
            problems.append(str(exc))
            continue
        opened += 1
        digest, expected = archive.sha256(entry), recorded.get(archive.name(entry))
        if expected is not None and digest != expected:
            problems.append(
                f"{entry.path}: SHA-256 {digest[:16]}… differs from the {expected[:16]}… recorded when it was "
                "merged: the entry was changed; restore it from the data branch's history"
            )
    listed = {archive.name(entry) for entry in entries}
    problems += [
        f"{archive.root / name}: recorded in {args.store} but no longer in the archive; restore it from the data "
        "branch's history"
        for name in sorted(recorded.keys() - listed)
    ]
    archived_runs = {entry.run_id for entry in entries}
    archived_answers = {answer_key(answer) for answer in archive.answers(problems.append)}
    missing_runs = [run_id for run_id in runs if run_id not in archived_runs]
    missing_answers = [key for key in answers if key not in archived_answers]
    if missing_runs or missing_answers:
        shown = ", ".join(missing_runs[:3]) + (", ..." if len(missing_runs) > 3 else "")
        problems.append(
            f"{args.store}: {len(missing_runs)} run(s) ({shown}) and {len(missing_answers)} answer(s) are "
            f"not in the archive {archive.root}, so a lost store would lose them; merge the runs' JUnit files "
            f"again with `python -m reports merge FILES --store {args.store}` (it archives them and the answers)"
        )
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"{archive.root}: {opened} of {len(entries)} entries read back valid"
        + (f" ({len(entries) - opened} in the data branch's index only)" if opened < len(entries) else "")
    )
    print(f"{args.store}: all {len(runs)} run(s) and {len(answers)} answer(s) are in the archive {archive.root}")
    return 0


COMMAND = Command(
    "verify",
    "exit 1 when an archive entry is damaged or changed, or the store holds a run or answer the archive lacks",
    add_arguments,
    run,
)

"""Integer ids the history store gives texts (signatures, messages, each distinct one stored once) and cells."""

from __future__ import annotations

import hashlib
import sqlite3

from reports.store.records import CellKey


class Texts:
    """Signatures and messages, each distinct text one row of `texts`, looked up by a 64-bit hash of it."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._ids: dict[str, int] = {}

    def id(self, text: str) -> int:
        known = self._ids.get(text)
        if known is None:
            digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)
            row = self._conn.execute("SELECT id FROM texts WHERE hash = ? AND text = ?", (digest, text)).fetchone()
            known = (
                row[0]
                if row
                else inserted_id(self._conn.execute("INSERT INTO texts (hash, text) VALUES (?, ?)", (digest, text)))
            )
            self._ids[text] = known
        return known


class Cells:
    """A cell's id in `cells`, added the first time it is seen."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._ids = {
            CellKey(*key): cell for cell, *key in conn.execute("SELECT id, model, variant, dtype, tp FROM cells")
        }

    def id(self, cell: CellKey) -> int:
        known = self._ids.get(cell)
        if known is None:
            known = self._ids[cell] = inserted_id(
                self._conn.execute(
                    "INSERT INTO cells (model, variant, dtype, tp) VALUES (?, ?, ?, ?)",
                    (cell.model, cell.variant, cell.dtype, cell.tp),
                )
            )
        return known


def inserted_id(cursor: sqlite3.Cursor) -> int:
    """The rowid of the row an INSERT just added (sqlite3 types it optional: None before any INSERT)."""
    if cursor.lastrowid is None:
        raise RuntimeError("sqlite3 gave no rowid for an INSERT")
    return cursor.lastrowid

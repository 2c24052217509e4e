"""What every piece of the projector shares: one profile's projection files, the log they
derive from, and what this process has learnt about them.

The projector is split by job — :mod:`projections.build` (new files), :mod:`projections.catchup`
(apply new events), :mod:`projections.heal` (checks and repairs), :mod:`projections.follow` (the
background thread), :mod:`projections.visibility` (what a read waits for) — and every piece is
handed the one :class:`Site` of its :class:`projections.projector.Projector`. The few rules the
pieces share live here too: how a piece says "this file must be rebuilt" (:class:`Broken`),
the cursor row, the check that a generation may be written.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from eventlog.log import Log
from projections import files
from projections.apply import Applier
from projections.files import Generation
from projections.health import LogView
from projections.schema import FTS_SCHEMA, STATE_DDL, STATE_SCHEMA

log = logging.getLogger("eventlog.projections")

ZERO_HASH = "0" * 64
SCHEMAS = {"state": STATE_SCHEMA, "fts": FTS_SCHEMA}


class Broken(Exception):
    """A projection file must be rebuilt: raised by the pieces, handled by :mod:`projections.heal`.
    ``status`` is a :mod:`projections.health` status, ``detail`` says why."""

    def __init__(self, status: str, detail: str = "") -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class Site:
    """One profile's projections as the projector's pieces see them.

    Where: ``dir`` (``$EVENTLOG_HOME/profiles/<name>``) and the pointers this program version
    reads through. From what: ``log`` and ``profile``. What state.db holds: :attr:`ddl` and
    :meth:`applier` — the build and the catch-up both take them from here, so every table
    added here is built by the same catch-up and rebuilt with the rest.

    What this process has learnt (plain attributes, written by the pieces under the lease and
    read by anyone; an int or str assignment is atomic):

    - ``known_seq``: a seq every projection in use includes (state.db, and the FTS index unless
      search is degraded). Raised by catch-ups and cursor reads, set by a rebuild; it may lag
      what another process applied since, never run ahead of the files.
    - ``fts_fault``: why search is degraded (answered by a scan of state.db), or None. Set by a
      failed search or FTS sync, cleared once the index is checked or rebuilt.
    """

    ddl: list[str] = STATE_DDL

    def __init__(self, directory: Path, log: Log, profile: str) -> None:
        self.dir = directory
        self.log = log
        self.profile = profile
        self.known_seq = 0
        self.fts_fault: str | None = None

    def state_pointer(self) -> Path:
        """The symlink this process reads state.db through (``state.db`` unless a newer
        program version owns it, see :mod:`projections.files`)."""
        return files.pointer_for(self.dir, "state", STATE_SCHEMA)

    def fts_pointer(self) -> Path:
        return files.pointer_for(self.dir, "fts", FTS_SCHEMA)

    def view(self) -> LogView:
        """The log's head, as of now, for identity checks."""
        return LogView.of(self.log)

    def applier(self, conn: sqlite3.Connection) -> Applier:
        """What turns events into state.db rows on ``conn`` (inside the caller's transaction)."""
        return Applier(conn, self.profile)


def report(kind: str, health: dict[str, Any]) -> None:
    """Log why a projection is about to be (re)built."""
    name = "state.db" if kind == "state" else "the FTS index"
    if health["status"] == "missing":
        log.info("building %s (%s)", name, health["detail"])
    else:
        log.warning("rebuilding %s: %s", name, health["detail"])


def check_writable(g: Generation, schema: int) -> None:
    """Raise :class:`Broken` unless generation ``g`` is this schema's, non-empty and writable."""
    if g.schema != schema:
        raise Broken("old_schema", g.name)
    try:
        st = os.stat(g.path)
    except FileNotFoundError:
        raise Broken("missing", g.name) from None
    if st.st_size == 0:
        raise Broken("missing", f"{g.name} is empty")
    if st.st_mode & 0o600 != 0o600 or not os.access(g.path, os.R_OK | os.W_OK):
        raise Broken("unreadable", g.name)


def init_meta(conn: sqlite3.Connection, kind: str, profile: str | None, log_id: str) -> None:
    """The identity rows of a new projection file, with its cursor at 0."""
    schema = STATE_SCHEMA if kind in ("state", "replay") else FTS_SCHEMA
    conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [
        ("kind", kind), ("schema_version", schema), ("profile", profile), ("log_id", log_id),
        ("last_seq", 0), ("last_hash", ZERO_HASH), ("built_at_ns", time.time_ns()),
    ])


def write_cursor(conn: sqlite3.Connection, seq: int, h: str | None, schema: str = "main") -> None:
    """Record the last applied event; call inside the transaction that wrote its rows."""
    conn.executemany(f"INSERT OR REPLACE INTO {schema}.meta (key, value) VALUES (?, ?)",
                     [("last_seq", seq), ("last_hash", h)])

"""Health checks of one projection file; they read and never change anything.

Statuses, worst first: ``missing`` (no pointer, no file, or an empty file), ``unreadable``
(permissions: the file must be readable and writable by its owner), ``corrupt`` (SQLite
refuses it, or an integrity check fails), ``foreign`` (not an eventlog projection of this kind,
of this profile, or of this log: the cursor hash differs from the log's hash at that seq),
``old_schema`` (written by an older version), ``ahead`` (cursor past the log head, or an FTS
index past its state.db), ``stale`` (behind the log; catching up fixes it), ``ok``.
``no_room``: the file could not even be read because the file system is full or read-only —
never rebuilt for it (see :mod:`projections.space`).
``newer_schema`` is reported for a file of a newer program version (never rebuilt by us).
"""
from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eventlog.errors import EventLogError
from eventlog.log import Log
from eventlog.log import damage as log_damage
from projections import db as sql
from projections import files, space
from projections.schema import FTS_APP_ID, FTS_SCHEMA, STATE_APP_ID, STATE_SCHEMA

HEALTHY = ("ok", "stale")
WAITING = ("no_room",)
"""Not healthy, and not to be rebuilt: the file system is full or read-only (a rebuild would
die); reads serve what the file holds, and the projections resume once there is room."""
_RANK = ["missing", "unreadable", "corrupt", "foreign", "no_room", "old_schema", "newer_schema", "ahead", "stale",
         "ok"]


@dataclass(frozen=True)
class LogView:
    """What a check needs from the log: its head and the hash at a seq."""

    head_seq: int
    head_hash: str
    hash_at: Callable[[int], str | None]
    head_now: Callable[[], int] | None = None
    """The log's head read again: a cursor past ``head_seq`` may only mean that another process
    applied events appended after this view was taken."""

    @classmethod
    def of(cls, log: Log) -> "LogView":
        seq, h = log.head()

        fast = getattr(log, "hash_at", None)  # a backend that reads a hash without decoding the event

        def hash_at(s: int) -> str | None:
            if s == seq:
                return str(h)
            try:
                if fast is not None:
                    found_fast = fast(s)
                    return found_fast if isinstance(found_fast, str) else None
                env = log.get(s)
            except EventLogError as e:  # a damaged event has no hash to compare with
                if not log_damage.is_damage(log, e):
                    raise  # the server out of reach or refusing: not a sign of another log
                return None
            found = env.get("hash") if isinstance(env, dict) else None
            return found if isinstance(found, str) else None

        def head_now() -> int:
            return int(log.head()[0])

        return cls(seq, h, hash_at, head_now)

    @property
    def log_id(self) -> str:
        return (self.hash_at(1) or "") if self.head_seq >= 1 else ""


def worst(*statuses: str) -> str:
    return min(statuses, key=_RANK.index)


def read_meta(db: sqlite3.Connection, schema: str = "main") -> dict[str, Any]:
    return dict(db.execute(f"SELECT key, value FROM {schema}.meta").fetchall())


def judge_meta(meta: dict[str, Any], kind: str, profile: str | None, log: LogView) -> tuple[str, str]:
    """(status, detail) of a projection's identity and cursor against the log."""
    if meta.get("kind") != kind:
        return "foreign", f"meta says kind {meta.get('kind')!r}, expected {kind!r}"
    if profile is not None and meta.get("profile") not in (None, profile):
        return "foreign", f"built for profile {meta.get('profile')!r}"
    last_seq = meta.get("last_seq")
    last_hash = meta.get("last_hash")
    if not isinstance(last_seq, int) or last_seq < 0:
        return "corrupt", f"cursor seq {last_seq!r} is not a number"
    log_id = meta.get("log_id") or ""
    if last_seq > 0 and log.head_seq > 0 and log_id and log_id != log.log_id:
        return "foreign", "derived from another log (first event hash differs)"
    if last_seq > log.head_seq:
        now = log.head_now() if log.head_now is not None else log.head_seq
        if last_seq > now:
            return "ahead", f"cursor at seq {last_seq}, log head is {now}"
        # The log grew after the view was taken and another process applied it: not ahead.
        if log.hash_at(last_seq) != last_hash:
            return "foreign", f"cursor hash at seq {last_seq} is not this log's"
        return ("stale", f"{now - last_seq} events behind the log") if last_seq < now else ("ok", "up to date")
    if last_seq > 0 and log.hash_at(last_seq) != last_hash:
        return "foreign", f"cursor hash at seq {last_seq} is not this log's"
    if last_seq < log.head_seq:
        return "stale", f"{log.head_seq - last_seq} events behind the log"
    return "ok", "up to date"


def inspect(pointer: Path, kind: str, *, profile: str | None, log: LogView, full: bool = False,
            state_seq: int | None = None) -> dict[str, Any]:
    """Check the projection ``pointer`` names. ``full`` adds SQLite's integrity check and, for
    FTS, a read of every index page. ``state_seq``: the state cursor an FTS file must not pass."""
    schema = STATE_SCHEMA if kind == "state" else FTS_SCHEMA
    app_id = STATE_APP_ID if kind == "state" else FTS_APP_ID
    out: dict[str, Any] = {"status": "ok", "detail": "", "pointer": pointer.name, "file": None,
                           "generation": None, "schema": None, "last_seq": None, "log_head": log.head_seq}

    def done(status: str, detail: str) -> dict[str, Any]:
        out["status"], out["detail"] = status, detail
        return out

    if not os.path.lexists(pointer):
        return done("missing", "no projection file")
    if not os.path.islink(pointer):
        what = "a directory" if os.path.isdir(pointer) else "a plain file"
        return done("foreign", f"{pointer.name} is {what}, not a generation pointer")
    g = files.read_pointer(pointer)
    if g is None:
        return done("foreign", f"{pointer.name} names {os.readlink(pointer)!r}, not a generation file")
    out.update(file=g.name, generation=g.gen, schema=g.schema)
    if os.path.islink(g.path):  # SQLite would follow it and write wherever it points
        return done("foreign", f"{g.name} is a symbolic link (to {os.readlink(g.path)!r}), not a generation file")
    try:
        st = os.stat(g.path)
    except FileNotFoundError:
        return done("missing", f"{g.name} does not exist")
    except OSError as e:
        return done("unreadable", f"{g.name}: {e.strerror}")
    if stat.S_ISDIR(st.st_mode):
        return done("foreign", f"{g.name} is a directory, not a database file")
    if st.st_size == 0:
        return done("missing", f"{g.name} is empty")
    # On a read-only file system nothing is writable, and nothing needs to be: it is read as it stands.
    want = os.R_OK if space.read_only(pointer.parent) else os.R_OK | os.W_OK
    if st.st_mode & 0o600 == 0o600 and st.st_uid != os.geteuid() and not os.access(g.path, want):
        # a command run as another user (root) made it: the mode is right, the owner is not this user
        return done("unreadable", f"{g.name} belongs to another user (uid {st.st_uid}, mode "
                                  f"{st.st_mode & 0o777:o}), not to this one (uid {os.geteuid()})")
    if st.st_mode & 0o600 != 0o600 or not os.access(g.path, want):
        return done("unreadable", f"{g.name} is not readable and writable by its owner "
                                  f"(mode {st.st_mode & 0o777:o})")
    if g.schema < schema:
        return done("old_schema", f"schema version {g.schema}, this program writes {schema}")
    if g.schema > schema:
        return done("newer_schema", f"schema version {g.schema} of a newer program")
    held = files.hold(g)  # no process deletes it while it is being looked at
    try:
        conn = sql.connect_ro(g.path)
    except sqlite3.Error as e:
        files.release(held, g)
        return done(_status(e, pointer.parent), f"cannot open {g.name}: {e}")
    try:
        # One snapshot for every read below: with a writer at work, counts read in separate
        # statements disagree for a moment and a healthy index looked corrupt.
        conn.execute("BEGIN")
        found_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if found_id != app_id:
            return done("foreign", f"application_id {found_id:#x} is not an eventlog {kind} projection")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != g.schema:
            return done("foreign", f"user_version {version} does not match the file name's schema {g.schema}")
        meta = read_meta(conn)
        out["last_seq"] = meta.get("last_seq")
        status, detail = judge_meta(meta, kind, profile, log)
        if status in HEALTHY and kind == "fts" and state_seq is not None and isinstance(meta.get("last_seq"), int):
            if meta["last_seq"] > state_seq:
                # state.db was read first and a writer went on since: ahead only of state.db now
                now = _cursor_now(pointer.parent / "state.db")
                if now is None or meta["last_seq"] > now:
                    status, detail = "ahead", f"index at seq {meta['last_seq']}, state.db at {now or state_seq}"
        if status in HEALTHY and kind == "fts":
            problem = fts_counts(conn, exact=full)
            if problem:
                return done("corrupt", problem)
        if full and status in HEALTHY + ("ahead",):
            problem = integrity(conn, kind)
            if problem:
                return done("corrupt", problem)
        return done(status, detail)
    except sqlite3.DatabaseError as e:
        return done(_status(e, pointer.parent), f"{g.name}: {e}")
    finally:
        conn.close()
        files.release(held, g)


def _cursor_now(pointer: Path) -> int | None:
    """The cursor (``meta.last_seq``) of the projection ``pointer`` names, read now; None when
    it cannot be read."""
    g = files.read_pointer(pointer)
    if g is None:
        return None
    try:
        conn = sql.connect_ro(g.path, fallback=False)
        try:
            seq = read_meta(conn).get("last_seq")
        finally:
            conn.close()
    except (sqlite3.Error, OSError):
        return None
    return seq if isinstance(seq, int) else None


def _status(e: BaseException, directory: Path) -> str:
    """The status a SQLite error reads as; ``no_room`` for a full disk or a read-only file system."""
    return "no_room" if space.out_of_room(e, directory) else sql.status_of(e)


def integrity(conn: sqlite3.Connection, kind: str, schema: str = "main") -> str | None:
    """A read-only deep check; returns what is wrong, or None."""
    rows = conn.execute(f"PRAGMA {schema}.integrity_check(20)").fetchall()
    if [r[0] for r in rows] != ["ok"]:
        return "integrity_check: " + "; ".join(str(r[0]) for r in rows[:5])
    if kind == "fts":
        # SQLite's integrity_check does not look inside FTS5 tables (and the 'integrity-check'
        # command needs a write transaction, which only the lease holder may open): read every
        # entry of both indexes instead, and check that the vocabulary is the word index's.
        conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab_tri_probe USING fts5vocab({schema}, vocab_tri, row)")
        try:
            words, entries = conn.execute(f"SELECT count(*), total(doc) FROM {schema}.fts_terms").fetchone()
            vocab = conn.execute(f"SELECT count(*) FROM {schema}.vocab").fetchone()[0]
            conn.execute("SELECT count(*) FROM temp.vocab_tri_probe").fetchone()
            if words != vocab:
                return f"the word index holds {words} words, its vocabulary {vocab}"
            documents = conn.execute(f"SELECT value FROM {schema}.meta WHERE key = 'documents'").fetchone()
            if documents is None or not isinstance(documents[0], int) or documents[0] < 0 \
                    or (documents[0] == 0 and entries > 0):
                return f"the word index holds {int(entries)} entries for {documents and documents[0]} documents"
        finally:
            conn.execute("DROP TABLE IF EXISTS temp.vocab_tri_probe")
    return None


def averaged_rows(conn: sqlite3.Connection, schema: str = "main") -> int:
    """How many documents the FTS5 word index holds, from its averages record (one row read)."""
    row = conn.execute(f"SELECT block FROM {schema}.fts_data WHERE id = 1").fetchone()
    block = bytes(row[0]) if row and row[0] else b""
    value = 0
    for i, byte in enumerate(block[:9]):  # a SQLite varint: 7 bits a byte, the ninth byte whole
        if i == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value
    return value


def fts_counts(conn: sqlite3.Connection, schema: str = "main", *, exact: bool = False) -> str | None:
    """Do the word index and the document count it records agree? Cheap (two rows read, on
    every open): an emptied index (``delete-all``) that still records documents. ``exact``:
    any difference in number (documents removed from the index behind its back)."""
    found = conn.execute(f"SELECT value FROM {schema}.meta WHERE key = 'documents'").fetchone()
    documents = found[0] if found is not None and isinstance(found[0], int) else None
    if documents is None:
        return None  # judged by integrity()
    indexed = averaged_rows(conn, schema)
    if exact and indexed != documents:
        return f"the word index holds {indexed} documents, its count says {documents}"
    if documents > 0 and indexed == 0:
        return f"the word index is empty but counts {documents} documents"
    return None


def fts_command_check(conn: sqlite3.Connection, schema: str = "main") -> str | None:
    """FTS5's own index-vs-content check. Needs a read-write connection: lease holder only."""
    try:
        conn.execute(f"INSERT INTO {schema}.fts (fts, rank) VALUES ('integrity-check', 1)")
    except sqlite3.DatabaseError as e:
        return f"fts integrity-check: {e}"
    return None

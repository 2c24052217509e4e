"""Build: write projection files from the log, from scratch, and swap them in.

A rebuild writes a new generation file completely (no journal while building: nothing names
the file yet), fsyncs it, then replaces the pointer atomically (see :mod:`projections.files`):
no reader ever sees a half-built file, readers holding the old file keep working, and the old
generation's ``-wal``/``-shm`` stay paired with it. Generation numbers are never reused.
Leftovers of a build that died are deleted by the next one.

state.db and the FTS index are rebuilt together (the index built in a second thread while
state.db is written, :class:`IndexBuilder`) or the index alone from state.db (an FTS fault).
A standalone snapshot (state and FTS tables in one file, as of a log prefix) is written the
same way to a path of the caller's, needs no lease and touches nothing live.

Lease held for everything except :meth:`Builder.standalone`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable

from projections import db as sql
from projections import files, fts
from projections.catchup import Writer
from projections.health import read_meta
from projections.schema import (
    FTS_APP_ID,
    FTS_DDL,
    FTS_SCHEMA,
    FTS_TABLES,
    REPLAY_APP_ID,
    STATE_APP_ID,
    STATE_SCHEMA,
)
from projections.site import ZERO_HASH, Site, init_meta, write_cursor
from projections.verified import Verified

log = logging.getLogger("eventlog.projections")

BULK_FLUSH = 5000
Progress = Callable[[int, int], None]


class Builder:
    """Rebuilds of one profile's projections (lease held) and standalone snapshots."""

    def __init__(self, site: Site, writer: Writer) -> None:
        self.site = site
        self.writer = writer

    def rebuild_state(self, until_seq: int | None = None, as_of_ns: int | None = None,
                      progress: Progress | None = None, *, with_fts: bool = False) -> dict[str, Any]:
        """Build state.db (and, ``with_fts``, the FTS index alongside) and swap it in.
        Returns ``{"events", "last_seq", "last_hash", "files"}``."""
        site = self.site
        pointer = site.state_pointer()
        files.collect_abandoned(site.dir, "state")
        g = files.next_generation(site.dir, "state", STATE_SCHEMA)
        index = fg = None
        if with_fts:
            files.collect_abandoned(site.dir, "fts")
            fg = files.next_generation(site.dir, "fts", FTS_SCHEMA)
            index = IndexBuilder(fg.path, site.profile, site.view().log_id)
        try:
            built = self._state_file(g.path, STATE_APP_ID, "state", until_seq, as_of_ns, progress, index=index)
            documents = index.finish(g.path, built["last_seq"], built["last_hash"]) if index is not None else 0
        except BaseException:
            if index is not None:
                index.abort()
            files.remove_file(g.path)
            raise
        old = files.read_pointer(pointer)
        self.writer.close()
        files.swap_pointer(pointer, g)
        files.collect_garbage(site.dir, "state", {old.name} if old else set())
        site.known_seq = built["last_seq"]
        log.info("state.db rebuilt as %s (%d events)", g.name, built["events"])
        names = [g.name]
        if fg is not None:
            fpointer = site.fts_pointer()
            fold_ = files.read_pointer(fpointer)
            files.swap_pointer(fpointer, fg)
            files.collect_garbage(site.dir, "fts", {fold_.name} if fold_ else set())
            site.fts_fault = None
            names.append(fg.name)
            log.info("FTS index rebuilt as %s (%d documents)", fg.name, documents)
        return {**built, "files": names}

    def rebuild_fts(self) -> dict[str, Any]:
        """Build the FTS index alone from the current state.db and swap it in.
        Returns ``{"documents", "last_seq", "files"}``."""
        site = self.site
        conn = self.writer.state()
        self.writer.detach_fts()
        smeta = read_meta(conn)
        state_gen = self.writer.state_gen
        assert state_gen is not None
        pointer = site.fts_pointer()
        files.collect_abandoned(site.dir, "fts")
        g = files.next_generation(site.dir, "fts", FTS_SCHEMA)
        files.create_empty(g.path)
        out = sql.connect_rw(g.path)
        try:
            bulk_pragmas(out)
            create(out, FTS_APP_ID, FTS_SCHEMA, FTS_DDL)
            fts.register(out)
            sql.attach_ro(out, state_gen.path, "s")
            out.execute("BEGIN")
            init_meta(out, "fts", site.profile, site.view().log_id)
            fts.sync(out, 0, smeta["last_seq"], fts_schema="main", state_schema="s", bulk=True)
            fts.rebuild_index(out, "main")
            write_cursor(out, smeta["last_seq"], smeta["last_hash"])
            documents = out.execute("SELECT count(*) FROM docs").fetchone()[0]
            out.execute("COMMIT")
            out.execute("DETACH DATABASE s")
            out.execute("PRAGMA journal_mode = WAL")
        finally:
            out.close()
        files.fsync_file(g.path)
        old = files.read_pointer(pointer)
        files.swap_pointer(pointer, g)
        files.collect_garbage(site.dir, "fts", {old.name} if old else set())
        site.fts_fault = None
        log.info("FTS index rebuilt as %s (%d documents)", g.name, documents)
        return {"documents": documents, "last_seq": smeta["last_seq"], "files": [g.name]}

    def standalone(self, out_path: Path, until_seq: int | None, as_of_ns: int | None,
                   progress: Progress | None) -> dict[str, Any]:
        """Write one self-contained file (state and FTS tables, no WAL) at ``out_path`` as of a
        log prefix: written beside it under a temporary name, then published over it. No lease."""
        out_path = out_path.absolute()
        files.make_dir(out_path.parent)
        tmp = files.temp_path(out_path)
        try:
            built = self._state_file(tmp, REPLAY_APP_ID, "replay", until_seq, as_of_ns, progress,
                                     with_fts=True, wal=False)
            for suffix in ("-wal", "-shm", "-journal"):
                try:
                    os.unlink(f"{out_path}{suffix}")
                except FileNotFoundError:
                    pass
            files.publish(tmp, out_path)
        except BaseException:
            files.remove_file(tmp)
            raise
        return {**built, "files": [str(out_path)]}

    def _state_file(self, path: Path, app_id: int, kind: str, until_seq: int | None, as_of_ns: int | None,
                    progress: Progress | None, *, with_fts: bool = False, wal: bool = True,
                    index: IndexBuilder | None = None) -> dict[str, Any]:
        """Write a complete state file at ``path`` from the log prefix (up to ``until_seq``, or
        to the last event appended at ``as_of_ns``); fsync it."""
        site = self.site
        view = site.view()
        stop = view.head_seq if until_seq is None else max(0, min(until_seq, view.head_seq))
        files.create_empty(path)
        conn = sql.connect_rw(path)
        events = 0
        verified = Verified(site.log, 1, stop, ZERO_HASH)  # the verified prefix only
        try:
            bulk_pragmas(conn)
            create(conn, app_id, STATE_SCHEMA, site.ddl + (FTS_TABLES if with_fts else []))
            conn.execute("BEGIN")
            init_meta(conn, kind, site.profile, view.log_id)
            if as_of_ns is not None:
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('as_of_ns', ?)", (int(as_of_ns),))
            if until_seq is not None:
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('until_seq', ?)", (int(until_seq),))
            applier = site.applier(conn)
            if index is not None:
                applier.docs = []
            last: dict[str, Any] | None = None
            if stop > 0:
                for env in verified:
                    ts = env.get("ts")
                    if as_of_ns is not None and isinstance(ts, int) and ts > as_of_ns:
                        break
                    applier.apply(env)
                    last = env
                    events += 1
                    if events % BULK_FLUSH == 0:
                        applier.flush(keep_cache=True)
                        if index is not None:
                            index.add(applier.docs)  # type: ignore[arg-type]
                            applier.docs = []
                        if progress is not None:
                            progress(events, stop)
            applier.flush()
            if index is not None:
                index.add(applier.docs)  # type: ignore[arg-type]
            if kind != "replay" and as_of_ns is None and until_seq is None:
                site.damage = verified.damage
            last_seq = last["seq"] if last else 0
            last_hash = last.get("hash") if last else ZERO_HASH
            write_cursor(conn, last_seq, last_hash)
            if with_fts:
                fts.register(conn)
                fts.sync(conn, 0, last_seq, fts_schema="main", state_schema="main", bulk=True)
                fts.rebuild_index(conn, "main")
            conn.execute("COMMIT")
            if progress is not None:
                progress(events, stop)
            conn.execute("PRAGMA optimize")
            conn.execute(f"PRAGMA journal_mode = {'WAL' if wal else 'DELETE'}")
        finally:
            conn.close()
        files.fsync_file(path)
        damage = verified.damage.to_dict() if verified.damage is not None else None
        return {"events": events, "last_seq": last_seq, "last_hash": last_hash, "damage": damage}


class IndexBuilder:
    """Builds a new FTS file in a second thread while state.db is being rebuilt (SQLite runs
    without the GIL, so the trigram indexing overlaps the Python work of the state build).

    ``add(docs)`` queues rows from :attr:`Applier.docs`; ``finish(state_path, seq, hash)``
    drops the documents of sessions deleted during the build, writes the cursor, merges the
    index, syncs the file. ``abort()`` on failure."""

    def __init__(self, path: Path, profile: str | None, log_id: str) -> None:
        self.path = path
        import queue

        self._queue: queue.Queue[list[tuple[int, str, str]] | None] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        files.create_empty(path)
        self._db = sql.connect_rw(path)
        bulk_pragmas(self._db)
        create(self._db, FTS_APP_ID, FTS_SCHEMA, FTS_DDL)
        self._db.execute("BEGIN")
        init_meta(self._db, "fts", profile, log_id)
        self._db.execute("INSERT INTO fts (fts, rank) VALUES ('automerge', 0)")
        self._db.execute("INSERT INTO fts (fts, rank) VALUES ('crisismerge', 2000)")
        self._thread = threading.Thread(target=self._run, name="eventlog-fts-build", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            chunk = self._queue.get()
            if chunk is None:
                return
            if self._error is not None:
                continue
            try:
                self._db.executemany("INSERT INTO docs (id, session_id, text) VALUES (?, ?, ?)", chunk)
                self._db.execute("INSERT INTO fts (rowid, text) SELECT id, text FROM docs WHERE id BETWEEN ? AND ?",
                                 (chunk[0][0], chunk[-1][0]))
            except BaseException as e:  # reported by finish()
                self._error = e

    def add(self, docs: list[tuple[int, str, str]]) -> None:
        if docs:
            self._queue.put(docs)

    def _stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def finish(self, state_path: Path, seq: int, h: str | None) -> int:
        self._stop()
        db = self._db
        try:
            if self._error is not None:
                raise self._error
            sql.attach_ro(db, state_path, "s")
            for (sid,) in db.execute("SELECT id FROM s.tombstones").fetchall():
                db.execute("INSERT INTO fts (fts, rowid, text) SELECT 'delete', id, text FROM docs "
                           "WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM docs WHERE session_id = ?", (sid,))
            write_cursor(db, seq, h)
            documents = db.execute("SELECT count(*) FROM docs").fetchone()[0]
            db.execute("INSERT INTO fts (fts) VALUES ('optimize')")
            db.execute("INSERT INTO fts (fts, rank) VALUES ('automerge', 4)")
            db.execute("INSERT INTO fts (fts, rank) VALUES ('crisismerge', 16)")
            db.execute("COMMIT")
            db.execute("DETACH DATABASE s")
            db.execute("PRAGMA journal_mode = WAL")
        finally:
            db.close()
        files.fsync_file(self.path)
        return int(documents)

    def abort(self) -> None:
        if self._thread.is_alive():
            self._stop()
        try:
            self._db.close()
        finally:
            files.remove_file(self.path)


def bulk_pragmas(conn: sqlite3.Connection) -> None:
    # The file is not referenced by any pointer until it is complete and synced: no journal.
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -8192")  # 8 MiB: bounds the anonymous peak of a 1M rebuild
    conn.execute("PRAGMA temp_store = MEMORY")


def create(conn: sqlite3.Connection, app_id: int, version: int, ddl: list[str]) -> None:
    conn.execute(f"PRAGMA application_id = {int(app_id)}")
    conn.execute(f"PRAGMA user_version = {int(version)}")
    for statement in ddl:
        conn.execute(statement)

"""Build: write projection files from the log, from scratch, and swap them in.

A rebuild writes a new generation file completely (no journal while building: nothing names
the file yet), fsyncs it, then replaces the pointer atomically (see :mod:`projections.files`):
no reader ever sees a half-built file, readers holding the old file keep working, and the old
generation's ``-wal``/``-shm`` stay paired with it. Generation numbers are never reused.
Leftovers of a build that died are deleted by the next one.

A full rebuild builds state.db and swaps it in — sessions and transcripts are readable from
then on — while a thread builds the search index beside it from the state file's committed
chunks (:mod:`projections.concurrent_index`); the index is swapped in when it is done (search
is degraded to a scan of state.db until then). The index alone is rebuilt from state.db in one
statement after an FTS fault (:meth:`Builder.rebuild_fts`). A standalone snapshot (state and
FTS tables in one file, as of a log prefix) is written to a path of the caller's, needs no
lease and touches nothing live.

Lease held for everything except :meth:`Builder.standalone`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable

from projections import db as sql
from projections import files, fts
from projections.catchup import Writer
from projections.concurrent_index import Indexer
from projections.extensions import ExtensionTables
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
from projections.site import SCHEMAS, ZERO_HASH, Site, init_meta, write_cursor
from projections.verified import Verified

log = logging.getLogger("eventlog.projections")

BULK_FLUSH = 5000
INDEX_BESIDE = True
STATE_PAGE_SIZE = 8192
"""Page size of a new state file. Messages are ~1-1.5 KB rows: at SQLite's default 4 KB the
state phase of a 100,000-message rebuild took 3.34 s of CPU (best of 4), at 8 KB 3.08 s, at
16 KB no less; the file is 3% smaller too."""
"""A full rebuild builds the search index beside state.db (False: from state.db after it, in one
statement — what ``bench.storage`` compares it with)."""
Progress = Callable[[int, int], None]


class Builder:
    """Rebuilds of one profile's projections (lease held) and standalone snapshots."""

    def __init__(self, site: Site, writer: Writer, extensions: ExtensionTables | None = None) -> None:
        self.site = site
        self.writer = writer
        self.extensions = extensions  # their read models are built with a full rebuild of state.db

    def rebuild_state(self, until_seq: int | None = None, as_of_ns: int | None = None,
                      progress: Progress | None = None, *, with_fts: bool = False) -> dict[str, Any]:
        """Build state.db and swap it in; ``with_fts``: then the search index too (search is
        degraded meanwhile; an index that fails to build is logged and left to the next
        catch-up, it never undoes the state.db swap). Returns ``{"events", "last_seq",
        "last_hash", "files"}``."""
        site = self.site
        pointer = site.state_pointer()
        g = files.next_generation(site.dir, "state", STATE_SCHEMA)
        held = files.create_generation(g)
        indexer: Indexer | None = None
        try:
            if with_fts and INDEX_BESIDE:  # see projections.concurrent_index
                gi = files.next_generation(site.dir, "fts", FTS_SCHEMA)
                indexer = Indexer(gi, g.path, site.profile, site.view().log_id)
                indexer.held = files.create_generation(gi)
                indexer.start()
            full = until_seq is None and as_of_ns is None
            built = self._state_file(g.path, STATE_APP_ID, "state", until_seq, as_of_ns, progress, indexer=indexer,
                                     extensions=self.extensions if full else None)
        except BaseException:
            if indexer is not None:
                indexer.abort()
                files.release(indexer.held, indexer.g)
            files.release(held, g)  # unreferenced: deleted
            raise
        self.writer.close()
        files.swap_pointer(pointer, g)
        files.release(held, None)
        if with_fts:
            # Until the new index is in, search answers from a scan of the new state.db.
            files.drop_pointer(site.fts_pointer())
        files.collect(site.dir, SCHEMAS)  # the generations just replaced, unless a reader holds one
        site.known_seq = built["last_seq"]
        log.info("state.db rebuilt as %s (%d events)", g.name, built["events"])
        names = [g.name]
        if with_fts:
            try:
                names += self._swap_index(indexer) if indexer is not None else self.rebuild_fts()["files"]
            except Exception as e:  # noqa: BLE001 - a search fault is its own class
                site.fts_fault = f"{type(e).__name__}: {e}"
                log.warning("building the search index failed (%s); search is degraded until it is rebuilt",
                            site.fts_fault)
        return {**built, "files": names}

    def _swap_index(self, indexer: Indexer) -> list[str]:
        """Wait for the index built beside the state file and swap it in (deleted if it failed)."""
        try:
            documents = indexer.result()
        except BaseException:
            files.release(indexer.held, indexer.g)
            raise
        files.swap_pointer(self.site.fts_pointer(), indexer.g)
        files.release(indexer.held, None)
        files.collect(self.site.dir, SCHEMAS)
        self.site.fts_fault = None
        log.info("FTS index rebuilt as %s (%d documents)", indexer.g.name, documents)
        return [indexer.g.name]

    def rebuild_fts(self) -> dict[str, Any]:
        """Build the search index alone from the current state.db (one ``INSERT ... SELECT``:
        no message passes through Python) and swap it in. Returns ``{"documents",
        "last_seq", "files"}``."""
        site = self.site
        conn = self.writer.state()
        self.writer.detach_fts()
        smeta = read_meta(conn)
        state_gen = self.writer.state_gen
        assert state_gen is not None
        pointer = site.fts_pointer()
        g = files.next_generation(site.dir, "fts", FTS_SCHEMA)
        held = files.create_generation(g)
        try:
            out = new_index_file(g.path, site.profile, site.view().log_id)
            try:
                sql.attach_ro(out, state_gen.path, "s")
                out.execute("BEGIN")
                documents = fts.build_from_state(out, fts_schema="main", state_schema="s")
                write_cursor(out, smeta["last_seq"], smeta["last_hash"])
                out.execute("COMMIT")
                out.execute("DETACH DATABASE s")
                out.execute("PRAGMA journal_mode = WAL")
            finally:
                out.close()
            files.fsync_file(g.path)
        except BaseException:
            files.release(held, g)
            raise
        files.swap_pointer(pointer, g)
        files.release(held, None)
        files.collect(site.dir, SCHEMAS)
        site.fts_fault = None
        log.info("FTS index rebuilt as %s (%d documents)", g.name, documents)
        return {"documents": documents, "last_seq": smeta["last_seq"], "files": [g.name]}

    def standalone(self, out_path: Path, until_seq: int | None, as_of_ns: int | None,
                   progress: Progress | None) -> dict[str, Any]:
        """Write one self-contained file (state and FTS tables, no WAL) at ``out_path`` as of a
        log prefix: written beside it under a temporary name, then published over it. No lease."""
        out_path = out_path.absolute()  # its folder exists (the callers check: nothing creates it)
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
                    indexer: Indexer | None = None, extensions: ExtensionTables | None = None) -> dict[str, Any]:
        """Write a complete state file at ``path`` from the log prefix (up to ``until_seq``, or
        to the last event appended at ``as_of_ns``); ``with_fts``: the search tables in the same
        file, filled from its messages at the end; fsync it. ``indexer``: the file is written in
        WAL mode and committed every :data:`BULK_FLUSH` events, each commit told to the indexer
        that reads it (which has stopped reading it when this returns). ``extensions``: their
        read models are built in the same pass (:meth:`ExtensionTables.seed`)."""
        site = self.site
        view = site.view()
        stop = view.head_seq if until_seq is None else max(0, min(until_seq, view.head_seq))
        files.create_empty(path)
        conn = sql.connect_rw(path)
        events = 0
        verified = Verified(site.log, 1, stop, ZERO_HASH)  # the verified prefix only
        try:
            conn.execute(f"PRAGMA page_size = {STATE_PAGE_SIZE}")
            bulk_pragmas(conn)
            if indexer is not None:  # a reader beside the writer: WAL, never fsynced until the end
                conn.execute("PRAGMA journal_mode = WAL")
            create(conn, app_id, STATE_SCHEMA, site.ddl + (FTS_TABLES if with_fts else []))
            conn.execute("BEGIN")
            init_meta(conn, kind, site.profile, view.log_id)
            if as_of_ns is not None:
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('as_of_ns', ?)", (int(as_of_ns),))
            if until_seq is not None:
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('until_seq', ?)", (int(until_seq),))
            applier = site.applier(conn)
            riders = extensions.seed(conn) if extensions is not None else []
            last: dict[str, Any] | None = None
            if stop > 0:
                for env in verified:
                    ts = env.get("ts")
                    if as_of_ns is not None and isinstance(ts, int) and ts > as_of_ns:
                        break
                    applier.apply(env)
                    for rider in riders:
                        try:
                            rider[1](conn, env)
                        except Exception as e:  # the extension's fault: it alone is left out
                            log.warning("read model %r is left to its own catch-up: %s", rider[0], e)
                            riders = [r for r in riders if r is not rider]
                            ExtensionTables.unseed(conn, rider[0])
                    last = env
                    events += 1
                    if events % BULK_FLUSH == 0:
                        applier.flush(keep_cache=True)
                        if indexer is not None:
                            write_cursor(conn, env["seq"], env.get("hash"))
                            conn.execute("COMMIT")
                            indexer.committed(env["seq"])
                            conn.execute("BEGIN")
                        if progress is not None:
                            progress(events, stop)
            applier.flush()
            if kind != "replay" and as_of_ns is None and until_seq is None:
                site.damage = verified.damage
            last_seq = last["seq"] if last else 0
            last_hash = last.get("hash") if last else ZERO_HASH
            write_cursor(conn, last_seq, last_hash)
            if until_seq is None and as_of_ns is None:  # built from the whole log: no erased words
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('rebuilt_at', ?)", (last_seq,))
            if riders:
                ExtensionTables.seeded(conn, riders, last_seq)
            if with_fts:
                fts.register(conn)
                fts.build_from_state(conn, fts_schema="main", state_schema="main")
                fts.purge(conn, last_seq)
            conn.execute("PRAGMA optimize")  # inside the last transaction: nothing is written after it
            conn.execute("COMMIT")
            if indexer is not None:
                indexer.finish(last_seq, last_hash)  # returns once it reads a snapshot of the finished file
                _checkpoint_all(conn, indexer)
            if progress is not None:
                progress(events, stop)
            conn.execute(f"PRAGMA journal_mode = {'WAL' if wal else 'DELETE'}")
        finally:
            conn.close()
        files.fsync_file(path)
        damage = verified.damage.to_dict() if verified.damage is not None else None
        return {"events": events, "last_seq": last_seq, "last_hash": last_hash, "damage": damage}


def _checkpoint_all(conn: sqlite3.Connection, indexer: Indexer) -> None:
    """Copy every frame of the state file's WAL into it, so that syncing the file makes it
    whole; the indexer's transaction, pinned at the last commit, does not stand in the way (it
    would if it read an older snapshot: then wait until it has stopped reading)."""
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
    if busy or copied != frames:
        indexer.released.wait()
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
        if busy or copied != frames:
            raise sqlite3.OperationalError(f"the new state file's WAL could not be checkpointed ({copied} of {frames})")


def new_index_file(path: Path, profile: str | None, log_id: str) -> sqlite3.Connection:
    """A connection to a new, empty search index file at ``path`` (bulk pragmas, the schema,
    its identity rows and the SQL functions the index uses), for a build to fill."""
    out = sql.connect_rw(path)
    try:
        bulk_pragmas(out)
        create(out, FTS_APP_ID, FTS_SCHEMA, FTS_DDL)
        fts.register(out)
        out.execute("BEGIN")
        init_meta(out, "fts", profile, log_id)
        out.execute("COMMIT")
    except BaseException:
        out.close()
        raise
    return out


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

"""Catch-up: apply the log's new events to the projections, exactly once. Lease held throughout.

state.db takes the events in batches, one SQLite transaction each, and every transaction also
writes the cursor (the last seq and its hash): a crash anywhere leaves rows and cursor in
step, and the next catch-up resumes after the cursor. The FTS index has its own cursor and is
brought up to state.db's in a second transaction; a crash between the two is only lag.

Nothing here repairs: a file that must be rebuilt raises :class:`projections.site.Broken` (or
a SQLite fault), and :class:`projections.heal.Healer` decides what to rebuild.
"""
from __future__ import annotations

import sqlite3
from typing import Any, Callable, Sequence

from projections import db as sql
from projections import files, fts
from projections.apply import Applier
from projections.files import Generation
from projections.health import HEALTHY, fts_command_check, fts_counts, judge_meta, read_meta
from projections.schema import FTS_APP_ID, FTS_SCHEMA, STATE_APP_ID, STATE_SCHEMA
from projections.site import Broken, Site, check_writable, write_cursor
from projections.verified import Verified

DEFAULT_BATCH = 1000


WAL_LIMIT = 1 << 20
"""Bytes a WAL is cut back to when SQLite restarts it after a checkpoint (``journal_size_limit``;
it grows to ~4 MB between automatic checkpoints); an idle projector empties it entirely
(:meth:`Writer.truncate_wal`)."""


class Writer:
    """The lease holder's read-write connection: state.db, with the FTS file attached as ``f``.

    Opened on first use, reopened when a pointer names another generation, closed with the
    projector. Used only while holding the projector lease; between catch-ups it stays open,
    idle (an idle WAL connection holds no lock), which saves reopening and re-attaching per
    catch-up.
    """

    def __init__(self, site: Site) -> None:
        self.site = site
        self._conn: sqlite3.Connection | None = None
        self.state_gen: Generation | None = None
        self._fts_gen: Generation | None = None
        self._holds: dict[str, tuple[int | None, Generation]] = {}  # kind -> hold of its generation

    @property
    def open(self) -> bool:
        """A read-write connection is open (this process has caught up or built under the lease)."""
        return self._conn is not None

    def state(self) -> sqlite3.Connection:
        """The connection to the generation state.db names now; raises :class:`Broken` when
        that file cannot be written or is not this profile's state projection."""
        g = files.read_pointer(self.site.state_pointer())
        if g is None:
            raise Broken("missing", "no state.db generation")
        if self._conn is not None and self.state_gen == g:
            return self._conn
        self.close()
        check_writable(g, STATE_SCHEMA)
        self._hold("state", g)
        try:
            conn = sql.connect_rw(g.path)
        except sqlite3.Error as e:
            self._let_go("state")
            raise Broken(sql.status_of(e), str(e)) from e
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] != STATE_APP_ID:
                raise Broken("foreign", "application_id")
            if conn.execute("PRAGMA user_version").fetchone()[0] != g.schema:
                raise Broken("foreign", "user_version")
        except sqlite3.DatabaseError as e:
            conn.close()
            self._let_go("state")
            raise Broken(sql.status_of(e), str(e)) from e
        except Broken:
            conn.close()
            self._let_go("state")
            raise
        fts.register(conn)
        conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT}")
        self._conn, self.state_gen = conn, g
        return conn

    def attach_fts(self, conn: sqlite3.Connection) -> Generation:
        """Attach the generation fts.db names now as ``f`` (once per generation)."""
        g = files.read_pointer(self.site.fts_pointer())
        if g is None:
            raise Broken("missing", "no fts.db generation")
        if self._fts_gen == g:
            return g
        if self._fts_gen is not None:
            conn.execute("DETACH DATABASE f")
            self._fts_gen = None
            self._let_go("fts")
        check_writable(g, FTS_SCHEMA)
        self._hold("fts", g)
        sql.attach_rw(conn, g.path, "f")
        self._fts_gen = g
        if conn.execute("PRAGMA f.application_id").fetchone()[0] != FTS_APP_ID:
            raise Broken("foreign", "application_id")
        if conn.execute("PRAGMA f.user_version").fetchone()[0] != g.schema:
            raise Broken("foreign", "user_version")
        conn.execute(f"PRAGMA f.journal_size_limit = {WAL_LIMIT}")
        return g

    def replaced(self) -> bool:
        """Whether the connection is open on a generation its pointer no longer names (another
        process rebuilt it): it holds that file, which goes once it lets go (:meth:`close`)."""
        if self._conn is None:
            return False
        if files.read_pointer(self.site.state_pointer()) != self.state_gen:
            return True
        return self._fts_gen is not None and files.read_pointer(self.site.fts_pointer()) != self._fts_gen

    def truncate_wal(self) -> bool:
        """Checkpoint both files' WALs into the databases and truncate them to zero bytes
        (``wal_checkpoint(TRUNCATE)``), never waiting: a reader inside a read transaction
        makes it give up. True when every WAL is empty now. Under the lease, when idle."""
        if files.read_pointer(self.site.state_pointer()) is None:
            return True
        conn = self.state()
        schemas = ["main"]
        if files.read_pointer(self.site.fts_pointer()) is not None:
            self.attach_fts(conn)
            schemas.append("f")
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            return all(conn.execute(f"PRAGMA {s}.wal_checkpoint(TRUNCATE)").fetchone()[0] == 0 for s in schemas)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(sql.BUSY_TIMEOUT_S * 1000)}")

    def detach_fts(self) -> None:
        """Let go of the FTS file (before it is rebuilt); closes the whole connection when the
        detach itself fails."""
        if self._conn is not None and self._fts_gen is not None:
            try:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                self._conn.execute("DETACH DATABASE f")
            except sqlite3.Error:
                self.close()
        self._fts_gen = None
        self._let_go("fts")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None
        self.state_gen = None
        self._fts_gen = None
        self._let_go("fts")
        self._let_go("state")

    def _hold(self, kind: str, g: Generation) -> None:
        """Hold generation ``g`` while the connection has it open (see :func:`files.hold`)."""
        self._let_go(kind)
        self._holds[kind] = (files.hold(g), g)

    def _let_go(self, kind: str) -> None:
        held = self._holds.pop(kind, None)
        if held is not None:
            files.release(*held)


Rider = tuple[str, Callable[[sqlite3.Connection, dict[str, Any]], None]]
"""An extension read model that takes the events in the same pass: its name and ``apply``
(the envelope upcast for it) -- see :meth:`CatchUp.apply`."""


class RiderFailed(Exception):
    """A rider's ``apply`` raised: the batch was rolled back; the pass is redone without it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name
        self.applied = 0  # events of this pass committed before the failed batch


class CatchUp:
    """Applies new events to state.db (:meth:`apply`), then to the FTS index (:meth:`sync_fts`)."""

    def __init__(self, site: Site, writer: Writer, batch_size: int = DEFAULT_BATCH) -> None:
        self.site = site
        self.writer = writer
        self.batch_size = max(1, int(batch_size))
        self.erase_due = 0
        """After :meth:`apply`: the seq of an erase record state.db has applied since it was last
        built from the whole log (0: none). The rows are gone, but the index's segments and the
        WAL may still hold the words: the healer purges (see :meth:`Healer._catch_up`)."""
        self.riders: Callable[[dict[str, Any]], Sequence[Rider]] = lambda meta: ()
        """The extension read models in step with state.db's cursor (given its ``meta``): they
        take each event in the same pass and transaction as the core tables (set by the
        projector, see :meth:`projections.extensions.ExtensionTables.in_step`)."""

    def apply(self) -> int:
        """Apply the events past state.db's cursor, up to the log head, in batches of
        ``batch_size``, each checked against the chain (:mod:`projections.verified`): at a
        damaged event it stops and sets ``site.damage``. Returns how many were applied.
        Raises :class:`Broken` (or a SQLite fault) when state.db must be rebuilt first.

        The extension read models whose cursor is state.db's (:attr:`riders`) take the same
        events in the same transactions, cursors included: each event is read and decoded once
        for all of them. A rider whose ``apply`` raises has its batch rolled back; the pass is
        then redone without it, and the extension's own catch-up meets the error and judges it
        (:mod:`projections.extensions`), as if it had never ridden along."""
        applied, dropped = 0, set[str]()
        while True:
            try:
                return applied + self._apply(dropped)
            except RiderFailed as e:
                dropped.add(e.name)
                applied += e.applied

    def _apply(self, dropped: set[str]) -> int:
        conn = self.writer.state()
        meta = read_meta(conn)
        status, detail = judge_meta(meta, "state", self.site.profile, self.site.view())
        if status not in HEALTHY:
            raise Broken(status, detail)
        last_seq, stop = meta["last_seq"], self.site.log.head()[0]
        self.erase_due = erase_due(meta)
        if last_seq >= stop:
            return 0
        riders = [r for r in self.riders(meta) if r[0] not in dropped]
        applier = self.site.applier(conn)
        batch: list[dict[str, Any]] = []
        applied = 0
        events = Verified(self.site.log, last_seq + 1, stop, meta["last_hash"])  # stops at a damaged event
        try:
            for env in events:
                batch.append(env)
                if env.get("type") == "log.erased":
                    self.erase_due = env["seq"]  # committed with its batch (the applier records it)
                if len(batch) >= self.batch_size:
                    _commit_batch(conn, applier, batch, riders)
                    applied += len(batch)
                    batch = []
            if batch:
                _commit_batch(conn, applier, batch, riders)
                applied += len(batch)
        except RiderFailed as e:
            e.applied = applied
            raise
        self.site.damage = events.damage
        return applied

    def sync_fts(self) -> None:
        """Bring the FTS index up to state.db's cursor. When search is degraded in this process
        (``site.fts_fault``) FTS5's own integrity check decides first, and a healthy index
        clears the fault. Raises :class:`Broken` or ``sqlite3.DatabaseError`` when the index
        must be rebuilt (any SQLite error on it: a dropped shadow table reads as "SQL logic
        error")."""
        conn = self.writer.state()
        self.writer.attach_fts(conn)
        smeta, fmeta = read_meta(conn), read_meta(conn, "f")
        status, detail = judge_meta(fmeta, "fts", self.site.profile, self.site.view())
        if status not in HEALTHY:
            raise Broken(status, detail)
        if fmeta["last_seq"] > smeta["last_seq"]:
            raise Broken("ahead", "index is past state.db")
        if self.site.fts_fault:
            conn.execute("BEGIN IMMEDIATE")  # the check needs the write lock we hold
            try:
                # The word index is contentless: FTS5's check cannot see documents removed from
                # it; their count against the one the index records can.
                problem = fts_command_check(conn, "f") or fts_counts(conn, "f", exact=True)
            finally:
                conn.execute("ROLLBACK")
            if problem:
                raise Broken("corrupt", problem)
        if fmeta["last_seq"] < smeta["last_seq"] or fts.pending(conn, fmeta["last_seq"]):
            conn.execute("BEGIN IMMEDIATE")
            try:
                fts.sync(conn, fmeta["last_seq"], smeta["last_seq"])
                write_cursor(conn, smeta["last_seq"], smeta["last_hash"], "f")
                conn.execute("COMMIT")
            except LookupError as e:  # state.db has purged rows this (older) index still needed
                conn.execute("ROLLBACK")
                raise Broken("stale", str(e)) from e
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        self.site.fts_fault = None

    def cursor(self) -> int:
        """state.db's cursor, through the writer connection."""
        return int(read_meta(self.writer.state())["last_seq"])


def erase_due(meta: dict[str, Any]) -> int:
    """The seq of the last erase record a state file applied after it was built from the whole
    log (0 when its build came after every erase it has seen)."""
    applied, built = meta.get("erase_applied"), meta.get("rebuilt_at")
    if not isinstance(applied, int):
        return 0
    return applied if not isinstance(built, int) or applied > built else 0


def _commit_batch(conn: sqlite3.Connection, applier: Applier, batch: list[dict[str, Any]],
                  riders: Sequence[Rider] = ()) -> None:
    """One transaction: the batch's rows and the cursor at its last event (the riders' rows and
    cursors too)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for env in batch:
            applier.apply(env)
            for name, apply in riders:
                try:
                    apply(conn, env)
                except Exception as e:
                    raise RiderFailed(name) from e
        applier.flush()
        last = batch[-1]
        write_cursor(conn, last["seq"], last.get("hash"))
        if riders:
            conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                             [(f"ext:{name}:seq", last["seq"]) for name, _ in riders])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise

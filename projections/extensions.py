"""Extension read models: an extension's tables in state.db, built by the same projector.

Each read model (:class:`eventlog.sessions.extensions.ReadModel`) keeps its own cursor in
state.db's ``meta`` (``ext:<name>:version``, ``ext:<name>:seq``, ``ext:<name>:tables``), so
that it can catch up on its own: after the core tables (under the same lease), it takes the log
from its cursor up to state.db's, one transaction per batch, rows and cursor together (exactly
once, as the core tables). Once its cursor is state.db's it rides along with the core tables'
catch-up instead (:meth:`ExtensionTables.in_step`): the same events, decoded once, in the same
transactions. A full rebuild of state.db builds them into the new file in its own pass
(:meth:`ExtensionTables.seed`), so the file is swapped in with them — also the rebuild a
store's open makes when state.db is missing or broken (SessionStore registers the read models
with the projector before it heals). A read model whose
version differs from the one its tables were built by — or whose tables are missing, after a
file built without it was swapped in — has its tables dropped and rebuilt from the start of the
log. Processes that do not register it never touch its tables. Two processes with two
versions of one read model therefore rebuild its tables back and forth; a reader keeps its own
version through its block because ``SessionStore.read_model`` checks the version and cursor
inside the read snapshot it holds for the block (see docs/ARCHITECTURE.md).

Like the core tables, a read model is built only from the verified prefix of the log: its own
catch-up checks each event against the chain and stops before a damaged one
(:mod:`projections.verified`), and a reader waits for it no further than that.

A read model whose ``apply`` (or ``ddl``) raises stops where it is (the core projections are not
affected) and is reported as broken; its readers get a :class:`ProjectionError` until it is
fixed, and an open that registers it is refused with that error. An SQL error of its own (no such
column, a constraint) is its fault like any other exception; a full disk or a damaged file is
the file's, for the healer.
"""
from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from eventlog.errors import ProjectionError
from eventlog.log.damage import Verified
from projections import db as sql
from projections.health import read_meta
from projections.site import Site

if TYPE_CHECKING:
    from eventlog.sessions.extensions import ReadModel
    from projections.catchup import Rider, Writer

log = logging.getLogger("eventlog.projections")
BATCH = 1000

_SQL_OF_ITS_OWN = frozenset({1, 19, 20, 25})
"""SQLite's primary result codes that judge the SQL a read model wrote, not the file it runs on:
SQLITE_ERROR (no such table or column, a syntax error), CONSTRAINT, MISMATCH, RANGE."""


class ExtensionFault(Exception):
    """A read model's own code or SQL failed (its ``apply``, its upcasters, its ``ddl``): that
    read model alone stops and is reported broken."""


def _its_own(e: BaseException) -> bool:
    """Whether ``e``, raised running a read model's code, is that code's failure (else the file's:
    a full disk, a lock, damage -- the healer's business)."""
    if isinstance(e, ProjectionError):
        return False
    if isinstance(e, sqlite3.Error):
        code = getattr(e, "sqlite_errorcode", None)
        if code is None:  # Python 3.10 (3.11 added the code): SQLite's own words for the file's errors
            return not any(words in str(e) for words in _FILE_ERROR_WORDS)
        return (code & 0xFF) in _SQL_OF_ITS_OWN
    return isinstance(e, Exception)


_FILE_ERROR_WORDS = ("database is locked", "database table is locked", "out of memory",
                     "attempt to write a readonly database", "interrupted", "disk I/O error",
                     "database disk image is malformed", "database or disk is full", "unable to open database file",
                     "locking protocol", "file is not a database")
"""What SQLite says (``sqlite3_errstr``) for the result codes that judge the file, not a read
model's SQL: BUSY, LOCKED, NOMEM, READONLY, INTERRUPT, IOERR, CORRUPT, FULL, CANTOPEN, PROTOCOL,
NOTADB."""


def _fault(rm: ReadModel, what: str, e: BaseException) -> ExtensionFault:
    return ExtensionFault(f"read model {rm.name!r}: {what} raised {type(e).__name__}: {e}")


class ExtensionTables:
    """The registered read models of one projector (lease held for :meth:`catch_up`)."""

    def __init__(self, site: Site, writer: Writer) -> None:
        self.site = site
        self.writer = writer
        self.models: dict[str, ReadModel] = {}
        self.upcast: Callable[[dict[str, Any]], dict[str, Any]] = lambda env: env
        self.broken: dict[str, str] = {}

    def register(self, models: dict[str, ReadModel], upcast: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """``models``: every read model to keep from now on (one left out is no longer kept and
        its breakdown is forgotten: an open refused for it unregisters it). The dicts are
        replaced, never changed, under a catch-up iterating them in another thread."""
        kept = self.models
        self.models = dict(models)
        # a breakdown outlives no unregistration (not even one noted meanwhile by a catch-up
        # still iterating the models as they were)
        self.broken = {name: why for name, why in self.broken.items() if name in self.models and name in kept}
        self.upcast = upcast

    def catch_up(self) -> None:
        """Bring every registered read model up to state.db's cursor (the lease is held)."""
        if not self.models:
            return
        conn = self.writer.state()
        for name, rm in self.models.items():
            if name in self.broken:
                continue
            try:
                self._catch_up(conn, rm)
            except ExtensionFault as e:  # its own SQL or code failed (an SQL error in its apply
                # reached every core read as a raw sqlite3 error: outside audit, helper-61)
                self.broken[name] = str(e)
                log.warning("read model %r stopped: %s", name, self.broken[name])
            except (sqlite3.Error, ProjectionError):
                raise  # the file itself: the healer's business
            except Exception as e:  # the extension's own code failed: it alone stops
                self.broken[name] = f"{type(e).__name__}: {e}"
                log.warning("read model %r stopped: %s", name, self.broken[name])

    def in_step(self, meta: dict[str, Any]) -> list[Rider]:
        """The registered read models whose cursor is state.db's (``meta``: its meta table): the
        core catch-up takes them along, each event decoded once for all (see
        :meth:`projections.catchup.CatchUp.apply`). The others catch up here, on their own."""
        out: list[Rider] = []
        for name, rm in self.models.items():
            if name in self.broken or meta.get(f"ext:{name}:version") != rm.version:
                continue
            seq = meta.get(f"ext:{name}:seq")
            if type(seq) is not int or seq != meta.get("last_seq"):
                continue
            out.append((name, self._rider(rm)))
        return out

    def _rider(self, rm: ReadModel) -> Callable[[sqlite3.Connection, dict[str, Any]], None]:
        upcast, apply = self.upcast, rm.apply

        def ride(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
            apply(conn, upcast(env))
        return ride

    def build_into(self, path: Path) -> None:
        """Build every registered read model into the standalone snapshot at ``path`` (a file of
        this process's own, e.g. a replay), up to that file's cursor."""
        if not self.models:
            return
        conn = sql.connect_rw(path)
        try:
            for rm in self.models.values():
                self._catch_up(conn, rm)
        finally:
            conn.close()

    def _catch_up(self, conn: sqlite3.Connection, rm: ReadModel) -> None:
        meta = read_meta(conn)
        core_seq = int(meta["last_seq"])
        version, seq = meta.get(f"ext:{rm.name}:version"), meta.get(f"ext:{rm.name}:seq")
        if version != rm.version or seq is None or not self._tables_present(conn, meta, rm):
            self._reset(conn, meta, rm)
            seq = 0
        seq = int(seq)
        while seq < core_seq:
            # Checked against the chain as the core's catch-up reads it: built now, a read model
            # takes only what verifies now, and stops before a damaged event (the core rows past
            # it were applied when it checked out; these would hold what it says now).
            events = Verified(self.site.log, seq + 1, min(core_seq, seq + BATCH), raw=False)
            batch = [env for _, _, env in events]
            if batch:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for env in batch:
                        try:
                            rm.apply(conn, self.upcast(env))
                        except BaseException as e:
                            if _its_own(e):
                                raise _fault(rm, f"apply of seq {env.get('seq')}", e) from e
                            raise
                    seq = batch[-1]["seq"]
                    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (f"ext:{rm.name}:seq", seq))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            if events.damage is not None:
                self.site.damage = events.damage
                return
            if not batch:
                return

    def _tables_present(self, conn: sqlite3.Connection, meta: dict[str, Any], rm: ReadModel) -> bool:
        recorded = json.loads(meta.get(f"ext:{rm.name}:tables") or "[]")
        present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return all(t in present for t in recorded)

    def _reset(self, conn: sqlite3.Connection, meta: dict[str, Any], rm: ReadModel) -> None:
        """Drop the read model's tables (as recorded) and create them anew, cursor at 0."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._create(conn, meta, rm)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        log.info("building read model %r (version %d) from the log", rm.name, rm.version)

    def _create(self, conn: sqlite3.Connection, meta: dict[str, Any], rm: ReadModel) -> None:
        """:meth:`_reset`'s work inside the caller's transaction."""
        recorded = json.loads(meta.get(f"ext:{rm.name}:tables") or "[]")
        for table in recorded:
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        before = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for statement in rm.ddl:
            try:
                conn.execute(statement)
            except BaseException as e:
                if _its_own(e):
                    raise _fault(rm, f"its ddl {str(statement)[:80]!r}", e) from e
                raise
        created = sorted({r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                         - before)
        bad = [t for t in created if not t.startswith(f"{rm.name}_")]
        if bad:
            raise ExtensionFault(f"read model {rm.name!r} creates tables outside its prefix: {bad} "
                                 f"(name its tables {rm.name}_...)")
        conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [
            (f"ext:{rm.name}:version", rm.version), (f"ext:{rm.name}:seq", 0),
            (f"ext:{rm.name}:tables", json.dumps(created))])

    # ---- built with a new state file ----------------------------------------------------------

    def seed(self, conn: sqlite3.Connection) -> list[Rider]:
        """Create every registered read model's tables in ``conn`` -- a state file being built
        from the log, its transaction open -- and return them as riders of that build: the file
        is swapped in with them built, each event decoded once for all. A read model whose
        tables cannot be created here is left out (its own catch-up meets the error later)."""
        out: list[Rider] = []
        for name, rm in self.models.items():
            if name in self.broken:
                continue
            try:
                self._create(conn, {}, rm)
            except (sqlite3.Error, ProjectionError, ExtensionFault) as e:
                log.warning("read model %r is left to its own catch-up: %s", name, e)
                self.unseed(conn, name)
                continue
            out.append((name, self._rider(rm)))
        return out

    @staticmethod
    def unseed(conn: sqlite3.Connection, name: str) -> None:
        """Take read model ``name`` out of a state file being built (its apply raised there):
        tables and cursor go, so that after the swap it is built on its own and judged there."""
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (f"ext:{name}:tables",)).fetchone()
        try:
            tables = json.loads(row[0]) if row else []
        except ValueError:
            tables = []
        for table in tables if isinstance(tables, list) else []:
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.executemany("DELETE FROM meta WHERE key = ?", [(f"ext:{name}:{k}",) for k in ("version", "seq", "tables")])

    @staticmethod
    def seeded(conn: sqlite3.Connection, riders: list[Rider], seq: int) -> None:
        """Set the cursor of the read models built with a state file to its last event."""
        conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                         [(f"ext:{name}:seq", seq) for name, _ in riders])


def extension_cursor(conn: sqlite3.Connection, name: str, version: int) -> int:
    """How far read model ``name`` at ``version`` has reached in the state.db of ``conn`` (-1 when
    its tables are of another version or not built yet)."""
    rows = dict(conn.execute("SELECT key, value FROM meta WHERE key IN (?, ?)",
                             (f"ext:{name}:version", f"ext:{name}:seq")).fetchall())
    if rows.get(f"ext:{name}:version") != version:
        return -1
    return int(rows.get(f"ext:{name}:seq") or 0)

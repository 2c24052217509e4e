"""The projector: keeps state.db and the FTS index derived from the log, and heals them.

One process at a time writes a profile's projections: whoever holds the flock lease
(``projector.lock``). The lease is taken per unit of work (a catch-up, a rebuild) and
released at once, so any process can be the writer next; the read-write connection is closed
with the lease. Everyone else reads through ``mode=ro`` connections (:class:`Reader`).

Exactly once: each batch of events is applied in one SQLite transaction that also writes the
cursor (the last seq and its hash), so a crash anywhere leaves rows and cursor in step and the
next catch-up resumes after the cursor. The FTS index has its own cursor and follows state.db
in a second transaction; after a crash between the two it simply catches up.

Self-healing: a projection that is missing, unreadable, corrupt, foreign (another log or
profile), ahead of the log or of an older schema is rebuilt into a new generation file and
swapped in (see :mod:`projections.files`); readers holding the old file keep working. An FTS
fault is rebuilt alone and degrades only search meanwhile.

Read-your-writes: :meth:`Projector.wait_for` returns once the projections include a given
seq, applying the log itself when no other process holds the lease. Cross-process visibility:
:meth:`Projector.start_follower` applies new events within ``poll`` (20 ms) plus the apply
time whenever it can take the lease; :meth:`Projector.refresh` does one such step inline.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from eventlog.errors import LeaseError, ProjectionError
from eventlog.log import Log
from projections import db as sql
from projections import files, fts
from projections.apply import Applier
from projections.files import Generation
from projections.health import HEALTHY, LogView, fts_command_check, inspect, judge_meta, read_meta
from projections.lease import Lease, Presence, SchemaUse, followed
from projections.schema import (
    FTS_APP_ID,
    FTS_DDL,
    FTS_SCHEMA,
    FTS_TABLES,
    REPLAY_APP_ID,
    STATE_APP_ID,
    STATE_DDL,
    STATE_SCHEMA,
)

log = logging.getLogger("eventlog.projections")

ZERO_HASH = "0" * 64
DEFAULT_BATCH = 1000
BULK_FLUSH = 5000
DEFAULT_LEASE_TIMEOUT = 120.0
FOLLOW_POLL = 0.02
_SCHEMAS = {"state": STATE_SCHEMA, "fts": FTS_SCHEMA}
FOLLOWER_OVERDUE_S = 0.25
"""A one-shot reader leaves catching up to a live follower unless the oldest event not yet
applied was appended longer ago than this (a stopped or starved follower): then it applies the
log itself, so its reads are never staler than this plus its own catch-up."""
REPAIR_LEASE_WAIT = 2.0  # a background FTS repair gives up if the lease stays busy; the next search retries
Progress = Callable[[int, int], None]


class _Broken(Exception):
    """Internal: a projection file must be rebuilt (status, detail)."""

    def __init__(self, status: str, detail: str = "") -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class Projector:
    """Writes and heals the projections of one profile.

    ``profile_dir`` is ``$EVENTLOG_HOME/profiles/<name>``; ``log`` anything with the EventLog
    read API (``head``, ``get``, ``read``). Thread-safe. Not usable across ``fork()``.
    """

    def __init__(self, profile_dir: str | os.PathLike[str], log: Log, profile_name: str | None = None, *,
                 batch_size: int = DEFAULT_BATCH, lease_timeout: float = DEFAULT_LEASE_TIMEOUT) -> None:
        self.dir = Path(profile_dir).absolute()
        files.make_dir(self.dir)
        self.log = log
        if profile_name is None:
            profile_name = log.profile if isinstance(getattr(log, "profile", None), str) else self.dir.name
        self.profile = profile_name
        self.batch_size = max(1, int(batch_size))
        self.lease_timeout = lease_timeout
        self.lease = Lease(self.dir)
        self._presence = Presence(self.dir)
        self._schema_use = SchemaUse(self.dir, _SCHEMAS)
        self._writer: sqlite3.Connection | None = None
        self._writer_gen: Generation | None = None
        self._fts_gen: Generation | None = None
        self._fts_degraded: str | None = None
        self._known_seq = 0
        self._probe: Any = None
        self._probe_lock = threading.Lock()
        self._follower: threading.Thread | None = None
        self._repairer: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    # ---- paths ---------------------------------------------------------------------------

    def state_pointer(self) -> Path:
        """The symlink this process reads state.db through (``state.db`` unless a newer
        program version owns it, see :mod:`projections.files`)."""
        return files.pointer_for(self.dir, "state", STATE_SCHEMA)

    def fts_pointer(self) -> Path:
        return files.pointer_for(self.dir, "fts", FTS_SCHEMA)

    # ---- lease -----------------------------------------------------------------------------

    @contextmanager
    def _locked(self, timeout: float | None = None) -> Iterator[None]:
        if self._closed:
            raise ProjectionError("the projector is closed")
        with self.lease.hold(self.lease_timeout if timeout is None else timeout):
            outer = self.lease._depth == 1
            try:
                yield
            finally:
                if outer:
                    self._close_writer()

    def _try_locked(self) -> bool:
        return not self._closed and self.lease.acquire(0)

    def _unlock(self) -> None:
        if self.lease._depth == 1:
            self._close_writer()
        self.lease.release()

    def _close_writer(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except sqlite3.Error:
                pass
        self._writer = None
        self._writer_gen = None
        self._fts_gen = None

    # ---- the writer connection (lease held) ---------------------------------------------------

    def _state_writer(self) -> sqlite3.Connection:
        g = files.read_pointer(self.state_pointer())
        if g is None:
            raise _Broken("missing", "no state.db generation")
        if self._writer is not None and self._writer_gen == g:
            return self._writer
        self._close_writer()
        _check_writable(g, STATE_SCHEMA)
        try:
            conn = sql.connect_rw(g.path)
        except sqlite3.Error as e:
            raise _Broken(sql.status_of(e), str(e)) from e
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] != STATE_APP_ID:
                raise _Broken("foreign", "application_id")
            if conn.execute("PRAGMA user_version").fetchone()[0] != g.schema:
                raise _Broken("foreign", "user_version")
        except sqlite3.DatabaseError as e:
            conn.close()
            raise _Broken(sql.status_of(e), str(e)) from e
        except _Broken:
            conn.close()
            raise
        fts.register(conn)
        self._writer, self._writer_gen = conn, g
        return conn

    # ---- catch-up ----------------------------------------------------------------------------

    def catch_up(self, until_seq: int | None = None, batch_size: int | None = None, *,
                 timeout: float | None = None) -> int:
        """Apply the log's new events (up to ``until_seq``) in batches of ``batch_size``, one
        transaction each, then bring the FTS index along. Heals what it finds broken.
        Returns the number of events applied to state.db. Raises :class:`LeaseError` when the
        lease is not free within ``timeout`` (default ``lease_timeout``)."""
        with self._locked(timeout):
            return self._catch_up_locked(until_seq, batch_size)

    def _catch_up_locked(self, until_seq: int | None = None, batch_size: int | None = None) -> int:
        applied = 0
        for attempt in (1, 2):
            try:
                conn = self._state_writer()
                meta = read_meta(conn)
                status, detail = judge_meta(meta, "state", self.profile, LogView.of(self.log))
                if status not in HEALTHY:
                    raise _Broken(status, detail)
                applied = self._apply_range(conn, meta["last_seq"], until_seq, batch_size or self.batch_size)
                break
            except (_Broken, sqlite3.DatabaseError) as e:
                if isinstance(e, sqlite3.DatabaseError) and not sql.is_fault(e):
                    raise
                if attempt == 2:
                    raise ProjectionError(f"state.db is still unusable after a rebuild: {e}") from e
                _report("state", {"status": getattr(e, "status", "corrupt"), "detail": str(e)})
                self._close_writer()
                self._rebuild_state_locked(until_seq, with_fts=files.read_pointer(self.fts_pointer()) is None)
        self._sync_fts_locked()
        # Published only now, with the index in step too: a waiting thread that sees it can search.
        self._known_seq = read_meta(self._state_writer())["last_seq"]
        return applied

    def _apply_range(self, conn: sqlite3.Connection, last_seq: int, until_seq: int | None, batch_size: int) -> int:
        head = self.log.head()[0]
        stop = head if until_seq is None else min(until_seq, head)
        if last_seq >= stop:
            return 0
        applier = Applier(conn, self.profile)
        batch: list[dict[str, Any]] = []
        applied = 0
        for env in self.log.read(last_seq + 1, stop):
            batch.append(env)
            if len(batch) >= batch_size:
                self._commit_batch(conn, applier, batch)
                applied += len(batch)
                batch = []
        if batch:
            self._commit_batch(conn, applier, batch)
            applied += len(batch)
        return applied

    def _commit_batch(self, conn: sqlite3.Connection, applier: Applier, batch: list[dict[str, Any]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for env in batch:
                applier.apply(env)
            applier.flush()
            last = batch[-1]
            write_cursor(conn, last["seq"], last.get("hash"))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # ---- FTS (lease held) -----------------------------------------------------------------------

    def _attach_fts(self, conn: sqlite3.Connection) -> Generation:
        g = files.read_pointer(self.fts_pointer())
        if g is None:
            raise _Broken("missing", "no fts.db generation")
        if self._fts_gen == g:
            return g
        if self._fts_gen is not None:
            conn.execute("DETACH DATABASE f")
            self._fts_gen = None
        _check_writable(g, FTS_SCHEMA)
        sql.attach_rw(conn, g.path, "f")
        self._fts_gen = g
        if conn.execute("PRAGMA f.application_id").fetchone()[0] != FTS_APP_ID:
            raise _Broken("foreign", "application_id")
        if conn.execute("PRAGMA f.user_version").fetchone()[0] != g.schema:
            raise _Broken("foreign", "user_version")
        return g

    def _detach_fts(self, conn: sqlite3.Connection | None) -> None:
        if conn is not None and self._fts_gen is not None:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                conn.execute("DETACH DATABASE f")
            except sqlite3.Error:
                self._close_writer()
        self._fts_gen = None

    def _sync_fts_locked(self) -> None:
        """Bring the FTS index up to state.db's cursor; rebuild it alone when it is broken."""
        conn = self._state_writer()
        try:
            self._attach_fts(conn)
            smeta, fmeta = read_meta(conn), read_meta(conn, "f")
            status, detail = judge_meta(fmeta, "fts", self.profile, LogView.of(self.log))
            if status not in HEALTHY:
                raise _Broken(status, detail)
            if fmeta["last_seq"] > smeta["last_seq"]:
                raise _Broken("ahead", "index is past state.db")
            if self._fts_degraded:
                # A search failed: FTS5's own check (needs the write lock we hold) decides.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    problem = fts_command_check(conn, "f")
                finally:
                    conn.execute("ROLLBACK")
                if problem:
                    raise _Broken("corrupt", problem)
            if fmeta["last_seq"] < smeta["last_seq"]:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    fts.sync(conn, fmeta["last_seq"], smeta["last_seq"])
                    write_cursor(conn, smeta["last_seq"], smeta["last_hash"], "f")
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            self._fts_degraded = None
        except (_Broken, sqlite3.DatabaseError) as e:
            # Any SQLite error on the index (a dropped shadow table reads as "SQL logic error")
            # is repaired the same way: the index is derived, rebuilding it alone is always safe.
            _report("fts", {"status": getattr(e, "status", "corrupt"), "detail": str(e)})
            self._fts_degraded = str(e)
            self._detach_fts(conn)
            self._rebuild_fts_locked()

    # ---- rebuilds -------------------------------------------------------------------------------

    def rebuild(self, which: str = "all", until_seq: int | None = None, as_of_ns: int | None = None,
                out_path: str | os.PathLike[str] | None = None, progress: Progress | None = None, *,
                timeout: float | None = None) -> dict[str, Any]:
        """Rebuild from the log into new files and swap them in (``which``: all|state|fts).

        ``until_seq``/``as_of_ns`` stop at that seq / before the first event appended after
        that time (a log prefix either way). ``out_path``: write one standalone file holding
        state and FTS tables instead (for audits; the live projections are not touched and no
        lease is needed). ``progress(done, total)`` is called as events are applied.
        Returns ``{"which", "events", "seconds", "events_per_s", "last_seq", "files"}``.
        """
        if which not in ("all", "state", "fts"):
            raise ValueError(f"which must be all, state or fts, not {which!r}")
        started = time.perf_counter()
        if out_path is not None:
            stats = self._build_standalone(Path(out_path), until_seq, as_of_ns, progress)
        else:
            with self._locked(timeout):
                stats = {"events": 0, "last_seq": None, "files": []}
                if which in ("all", "state"):
                    stats.update(self._rebuild_state_locked(until_seq, as_of_ns, progress, with_fts=which == "all"))
                else:
                    f = self._rebuild_fts_locked()
                    stats.update(events=f["documents"], last_seq=f["last_seq"], files=f["files"])
        seconds = time.perf_counter() - started
        stats.pop("last_hash", None)
        stats.update(which=which, seconds=seconds, events_per_s=stats["events"] / seconds if seconds > 0 else 0.0)
        return stats

    def _rebuild_state_locked(self, until_seq: int | None = None, as_of_ns: int | None = None,
                              progress: Progress | None = None, *, with_fts: bool = False) -> dict[str, Any]:
        """Build state.db (and, ``with_fts``, the FTS index alongside) and swap it in."""
        pointer = self.state_pointer()
        files.collect_abandoned(self.dir, "state")
        g = files.next_generation(self.dir, "state", STATE_SCHEMA)
        index = fg = None
        if with_fts:
            files.collect_abandoned(self.dir, "fts")
            fg = files.next_generation(self.dir, "fts", FTS_SCHEMA)
            index = _IndexBuilder(fg.path, self.profile, LogView.of(self.log).log_id)
        try:
            built = self._build_state_file(g.path, STATE_APP_ID, "state", until_seq, as_of_ns, progress, index=index)
            documents = index.finish(g.path, built["last_seq"], built["last_hash"]) if index is not None else 0
        except BaseException:
            if index is not None:
                index.abort()
            files.remove_file(g.path)
            raise
        old = files.read_pointer(pointer)
        self._close_writer()
        files.swap_pointer(pointer, g)
        files.collect_garbage(self.dir, "state", {old.name} if old else set())
        self._known_seq = built["last_seq"]
        log.info("state.db rebuilt as %s (%d events)", g.name, built["events"])
        names = [g.name]
        if fg is not None:
            fpointer = self.fts_pointer()
            fold_ = files.read_pointer(fpointer)
            files.swap_pointer(fpointer, fg)
            files.collect_garbage(self.dir, "fts", {fold_.name} if fold_ else set())
            self._fts_degraded = None
            names.append(fg.name)
            log.info("FTS index rebuilt as %s (%d documents)", fg.name, documents)
        return {**built, "files": names}

    def _rebuild_fts_locked(self) -> dict[str, Any]:
        conn = self._state_writer()
        self._detach_fts(conn)
        smeta = read_meta(conn)
        state_gen = self._writer_gen
        assert state_gen is not None
        pointer = self.fts_pointer()
        files.collect_abandoned(self.dir, "fts")
        g = files.next_generation(self.dir, "fts", FTS_SCHEMA)
        files.create_empty(g.path)
        out = sql.connect_rw(g.path)
        try:
            _bulk_pragmas(out)
            _create(out, FTS_APP_ID, FTS_SCHEMA, FTS_DDL)
            fts.register(out)
            sql.attach_ro(out, state_gen.path, "s")
            out.execute("BEGIN")
            init_meta(out, "fts", self.profile, LogView.of(self.log).log_id)
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
        files.collect_garbage(self.dir, "fts", {old.name} if old else set())
        self._fts_degraded = None
        log.info("FTS index rebuilt as %s (%d documents)", g.name, documents)
        return {"documents": documents, "last_seq": smeta["last_seq"], "files": [g.name]}

    def _build_state_file(self, path: Path, app_id: int, kind: str, until_seq: int | None, as_of_ns: int | None,
                          progress: Progress | None, *, with_fts: bool = False, wal: bool = True,
                          index: _IndexBuilder | None = None) -> dict[str, Any]:
        """Write a complete state file at ``path`` from the log prefix; fsync it."""
        view = LogView.of(self.log)
        stop = view.head_seq if until_seq is None else max(0, min(until_seq, view.head_seq))
        files.create_empty(path)
        conn = sql.connect_rw(path)
        events = 0
        try:
            _bulk_pragmas(conn)
            _create(conn, app_id, STATE_SCHEMA, STATE_DDL + (FTS_TABLES if with_fts else []))
            conn.execute("BEGIN")
            init_meta(conn, kind, self.profile, view.log_id)
            if as_of_ns is not None:
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('as_of_ns', ?)", (int(as_of_ns),))
            if until_seq is not None:
                conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('until_seq', ?)", (int(until_seq),))
            applier = Applier(conn, self.profile)
            if index is not None:
                applier.docs = []
            last: dict[str, Any] | None = None
            if stop > 0:
                for env in self.log.read(1, stop):
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
        return {"events": events, "last_seq": last_seq, "last_hash": last_hash}

    def _build_standalone(self, out_path: Path, until_seq: int | None, as_of_ns: int | None,
                          progress: Progress | None) -> dict[str, Any]:
        out_path = out_path.absolute()
        files.make_dir(out_path.parent)
        tmp = files.temp_path(out_path)
        try:
            built = self._build_state_file(tmp, REPLAY_APP_ID, "replay", until_seq, as_of_ns, progress,
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

    # ---- health ------------------------------------------------------------------------------

    def health(self, full: bool = True) -> dict[str, Any]:
        """``{"ok": bool, "state": {...}, "fts": {...}}`` where each part has ``status`` (see
        :mod:`projections.health`), ``detail``, ``file``, ``generation``, ``last_seq``,
        ``log_head``; ``fts["degraded"]`` tells whether search runs on the fallback scan.
        Reads only: never rebuilds, never takes a write lock."""
        view = LogView.of(self.log)
        state = inspect(self.state_pointer(), "state", profile=self.profile, log=view, full=full)
        state_seq = state["last_seq"] if state["status"] in HEALTHY else None
        ftsh = inspect(self.fts_pointer(), "fts", profile=self.profile, log=view, full=full, state_seq=state_seq)
        ftsh["degraded"] = bool(self._fts_degraded) or ftsh["status"] not in HEALTHY
        if self._fts_degraded and ftsh["status"] in HEALTHY:
            ftsh["detail"] = f"search failed in this process: {self._fts_degraded}"
        return {"ok": state["status"] in HEALTHY and ftsh["status"] in HEALTHY and not self._fts_degraded,
                "state": state, "fts": ftsh}

    def ensure(self, full: bool = False, timeout: float | None = None) -> dict[str, Any]:
        """Detect and repair: rebuild whatever is not healthy, then catch up. ``full`` adds the
        deep integrity checks (slower: reads every page). Waits for the lease only when
        something must be repaired. Returns the health after repair."""
        self.collect_superseded()
        h = self.health(full=full)
        if h["ok"]:
            if h["state"]["status"] == "stale" or h["fts"]["status"] == "stale":
                self.refresh()
            return h
        with self._locked(timeout):
            self._repair_locked(full)
        return self.health(full=False)

    def collect_superseded(self) -> list[str]:
        """After a hot update: remove the private pointers (and their files) of older program
        versions once no process of that version is left. Cheap when there are none (one
        directory listing); never waits."""
        removed = files.collect_superseded(self.dir, _SCHEMAS)
        if removed:
            log.info("removed files of older program versions: %s", ", ".join(removed))
        return removed

    def _repair_locked(self, full: bool) -> None:
        view = LogView.of(self.log)
        state = inspect(self.state_pointer(), "state", profile=self.profile, log=view, full=full)
        if state["status"] not in HEALTHY:
            _report("state", state)
            ftsh = inspect(self.fts_pointer(), "fts", profile=self.profile, log=view)
            both = ftsh["status"] not in HEALTHY
            if both:
                _report("fts", ftsh)
            self._rebuild_state_locked(with_fts=both)
            state = inspect(self.state_pointer(), "state", profile=self.profile, log=view)
        ftsh = inspect(self.fts_pointer(), "fts", profile=self.profile, log=view, full=full,
                       state_seq=state["last_seq"])
        problem = None if ftsh["status"] in HEALTHY else f"{ftsh['status']} ({ftsh['detail']})"
        if problem is None and full:
            problem = self._fts_command_check()
        if problem is None and self._fts_degraded:
            problem = self._fts_degraded
        if problem is not None:
            _report("fts", {"status": ftsh["status"], "detail": problem})
            self._close_writer()
            self._rebuild_fts_locked()
        self._catch_up_locked()

    def _fts_command_check(self) -> str | None:
        g = files.read_pointer(self.fts_pointer())
        if g is None:
            return "missing"
        try:
            conn = sql.connect_rw(g.path)
        except sqlite3.Error as e:
            return str(e)
        try:
            conn.execute("BEGIN IMMEDIATE")
            return fts_command_check(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    def report_fts_fault(self, error: BaseException | str) -> None:
        """Called by a reader whose search hit an FTS fault: search is degraded (answered by a
        scan) until the index is checked and, if broken, rebuilt alone — by a background
        thread started here, or by the next catch-up or :meth:`ensure`."""
        first = not self._fts_degraded
        self._fts_degraded = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        if first:
            log.warning("search degraded: %s", self._fts_degraded)
        with self._probe_lock:
            if self._closed or (self._repairer is not None and self._repairer.is_alive()):
                return
            self._repairer = threading.Thread(target=self._repair_fts, name="eventlog-fts-repair", daemon=True)
            self._repairer.start()

    def _repair_fts(self) -> None:
        try:
            with self._locked(REPAIR_LEASE_WAIT):
                if self._fts_degraded:
                    self._catch_up_locked()
        except LeaseError:
            pass
        except Exception:  # the next search reports again; ensure() raises with details
            log.exception("repairing the FTS index failed")

    @property
    def search_degraded(self) -> bool:
        return bool(self._fts_degraded)

    # ---- read-your-writes and following ------------------------------------------------------------

    def probe_reader(self) -> Any:
        """The reader this projector checks its cursor through (created once, closed with the
        projector); the projections read model queries through it too."""
        with self._probe_lock:
            if self._probe is None:
                from projections.queries import Reader
                self._probe = Reader(self)
            return self._probe

    def cursor(self) -> int:
        """The seq every projection in use has reached (state.db, and the FTS index unless
        search is degraded). Read-only."""
        state_seq, fts_seq = self.probe_reader().cursors()
        if fts_seq is None or self._fts_degraded:
            return int(state_seq)
        return int(min(state_seq, fts_seq))

    def refresh(self) -> bool:
        """Catch up now if the log is ahead, no follower keeps the projections current (see
        :class:`projections.lease.Presence`) and the lease is free; never waits. Returns True
        when this call applied the log (or there was nothing to apply).

        With a follower alive in some process, what this reads lags the log by at most that
        follower's bound (``FOLLOW_POLL`` plus the time to apply one poll's events), and a
        one-shot reader costs the same whether 0 or 1,000 events came in since the last one.
        A follower that falls behind by more than ``FOLLOWER_OVERDUE_S`` (stopped, starved)
        no longer counts: the reader applies the log itself."""
        head = self.log.head()[0]
        if self._known_seq >= head:
            return True
        self._known_seq = max(self._known_seq, self.cursor())  # another process may have applied it
        if self._known_seq >= head:
            return True
        if followed(self.dir) and not self._overdue():
            return False
        if not self._try_locked():
            return False
        try:
            self._catch_up_locked()
        finally:
            self._unlock()
        return True

    def _overdue(self) -> bool:
        """True when the oldest event the projections lack is older than FOLLOWER_OVERDUE_S."""
        env = self.log.get(self._known_seq + 1)
        ts = env.get("ts") if env else None
        return isinstance(ts, int) and time.time_ns() - ts > FOLLOWER_OVERDUE_S * 1e9

    def wait_for(self, seq: int, timeout: float = 10.0) -> bool:
        """Block until the projections include event ``seq`` (read-your-writes). Applies the
        log itself whenever the lease is free; otherwise polls the cursor the lease holder
        advances. Returns False on timeout."""
        if seq <= self._known_seq:
            return True
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            current = self.cursor()
            if current >= seq:
                self._known_seq = max(self._known_seq, current)
                return True
            if self._try_locked():
                try:
                    self._catch_up_locked()
                finally:
                    self._unlock()
                if self._known_seq >= seq:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def sync(self, timeout: float = 10.0) -> bool:
        """Wait until the projections reach the log head as of this call."""
        return self.wait_for(self.log.head()[0], timeout)

    def start_follower(self, poll: float = FOLLOW_POLL) -> None:
        """Start a daemon thread that applies new log events within ``poll`` seconds whenever
        this process can take the lease (idempotent)."""
        if self._follower is not None and self._follower.is_alive():
            return
        self._stop.clear()
        self._presence.announce()
        self._follower = threading.Thread(target=self._follow, args=(poll,), name="eventlog-projector", daemon=True)
        self._follower.start()

    def stop_follower(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.join()
            self._follower = None
        self._presence.withdraw()

    def _follow(self, poll: float) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self.log.head()[0] > self._known_seq:
                    if self._try_locked():
                        try:
                            self._catch_up_locked()
                        finally:
                            self._unlock()
                    else:
                        self._known_seq = max(self._known_seq, self.cursor())
                if failures:
                    self._presence.announce()
                failures = 0
            except Exception:  # keep following; the next reader or ensure() reports the fault
                failures += 1
                self._presence.withdraw()  # a failing follower must not keep readers from catching up
                log.exception("projection follower failed (attempt %d)", failures)
            self._stop.wait(poll if failures == 0 else min(5.0, poll * 2 ** failures))

    # ---- readers and lifetime ------------------------------------------------------------------

    def reader(self) -> Any:
        """A new :class:`projections.queries.Reader` on this profile's projections."""
        from projections.queries import Reader
        return Reader(self)

    def close(self) -> None:
        if self._closed:
            return
        self.stop_follower()
        self._closed = True
        if self._repairer is not None:
            self._repairer.join()
        with self.lease._mutex:
            self._close_writer()
        if self._probe is not None:
            self._probe.close()
        self.lease.close()
        self._schema_use.close()

    def __enter__(self) -> "Projector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _IndexBuilder:
    """Builds a new FTS file in a second thread while state.db is being rebuilt (SQLite runs
    without the GIL, so the trigram indexing overlaps the Python work of the state build).

    ``add(docs)`` queues rows from :attr:`Applier.docs`; ``finish(state_path, seq, hash)``
    drops the documents of sessions deleted during the build, writes the cursor, merges the
    index, syncs the file. ``abort()`` on failure."""

    def __init__(self, path: Path, profile: str | None, log_id: str) -> None:
        import queue

        self.path = path
        self._queue: Any = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        files.create_empty(path)
        self._db = sql.connect_rw(path)
        _bulk_pragmas(self._db)
        _create(self._db, FTS_APP_ID, FTS_SCHEMA, FTS_DDL)
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


# ---- helpers shared by the builders ---------------------------------------------------------------

def _report(kind: str, health: dict[str, Any]) -> None:
    name = "state.db" if kind == "state" else "the FTS index"
    if health["status"] == "missing":
        log.info("building %s (%s)", name, health["detail"])
    else:
        log.warning("rebuilding %s: %s", name, health["detail"])


def _check_writable(g: Generation, schema: int) -> None:
    """Raise :class:`_Broken` unless generation ``g`` is this schema's, non-empty and writable."""
    if g.schema != schema:
        raise _Broken("old_schema", g.name)
    try:
        st = os.stat(g.path)
    except FileNotFoundError:
        raise _Broken("missing", g.name) from None
    if st.st_size == 0:
        raise _Broken("missing", f"{g.name} is empty")
    if st.st_mode & 0o600 != 0o600 or not os.access(g.path, os.R_OK | os.W_OK):
        raise _Broken("unreadable", g.name)


def _bulk_pragmas(conn: sqlite3.Connection) -> None:
    # The file is not referenced by any pointer until it is complete and synced: no journal.
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -8192")  # 8 MiB: bounds the anonymous peak of a 1M rebuild
    conn.execute("PRAGMA temp_store = MEMORY")


def _create(conn: sqlite3.Connection, app_id: int, version: int, ddl: list[str]) -> None:
    conn.execute(f"PRAGMA application_id = {int(app_id)}")
    conn.execute(f"PRAGMA user_version = {int(version)}")
    for statement in ddl:
        conn.execute(statement)


def init_meta(conn: sqlite3.Connection, kind: str, profile: str | None, log_id: str) -> None:
    schema = STATE_SCHEMA if kind in ("state", "replay") else FTS_SCHEMA
    conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [
        ("kind", kind), ("schema_version", schema), ("profile", profile), ("log_id", log_id),
        ("last_seq", 0), ("last_hash", ZERO_HASH), ("built_at_ns", time.time_ns()),
    ])


def write_cursor(conn: sqlite3.Connection, seq: int, h: str | None, schema: str = "main") -> None:
    conn.executemany(f"INSERT OR REPLACE INTO {schema}.meta (key, value) VALUES (?, ?)",
                     [("last_seq", seq), ("last_hash", h)])


__all__ = ["Projector", "LeaseError", "ProjectionError"]

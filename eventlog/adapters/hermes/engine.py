"""One engine per ``db_path`` per process: the log, the projection writer, the lease.

Every ``SessionDB`` opened on a path in this process shares one :class:`Engine` (reference
counted), because py-lmdb refuses to open one environment twice in a process. (This small
registry is meant to give way to eventlog's own shared environments once they exist.)

A write (:meth:`Engine.write`) runs, under the thread mutex and the projection lease:

1. ``BEGIN IMMEDIATE`` on the projection, then the caller's function, which builds events and
   applies each with the fold (:func:`.apply.apply`) — Hermes' validation and conflicts raise
   here, before anything is appended, and an event that changed no row is dropped;
2. append the events to the log (durable on return) only if the log still ends at the
   projection's cursor — the events were derived from the projection at that seq;
3. store the new cursor and commit. If the log had moved (a writer died between its append and
   its commit, perhaps inside LMDB's commit, where a read does not see it yet), nothing was
   appended: roll back, apply the log in order, and run the callers' functions again.

Readers of ``db_path`` therefore see a write as soon as its caller returns. Concurrent writes of
one process are committed in groups (one projection transaction, one log append: one sync).
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from eventlog.adapters.hermes import events, projection
from eventlog.adapters.hermes.apply import apply, erase_due, settle_erase_due
from eventlog.errors import HeadMovedError, StorageError, ValidationError
from eventlog.log.base import erase_record_room
from eventlog.log.filesystem import refuse_network
from eventlog.log.lmdb import EventLog  # at import, before any caller can patch what it uses
from eventlog.profiles import denied, make_dir, refuse_lost_log

log = logging.getLogger("eventlog.adapters.hermes")
T = TypeVar("T")

_registry: dict[str, "Engine"] = {}
_registry_lock = threading.RLock()  # re-entrant: a GC finalizer may release an engine mid-acquire


def _forget_after_fork() -> None:
    # A forked child must open its own environments; the parent's stay the parent's.
    global _registry_lock
    _registry_lock = threading.RLock()
    for engine in list(_registry.values()):
        engine._forked = True
    _registry.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class Tx:
    """What a write function gets: the projection connection inside the open transaction, and
    :meth:`emit` to apply an event and keep it for the log."""

    __slots__ = ("conn", "events", "base")

    def __init__(self, conn: sqlite3.Connection, base: int | None = None) -> None:
        self.conn = conn
        self.events: list[dict[str, Any]] = []
        self.base = base  # the seq this write's first event gets (None: a write that never commits)

    def emit(self, type_: str, session_id: Any, data: dict[str, Any]) -> Any:
        """Apply the event now; keep it only when it changed rows (an event that changed
        nothing would replay to nothing)."""
        ev = events.event(type_, session_id, data)
        before = self.conn.total_changes
        result = apply(self.conn, ev, None if self.base is None else self.base + len(self.events))
        if self.conn.total_changes != before:
            self.events.append(ev)
        return result

    def record(self, type_: str, session_id: Any, data: dict[str, Any]) -> None:
        """Keep an event whose effect is already in the transaction (raw SQL, see :mod:`.raw`)."""
        self.events.append(events.event(type_, session_id, data))


class _Request:
    __slots__ = ("fn", "result", "error", "done", "appended")

    def __init__(self, fn: Callable[[Tx], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.appended = False
        """Its events are in the log: its result stands whatever fails after."""


NO_PROJECTION = "no projection yet"
GATHER_S = 0.0004
"""How long a group's leader waits for the previous group's writers to queue again."""
MAX_GROUP = 256
"""Most write calls one projection transaction and one log append serve (group commit)."""
HEAD_RETRIES = 5
"""How often a write group runs again when the log turns out to hold events its projection had
not applied (once is the rule: under the lease only a dead writer's last commit can be missed)."""
_DONE, _SPLIT, _BEHIND = "done", "split", "behind"
LOOK_EVERY_S = 1.0
"""How often a writing engine opens its projection afresh to see what readers see (the header, the
cursor, Hermes' objects: ~0.4 ms)."""
HASH_EVERY = 1024
"""The cursor's log identity (an applied event's hash, a log read) is refreshed this often."""


class Engine:
    def __init__(self, layout: projection.Layout) -> None:
        self.layout = layout
        self.refs = 0
        self.mutex = threading.RLock()
        self.lease = projection.Lease(layout.dir)
        self.log: Any = None
        self._writer: sqlite3.Connection | None = None
        self._writer_path: Path | None = None
        self._writer_target: str | None = None
        self._writer_id: tuple[int, int] | None = None
        self.generation = 0
        """Bumped whenever the writer moves to another generation file (readers follow)."""
        self._cursor = 0
        self._hash_seq = 0
        self._validated: Path | None = None
        self._served: Path | None = None
        self._queue: list[_Request] = []
        self._leading = False
        self._last_group = 1
        self._turn = threading.Condition(threading.Lock())
        self._forked = False
        self.closed = False
        self.closing = False
        """Set when the last handle went: what waits for the mutex then is refused."""
        self._next_look = 0.0
        """When the writer next checks its file as a new reader sees it (:meth:`_connection`)."""
        self._erases_checked = False
        """Whether this engine's first write has looked for erases left due (:meth:`finish_erases`)."""

    # ---- lifecycle ----------------------------------------------------------------------

    @classmethod
    def acquire(cls, db_path: str | os.PathLike[str]) -> "Engine":
        layout = projection.Layout(db_path)
        key = str(layout.pointer)
        with _registry_lock:
            engine = _registry.get(key)
            if engine is None or engine.closing:
                engine = cls(layout)
                try:
                    engine._open()
                except PermissionError as e:  # a folder or file of another user's (a run with sudo)
                    raise denied(e, f"cannot open the session store {layout.pointer}") from e
                _registry[key] = engine
            engine.refs += 1
            return engine

    def release(self) -> None:
        with _registry_lock:
            self.refs -= 1
            if self.refs > 0 or self.closing:
                return
            if _registry.get(str(self.layout.pointer)) is self:
                del _registry[str(self.layout.pointer)]  # an open from now on makes an engine of its own
            self.closing = True
        self._close()  # waits for a write under way, without the registry: opens never wait for it

    def release_collected(self) -> None:
        """:meth:`release` for a handle the garbage collector took without a ``close``. The
        collector runs finalizers in whichever thread allocates at that moment — one that
        another thread, holding the registry lock, may be waiting for (a thread being started
        in :meth:`acquire`: the log's sweeper) — so this never waits for the lock: when it is
        taken, a short-lived thread of its own (which nobody waits for) releases the engine once
        the lock is free, so that the engine's log and threads do not outlive their last handle."""
        if _registry_lock.acquire(blocking=False):
            try:
                self.release()
            finally:
                _registry_lock.release()
        else:
            threading.Thread(target=self.release, name="eventlog-hermes-release", daemon=True).start()

    def _open(self) -> None:
        """Open the log; import a Hermes database found at ``db_path``; rebuild a projection
        that is missing or unusable. A usable one is served as it stands, without the lease: a
        lag is a writer's commit under way (it applies its own events), or, when the lease is
        free, a dead writer's tail, applied here: an open never waits for a busy writer."""
        refuse_network(self.layout.log_dir)  # before a Hermes database there is imported into a log beside it
        make_dir(self.layout.dir)
        try:
            if self.layout.is_foreign_file():
                with self.lease:
                    if self.layout.is_foreign_file():
                        from eventlog.adapters.hermes.importer import adopt

                        adopt(self.layout)
            refuse_lost_log(self.layout.profile)
            self.log = EventLog.open(self.layout.log_dir, profile=projection.PROFILE)
            if self._usable() is None:
                if self._cursor < self.log.head()[0]:
                    self._take_tail()
                return
            with self.lease:
                why = self._usable()
                if why is None:
                    return
                if why != NO_PROJECTION:
                    log.warning("hermes projection %s: %s; rebuilding it from the log", self.layout.pointer, why)
                projection.rebuild(self.layout, self.log)
                self._validated = self.layout.current()
        except BaseException:
            self._close()
            raise

    def _usable(self) -> str | None:
        """None when the projection can serve (perhaps after a catch-up); else why it must be
        rebuilt."""
        current = self.layout.current()
        if current is None and not os.path.lexists(self.layout.pointer):
            return NO_PROJECTION
        why, cursor = projection.examine(current, self.log)
        if why is not None:
            return why
        assert current is not None and cursor is not None
        _, seq, hash_seq, _ = cursor
        self._hash_seq = hash_seq
        self._cursor = seq
        self._validated = self._served = current
        return None

    def _close(self) -> None:
        """Close the writer, the lease and the log once no thread uses them: a handle closed by
        one thread while another's write runs on the engine (Hermes' ``close`` waits for it too)
        closed the writer connection under that write, and the process died in SQLite (outside
        audit, helper-53). Whatever takes the mutex after this fails as on a closed handle."""
        self.closing = True
        if self._forked:
            self.closed = True
            return
        with self.mutex:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self.lease.close()
            if self.log is not None:
                self.log.close()
            self.closed = True

    @contextmanager
    def _held(self) -> Iterator[None]:
        """The engine's mutex, for work on its writer, lease or log: refused once the engine is
        closed (its last handle was closed while this call waited)."""
        with self.mutex:
            _refuse_closed(self)
            yield

    # ---- the projection writer ----------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """The writer connection on the generation ``db_path`` names now (reopened after a swap,
        and when the file it has open is no longer the one there: deleted or replaced under it,
        its writes would reach no reader)."""
        try:
            target = os.readlink(self.layout.pointer)
        except OSError:
            target = None
        same_link = self._writer is not None and target is not None and target == self._writer_target
        if same_link and _file_id(self.layout.pointer) == self._writer_id:
            now = time.monotonic()
            if now < self._next_look:
                return self._writer  # type: ignore[return-value]
            # Every LOOK_EVERY_S the file is also opened afresh, as a reader opens it: garbage
            # written over its header (a disk fault, a stray write through the link) failed every
            # reader while this connection, working from its WAL, kept committing (outside audit,
            # helper-53). The next read of a writing handle healed it; a process that only writes
            # beside read_only readers and raw pollers never did.
            self._next_look = now + LOOK_EVERY_S
            why = projection.problem(self._writer_path, self.log)
            if why is None:
                return self._writer  # type: ignore[return-value]
            log.warning("hermes projection %s: %s under the writer; rebuilding it from the log", self.layout.pointer, why)
            self._validated = self._served = None
            same_link = False  # said
        if self.layout.is_foreign_file():
            # Something not ours was put at db_path while this engine ran: a Hermes database with
            # sessions is refused, anything else kept aside — never covered by the rebuild's link
            # (a real Hermes history was, with no trace: outside audit, helper-42).
            if self.log.head()[0] == 0:
                raise StorageError(f"{self.layout.pointer} was replaced while eventlog's SessionDB had it open",
                                   hint="close every SessionDB on it and open it again: a Hermes database there "
                                        "is then switched to eventlog")
            from eventlog.adapters.hermes.importer import adopt

            adopt(self.layout)
            self._validated = self._served = None
        elif same_link:
            log.warning("hermes projection %s: the file under the writer was removed or replaced; rebuilding it"
                        " from the log", self.layout.pointer)
            self._validated = self._served = None  # checked again; readers of this process follow
        current = self.layout.current()
        if current is None or (current != self._validated and projection.problem(current, self.log) is not None):
            current = projection.rebuild(self.layout, self.log)
        self._validated = current
        if self._writer is not None:
            self._writer.close()
        self._writer = projection.connect(current)
        self._writer_id = _file_id(current)
        if current != self._served:  # readers of this process follow the writer to a new file
            self.generation += 1
            self._served = current
        self._writer_path = current
        self._writer_target = os.readlink(self.layout.pointer)
        self._next_look = time.monotonic() + LOOK_EVERY_S  # just checked
        return self._writer

    def _sync(self, conn: sqlite3.Connection) -> None:
        """Bring the projection level with the log (under the lease)."""
        head = self.log.head()[0]
        cursor = projection.read_seq(conn)
        if cursor > head:
            log.warning("hermes projection %s is ahead of its log; rebuilding it", self.layout.pointer)
            projection.rebuild(self.layout, self.log)
            conn = self._connection()
            cursor = projection.read_seq(conn)
        if cursor < head:
            try:
                cursor = projection.catch_up(conn, self.log, cursor, head)
            except projection.ErasedHere:
                # erased through eventlog (its CLI, retention): the sessions leave the files
                log.warning("hermes projection %s: the log erased sessions it shows; rebuilding it",
                            self.layout.pointer)
                self._purge_rebuild()
                cursor = projection.read_seq(self._connection())
            self._hash_seq = cursor
            self._touch()  # rows changed: a poller of the mtime (mcp_serve) must look again
        self._cursor = cursor

    def _purge_rebuild(self) -> Path:
        """Rebuild the projection into a new generation and remove every other one (they hold
        what an erase took out). Under the lease."""
        path = projection.rebuild(self.layout, self.log)
        for name in os.listdir(self.layout.dir):
            if name.startswith("state.") and name.endswith(".db") and name != path.name:
                projection.remove_file(self.layout.dir / name)
        return path

    def write(self, fn: Callable[[Tx], T], *, healed: bool = False) -> T:
        """Run ``fn`` as one atomic write (see the module docstring); returns its result.

        Concurrent calls of this process are committed in groups: the first caller leads, runs
        every queued function in one projection transaction (each in its own savepoint, so one
        that raises undoes only its own rows) and appends all their events in one log append, so
        one sync serves them all."""
        if not self._erases_checked:
            self.finish_erases()
        generation = self.generation
        req = _Request(fn)
        turn = self._turn
        with turn:
            self._queue.append(req)
            while not req.done and (self._leading or self._queue[0] is not req):
                turn.wait()
            if not req.done:
                self._leading = True
                # With concurrent writers about, give the callers just woken from the previous
                # group a moment to queue again, so one sync serves them all (a lone writer never
                # waits).
                deadline = time.perf_counter() + GATHER_S
                while len(self._queue) < self._last_group and time.perf_counter() < deadline:
                    turn.wait(0.00005)
                group, self._queue[:] = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
                self._last_group = len(group)
        if not req.done:
            try:
                self._commit(group)
            except BaseException as e:
                # Failed before the log took the group's events (opening the transaction on a
                # damaged file, a catch-up): every caller of the group gets the error, not only
                # the leader — the others returned None as if written.
                for r in group:
                    if not r.appended:
                        r.result, r.error = None, r.error or e
            finally:
                with turn:
                    for r in group:
                        r.done = True
                    self._leading = False
                    turn.notify_all()
        if req.error is not None:
            if not healed and is_corrupt(req.error):
                # The projection file is damaged (a torn page, a disk fault): nothing of this
                # write reached the log, so it is rebuilt from the log and the write runs again.
                self.heal(req.error, generation)
                return self.write(fn, healed=True)
            raise req.error
        return req.result  # type: ignore[no-any-return]

    def _commit(self, group: list[_Request]) -> None:
        outcome = self._commit_again(group)
        if outcome == _SPLIT:
            # The log refused the group's batch as invalid (nothing was appended): one caller's
            # bad write (an event over the size limit) must not fail the others, so each runs
            # again on its own and gets its own answer.
            for r in group:
                if r.error is None:
                    self._commit_again([r])

    def _commit_again(self, group: list[_Request]) -> str:
        """:meth:`_commit_group`, run again while the log turns out to hold events the
        projection had not applied (each caller's function runs again on the caught-up state:
        its results and errors were decided on a state that missed them)."""
        for _ in range(HEAD_RETRIES):
            outcome = self._commit_group(group)
            if outcome != _BEHIND:
                return outcome
            for r in group:
                r.result, r.error = None, None
        err = StorageError(f"the log at {self.layout.log_dir} kept moving under the projection's lease "
                           f"({HEAD_RETRIES} tries); nothing of this write was appended",
                           hint="is another program appending to this log without the facade?")
        for r in group:
            r.error = err
        return _DONE

    def _commit_group(self, group: list[_Request]) -> str:
        """Commit ``group``. :data:`_SPLIT` when the log refused its batch as invalid and the
        group had several writers (then nothing is written and their results are unset);
        :data:`_BEHIND` when the log held events the projection had not applied (nothing was
        appended; they are applied now, and the group must run again)."""
        with self._held(), self.lease:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            if projection.read_seq(conn) < self.log.head()[0]:
                # The log holds events the projection has not applied (a writer killed between its
                # append and its commit): apply them first, so that ids, conflicts and locks are
                # decided on the whole log — else this write would reuse a dead writer's message id
                # and be dropped from every replay after it was acknowledged.
                conn.execute("ROLLBACK")
                self._sync(conn)
                conn = self._connection()  # a catch-up may have moved it to a new generation
                conn.execute("BEGIN IMMEDIATE")
            events: list[dict[str, Any]] = []
            try:
                cursor = projection.read_seq(conn)
                alone = len(group) == 1
                for r in group:
                    tx = Tx(conn, cursor + 1 + len(events))  # the log takes the group's events in order
                    if alone:
                        try:
                            r.result = r.fn(tx)
                        except BaseException as e:
                            r.error = e
                    else:
                        conn.execute("SAVEPOINT w")
                        try:
                            r.result = r.fn(tx)
                            conn.execute("RELEASE w")
                        except BaseException as e:
                            conn.execute("ROLLBACK TO w")
                            conn.execute("RELEASE w")
                            r.error = e
                    if r.error is None:
                        events += tx.events
                if not events:
                    _rollback(conn)
                    return _DONE
                # Appended only right after the cursor: the events were derived from the projection
                # at that seq. The head read above can be older than the log's (a read transaction
                # does not see the last commit of a writer killed inside it until the next writer
                # has recovered LMDB's lock), and an event built on a state that missed one before
                # it could be dropped by every replay (a message id used twice) once acknowledged.
                seqs = self.log.append(events, expected_head=cursor)
                for r in group:
                    r.appended = r.error is None
            except HeadMovedError:
                _rollback(conn)
                self._sync(conn)
                return _BEHIND
            except ValidationError as e:
                _rollback(conn)
                writers = [r for r in group if r.error is None]
                if len(writers) > 1:
                    for r in writers:
                        r.result = None
                    return _SPLIT
                for r in writers:
                    r.error = e
                return _DONE
            except BaseException as e:
                _rollback(conn)
                for r in group:
                    r.error = r.error or e
                return _DONE
            last = seqs[-1]
            known_hash = None
            if last - self._hash_seq >= HASH_EVERY or self._hash_seq == 0:
                env = self.log.get(last)
                known_hash = env["hash"] if env else None
            try:
                projection.write_cursor(conn, last, known_hash)
                conn.execute("COMMIT")
            except sqlite3.Error as e:  # the events are durable in the log; the next sync applies them
                log.warning("hermes projection commit failed after append (%s); it will catch up", e)
                _rollback(conn)
                return _DONE
            self._cursor = last
            if known_hash is not None:
                self._hash_seq = last
            self._touch()
        return _DONE

    def _touch(self) -> None:
        # Hermes' mcp_serve polls the mtime of state.db; in WAL mode a commit leaves the main file
        # untouched, so mark it (utime opens no descriptor: no POSIX lock can be disturbed).
        try:
            if self._writer_path is not None:
                os.utime(self._writer_path)
        except OSError:
            pass

    def refresh(self, reader: sqlite3.Connection) -> None:
        """Read-your-writes for readers: the projection (seen through ``reader``) level with the
        log. A writer holds the lease from its append to its commit, so a lag while the lease is
        free is a dead writer's tail: it is applied here. A lag while the lease is held is a
        commit under way: never waited for."""
        head = self.log.head()[0]
        if head <= self._cursor:
            return
        applied = projection.read_seq(reader)
        if applied >= head:
            self._cursor = applied
            return
        self._take_tail(reader)

    def _take_tail(self, reader: sqlite3.Connection | None = None) -> None:
        if not self.mutex.acquire(blocking=False):
            return
        try:
            if not self.closing and self.lease.try_enter():
                try:
                    # The writer we saw may have committed and left just now: look again first.
                    if reader is not None and projection.read_seq(reader) >= self.log.head()[0]:
                        return
                    self._sync(self._connection())
                finally:
                    self.lease.__exit__(None, None, None)
        finally:
            self.mutex.release()

    def erase(self, reason: str) -> int:
        """Make the content of the sessions deleted and not erased yet (``erase_due``: the
        delete just committed, and any whose process was killed before its erase) unrecoverable:
        their events up to their deletion become stubs with one ``log.erased`` record (eventlog's
        erase; the log is compacted), then the projection is rebuilt into a new generation and
        every older one removed, so no file keeps what Hermes deleted. A session of the same id
        that another process made again after the deletion keeps its events (they come after
        it). The AUTOINCREMENT counters are carried in the record, so a rebuild never hands out
        an id a deleted row had. Returns the record's seq (0: nothing)."""
        with self._held(), self.lease:
            self._sync(self._connection())
            conn = self._connection()  # the catch-up may have moved it to a new generation
            due = erase_due(conn)
            # A Hermes id eventlog's stream ids cannot hold lives in a mapped stream (the id in
            # the data): read that stream, and only that id's events (the differential test found
            # such a session's events left unerased, so a rebuild brought back a deleted delegate).
            found = {sid: [env["seq"] for env in self.log.read_session(events.map_session_id(sid))
                           if (bound is None or env["seq"] <= bound) and env["type"] not in KEPT_BY_DELETE
                           and not env.get("erased") and events.session_of(env) == sid]
                     for sid, bound in due.items()}
            session_ids = [sid for sid, seqs_of in found.items() if seqs_of]
            seqs = [q for sid in session_ids for q in found[sid]]
            empty = [sid for sid, seqs_of in found.items() if not seqs_of]
            if empty:  # nothing of theirs in the log (made by raw SQL): no longer due
                conn.execute("BEGIN IMMEDIATE")
                settle_erase_due(conn, empty)
                conn.execute("COMMIT")
            if not seqs:
                return 0
            sequences = {str(n): int(s) for n, s in conn.execute("SELECT name, seq FROM sqlite_sequence")}
            import getpass

            try:
                who = getpass.getuser()
            except Exception:  # no user database entry (a container)
                who = "unknown"
            # The record names every id it settles (a rebuild then finds none of them due).
            data = {"reason": reason, "by": who, "sessions": list(found), "sqlite_sequence": sequences}
            # More events than one record can name (~186,000: a long conversation): the
            # oldest go first in records that settle no session, the last record settles them all
            # (outside audit, helper-87: the record was refused as too large, at every first write).
            seqs, per_record = sorted(seqs), erase_record_room(data)
            while len(seqs) > per_record:
                part, seqs = seqs[:per_record], seqs[per_record:]
                self.log.erase(part, {**data, "sessions": []}, compact=False)
            seq = int(self.log.erase(seqs, data, compact=False))
            compacted = bool(seq) and self.log.compact_after_erase()
            self._purge_rebuild()  # the replaced generation held the words
            if compacted:
                self.log.erase_finished(seq)  # compacted and the projection purged: files clean
            self._sync(self._connection())
            return seq

    def finish_erases(self) -> int:
        """Erase the sessions deleted whose erase never ran (``erase_due``: a process killed
        between a delete's commit and its erase). A process's first write does this, so what
        Hermes deleted does not stay in the log because a delete was interrupted. Returns the
        erase record's seq (0: nothing was due)."""
        with self._held(), self.lease:  # _connection may rebuild or adopt: never without the lease
            if self._erases_checked:
                return 0
            conn = self._connection()
            due = erase_due(conn)
            seq = self.erase("deleted through Hermes' SessionDB (an interrupted delete, finished)") if due else 0
            self._erases_checked = True
            return seq

    def heal(self, error: BaseException, generation: int | None = None) -> None:
        """Rebuild a projection a query found damaged (:func:`is_corrupt`); the log is the data.
        ``generation``: the one the query ran on — when this process has moved to another file
        since (another caller healed it first), nothing is rebuilt again."""
        with self._held():
            if generation is not None and generation != self.generation:
                return
            log.warning("hermes projection %s is damaged (%s); rebuilding it from the log", self.layout.pointer, error)
            self.rebuild()

    def rebuild(self) -> Path:
        """Rebuild the projection from the log now (``eventlog``-side repair)."""
        with self._held(), self.lease:
            path = projection.rebuild(self.layout, self.log)
            self._sync(self._connection())
            return path


def closed_error() -> AttributeError:
    """What a call on a closed handle raises. Hermes' ``close()`` sets its connection to None, so
    every call made after it fails at its first statement with this AttributeError (not an
    sqlite3.Error: callers' ``except sqlite3.Error`` guards let it through)."""
    return AttributeError("'NoneType' object has no attribute 'execute'")


def _refuse_closed(engine: Engine) -> None:
    if engine.closing:
        raise closed_error()


def is_corrupt(error: BaseException) -> bool:
    """True for SQLite's "database disk image is malformed", "file is not a database" and "disk
    I/O error" (the primary result codes SQLITE_CORRUPT, SQLITE_NOTADB and SQLITE_IOERR, whatever
    the extended code): the projection file, its WAL or its shared-memory index is damaged — a
    WAL truncated under open connections fails every later statement with an I/O error — and a
    projection rebuilt from the log in a new file is the repair. (A full disk is SQLITE_FULL, not
    one of these.) Python 3.10's errors carry no code (3.11 added ``sqlite_errorcode``): there,
    SQLite's own words for the three decide (a damaged FTS index's: "vtable constructor failed")."""
    if not isinstance(error, sqlite3.DatabaseError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (10, 11, 26)
    text = str(error)
    return any(words in text for words in ("database disk image is malformed", "file is not a database",
                                           "disk I/O error", "vtable constructor failed"))


def _file_id(path: Path) -> tuple[int, int] | None:
    """Device and inode of the file at ``path`` (links followed), or None when there is none or
    it is empty. A generation is never empty (it is built before it is linked); one truncated
    under the writer (``> state.db`` writes through the link) kept taking its writes while every
    reader failed on it, until a read of a writing handle met the damage (outside audit,
    helper-53): it is rebuilt at the next write, like a file removed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st.st_size > 0 else None


def _rollback(conn: sqlite3.Connection) -> None:
    """End the write transaction after a failure. SQLite has already rolled it back after some
    errors (an I/O error among them), and the "no transaction is active" that ROLLBACK then
    raises must not replace the error the caller gets (it hid a damaged WAL from the repair)."""
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


KEPT_BY_DELETE = frozenset({"hermes.compression_lock_acquired", "hermes.compression_lock_refreshed",
                            "hermes.compression_lock_released"})
"""Events of a session that its erase spares: Hermes' delete and prune remove the session's
row and messages but keep its compression lock row (holder and times, no content); erasing
these events would make the rebuilt projection drop a row Hermes keeps (found by the
differential test)."""


def finalizer(owner: object, engine: Engine) -> "weakref.finalize[..., Any]":
    """Release ``engine`` when ``owner`` is garbage-collected without being closed (never
    waiting: :meth:`Engine.release_collected`)."""
    return weakref.finalize(owner, engine.release_collected)


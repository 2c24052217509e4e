"""The per-profile event log on LMDB: append, read, follow, verify.

Named databases in one LMDB environment:

``events``   8-byte big-endian seq -> canonical envelope bytes (``put(append=True)``, checked)
``ids``      event id -> seq (idempotency: a retried id returns its original seq)
``streams``  session id -> its seqs (dupsort, fixed 8-byte values; the count is the stream version)
``meta``     ``format``, ``profile``, ``head`` (seq + raw sha256 of the last event)

Every table is written in the same write transaction as the events it describes, so they can
never disagree. Appends from many threads of one process share write transactions (group
commit): one leader thread commits everything queued, one sync serves all of them, and each
caller returns only once its own events are durable. Appends from several processes are
serialized by LMDB's write lock. Nothing here ever rewrites or deletes an event.
"""
from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import lmdb

from eventlog.errors import (
    ClosedError,
    ConcurrencyError,
    DiskFullError,
    DuplicateEventError,
    EventLogError,
    ForkedEnvironmentError,
    IntegrityError,
    StorageError,
    ValidationError,
)
from eventlog.log import codec, residency
from eventlog.log.base import LogBase, VerifyResult, prepare_batch
from eventlog.profiles import make_dir, restrict_file

FORMAT_VERSION = b"1"
DEFAULT_MAP_SIZE = 32 * 1024**3
"""Address space reserved up front (the file is sparse); doubled on MapFullError."""
READ_CHUNK = 1024
READ_CHUNK_BYTES = 4 << 20
"""A scan's read transaction also ends once its chunk holds this many bytes (at least one event)."""
RELEASE_EVERY_BYTES = 8 << 20
"""A scan hands the log pages it read back to the page cache after this many bytes (see
:mod:`eventlog.log.residency`): a rebuild of a 2 GB log stays a few dozen MB resident."""
"""Events per read transaction in long scans: a long-lived reader pins freed pages."""
READER_SWEEP_S = 1.0
"""How often a process that reads clears reader slots left by dead processes."""
COMMIT_DELAY_S = 0.0004
"""How long a leader waits for concurrent callers to queue before it commits (see _gather)."""
GROUP_MAX_EVENTS = 20_000
GROUP_MAX_BYTES = 64 * 1024 * 1024
DURABILITIES = ("sync", "nosync")

_SEQ = 8
_Thread = threading.Thread
"""Bound at import: an embedding runtime's tests may monkeypatch ``threading.Thread`` (Hermes'
run thread targets inline that way), which must not turn the reader sweep into an endless call."""
_live_logs: "weakref.WeakSet[EventLog]" = weakref.WeakSet()


def _mark_forked() -> None:
    for log in list(_live_logs):
        log._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def seq_key(seq: int) -> bytes:
    return seq.to_bytes(_SEQ, "big")


def key_seq(key: bytes | memoryview) -> int:
    return int.from_bytes(bytes(key), "big")


class _LockReplaced(Exception):
    """Internal: lock.mdb changed under an open write transaction; the group is retried."""


def log_warn(message: str) -> None:
    import logging

    logging.getLogger("eventlog.log").warning(message)


class _Request:
    __slots__ = ("items", "expected", "size", "owner", "wake", "done", "seqs", "error")

    def __init__(self, items: list[codec.Prepared], expected: int | None) -> None:
        self.items = items
        self.expected = expected
        self.size = sum(len(it.data_bytes) for it in items)
        self.owner = threading.get_ident()
        self.wake: threading.Lock | None = None  # made (held) only when the caller has to wait
        self.done = False
        self.seqs: list[int] = []
        self.error: BaseException | None = None


def _nearly_full(path: Path) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 4 * 1024 * 1024


def storage_error(e: lmdb.Error, action: str, path: Path | None = None) -> StorageError:
    """The one place LMDB errors become eventlog errors (cause chained by the caller)."""
    text = str(e)
    if isinstance(e, lmdb.MapFullError):
        return DiskFullError(f"{action}: LMDB map is full", hint="open with a larger map_size")
    if isinstance(e, lmdb.ReadersFullError):
        return StorageError(
            f"{action}: LMDB reader table is full",
            hint="dead processes may hold reader slots: reopen the log (it runs reader_check) or raise max_readers",
        )
    if "No space left" in text or getattr(e, "errno", None) == errno.ENOSPC or (
            "Input/output error" in text and path is not None and _nearly_full(path)):
        return DiskFullError(f"{action}: no space left on device", hint="free disk space, then retry: nothing was written")
    if isinstance(e, (lmdb.ReadonlyError,)) or "Permission denied" in text or "Read-only" in text:
        return StorageError(
            f"{action}: the log directory or its lock file is not writable ({text})",
            hint="check the owner and permissions of the profile's log/ directory",
        )
    if isinstance(e, lmdb.InvalidError) or isinstance(e, lmdb.CorruptedError) or isinstance(e, lmdb.VersionMismatchError):
        return StorageError(f"{action}: the log file is not a valid LMDB environment ({text})",
                            hint="restore the profile's log/ from a backup or an export")
    return StorageError(f"{action}: {text}")


class EventLog(LogBase):
    """An append-only, hash-chained event log in one LMDB environment.

    Open with :meth:`open`; use as a context manager or call :meth:`close`. Thread-safe.
    Not usable across ``fork()``: the child must open its own (raises
    :class:`ForkedEnvironmentError` otherwise).
    """

    def __init__(self, path: Path, env: lmdb.Environment, durability: str, profile: str | None) -> None:
        self.path = path
        self.durability = durability
        self._pid = os.getpid()
        self._forked = False
        self._closed = False
        self._open_args: tuple[Path, int, int, str, bool] = (path, DEFAULT_MAP_SIZE, 512, durability, False)
        self._attach(env)
        self._mu = threading.Lock()
        self._queue: deque[_Request] = deque()
        self._leader = False
        self._last_group = 0
        self._readers = 0
        self._resizing = False
        self._rcv = threading.Condition()
        self._appended = threading.Condition()
        self.profile = profile
        self._sweep_lock = threading.Lock()
        self._sweeper = _Thread(target=self._sweep, name="eventlog-reader-sweep", daemon=True)
        self.commits = 0
        """Write transactions committed by this handle (group commit shares them)."""
        self._init_meta(profile)
        _live_logs.add(self)
        self._sweeper.start()

    def _attach(self, env: lmdb.Environment) -> None:
        self._env = env
        self._events = env.open_db(b"events")
        self._ids = env.open_db(b"ids")
        self._streams = env.open_db(b"streams", dupsort=True, dupfixed=True)
        self._meta = env.open_db(b"meta")
        self._lock_path = str(self.path / "lock.mdb")
        st = os.stat(self._lock_path)
        self._lock_id = (st.st_dev, st.st_ino)

    def _sweep(self) -> None:
        """Clear reader slots of dead processes every READER_SWEEP_S, even while idle, so a
        table filled by SIGKILLed readers frees itself for every process that opens the log."""
        while True:
            time.sleep(READER_SWEEP_S)
            with self._sweep_lock:
                if self._closed or self._forked or self._pid != os.getpid():
                    return
                try:
                    self._env.reader_check()
                except lmdb.Error:
                    pass

    # ---------------------------------------------------------------- open / close

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        durability: str = "sync",
        profile: str | None = None,
        map_size: int = DEFAULT_MAP_SIZE,
        max_readers: int = 512,
        readonly: bool = False,
    ) -> "EventLog":
        """Open (creating if needed) the log at directory ``path``.

        ``durability="sync"`` (default): an append returns after its events are on disk and
        survive an OS crash or power loss. ``"nosync"``: survives a crash of the process only.
        Raises :class:`StorageError` (with a hint) when the directory is unusable.
        """
        if durability not in DURABILITIES:
            raise ValidationError("durability", f"must be one of {DURABILITIES}")
        p = Path(path)
        if not readonly:
            try:
                make_dir(p)
            except OSError as e:
                raise StorageError(f"cannot create the log directory {p}: {e.strerror}",
                                   hint="check that the home directory is writable") from e
        env = cls._open_env(p, map_size, max_readers, durability, readonly)
        try:
            env.reader_check()
        except lmdb.Error:
            pass
        if not readonly:
            for name in ("data.mdb", "lock.mdb"):
                restrict_file(p / name)
        try:
            log = cls(p, env, durability, profile)
        except lmdb.Error as e:
            env.close()
            raise storage_error(e, f"cannot open log at {p}") from e
        log._open_args = (p, map_size, max_readers, durability, readonly)
        return log

    @staticmethod
    def _open_env(p: Path, map_size: int, max_readers: int, durability: str, readonly: bool) -> lmdb.Environment:
        # py-lmdb begins a read transaction while opening: with the reader table full of slots
        # of dead processes, wait for a live process's sweep (READER_SWEEP_S) before giving up.
        deadline = time.monotonic() + 3 * READER_SWEEP_S
        while True:
            try:
                return EventLog._open_env_once(p, map_size, max_readers, durability, readonly)
            except lmdb.ReadersFullError as e:
                if time.monotonic() > deadline:
                    raise storage_error(e, f"cannot open log at {p}") from e
                time.sleep(0.05)

    @staticmethod
    def _open_env_once(p: Path, map_size: int, max_readers: int, durability: str, readonly: bool) -> lmdb.Environment:
        try:
            return lmdb.open(
                str(p),
                map_size=map_size,
                max_dbs=8,
                max_readers=max_readers,
                subdir=True,
                sync=durability == "sync",
                metasync=durability == "sync",
                readonly=readonly,
                create=not readonly,
                mode=0o600,
                readahead=False,
                lock=True,
            )
        except lmdb.ReadersFullError:
            raise
        except lmdb.Error as e:
            raise storage_error(e, f"cannot open log at {p}") from e

    def _init_meta(self, profile: str | None) -> None:
        with self._env.begin(write=False) as txn:
            fmt = txn.get(b"format", db=self._meta)
            stored_profile = txn.get(b"profile", db=self._meta)
        if fmt is not None and fmt != FORMAT_VERSION:
            raise StorageError(f"log format {fmt!r} is not supported by this version (expects {FORMAT_VERSION!r})",
                               hint="upgrade eventlog")
        if stored_profile is not None and self.profile is None:
            self.profile = stored_profile.decode()
        if fmt is None and not self._env.flags().get("readonly"):
            with self._env.begin(write=True) as txn:
                txn.put(b"format", FORMAT_VERSION, db=self._meta, overwrite=False)
                if profile is not None:
                    txn.put(b"profile", profile.encode(), db=self._meta, overwrite=False)

    def close(self) -> None:
        """Close the environment. Later calls raise :class:`ClosedError`."""
        if self._closed:
            return
        with self._sweep_lock:
            self._closed = True
            if not self._forked and self._pid == os.getpid():
                self._env.close()
        with self._appended:
            self._appended.notify_all()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ClosedError("the event log is closed")
        if self._forked or self._pid != os.getpid():
            self._forked = True
            raise ForkedEnvironmentError()

    # ---------------------------------------------------------------- transactions

    @contextmanager
    def _read(self) -> Iterator[lmdb.Transaction]:
        """A short read transaction; waits while this process grows the map."""
        self._check()
        self._ensure_lock()
        with self._rcv:
            while self._resizing:
                self._rcv.wait()
            self._readers += 1
        try:
            for attempt in range(3):
                try:
                    txn = self._env.begin(write=False, buffers=False)
                    break
                except lmdb.MapResizedError:
                    self._adopt_new_map_size()
                except lmdb.ReadersFullError as e:
                    self._env.reader_check()
                    if attempt == 2:
                        raise storage_error(e, "cannot read the log") from e
            else:  # pragma: no cover - three resizes in a row
                raise StorageError("the log map kept changing size while opening a read transaction")
            try:
                yield txn
            finally:
                txn.abort()
        except lmdb.Error as e:
            raise storage_error(e, "cannot read the log") from e
        finally:
            with self._rcv:
                self._readers -= 1
                self._rcv.notify_all()

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """No read transaction of this process is open inside (needed to change the map size)."""
        with self._rcv:
            self._resizing = True
            while self._readers:
                self._rcv.wait()
        try:
            yield
        finally:
            with self._rcv:
                self._resizing = False
                self._rcv.notify_all()

    def _adopt_new_map_size(self) -> None:
        # Another process grew the map: pick up its size (no transaction of ours may be open).
        with self._rcv:
            self._readers -= 1
        try:
            with self._exclusive():
                self._env.set_mapsize(0)
        finally:
            with self._rcv:
                self._readers += 1

    # ---------------------------------------------------------------- append

    def append(self, events: Iterable[Any], expected_version: int | None = None) -> list[int]:
        """Append ``events`` atomically and return their seqs.

        Each event is ``{"type", "session"?, "data", "id"?, "v"?}``. The batch is all or nothing.
        ``expected_version``: the number of events the caller believes the (single) session
        stream of this batch holds; a mismatch raises :class:`ConcurrencyError` and writes
        nothing. An event whose id is already stored with the same content is not written
        again: its original seq is returned. The same id with other content raises
        :class:`DuplicateEventError`. Returns only once the events are durable under the
        log's durability. Invalid input raises :class:`ValidationError` naming the field.
        """
        self._check()
        items = prepare_batch(events, expected_version)
        if not items:
            return []
        req = _Request(items, expected_version)
        with self._mu:
            self._queue.append(req)
            lead = not self._leader
            if lead:
                self._leader = True
            else:
                req.wake = wake = threading.Lock()
                wake.acquire()
        if not lead:
            wake.acquire()  # released when our group is durable, or when we are made leader
            lead = not req.done
        if lead:
            self._lead()
        if req.error is not None:
            raise req.error
        return req.seqs

    def _lead(self) -> None:
        """Commit one group from the head of the queue, wake its callers, pass leadership on.

        One LMDB commit (and so one sync) serves every request of the group. Only the
        threads concerned are woken: the callers of this group and the next leader.
        """
        if self._last_group > 1:
            self._gather()
        with self._mu:
            group: list[_Request] = []
            n = size = 0
            while self._queue and (not group or (n < GROUP_MAX_EVENTS and size < GROUP_MAX_BYTES)):
                r = self._queue.popleft()
                group.append(r)
                n += len(r.items)
                size += r.size
        self._last_group = len(group)
        try:
            self._commit_group(group)
        finally:
            me = threading.get_ident()
            for r in group:
                r.done = True
                if r.owner != me and r.wake is not None:
                    r.wake.release()
            with self._mu:
                if self._queue:
                    head = self._queue[0].wake
                    assert head is not None  # queued behind a leader, so it waits on its lock
                    head.release()  # the head of the queue leads next
                else:
                    self._leader = False
            with self._appended:
                self._appended.notify_all()

    def _gather(self) -> None:
        """With concurrent appenders about, wait up to COMMIT_DELAY_S for the callers just
        woken from the previous group to queue again, so one sync serves them all (a commit
        delay, as databases with group commit use). A lone appender never waits."""
        deadline = time.perf_counter() + COMMIT_DELAY_S
        want = self._last_group
        while len(self._queue) < want and time.perf_counter() < deadline:
            time.sleep(0.00005)

    def _commit_group(self, group: list[_Request]) -> None:
        for attempt in range(8):
            for r in group:
                r.seqs, r.error = [], None
            try:
                self._write_group(group)
                return
            except _LockReplaced:
                self._ensure_lock()
            except lmdb.MapFullError:
                self._grow_map()
            except lmdb.MapResizedError:
                with self._exclusive():
                    self._env.set_mapsize(0)
            except lmdb.Error as e:
                err: BaseException = storage_error(e, "append failed", self.path)
                err.__cause__ = e
                for r in group:
                    r.seqs, r.error = [], err
                return
            except Exception as e:  # never leave a caller of this group waiting
                err = e if isinstance(e, EventLogError) else StorageError(f"append failed: {e!r}")
                if err is not e:
                    err.__cause__ = e
                for r in group:
                    r.seqs, r.error = [], err
                return
        err = DiskFullError("append failed: the LMDB map could not be grown enough", hint="raise map_size")
        for r in group:
            r.seqs, r.error = [], err

    def _grow_map(self) -> None:
        with self._exclusive():
            size = self._env.info()["map_size"]
            self._env.set_mapsize(size * 2)

    def _write_group(self, group: list[_Request]) -> None:
        # The lock file's identity is checked once, inside the write transaction: a replaced
        # table raises _LockReplaced and _commit_group rejoins the current one and retries.
        env = self._env
        txn = env.begin(write=True)
        try:
            if self._lock_replaced():  # removed after the check: retry the group on the new table
                raise _LockReplaced()
            head = txn.get(b"head", db=self._meta)
            start = key_seq(head[:_SEQ]) if head else 0
            seq, prev = (start, head[_SEQ:].hex()) if head else (0, codec.ZERO_HASH)
            ids_cur = txn.cursor(db=self._ids)
            stream_cur = txn.cursor(db=self._streams)
            ev_cur = txn.cursor(db=self._events)
            for r in group:
                fresh = self._plan(r, txn, ids_cur, stream_cur)
                for i, it in fresh:
                    seq += 1
                    ts = time.time_ns()
                    raw, digest = codec.seal(it, seq, ts, prev)
                    key = seq_key(seq)
                    if not ev_cur.put(key, raw, append=True):
                        raise StorageError(f"seq {seq} could not be appended (key out of order)")
                    if not ids_cur.put(it.id.encode(), key, overwrite=False):
                        raise StorageError(f"event id {it.id!r} appeared twice inside one transaction")
                    if it.session is not None:
                        stream_cur.put(it.session.encode(), key)
                    prev = digest
                    r.seqs[i] = seq
            if seq == start:
                txn.abort()  # refusals and replays write nothing, not even the head
                return
            txn.put(b"head", seq_key(seq) + bytes.fromhex(prev), db=self._meta)
            txn.commit()
        except BaseException:
            txn.abort()
            raise
        self.commits += 1

    def _lock_replaced(self) -> bool:
        # Only os.stat: opening and closing lock.mdb would cancel LMDB's own fcntl locks.
        try:
            st = os.stat(self._lock_path)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._lock_id

    def _ensure_lock(self) -> None:
        """Rejoin the log's lock table if lock.mdb was deleted or replaced since it was opened.

        LMDB's write mutex and reader table live in lock.mdb. A process that opens the log after
        the file was removed creates a new one, and a process still on the old table would then
        write in parallel with it and lose commits. So every write (and every read) first checks
        the file's identity and, when it changed, reopens the environment on the current lock
        file — waiting until no transaction of this process is open.
        """
        if not self._lock_replaced():
            return
        with self._exclusive():
            if not self._lock_replaced():
                return
            log_warn(f"{self.path / 'lock.mdb'} was deleted or replaced; reopening the log on the current lock file")
            with self._sweep_lock:
                self._env.close()
                self._attach(self._open_env(*self._open_args))

    def _plan(
        self,
        r: _Request,
        txn: lmdb.Transaction,
        ids_cur: lmdb.Cursor,
        stream_cur: lmdb.Cursor,
    ) -> list[tuple[int, codec.Prepared]]:
        """Decide what of request ``r`` to write, as ``(input index, event)`` pairs.

        Sets ``r.seqs`` (one slot per input event, stored seqs already filled in for replayed
        ids) or ``r.error``; returns ``[]`` when nothing is to be written.
        """
        r.seqs = [0] * len(r.items)
        fresh: list[tuple[int, codec.Prepared]] = []
        for i, it in enumerate(r.items):
            found = ids_cur.get(it.id.encode()) if it.caller_id else None
            if found is None:
                fresh.append((i, it))
                continue
            stored = codec.decode(txn.get(found, db=self._events) or b"null")
            if not it.same_content(stored):
                r.seqs, r.error = [], DuplicateEventError(it.id, key_seq(found))
                return []
            r.seqs[i] = key_seq(found)
        if fresh and r.expected is not None:
            stream = r.items[0].session
            assert stream is not None
            # The write transaction sees its own writes, so earlier requests of this group count.
            actual = stream_cur.count() if stream_cur.set_key(stream.encode()) else 0
            if actual != r.expected:
                r.seqs, r.error = [], ConcurrencyError(stream, r.expected, actual)
                return []
        return fresh

    def append_sealed(self, raws: Sequence[bytes]) -> int:
        """Append already-sealed events verbatim (an audit import); returns how many were written.

        Each must continue this log's chain exactly: its seq is head + 1, its prev is the head
        hash, its hash recomputes, and its id is new. Used to reproduce an exported log with
        identical seqs and hashes. All or nothing; raises :class:`IntegrityError` naming the
        first event that does not fit.
        """
        self._check()
        if not raws:
            return 0
        # LMDB's write lock serializes this transaction with group-commit leaders.
        try:
            with self._env.begin(write=True) as txn:
                head = txn.get(b"head", db=self._meta)
                seq, prev = (key_seq(head[:_SEQ]), head[_SEQ:].hex()) if head else (0, codec.ZERO_HASH)
                ids, streams, evs = (txn.cursor(db=d) for d in (self._ids, self._streams, self._events))
                for raw in raws:
                    env, reason = codec.check_stored(raw, seq + 1, prev)
                    if reason is not None or env is None:
                        raise IntegrityError(f"imported event {seq + 1} does not continue the chain: {reason}")
                    seq += 1
                    key = seq_key(seq)
                    if not evs.put(key, raw, append=True):
                        raise IntegrityError(f"seq {seq} could not be appended (key out of order)")
                    eid = env.get("id")
                    if type(eid) is not str or not ids.put(eid.encode(), key, overwrite=False):
                        raise IntegrityError(f"imported event {seq} has a missing or already used id {eid!r}")
                    if env.get("session") is not None:
                        streams.put(str(env["session"]).encode(), key)
                    prev = env["hash"]
                txn.put(b"head", seq_key(seq) + bytes.fromhex(prev), db=self._meta)
        except lmdb.Error as e:
            raise storage_error(e, "import failed") from e
        with self._appended:
            self._appended.notify_all()
        return len(raws)

    def event_seq(self, event_id: str) -> int | None:
        """The seq of the event with id ``event_id``, or None."""
        with self._read() as txn:
            found = txn.get(event_id.encode(), db=self._ids)
        return None if found is None else key_seq(found)

    # ---------------------------------------------------------------- reads

    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last event; ``(0, 64 zeros)`` for an empty log."""
        with self._read() as txn:
            raw = txn.get(b"head", db=self._meta)
        if not raw:
            return 0, codec.ZERO_HASH
        return key_seq(raw[:_SEQ]), raw[_SEQ:].hex()

    def get(self, seq: int) -> dict[str, Any] | None:
        """The envelope at ``seq``, or ``None``."""
        with self._read() as txn:
            raw = txn.get(seq_key(seq), db=self._events)
        return None if raw is None else codec.decode(raw)

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        """Envelopes with ``from_seq <= seq <= to_seq`` in order (``raw=True``: ``(seq, bytes)``).

        Streams in bounded read transactions (:data:`READ_CHUNK` events or :data:`READ_CHUNK_BYTES`), so a long scan
        never pins the pages that writers free meanwhile.
        """
        nxt = max(1, from_seq)
        since_release = 0
        while True:
            chunk: list[tuple[int, bytes]] = []
            chunk_bytes = 0
            with self._read() as txn:
                cur = txn.cursor(db=self._events)
                if cur.set_range(seq_key(nxt)):
                    for k, v in cur:
                        s = key_seq(k)
                        if to_seq is not None and s > to_seq:
                            break
                        chunk.append((s, bytes(v)))
                        since_release += len(v)
                        chunk_bytes += len(v)
                        if len(chunk) >= READ_CHUNK or chunk_bytes >= READ_CHUNK_BYTES:
                            break
            if since_release >= RELEASE_EVERY_BYTES:
                self.release_pages()
                since_release = 0
            for s, v in chunk:
                yield (s, v) if raw else codec.decode(v)
            if len(chunk) < READ_CHUNK and chunk_bytes < READ_CHUNK_BYTES:
                return
            nxt = chunk[-1][0] + 1

    def release_pages(self) -> int:
        """Drop this process's mapping of the log pages it has touched (they stay in the page
        cache). Long scans call it every :data:`RELEASE_EVERY_BYTES`; returns bytes advised."""
        if self._closed or self._forked:
            return 0
        return residency.release(str(self.path / "data.mdb"))

    def _get_raw(self, txn: lmdb.Transaction, key: bytes) -> bytes | None:
        raw = txn.get(key, db=self._events)
        return None if raw is None else bytes(raw)

    def stream_version(self, session: str) -> int:
        """The number of events in ``session``'s stream (0 for an unknown session)."""
        with self._read() as txn:
            cur = txn.cursor(db=self._streams)
            return cur.count() if cur.set_key(session.encode()) else 0

    def read_session(self, session: str) -> Iterator[dict[str, Any]]:
        """The envelopes of one session stream, in seq order, in bounded read transactions."""
        key = session.encode()
        after = 0
        while True:
            chunk: list[bytes | None] = []
            with self._read() as txn:
                cur = txn.cursor(db=self._streams)
                found = cur.set_range_dup(key, seq_key(after + 1)) if after else cur.set_key(key)
                if found:
                    seqs = []
                    for v in cur.iternext_dup():
                        seqs.append(v)
                        if len(seqs) >= READ_CHUNK:
                            break
                    chunk = [self._get_raw(txn, bytes(s)) for s in seqs]
                    if seqs:
                        after = key_seq(seqs[-1])
            for raw in chunk:
                if raw is not None:
                    yield codec.decode(raw)
            if len(chunk) < READ_CHUNK:
                return

    def _wait_appended(self, seconds: float) -> None:
        with self._appended:
            if not self._closed:
                self._appended.wait(seconds)

    # ---------------------------------------------------------------- misc

    def size_bytes(self) -> int:
        """Bytes used by the log's data file (pages in use, not the sparse map size)."""
        self._check()
        info = self._env.info()
        stat = self._env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])

    def reader_check(self) -> int:
        """Clear reader slots of dead processes; returns how many were cleared."""
        self._check()
        return int(self._env.reader_check())

    def __repr__(self) -> str:
        return f"EventLog({str(self.path)!r}, durability={self.durability!r})"


__all__ = ["EventLog", "VerifyResult"]

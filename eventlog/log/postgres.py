"""The per-profile event log on PostgreSQL: one log shared by many hosts.

Needs psycopg 3 (eventlog's ``[postgres]`` extra: ``pip install -e '.[postgres]'`` in its clone); the core
never imports this module.
Layout, registry and privileges: :mod:`eventlog.log.pg_schema`.

Appends. Every write transaction first takes the profile's transaction-scoped advisory lock,
then reads the head row, checks ids and stream versions, seals the events (seq, ts, prev,
hash: :func:`eventlog.log.codec.seal`, so the chain and the canonical bytes are byte-identical
to the LMDB log's; stored in the same format 2, :mod:`eventlog.log.stored`) and writes them
with the new head. Writers of every host are serialized by
that lock, so seqs are assigned in commit order and gapless: a rolled-back transaction never
consumed a seq (no sequence objects, which leave holes), and any snapshot sees a prefix of the
log. Within a process, concurrent callers share transactions (group commit, as the LMDB log
does): a leader thread commits what is queued in one transaction, and one caller's refusal
(a stale ``expected_version``, a reused id) fails only that caller.

Lost connections. A connection lost before COMMIT leaves nothing; one lost *during* COMMIT
leaves the outcome unknown. Either way the leader reconnects and runs the group again: every
event id (caller-given or generated before the first attempt) is looked up first, so a retry
finds what the lost COMMIT stored and returns its original seqs.

Following. Right after the COMMIT, in the same round trip but as a transaction of its own
(never inside the append transaction, where NOTIFY would hold a cluster-wide lock until the
flush), the writer sends ``NOTIFY`` on the profile's channel; ``follow`` LISTENs on its own
connection and wakes at once. Catch-up reads are the
truth; while the listener is down, followers poll. Every connection reconnects by itself
after a server restart (within ``reconnect_timeout`` for calls that must answer).
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import psycopg
from psycopg import errors as pgerr

from eventlog.errors import (
    ClosedError,
    ConcurrencyError,
    DuplicateEventError,
    EventLogError,
    IntegrityError,
    OutcomeUnknownError,
    ProfileGoneError,
    StorageError,
    ValidationError,
    WriterBusyError,
)
from eventlog.log import check_url_userinfo, codec, stored
from eventlog.log.base import (
    FOLLOW_POLL_S,
    LogBase,
    VerifyResult,
    check_erase_seqs,
    check_sealed,
    erasable,
    erase_event,
    erased_pairs,
    interrupted,
    named_unerased,
    prepare_batch,
    seq_arg,
    str_arg,
    verify_chain,
)
from eventlog.log.pg_follow import Wakeups
from eventlog.log.pg_follow import quiet_close as _quiet_close
from eventlog.log.pg_schema import (
    BODY_FORMAT,
    BODY_FORMATS,
    ERASE_MARK_KEY,
    LOCK_NAMESPACE,
    REGISTRY_OWNER_HINT,
    ProfileInfo,
    Statements,
    connect,
    drop_if_empty,
    holder_text,
    lookup,
    provision,
    redact,
    storage_error,
    upgrade,
)
from eventlog.log.pg_watch import WATCH
from eventlog.profiles import validate_profile

_log = logging.getLogger("eventlog.log")
T = TypeVar("T")

DURABILITIES = ("sync", "nosync")
"""``sync``: an append returns once its commit is flushed to the server's WAL (synchronous_commit
on). ``nosync``: once the server has it in memory (synchronous_commit off: a server crash may
lose the last few hundred milliseconds of appends; a client crash loses nothing acknowledged)."""
READ_CHUNK = 1000
COMMIT_DELAY_S = 0.0005
"""How long a leader waits for the callers of the previous group to queue again (see LMDB's)."""
GROUP_MAX_EVENTS = 20_000
GROUP_MAX_BYTES = 64 * 1024 * 1024
WRITE_CHUNK_BYTES = 64 * 1024 * 1024
"""Stored bytes of events one INSERT statement carries; a larger append is written in several
statements of one transaction (PostgreSQL refuses a value or message past 1 GB: a batch that
large failed like a lost connection and was resent until reconnect_timeout)."""
SEALED_CHUNK = 2000
"""Sealed events an ``append_sealed`` checks and writes a statement, inside its one transaction."""
LISTEN_FALLBACK_POLL_S = 1.0
"""How often a follower re-reads while its LISTEN connection is up (NOTIFY wakes it sooner)."""
DICT_TRAIN_AFTER = 2000
"""A format-2 log trains its compression dictionary once it holds this many events (as on LMDB)."""
DICT_SAMPLES = 2000
FAST_PATH_BACKOFF = 32
"""Groups written the two-round-trip way after the one-round-trip way found another writer's head."""
IDLE_IN_TRANSACTION_S = 60
"""A session of ours stopped inside a transaction (SIGSTOP, a debugger) is ended by the server
after this long, so it cannot hold a profile's advisory lock (the append lock, the rules lock)
forever."""
ANSWER_TIMEOUT = 20.0
"""Default ``answer_timeout`` (seconds): see :mod:`eventlog.log.pg_watch`."""
SERVER_KEEPALIVES = ("SET tcp_keepalives_idle = 10", "SET tcp_keepalives_interval = 5", "SET tcp_keepalives_count = 3",
                     "SET tcp_user_timeout = 30000")
"""The server's side of each connection notices a host that vanished from the network (power
loss, a partition) within ~25 s when idle and 30 s with data unacknowledged, not the system's
default ~2 h, and ends its session (TCP connections; ignored on a Unix socket)."""


def drop_empty_profile(url: str, profile: str, *, connect_timeout: float = 10.0) -> bool:
    """Remove ``profile`` from the server at ``url`` if its log holds no event (see
    :func:`eventlog.log.pg_schema.drop_if_empty`): what ``eventlog import`` does after a refused
    import that created the profile. Best effort: False when nothing was removed, also when the
    server or this login cannot do it."""
    validate_profile(profile)
    check_url_userinfo(url, "url")
    try:
        conn = connect(url, connect_timeout=connect_timeout)
    except psycopg.Error:
        return False
    try:
        return drop_if_empty(conn, profile)
    except psycopg.Error as e:
        _log.warning("could not remove the empty profile %r from %s: %s", profile, redact(url), e)
        return False
    finally:
        _quiet_close(conn)


_BEFORE, _LOOKED_UP, _SENT = 0, 1, 2
"""How far a write attempt got: nothing sent that commits; the group's ids looked up under the
profile's lock (any earlier attempt's COMMIT is settled and seen); a COMMIT sent."""


@contextmanager
def _pipeline(conn: psycopg.Connection[Any]) -> Iterator[Any]:
    """``conn.pipeline()``, with a psycopg error of the block raised after the pipeline ended.
    Raised inside it (a failed guard aborts the pipeline, a lost connection breaks it), psycopg's
    exit printed "error ignored terminating <Pipeline ...>" to stderr through its logger."""
    failed: psycopg.Error | None = None
    try:
        with conn.pipeline() as pipe:
            try:
                yield pipe
            except psycopg.Error as e:
                failed = e
    except psycopg.Error:
        if failed is None:
            raise
    if failed is not None:
        raise failed


def _aborted_inside(conn: psycopg.Connection[Any]) -> bool:
    """After a failed write: the server answered a statement of the transaction with an error
    (a statement timeout, a refused privilege), so the transaction is aborted and the COMMIT
    sent after it in the pipeline did not commit: the outcome is known, nothing was stored.
    False for a lost connection (the COMMIT may have landed) and once the transaction ended
    (an error after the COMMIT, in the NOTIFY's own transaction)."""
    return (not conn.closed and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR)


class _Sent(Exception):
    """An erase's connection failed after its COMMIT was sent (it may have committed)."""

    def __init__(self, seq: int, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.seq = seq
        self.error = error


def _lost(e: BaseException) -> bool:
    """A failure worth reconnecting and retrying for: the connection (or the server) went
    away, or the server refused for a moment (starting up, shutting down, cancelled). The
    server ending a session left idle inside a transaction past ``idle_in_transaction_session_timeout``
    (a host stopped or stalled in a write: the transaction did not commit) is one too, though
    psycopg raises it as an ``InternalError`` (SQLSTATE 25P03): an erase or an import resumed
    after it failed "check the PostgreSQL URL" where an append whose error happened to read
    "server closed the connection" was retried."""
    return ((isinstance(e, psycopg.OperationalError) and not isinstance(e, pgerr.DiskFull))
            or isinstance(e, pgerr.IdleInTransactionSessionTimeout))


class _Request:
    __slots__ = ("items", "payloads", "expected", "fence", "size", "done", "seqs", "error")

    def __init__(self, items: list[codec.Prepared], payloads: list[tuple[int, int, bytes]] | None,
                 expected: int | None, fence: int | None = None) -> None:
        self.items = items
        self.payloads = payloads  # format 2: each event's (codec, dictionary, data), made outside the transaction
        self.expected = expected
        self.fence = fence  # made inside this handle's rules lock: the server pid that must still hold it
        self.size = sum(len(it.data_bytes) for it in items)
        self.done = False
        self.seqs: list[int] = []
        self.error: BaseException | None = None


class _Pool:
    """Idle reader connections, reused; a connection that failed is dropped, never reused. Once
    closed it hands out none, and closes each connection given back (a read of another thread,
    the dictionary's training, was in flight when its log closed: kept, it stayed open)."""

    def __init__(self, make: Callable[[], psycopg.Connection[Any]], keep: int = 4) -> None:
        self._make = make
        self._keep = keep
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def conn(self) -> Iterator[psycopg.Connection[Any]]:
        c = self.take()
        ok = False
        try:
            yield c
            ok = True
        finally:
            self.give(c, ok)

    def take(self) -> psycopg.Connection[Any]:
        """An idle connection, or a new one; hand it back with :meth:`give`."""
        with self._lock:
            if self._closed:
                raise ClosedError("the event log is closed", hint="open the log again")
            c = self._idle.pop() if self._idle else None
        if c is None or c.closed:
            c = self._make()
        return c

    def give(self, c: psycopg.Connection[Any], ok: bool) -> None:
        """Keep ``c`` for reuse if ``ok`` and it is idle outside a transaction; else close it."""
        kept = False
        if ok and not c.closed and c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            with self._lock:
                if not self._closed and len(self._idle) < self._keep:
                    self._idle.append(c)
                    kept = True
        if not kept:
            _quiet_close(c)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            _quiet_close(c)


class PostgresLog(LogBase):
    """An append-only, hash-chained event log of one profile in a PostgreSQL database.

    Open with :meth:`open`; use as a context manager or call :meth:`close`. Thread-safe. Not
    usable across ``fork()``: open another one in the child.
    """

    def __init__(self, url: str, profile: str, info: ProfileInfo, durability: str, *,
                 connect_timeout: float, reconnect_timeout: float, lock_timeout: float | None = None,
                 answer_timeout: float | None = ANSWER_TIMEOUT) -> None:
        self.url = url
        self.answer_timeout = answer_timeout
        """Seconds a statement may go unanswered before the server is asked, on a new connection,
        whether it still answers; when it does not (within ``connect_timeout``), the statement's
        connection is cut and the call goes on as after a lost connection. None: never."""
        self.append_lock_timeout = lock_timeout
        """Seconds an append waits for the profile's append lock another session holds, then
        :class:`WriterBusyError`; None (the default): as long as it is held."""
        self.profile = profile
        self.info = info
        self.durability = durability
        self.reconnect_timeout = reconnect_timeout
        self._connect_timeout = connect_timeout
        self._where = f"{redact(url)} profile {profile!r}"
        self._sql = Statements(info)
        self._format = info.format
        self._compression = stored.Compression(self._load_dict)
        self._train_after = DICT_TRAIN_AFTER
        self._training = False
        self._pid = os.getpid()
        self._closed = False
        self.commits = 0
        """Write transactions committed by this handle (group commit shares them)."""
        self._watched = False  # counted in the statement watch's users (pg_watch)
        self._stubbing = 0
        self.stubbed = 0
        """Events this handle's imports stubbed for an imported ``log.erased`` record (their words
        left the log's rows; a profile's projections still hold them until purged)."""
        # group commit
        self._cv = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._leader = False
        self._last_group = 0
        self._write_mutex = threading.Lock()  # the writer connection: one transaction at a time
        self._cached_head: tuple[int, str] | None = None  # the head this handle last wrote or read
        self._fast_backoff = 0
        self._writer: psycopg.Connection[Any] | None = None
        self._phase = _BEFORE  # of the write attempt in flight (under _write_mutex)
        self._pool = _Pool(self._connect_reader)
        self._rules = threading.local()  # .pid: the backend holding this thread's rules lock
        self._wakeups = Wakeups(lambda: connect(url, connect_timeout=connect_timeout), self._sql.listen)

    @property
    def path(self) -> None:
        """A PostgreSQL log has no local path."""
        return None

    # ---------------------------------------------------------------- open / close

    @classmethod
    def open(cls, url: str, *, profile: str, durability: str = "sync", create: bool = True,
             connect_timeout: float = 10.0, reconnect_timeout: float = 30.0,
             lock_timeout: float | None = None, answer_timeout: float | None = ANSWER_TIMEOUT) -> "PostgresLog":
        """Open ``profile``'s log in the database at ``url`` (``postgresql://user:pw@host:port/db``).

        With ``create`` (default) a profile that is not provisioned yet is created, which needs
        an administrator login (CREATE on the database, CREATEROLE); a login that was granted a
        profile's role (:func:`eventlog.log.pg_schema.grant_login`) can open only that profile.
        ``reconnect_timeout``: how long a call keeps reconnecting after the connection or the
        server went away before it raises :class:`StorageError`. ``lock_timeout``: how long an
        append waits for the profile's append lock while another session holds it (a host
        stopped inside a write, a long import) before it raises :class:`WriterBusyError`,
        nothing written; None (default) waits as long as it is held. ``answer_timeout`` (default
        20 s; None: never): how long a statement may go unanswered before the server is asked, on
        a new connection, whether it still answers; if it does not answer that within
        ``connect_timeout`` (its processes frozen while its host still acknowledges packets), the
        statement's connection is cut and the call goes on as after a lost connection. A slow
        statement on a server that answers is never cut. Raises :class:`StorageError`
        (with a hint) when the server cannot be reached or the profile cannot be used.
        """
        validate_profile(profile)
        check_url_userinfo(url, "url")
        if durability not in DURABILITIES:
            raise ValidationError("durability", f"must be one of {DURABILITIES}")
        for name, value, most in (("connect_timeout", connect_timeout, 1e9), ("reconnect_timeout", reconnect_timeout,
                                                                                float("inf"))):
            # A string or NaN was taken, and failed later: int(nan) at open, and "now + '5'" in the
            # except clause of a lost connection (a raw TypeError out of the group commit's leader).
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= most:
                raise ValidationError(name, "must be a number of seconds, 0 or more")
        for name, maybe in (("lock_timeout", lock_timeout), ("answer_timeout", answer_timeout)):
            if maybe is not None and (isinstance(maybe, bool) or not isinstance(maybe, (int, float))
                                      or not 0 <= maybe <= 1e9):
                raise ValidationError(name, "must be a number of seconds, 0 or more")
        where = f"{redact(url)} profile {profile!r}"
        try:
            conn = connect(url, connect_timeout=connect_timeout, answer_timeout=answer_timeout)
        except psycopg.Error as e:
            raise storage_error(e, "cannot open the log", redact(url)) from e
        try:
            info = lookup(conn, profile)
            denied = ""
            if info is None and create:
                try:
                    info = provision(conn, profile)
                except pgerr.InsufficientPrivilege as e:
                    info = None
                    denied = redact(str(e).strip().splitlines()[0]) if str(e).strip() else "permission denied"
            elif info is not None:
                upgrade(conn, info)  # a profile provisioned by an earlier release, if this login may
            if info is None and ("schema" in denied or "profiles" in denied):  # an administrator, not the registry's
                raise StorageError(f"profile {profile!r} does not exist on {redact(url)}, and this login may not "
                                   f"create it: {denied}", hint=REGISTRY_OWNER_HINT)
            if info is None:
                raise StorageError(f"profile {profile!r} does not exist on {redact(url)}, or this login may not use it"
                                   + (f" (creating it was refused: {denied})" if denied else ""),
                                   hint="create it with `eventlog init` (or any write) and an administrator URL; "
                                        "for another login, grant it the profile's role "
                                        "(eventlog.log.pg_schema.grant_login)")
            if info.format not in BODY_FORMATS:
                raise StorageError(f"log format {info.format} of profile {profile!r} is not supported by this version "
                                   f"(reads {BODY_FORMATS}, writes {BODY_FORMAT})", hint="upgrade eventlog")
            log = cls(url, profile, info, durability, connect_timeout=connect_timeout,
                      reconnect_timeout=reconnect_timeout, lock_timeout=lock_timeout, answer_timeout=answer_timeout)
            log._setup(conn, writer=True, looked_up=True)
            log._writer = conn
            if answer_timeout is not None:
                WATCH.attach()
                log._watched = True
        except psycopg.Error as e:
            _quiet_close(conn)
            raise storage_error(e, "cannot open the log", where) from e
        except BaseException:
            _quiet_close(conn)
            raise
        return log

    def _setup(self, conn: psycopg.Connection[Any], *, writer: bool = False, looked_up: bool = False) -> None:
        """Make a new connection one of this handle's: check that the registry still maps the
        profile's name to the profile this handle opened (a profile removed and another created
        since must not be reached by its schema or role name), then take the profile's role."""
        if not looked_up:
            row = conn.execute(self._sql.identity, (self.profile,)).fetchone()
            if row is None or (int(row[0]), str(row[1]), str(row[2])) != (self.info.id, self.info.schema,
                                                                         self.info.role):
                raise self._gone(row is not None, conn)
        settings = [self._sql.set_role, f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_S}s'",
                    *SERVER_KEEPALIVES]
        if writer:
            settings.append("SET synchronous_commit = " + ("on" if self.durability == "sync" else "off"))
        conn.execute("; ".join(settings))  # one round trip

    def _gone(self, replaced: bool, conn: psycopg.Connection[Any] | None = None) -> StorageError:
        """:class:`ProfileGoneError`, or, when the registry hides the profile from this login only
        because its role was revoked from it (the profile is intact), a StorageError saying so."""
        if not replaced and conn is not None:
            try:
                row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s) "
                                   "AND NOT pg_has_role(session_user, %s, 'MEMBER')",
                                   (self.info.role, self.info.role)).fetchone()
            except psycopg.Error:
                row = None  # cannot tell
            if row is not None and row[0]:
                return StorageError(f"this login may no longer use profile {self.profile!r} on {redact(self.url)}: "
                                    f"its role {self.info.role} was revoked from it while this log was open; "
                                    "nothing was read or written", hint="an administrator grants the profile to this "
                                    "login again (eventlog.log.pg_schema.grant_login), then open it again")
        what = "was removed and created anew" if replaced else "was removed"
        return ProfileGoneError(f"profile {self.profile!r} {what} on {redact(self.url)} while this log was open "
                                f"(it had schema {self.info.schema}); nothing was read or written")

    def _converted(self, e: psycopg.Error, action: str) -> StorageError:
        """``e`` as an eventlog error: :class:`ProfileGoneError` when it is what a removed profile
        gives (its schema, tables or role gone) and the registry no longer maps this profile to
        this handle's, else :func:`storage_error`'s."""
        if isinstance(e, (pgerr.UndefinedTable, pgerr.InvalidSchemaName, pgerr.InsufficientPrivilege,
                          pgerr.UndefinedObject, pgerr.InvalidParameterValue)):
            try:
                with self._connect() as conn:
                    found = lookup(conn, self.profile)
                    if found is None or (found.id, found.schema, found.role) != (self.info.id, self.info.schema,
                                                                                 self.info.role):
                        return self._gone(found is not None, conn)
            except psycopg.Error:
                pass  # cannot tell: report e
        return storage_error(e, action, self._where)

    def _connect(self) -> psycopg.Connection[Any]:
        return connect(self.url, connect_timeout=self._connect_timeout, answer_timeout=self.answer_timeout)

    def _connect_reader(self) -> psycopg.Connection[Any]:
        conn = self._connect()
        try:
            self._setup(conn)
        except BaseException:
            _quiet_close(conn)
            raise
        return conn

    def close(self) -> None:
        """Close every connection (waiting for a commit in flight). Later calls raise
        :class:`ClosedError`. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._wakeups.close()
        with self._write_mutex:
            _quiet_close(self._writer)
            self._writer = None
        self._pool.close()
        if self._watched:
            self._watched = False
            WATCH.detach()

    def __enter__(self) -> "PostgresLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the event log is closed", hint="open the log again")
        if self._pid != os.getpid():
            raise StorageError("this PostgresLog was opened before fork() and cannot be used in the child process",
                               hint="open a new log in the child after forking")

    # ---------------------------------------------------------------- connections and retries

    def _retrying(self, action: str, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn`` on a reader connection; reconnect and run it again while the server is away
        (up to ``reconnect_timeout``). Only for reads: they can be repeated."""
        deadline: float | None = None
        delay = 0.05
        while True:
            self._check_open()
            try:
                with self._pool.conn() as conn:
                    return fn(conn)
            except psycopg.Error as e:
                if not _lost(e):
                    raise self._converted(e, action) from e
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.reconnect_timeout
                if now >= deadline:
                    raise storage_error(e, action, self._where) from e
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _writer_conn(self) -> psycopg.Connection[Any]:
        """The writer connection (held under ``_write_mutex``), reconnected if it was lost."""
        if self._writer is None or self._writer.closed or self._writer.broken:
            _quiet_close(self._writer)
            self._writer = None
            conn = self._connect()
            try:
                self._setup(conn, writer=True)
            except BaseException:
                _quiet_close(conn)
                raise
            self._writer = conn
        return self._writer

    def _drop_writer(self) -> None:
        _quiet_close(self._writer)
        self._writer = None
        self._cached_head = None

    # ---------------------------------------------------------------- append

    def append(self, events: Iterable[Any], expected_version: int | None = None) -> list[int]:
        """Append ``events`` atomically and return their seqs (the contract of
        :meth:`eventlog.log.Log.append`). Returns once the commit is durable under the log's
        durability; keeps reconnecting up to ``reconnect_timeout`` while the server is away,
        then raises :class:`StorageError` (the events may or may not be stored then: append
        them again with the same ids to find out)."""
        self._check_open()
        items = prepare_batch(events, expected_version)
        if not items:
            return []
        payloads = [self._compression.compress(it.data_bytes) for it in items] if self._format == 2 else None
        req = _Request(items, payloads, expected_version, getattr(self._rules, "pid", None))
        with self._cv:
            self._queue.append(req)
            while not req.done and self._leader:
                self._cv.wait()
            lead = not req.done
            if lead:
                self._leader = True
        if lead:
            try:
                while not req.done:
                    self._lead_once()
            finally:
                with self._cv:
                    self._leader = False
                    self._cv.notify_all()
        if req.error is not None:
            raise req.error
        return req.seqs

    def _lead_once(self) -> None:
        """Commit one group from the head of the queue and wake its callers."""
        if self._last_group > 1:
            deadline = time.perf_counter() + COMMIT_DELAY_S
            while len(self._queue) < self._last_group and time.perf_counter() < deadline:
                time.sleep(0.00005)
        with self._cv:
            group: list[_Request] = []
            n = size = 0
            while self._queue and (not group or (n < GROUP_MAX_EVENTS and size < GROUP_MAX_BYTES)):
                r = self._queue.popleft()
                group.append(r)
                n += len(r.items)
                size += r.size
        self._last_group = len(group)
        try:
            with self._write_mutex:
                try:
                    self._commit_group(group)
                except BaseException as e:
                    # KeyboardInterrupt or SystemExit (a signal handler) in the thread leading the group:
                    # its other callers took the seqs their events were sealed at as committed.
                    self._cached_head = None
                    for r in group:
                        r.seqs, r.error = [], interrupted(self._where, e, r.items)
                    raise
        finally:
            with self._cv:
                for r in group:
                    r.done = True
                self._cv.notify_all()

    def _commit_group(self, group: list[_Request]) -> None:
        deadline: float | None = None
        delay = 0.05
        unknown = False  # a COMMIT of this group went out on a connection lost before its answer
        while True:
            for r in group:
                r.seqs, r.error = [], None
            if self._closed:
                self._fail(group, ClosedError("the event log is closed", hint="open the log again"))
                return
            self._phase = _BEFORE
            try:
                top = self._write_group(group)
            except psycopg.Error as e:
                if self._phase == _SENT:
                    unknown = True
                elif self._phase == _LOOKED_UP:  # the ids were looked up under the lock: no earlier COMMIT is pending
                    unknown = False
                if isinstance(e, pgerr.LockNotAvailable) and self._phase != _SENT:
                    # The append lock's wait ran out (lock_timeout): this attempt wrote nothing; an
                    # earlier one whose COMMIT was lost has an unknown outcome still.
                    err0: EventLogError = (self._busy(e) if not unknown else
                                           self._outcome_unknown(e, [it.id for r in group for it in r.items]))
                    self._fail(group, err0)
                    return
                if _lost(e):
                    # The COMMIT may or may not have happened: the retry looks every id up first.
                    self._drop_writer()
                    now = time.monotonic()
                    deadline = deadline if deadline is not None else now + self.reconnect_timeout
                    if now < deadline:
                        _log.warning("append to %s: %s; retrying", self._where,
                                     redact(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__)
                        time.sleep(delay)
                        delay = min(delay * 2, 1.0)
                        continue
                    if unknown:
                        for r in group:
                            r.seqs, r.error = [], self._outcome_unknown(e, [it.id for it in r.items])
                        return
                    err: EventLogError = storage_error(e, "append failed", self._where)
                elif isinstance(e, psycopg.IntegrityError):
                    self._drop_writer()
                    err = self._planted(e)
                else:
                    err = self._converted(e, "append failed")
                err.__cause__ = e
                self._fail(group, err)
                return
            except Exception as e:  # never leave a caller of this group waiting
                err2 = e if isinstance(e, EventLogError) else StorageError(f"append failed: {redact(repr(e))}")
                if err2 is not e:
                    err2.__cause__ = e
                self._fail(group, err2)
                return
            if top:
                self._wakeups.bump()
            return

    def _outcome_unknown(self, e: psycopg.Error, ids: list[str], what: str = "append",
                         hint: str | None = None) -> OutcomeUnknownError:
        text = redact(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__
        err = OutcomeUnknownError(f"{what} to {self._where}: the connection was lost after COMMIT was sent and the "
                                  f"server stayed out of reach for {self.reconnect_timeout:g} s, so whether the events "
                                  f"were stored is unknown: {text}", ids, hint=hint)
        err.__cause__ = e
        return err

    def _rules_lost(self, what: str) -> StorageError:
        return StorageError(f"{what} on {self._where} refused: the rules lock this write was checked under was lost "
                            "(its connection ended) before the write, so another host may have written meanwhile; "
                            "nothing was written", hint="retry the call: it checks its rule again")

    def _planted(self, e: psycopg.IntegrityError) -> IntegrityError:
        """A unique or check constraint failed inside the profile's lock, where eventlog's own
        writers cannot collide (ids were looked up, the head read): a row was written around
        eventlog (the profile's role used directly). Not retried: it would fail alike."""
        diag = e.diag
        where = f"{diag.table_name or 'a'} table's {diag.constraint_name or 'constraint'}"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        detail = redact(diag.message_detail or first).rstrip(".")
        return IntegrityError(f"append to {self._where} refused by the {where}: {detail}; a row was written to the "
                              "profile's tables without eventlog", hint="run `eventlog log verify` (it names the seq); "
                              "an administrator removes the rows past the head, then appends go on")

    @staticmethod
    def _fail(group: list[_Request], err: BaseException) -> None:
        for r in group:
            r.seqs, r.error = [], err

    def _write_group(self, group: list[_Request]) -> int:
        """One write transaction for ``group``; returns the new head seq (0 when nothing was written).

        Fast path (one round trip), while this handle wrote the head it last saw: the group is
        sealed on that head before the transaction, and the transaction takes the lock, checks
        that the head (and each guarded stream version) is still what was assumed, and writes.
        A check that fails, or an id already stored, aborts it (nothing written) and the group
        goes the usual way (two round trips): lock and read first, then seal and write. A retry
        after a lost connection always goes the usual way, so it looks every id up.
        """
        conn = self._writer_conn()
        small = sum(r.size for r in group) <= WRITE_CHUNK_BYTES  # a larger group is written in several statements
        fenced = any(r.fence is not None for r in group)  # the rules lock is checked with the reads
        if self._cached_head is not None and self._fast_backoff == 0 and small and not fenced:
            try:
                top = self._write_fast(conn, group, *self._cached_head)
            except (pgerr.DivisionByZero, pgerr.UniqueViolation):
                self._abort(conn)
                self._cached_head = None
                for r in group:
                    r.seqs, r.error = [], None
                self._fast_backoff = FAST_PATH_BACKOFF  # another writer is about: read first for a while
                self._phase = _BEFORE  # that transaction failed inside: nothing of it committed
            else:
                if top:
                    self._after_commit(top, 0)
                return top
        self._fast_backoff = max(0, self._fast_backoff - 1)
        top, newest_dict = self._write_slow(conn, group)
        self._after_commit(top, newest_dict)
        return top

    def _after_commit(self, top: int, newest_dict: int) -> None:
        if top:
            self.commits += 1
        if self._format == 2:
            if newest_dict > self._compression.current:  # another host trained one: use it next time
                try:
                    self._adopt_dict(newest_dict)
                except EventLogError as e:
                    # The group is committed: its callers must hear success (told otherwise, they
                    # would append it again under new ids). A later commit adopts the dictionary
                    # (second-round audit, helper-57).
                    _log.warning("%s: the compression dictionary %d another host trained is not in use yet: %s",
                                 self._where, newest_dict, e)
            elif top:
                self._maybe_train(top)

    def _seal(self, group: list[_Request], start: int, prev: str, found: dict[str, tuple[int, Any]],
              versions: dict[str, int] | None, guards: list[tuple[str, int]],
              erased: set[str] | None = None, fences: set[int] | None = None) -> tuple[int, str, list[Any]]:
        """Plan and seal ``group`` on head ``(start, prev)``: returns the new head and the rows of
        the ``write`` statement (empty when nothing is to be written). ``erased``: the guarded
        streams whose first and last events are erased (refused at any expected version)."""
        seq = start
        new: Counter[str] = Counter()
        pending: dict[str, tuple[int, bytes]] = {}
        seqs: list[int] = []
        eids: list[str] = []
        sessions: list[str | None] = []
        bodies: list[bytes] = []
        for r in group:
            for i, it in self._plan(r, found, pending, versions, new, guards, erased or set(), fences):
                seq += 1
                ts = time.time_ns()
                raw, digest = codec.seal(it, seq, ts, prev)
                if r.payloads is not None:
                    c, d, payload = r.payloads[i]
                    body = stored.pack_parts(it.type, it.v, it.session, it.id, ts, prev, digest, c, d, payload)
                else:
                    body = raw
                prev = digest
                seqs.append(seq)
                eids.append(it.id)
                sessions.append(it.session)
                bodies.append(body)
                pending[it.id] = (seq, body)
                if it.session is not None:
                    new[it.session] += 1
                r.seqs[i] = seq
        if seq == start:
            return seq, prev, []
        return seq, prev, [seqs, eids, sessions, bodies, list(new), list(new.values())]

    def _write_fast(self, conn: psycopg.Connection[Any], group: list[_Request], start: int, start_hash: str) -> int:
        guards: list[tuple[str, int]] = []
        seq, prev, rows = self._seal(group, start, start_hash, {}, None, guards)
        if not rows:
            return 0
        st = self._sql
        streams, versions = [g[0] for g in guards], [g[1] for g in guards]
        try:
            self._phase = _SENT  # the COMMIT goes out in the same pipeline
            with _pipeline(conn):  # a failed guard aborts it: its error is raised after it ended
                conn.execute("BEGIN")
                self._bound_lock_wait(conn)
                conn.execute(st.lock, st.lock_args)
                # A failed guard skips what follows it in the pipeline; psycopg (3.3) then
                # believes a statement it meant to prepare there exists (the next use of it
                # fails with "prepared statement ... does not exist"), so nothing from here
                # on is prepared.
                conn.execute(st.write_guarded, (start, start_hash, streams, versions, *rows, seq, prev),
                             prepare=False)
                conn.execute("COMMIT", prepare=False)
                conn.execute(st.notify, (self.info.channel, str(seq)), prepare=False)  # its own transaction
        except BaseException:
            if self._phase == _SENT and _aborted_inside(conn):
                self._phase = _BEFORE  # the server refused a statement before the COMMIT: nothing committed
            self._abort(conn)
            self._cached_head = None
            raise
        self._cached_head = (seq, prev)
        return seq

    def _bound_lock_wait(self, conn: psycopg.Connection[Any]) -> None:
        """Inside a write transaction, before it takes the append lock: with a lock timeout, the
        server gives up the wait after it (``LockNotAvailable``, the transaction aborted)."""
        if self.append_lock_timeout is not None:
            ms = max(1, round(self.append_lock_timeout * 1000))  # 0 would mean no timeout at all
            conn.execute(f"SET LOCAL lock_timeout = {ms}", prepare=False)

    def _busy(self, e: psycopg.Error | None, *, what: str = "its append lock", rules: bool = False,
              timeout: float | None = None) -> WriterBusyError:
        """A lock's wait ran out — the append lock's (``lock_timeout``) or, with ``rules``, the
        rules lock's (``what`` names it in the message): who holds it, as far as the server says."""
        holder, client, remedy = None, "", ""
        try:
            with self._pool.conn() as c:
                row = c.execute(self._sql.lock_holder, self._sql.rules_args if rules else self._sql.lock_args).fetchone()
                if row:
                    holder = int(row[0])
                    client, remedy = holder_text(row[1], row[2])
        except psycopg.Error:
            pass
        who = f", held by server process {holder}{' ' + client if client else ''}" if holder is not None else ""
        waited = float(timeout if timeout is not None else self.append_lock_timeout or 0)
        err = WriterBusyError(f"{self._where} ({what}{who})", None, waited)
        err.hint = ("retry once that session's write is done" + (f"; {remedy}" if remedy else "") +
                    f"; or end it on the server (SELECT pg_terminate_backend({holder}); a server process that is "
                    f"itself stopped ends only once resumed: `kill -CONT {holder}` on the server's host)"
                    if holder is not None else "retry once that session's write is done")
        err.__cause__ = e
        return err

    def _write_slow(self, conn: psycopg.Connection[Any], group: list[_Request]) -> tuple[int, int]:
        """Returns the new head seq (0: nothing written) and the newest dictionary id stored."""
        st = self._sql
        ids = [it.id for r in group for it in r.items]
        guarded = sorted({str(r.items[0].session) for r in group if r.expected is not None})
        top = 0
        # Two round trips: BEGIN + lock + reads in the first sync, writes + COMMIT in the second.
        try:
            with _pipeline(conn) as pipe:  # an error is raised after the pipeline ended
                conn.execute("BEGIN")
                self._bound_lock_wait(conn)
                conn.execute(st.lock, st.lock_args)
                head_cur = conn.execute(st.head_and_dict)
                ids_cur = conn.execute(st.find_ids, (ids,), binary=True)
                ver_cur = conn.execute(st.versions, (guarded,)) if guarded else None
                pids = sorted({r.fence for r in group if r.fence is not None})
                fence_cur = conn.execute(st.rules_held, (*st.rules_args, pids)) if pids else None
                pipe.sync()
                head = head_cur.fetchone()
                self._phase = _LOOKED_UP
                if head is None:
                    raise IntegrityError(f"the head row of {self._where} is missing", hint="restore the profile's schema")
                found = {str(i): (int(s), body) for i, s, body in ids_cur.fetchall()}
                counted = ver_cur.fetchall() if ver_cur else []
                versions: dict[str, int] = {str(k): int(v) for k, v, _ in counted}
                erased = {str(k) for k, _, gone in counted if gone}
                fences = {int(p) for (p,) in fence_cur.fetchall()} if fence_cur else set()
                start, newest_dict = int(head[0]), int(head[2] or 0)
                seq, prev, rows = self._seal(group, start, str(head[1]), found, versions, [], erased, fences)
                if rows:
                    self._write_rows(conn, rows, seq, prev)
                    self._phase = _SENT
                    conn.execute("COMMIT")
                    conn.execute(st.notify, (self.info.channel, str(seq)))  # its own transaction, after the commit
                    top = seq
                else:
                    conn.execute("ROLLBACK")  # refusals and replays write nothing, not even the head
        except BaseException:
            if self._phase == _SENT and _aborted_inside(conn):
                self._phase = _LOOKED_UP  # the ids were looked up and this transaction did not commit
            self._abort(conn)
            self._cached_head = None
            raise
        self._cached_head = (seq, prev)
        return top, newest_dict

    def _write_rows(self, conn: psycopg.Connection[Any], rows: list[Any], seq: int, prev: str) -> None:
        """The ``write`` statement for ``rows`` (events, then stream versions) and the new head;
        events past :data:`WRITE_CHUNK_BYTES` go first in INSERTs of their own, in the same
        transaction (one statement's parameters may not pass 1 GB, and are sent as hex text)."""
        seqs, eids, sessions, bodies, streams, counts = rows
        start = size = 0
        for i, body in enumerate(bodies):
            if i > start and size + len(body) > WRITE_CHUNK_BYTES:
                conn.execute(self._sql.insert_events, (seqs[start:i], eids[start:i], sessions[start:i], bodies[start:i]))
                start, size = i, 0
            size += len(body)
        conn.execute(self._sql.write, (seqs[start:], eids[start:], sessions[start:], bodies[start:], streams, counts,
                                       seq, prev))

    @staticmethod
    def _abort(conn: psycopg.Connection[Any]) -> None:
        """Roll back whatever transaction a failed write left open (a broken connection is dropped)."""
        if conn.closed or conn.broken:
            return
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            _quiet_close(conn)

    def _plan(self, r: _Request, found: dict[str, tuple[int, Any]], pending: dict[str, tuple[int, bytes]],
              versions: dict[str, int] | None, new: Counter[str],
              guards: list[tuple[str, int]], erased: set[str],
              fences: set[int] | None = None) -> list[tuple[int, codec.Prepared]]:
        """What of request ``r`` to write, as ``(input index, event)``; sets ``r.seqs`` (stored
        seqs filled in for ids already in the log, or written earlier in this group) or ``r.error``.
        ``versions`` None (the fast path): an ``expected_version`` is taken as right and becomes
        a guard ``(stream, version it must have before this group)`` the transaction checks.
        ``fences``: the server pids found holding the rules lock (a request made inside it whose
        holder is not among them is refused: its rule was checked under a lock since lost)."""
        r.seqs = [0] * len(r.items)
        fresh: list[tuple[int, codec.Prepared]] = []
        for i, it in enumerate(r.items):
            hit = found.get(it.id)
            if hit is None:
                mine = pending.get(it.id)
                hit = None if mine is None else (mine[0], mine[1])
            if hit is None:
                fresh.append((i, it))
                continue
            if not it.same_content(self._envelope(hit[0], hit[1])):
                r.seqs, r.error = [], DuplicateEventError(it.id, hit[0])
                return []
            r.seqs[i] = hit[0]
        if fresh and r.fence is not None and fences is not None and r.fence not in fences:
            r.seqs, r.error = [], self._rules_lost("append")
            return []
        if fresh and r.expected is not None:
            stream = str(r.items[0].session)
            if versions is None:
                guards.append((stream, r.expected - new[stream]))
                return fresh
            actual = versions.get(stream, 0) + new[stream]  # earlier requests of this group count
            if actual != r.expected or stream in erased:
                r.seqs, r.error = [], ConcurrencyError(stream, r.expected, actual)
                return []
        return fresh

    def erase(self, seqs: Sequence[int], data: dict[str, Any], *, streams: Sequence[str] = ()) -> int:
        """Replace the events at ``seqs`` by their stubs and append the ``log.erased`` record
        naming them, in one transaction under the profile's lock (see
        :meth:`eventlog.log.Log.erase`); returns the record's seq, 0 when all were erased already.

        The role may not UPDATE events: the stubs go in through the profile's SECURITY DEFINER
        function ``erase_events``, which accepts them only beside the record this transaction
        appended. The old row versions stay in the table's dead tuples, the server's WAL and its
        backups until the server reclaims them (``VACUUM FULL`` on the events table and a
        checkpoint, by the database owner): that part of an erasure is the administrator's."""
        self._check_open()
        wanted = check_erase_seqs(seqs)
        names = [str_arg(x, "streams") for x in streams]
        if self._format != 2:
            raise StorageError("erasing needs a format-2 log", hint="copy the log into a new profile to migrate it")
        with self._write_mutex:
            deadline: float | None = None
            delay, sent = 0.05, 0  # sent: the seq of a record whose COMMIT went out (lost or not)
            while True:
                self._check_open()
                self._cached_head = None
                try:
                    seq = self._erase_once(wanted, data, sent, names)
                    break
                except _Sent as s:
                    sent = s.seq
                    e = s.error
                except psycopg.Error as err:
                    e = err
                if isinstance(e, pgerr.UndefinedFunction):
                    raise StorageError("this profile's schema predates erasing on PostgreSQL",
                                       hint="open the log once with the administrator URL that created it "
                                            "(it adds the erase_events function)") from e
                self._drop_writer()
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.reconnect_timeout
                if not _lost(e):
                    raise self._converted(e, "erase failed") from e
                if now >= deadline and sent:
                    raise OutcomeUnknownError(
                        f"erase on {self._where}: the connection was lost after COMMIT was sent and the server stayed "
                        f"out of reach for {self.reconnect_timeout:g} s, so whether the erase was stored is unknown",
                        hint="call erase again with the same seqs once the server is back: events already erased are "
                             "skipped (it returns 0 when every one is)") from e
                if now >= deadline:
                    raise storage_error(e, "erase failed", self._where) from e
                _log.warning("erase on %s: %s; retrying", self._where,
                             redact(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        if seq:
            self._wakeups.bump()
        return seq

    def _erase_once(self, wanted: list[int], data: dict[str, Any], sent: int, streams: Sequence[str] = ()) -> int:
        """One try of :meth:`erase`. ``sent``: the record seq of an earlier try whose COMMIT
        went out before the connection was lost: when nothing is left to erase now and that
        record is in the log, that try committed and its seq is the answer."""
        conn = self._writer_conn()
        seq = 0
        try:
            with conn.transaction():
                conn.execute(self._sql.lock, self._sql.lock_args)
                row = conn.execute(self._sql.head).fetchone()
                assert row is not None
                start, prev = int(row[0]), str(row[1])
                if streams:  # read under the profile's lock: nothing appended since is left out
                    wanted = sorted(set(wanted).union(int(q) for (q,) in conn.execute(self._sql.stream_seqs,
                                                                                     (list(streams),))))
                rows = {int(q): bytes(b) for q, b in conn.execute(self._sql.erase_rows, (wanted,), binary=True)}
                envs = erasable(wanted, lambda q: self._envelope(q, rows[q]) if q in rows else None)
                listed: list[list[Any]] = [[env["seq"], env["hash"]] for env in envs]
                stubs = [stored.pack_stub(codec.stub(env)) for env in envs]
                if not listed:
                    raise psycopg.Rollback()
                fence = getattr(self._rules, "pid", None)  # an erase_session, inside the rules lock
                if fence is not None and not conn.execute(self._sql.rules_held, (*self._sql.rules_args,
                                                                                  [fence])).fetchone():
                    raise self._rules_lost("erase")
                p = codec.prepare(erase_event(listed, data), log_type=True)
                seq, ts = start + 1, time.time_ns()
                _raw, digest = codec.seal(p, seq, ts, prev)
                # Stored as it is (not compressed): erase_events reads which events it names.
                body = stored.pack_parts(p.type, p.v, p.session, p.id, ts, prev, digest, stored.CODEC_RAW, 0,
                                         p.data_bytes)
                conn.execute(self._sql.write, ([seq], [p.id], [None], [body], [], [], seq, digest))
                conn.execute(self._sql.erase, ([q for q, _ in listed], stubs))
                conn.execute(self._sql.set_erase_mark, (ERASE_MARK_KEY, seq))
                sent = seq  # leaving the block sends the COMMIT
        except psycopg.Error as e:
            if sent:
                raise _Sent(sent, e) from e
            raise
        if not listed:
            if sent:  # an earlier try's COMMIT arrived: its record is the erase
                found = self.get(sent)
                return sent if found is not None and found.get("type") == codec.ERASED_TYPE else 0
            return 0
        try:
            conn.execute(self._sql.notify, (self.info.channel, str(seq)))
        except psycopg.Error:
            self._drop_writer()  # committed: followers also poll, so a lost notice only delays them
        return seq

    def append_sealed(self, raws: Sequence[bytes]) -> int:
        """Append already-sealed events verbatim (they must continue this log's chain exactly:
        seq head + 1, prev the head hash, hash recomputing, id new); all or nothing, raising
        :class:`IntegrityError` naming the first that does not fit. Returns how many were written.
        A whole export goes in one call: one transaction, written :data:`SEALED_CHUNK` events a
        statement (the decoded envelopes of one chunk at a time)."""
        self._check_open()
        batch = raws  # iterated (again on a retry), SEALED_CHUNK at a time: a lazy sequence stays lazy
        if not len(batch):
            return 0
        deadline: float | None = None
        end: tuple[int, str] | None = None  # the head a lost COMMIT would have left
        end_stubbed = 0  # what the attempt that sent that COMMIT stubbed
        counted = False
        with self._write_mutex:
            self._cached_head = None
            while True:
                self._check_open()
                try:
                    conn = self._writer_conn()
                    self._stubbing = 0
                    with conn.transaction():
                        conn.execute(self._sql.lock, self._sql.lock_args)
                        row = conn.execute(self._sql.head).fetchone()
                        assert row is not None
                        head = (int(row[0]), str(row[1]))
                        if end is not None and head == end:
                            self._stubbing = end_stubbed
                            raise psycopg.Rollback()  # the lost COMMIT did store them
                        end = None  # it did not (or none was sent)
                        at = head
                        events = iter(batch)
                        while chunk := [bytes(r) for r in itertools.islice(events, SEALED_CHUNK)]:
                            at = self._write_sealed(conn, chunk, *at)  # one transaction, in bounded statements
                        end, end_stubbed = at, self._stubbing
                    # Counted once: a retry after a lost connection (before its head check, or at
                    # the NOTIFY below) must neither forget nor repeat what the commit stubbed.
                    if not counted:
                        self.stubbed += self._stubbing
                        counted = True
                    conn.execute(self._sql.notify, (self.info.channel, str(end[0])))
                    break
                except psycopg.Error as e:
                    if not _lost(e):
                        raise self._converted(e, "import failed") from e
                    self._drop_writer()
                    now = time.monotonic()
                    deadline = deadline if deadline is not None else now + self.reconnect_timeout
                    if now >= deadline and end is not None:
                        ids = [str(codec.decode(raw).get("id")) for raw in batch]
                        raise self._outcome_unknown(e, ids, "import", hint="once the server is back, read the log's "
                                                    "head: it ends either before these events or with them "
                                                    "(`eventlog log copy` run again resumes after what it holds)") from e
                    if now >= deadline:
                        raise storage_error(e, "import failed", self._where) from e
                    time.sleep(0.1)
        self._wakeups.bump()
        return len(batch)

    def _write_sealed(self, conn: psycopg.Connection[Any], batch: list[bytes], seq: int, prev: str) -> tuple[int, str]:
        seqs: list[int] = []
        eids: list[str] = []
        sessions: list[str | None] = []
        new: Counter[str] = Counter()
        envs: list[dict[str, Any]] = []
        seen: set[str] = set()  # a whole export goes in one call: a list's lookups would be quadratic
        for raw in batch:
            env = check_sealed(raw, seq + 1, prev)
            seq += 1
            eid, session = env["id"], env.get("session")
            if eid in seen:
                raise IntegrityError(f"imported event {seq} has an already used id {eid!r}")
            seen.add(eid)
            seqs.append(seq)
            eids.append(eid)
            envs.append(env)
            sessions.append(session)
            if session is not None:
                new[session] += 1
            prev = str(env["hash"])
        taken = conn.execute(self._sql.find_ids, (eids,)).fetchone()
        if taken is not None:
            raise IntegrityError(f"imported event {seqs[eids.index(str(taken[0]))]} has an already used id {taken[0]!r}")
        if self._format != 2:
            self._write_rows(conn, [seqs, eids, sessions, batch, list(new), list(new.values())], seq, prev)
            self._unstubbed_format1(conn, [env for env in envs if env.get("type") == codec.ERASED_TYPE])
            return seq, prev
        bodies = [self._pack_imported(q, env, raw) for q, env, raw in zip(seqs, envs, batch)]
        # An imported log.erased record ends a statement of its own, so that it is the head this
        # transaction wrote when erase_events is asked to stub what it names (_stub_named).
        ends = [i + 1 for i, env in enumerate(envs) if env.get("type") == codec.ERASED_TYPE]
        start = 0
        for end in ends if ends and ends[-1] == len(envs) else [*ends, len(envs)]:
            part: Counter[str] = Counter(x for x in sessions[start:end] if x is not None)
            self._write_rows(conn, [seqs[start:end], eids[start:end], sessions[start:end], bodies[start:end],
                                    list(part), list(part.values())], seqs[end - 1], str(envs[end - 1]["hash"]))
            if end in ends:
                self._stub_named(conn, envs[end - 1], bodies[end - 1])
                conn.execute(self._sql.set_erase_mark, (ERASE_MARK_KEY, seqs[end - 1]))
            start = end
        return seq, prev

    def _unstubbed_format1(self, conn: psycopg.Connection[Any], records: list[dict[str, Any]]) -> None:
        """A format-1 log cannot be erased (its rows are not what ``erase_events`` stubs): imported
        ``log.erased`` records that name events it holds whole leave them so, and say it, as a
        record the function refuses does (it said nothing: the words stayed silently)."""
        envs = self._held_whole(conn, records)
        if envs:
            _log.warning("import into %s: erase records name events this format-1 log holds whole (%d); they "
                         "stay whole (a format-1 log cannot be erased): copy the log into a new profile with "
                         "`eventlog log copy` and erase the sessions there", self._where, len(envs))

    def _held_whole(self, conn: psycopg.Connection[Any], records: list[dict[str, Any]], *,
                    only_format2: bool = False) -> list[dict[str, Any]]:
        """The events the ``log.erased`` ``records`` name that this log holds whole
        (:func:`named_unerased`), read in one statement; ``only_format2``: of those stored in
        format 2."""
        wanted = sorted({q for r in records for q, _ in erased_pairs(r)})
        if not wanted:
            return []
        rows = {int(q): bytes(b) for q, b in conn.execute(self._sql.erase_rows, (wanted,), binary=True)
                if not only_format2 or bytes(b)[:1] == b"\x02"}
        return named_unerased(records, lambda q: self._envelope(q, rows[q]) if q in rows else None)

    def _pack_imported(self, seq: int, env: dict[str, Any], raw: bytes) -> bytes:
        """:func:`stored.pack_sealed`, but a ``log.erased`` record keeps its data as it is, as an
        erase stores it: ``erase_events`` reads from it which events it names."""
        if env.get("type") == codec.ERASED_TYPE and not codec.is_stub(env):
            try:
                value = stored.pack_parts(env["type"], env["v"], env["session"], env["id"], env["ts"], env["prev"],
                                          env["hash"], stored.CODEC_RAW, 0, codec.canonical(env["data"]))
                if stored.canonical_bytes(seq, value, self._compression) == bytes(raw):
                    return value
            except (KeyError, TypeError, ValueError, OverflowError, UnicodeError):
                pass
        return stored.pack_sealed(seq, env, raw, self._compression)

    def _stub_named(self, conn: psycopg.Connection[Any], record: dict[str, Any], body: bytes) -> None:
        """After an imported ``log.erased`` record (the head this transaction just wrote), replace
        by their stubs the events it names that this log held whole — a mirror refreshed by
        ``eventlog log copy`` or ``import`` after an erase at its source kept their words (outside
        audit, helper-74) — through ``erase_events``, as an erase does. A record the function
        cannot take (one not stored as an erase stores it, a session on it) stubs nothing: the
        import goes on, and the events stay as they were (inside a savepoint)."""
        if body[:1] != b"\x02":
            return
        # a first-format value in a format-2 log is not erase_events'
        envs = self._held_whole(conn, [record], only_format2=True)
        if not envs:
            return
        try:
            with conn.transaction():  # a savepoint
                conn.execute(self._sql.erase, ([env["seq"] for env in envs],
                                               [stored.pack_stub(codec.stub(env)) for env in envs]))
        except psycopg.Error as e:
            if _lost(e):
                raise
            _log.warning("import into %s: the erase record at seq %s could not stub the events it names (%s); they "
                         "stay whole: erase the sessions on this log too", self._where, record.get("seq"),
                         redact(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__)
            return
        self._stubbing += len(envs)

    # ---------------------------------------------------------------- stored values (formats 1 and 2)

    def _envelope(self, seq: int, body: bytes) -> dict[str, Any]:
        try:
            return stored.envelope(seq, bytes(body), self._compression)
        except ValueError as e:
            raise IntegrityError(f"event {seq} of {self._where} is damaged: {e}",
                                 hint="run `eventlog log verify`; restore the log from a backup or an export") from e

    def _canonical(self, seq: int, body: bytes) -> bytes:
        """Canonical bytes of a stored value; an undecodable one is passed through as stored,
        so that the chain check names it (it is not canonical JSON)."""
        value = bytes(body)
        try:
            return stored.canonical_bytes(seq, value, self._compression)
        except ValueError:
            return value

    def _load_dict(self, dict_id: int) -> bytes | None:
        row = self._retrying("cannot read the log's compression dictionary",
                             lambda c: c.execute(self._sql.get_dict, (dict_id,), binary=True).fetchone())
        return None if row is None else bytes(row[0])

    def _adopt_dict(self, dict_id: int) -> None:
        raw = self._load_dict(dict_id)
        if raw is not None and dict_id > self._compression.current:
            self._compression.use(dict_id, raw)

    def train_dictionary(self, samples: int = DICT_SAMPLES) -> int:
        """Train the profile's zstd dictionary on the data of its last ``samples`` events (once:
        the first host to store one wins, every host then uses it); returns the id in use (0 when
        there is too little to learn from)."""

        if self._format != 2:
            return 0  # format 1 stores the canonical bytes as they are
        head = self.head()[0]
        trained = stored.train([codec.canonical(env["data"]) for env in self.read(max(1, head - samples + 1))
                                if "data" in env])
        if trained is None:
            return 0
        self._retrying("cannot store the compression dictionary", lambda c: c.execute(self._sql.add_dict, (1, trained)))
        self._adopt_dict(1)
        return self._compression.current

    def _maybe_train(self, head: int) -> None:
        """Train a dictionary in the background once a format-2 log without one holds
        DICT_TRAIN_AFTER events (one attempt per threshold, doubled after a failure)."""
        if self._compression.current or head < self._train_after or self._training or self._closed:
            return
        self._training = True

        def train() -> None:
            try:
                if not self.train_dictionary():
                    self._train_after *= 2
            except EventLogError as e:
                self._train_after *= 2
                if not self._closed:
                    _log.warning("training the compression dictionary of %s failed: %s", self._where, e)
            finally:
                self._training = False

        threading.Thread(target=train, name="eventlog-pg-train-dict", daemon=True).start()

    # ---------------------------------------------------------------- follow

    def _wait_appended(self, seconds: float) -> None:
        self._wakeups.wait(self._wakeups.current(), seconds)

    def follow(self, from_seq: int = 1, timeout: float | None = None, *,
               poll: float = FOLLOW_POLL_S) -> Iterator[dict[str, Any]]:
        """Yield envelopes from ``from_seq`` on, waiting for new ones as they land anywhere.

        Woken by this process's commits and by NOTIFY from other hosts; while the LISTEN
        connection is down, re-reads every ``poll`` seconds. Rides out server restarts (reads
        reconnect). Stops after ``timeout`` seconds without a new event, or when the log closes;
        raises :class:`ProfileGoneError` when the profile was removed from the server.
        """
        nxt = max(1, seq_arg(from_seq, "from_seq"))
        wk = self._wakeups
        wk.ensure_listener()
        idle_since = time.monotonic()
        while not self._closed:
            gen = wk.current()
            got = False
            try:
                for env in self.read(nxt):
                    got = True
                    nxt = env["seq"] + 1
                    yield env
            except ClosedError:
                return
            except ProfileGoneError:  # for good: it was warned about every second, and followed forever
                raise
            except StorageError as e:  # the server is away for longer than reconnect_timeout
                if self._closed:
                    return
                _log.warning("follow %s: %s; still trying", self._where, e)
            now = time.monotonic()
            if got:
                idle_since = now
                continue
            if timeout is not None and now - idle_since >= timeout:
                return
            wait = LISTEN_FALLBACK_POLL_S if wk.listening else poll
            if timeout is not None:
                wait = min(wait, max(0.0, timeout - (now - idle_since)))
            wk.wait(gen, wait)

    # ---------------------------------------------------------------- reads

    @contextmanager
    def rules_lock(self, timeout: float) -> Iterator[None]:
        """Hold the profile's rules lock on the server — what a domain rule's check and its
        append take together (:meth:`SessionStore._ruled`), so that hosts sharing this log
        serialize them as one host's processes do with a lock file. Waits at most ``timeout``
        seconds for another holder, then :class:`WriterBusyError`; connections lost meanwhile are
        replaced (within ``reconnect_timeout``, then :class:`StorageError`).

        A transaction-scoped advisory lock, held by a transaction left open on a connection of
        its own: a holder that stops (SIGSTOP, a debugger) or vanishes from the network is ended
        by the server after ``idle_in_transaction_session_timeout`` (60 s), which frees the lock,
        whatever still answers for the host's TCP stack (its kernel, a proxy, a NAT). A session
        lock on an idle connection stayed held until TCP keepalives gave up (about 2 h by default).

        A lock that is lost while held (its connection cut, or ended by that timeout) must not let
        two hosts act on one rule: this thread's appends inside it are checked, in their write
        transaction, to come from a holder that still has it (else refused, nothing written);
        and a new holder first waits for the appends in flight (the profile's append lock, shared
        for an instant), so it sees every write checked under an earlier holder."""
        self._check_open()
        try_lock = "SELECT pg_try_advisory_xact_lock(%d, %d)" % (LOCK_NAMESPACE + 1, self.info.id)
        # Waits in the lock's queue (a try, polled, could starve behind back-to-back appends).
        in_flight = ("SELECT pg_advisory_lock_shared(%d, %d); SELECT pg_advisory_unlock_shared(%d, %d)"
                     % ((LOCK_NAMESPACE, self.info.id) * 2))
        deadline = time.monotonic() + timeout
        lost_until: float | None = None
        delay = 0.002
        conn: psycopg.Connection[Any] | None = None
        while conn is None:
            self._check_open()
            c: psycopg.Connection[Any] | None = None
            try:
                c = self._pool.take()
                cur = c.execute("BEGIN; " + try_lock)  # one round trip
                cur.nextset()
                while not (row := cur.fetchone()) or not row[0]:  # held elsewhere: try again in this transaction
                    if time.monotonic() >= deadline:
                        c.execute("ROLLBACK")
                        self._pool.give(c, True)
                        c = None
                        raise self._busy(None, what="its rules lock", rules=True, timeout=timeout)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
                    cur = c.execute(try_lock)
                wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
                c.execute(f"SET LOCAL lock_timeout = {wait_ms}; {in_flight}; SET LOCAL lock_timeout = 0")
                conn = c
            except psycopg.Error as e:
                if c is not None:
                    self._pool.give(c, False)
                if isinstance(e, pgerr.LockNotAvailable):  # appends in flight past the timeout
                    raise self._busy(e, what="its rules lock, waiting for an append in flight under its append lock",
                                     timeout=timeout) from e
                if not _lost(e):
                    raise self._converted(e, "the rules lock failed") from e
                now = time.monotonic()
                lost_until = lost_until if lost_until is not None else now + self.reconnect_timeout
                if now >= lost_until:
                    raise storage_error(e, "the rules lock failed", self._where) from e
                time.sleep(min(delay, 0.05))
                delay = min(delay * 2, 1.0)
        ok = False
        outer = getattr(self._rules, "pid", None)
        self._rules.pid = conn.info.backend_pid
        done = threading.Event()
        held = conn

        def beat() -> None:
            # A holder that runs longer than the server's idle timeout (an erase of a large lineage)
            # keeps its lock: its writes would be refused once the server ended the session. A
            # stopped or vanished holder's beats stop too, and the server frees the lock as before.
            while not done.wait(IDLE_IN_TRANSACTION_S / 3):
                try:
                    held.execute("SELECT 1")
                except psycopg.Error:
                    return  # the session is gone: the holder's writes are refused

        beater = threading.Thread(target=beat, name="eventlog-pg-rules-beat", daemon=True)
        beater.start()
        try:
            yield
            ok = True
        finally:
            self._rules.pid = outer
            done.set()
            beater.join()
            try:
                conn.execute("COMMIT" if ok else "ROLLBACK")  # either frees the lock
                self._pool.give(conn, True)
            except psycopg.Error as e:  # the session is gone, and its lock with it
                self._pool.give(conn, False)
                if ok:
                    _log.warning("releasing the rules lock of %s: %s (the server freed it with the session)",
                                 self._where, redact(str(e).strip().splitlines()[0]) if str(e).strip() else e)

    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last event; ``(0, 64 zeros)`` for an empty log."""
        row = self._retrying("cannot read the head", lambda c: c.execute(self._sql.head).fetchone())
        if row is None:
            raise IntegrityError(f"the head row of {self._where} is missing", hint="restore the profile's schema")
        return int(row[0]), str(row[1])

    def get(self, seq: int) -> dict[str, Any] | None:
        """The envelope at ``seq``, or None."""
        seq_arg(seq, "seq")
        row = self._retrying("cannot read the log", lambda c: c.execute(self._sql.get, (seq,), binary=True).fetchone())
        return None if row is None else self._envelope(seq, row[0])

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        """Envelopes with ``from_seq <= seq <= to_seq`` in seq order (``raw=True``: ``(seq, bytes)``),
        fetched :data:`READ_CHUNK` at a time (a connection is never held between chunks)."""
        self._check_open()
        nxt = max(1, seq_arg(from_seq, "from_seq"))
        seq_arg(to_seq, "to_seq", optional=True)
        args: tuple[int, ...]
        while True:
            if to_seq is not None and nxt > to_seq:
                return
            if to_seq is None:
                q, args = self._sql.read, (nxt, READ_CHUNK)
            else:
                q, args = self._sql.read_to, (nxt, to_seq, READ_CHUNK)
            rows = self._retrying("cannot read the log", lambda c: c.execute(q, args, binary=True).fetchall())
            for s, body in rows:
                yield (int(s), self._canonical(int(s), body)) if raw else self._envelope(int(s), body)
            if len(rows) < READ_CHUNK:
                return
            nxt = int(rows[-1][0]) + 1

    def read_session(self, session_id: str, *, after: int = 0) -> Iterator[dict[str, Any]]:
        """The envelopes of one session stream with ``seq > after``, in seq order."""
        self._check_open()
        session = str_arg(session_id, "session_id")
        after = max(0, seq_arg(after, "after"))
        while True:
            rows = self._retrying("cannot read the log", lambda c: c.execute(
                self._sql.session, (session, after, READ_CHUNK), binary=True).fetchall())
            for s, body in rows:
                yield self._envelope(int(s), body)
            if len(rows) < READ_CHUNK:
                return
            after = int(rows[-1][0])

    def stream_version(self, session: str) -> int:
        """How many events the session stream holds (0 when unknown)."""
        str_arg(session, "session")
        row = self._retrying("cannot read the log", lambda c: c.execute(self._sql.version, (session,)).fetchone())
        return 0 if row is None else int(row[0])

    def erase_mark(self) -> int:
        """The seq of the last ``log.erased`` record (0: none; a record written by a release
        before this one is not counted), as :meth:`eventlog.log.lmdb.EventLog.erase_mark`: every
        erase and every import that brings such a record moves it, in the same transaction. An
        erase changes no stream's version, so a cache of another host that trusts one compares
        this too (the adapters' histories and checkpoint copies); one index lookup."""
        row = self._retrying("cannot read the log", lambda c: c.execute(self._sql.version, (ERASE_MARK_KEY,)).fetchone())
        return 0 if row is None else int(row[0])

    def stream_state(self, session: str) -> tuple[int, int]:
        """``(stream_version(session), erase_mark())`` from one statement: an adapter's read
        asks both, and on a server each is a round trip."""
        str_arg(session, "session")
        rows = self._retrying("cannot read the log",
                              lambda c: c.execute(self._sql.stream_state, (session, ERASE_MARK_KEY)).fetchall())
        got = {str(k): int(v) for k, v in rows}
        return got.get(session, 0), got.get(ERASE_MARK_KEY, 0)

    def event_seq(self, event_id: str) -> int | None:
        """The seq of the event with this id, or None."""
        str_arg(event_id, "event_id")
        row = self._retrying("cannot read the log", lambda c: c.execute(self._sql.event_seq, (event_id,)).fetchone())
        return None if row is None else int(row[0])

    def verify(self) -> VerifyResult:
        """Recompute the whole chain from one consistent snapshot (REPEATABLE READ, streamed by a
        server-side cursor), so appends by other hosts meanwhile do not look like damage."""
        self._check_open()

        def run(conn: psycopg.Connection[Any]) -> VerifyResult:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                row = conn.execute(self._sql.head).fetchone()
                head = (0, codec.ZERO_HASH) if row is None else (int(row[0]), str(row[1]))
                with conn.cursor(name="eventlog_verify", binary=True) as cur:
                    cur.itersize = READ_CHUNK
                    cur.execute(self._sql.read_all)
                    events = ((int(s), self._canonical(int(s), b)) for s, b in cur)
                    return verify_chain(events, lambda: head)

        res = self._retrying("cannot verify the log", run)
        return res.name_unerased(self.get) if res.unerased_named else res

    def size_bytes(self) -> int:
        """Bytes the profile's tables and indexes use on the server."""
        row = self._retrying("cannot read the log size",
                             lambda c: c.execute(self._sql.size, (self.info.schema,)).fetchone())
        return 0 if row is None else int(row[0])

    def __repr__(self) -> str:
        return f"PostgresLog({redact(self.url)!r}, profile={self.profile!r}, durability={self.durability!r})"


__all__ = ["DURABILITIES", "PostgresLog"]

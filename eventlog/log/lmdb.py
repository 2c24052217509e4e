"""The per-profile event log on LMDB: append, read, follow, verify.

Named databases in one LMDB environment:

``events``   8-byte big-endian seq -> canonical envelope bytes (``put(append=True)``, checked)
``ids``      event id -> seq (idempotency: a retried id returns its original seq), for every
             event whose id is not derived from its own seq: an event appended without an id
             gets ``codec.derived_id(ts, seq)`` and is found at that seq (no row: one B-tree
             write fewer per event)
``streams``  session id -> its seqs (dupsort, fixed 8-byte values; the count is the stream version)
``meta``     ``format``, ``profile``, ``head`` (seq + raw sha256 of the last event),
             ``idclaim`` (the highest seq a caller-chosen id of the derived form named before
             that seq was written: derived ids up to it are looked up before use)

Every table is written in the same write transaction as the events it describes, so they can
never disagree. Appends from many threads of one process share write transactions (group
commit): one leader thread commits everything queued, one sync serves all of them, and each
caller returns only once its own events are durable. Appends from several processes are
serialized by LMDB's write lock, taken after a flock on ``writer.lock`` that can time out (a
process stopped mid-write is named in :class:`~eventlog.errors.WriterBusyError` instead of
hanging the next writer). Nothing here ever rewrites or deletes an event.

Opening never needs the writer: an existing log is opened read-only and made writable at this
process's first write, so readers keep working past a writer stopped inside its transaction.
All handles opened on one log in one process share one environment (py-lmdb allows one).
"""
from __future__ import annotations

import errno
import fcntl
import os
import random
import struct
import sys
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
    EarlierProcessError,
    EventLogError,
    ForkedEnvironmentError,
    HeadMovedError,
    IntegrityError,
    PermissionDeniedError,
    StorageError,
    ValidationError,
    WriterBusyError,
    process_state,
)
from eventlog.log import codec, residency, stored
from eventlog.log import damage as log_damage
from eventlog.log.base import (
    LogBase,
    VerifyResult,
    check_erase_seqs,
    check_sealed,
    erasable,
    erase_event,
    interrupted,
    named_unerased,
    prepare_batch,
    seq_arg,
    str_arg,
    verify_chain,
)
from eventlog.log.filesystem import refuse_network
from eventlog.log.stored import FORMAT_1, FORMAT_2
from eventlog.profiles import (
    FILE_MODE,
    GENERATION_RE,
    access_problem,
    denied,
    flock_holder,
    flock_until,
    fsync_dir,
    fsync_file,
    give_owner_access,
    hand_over,
    make_dir,
    open_private,
    path_text,
    restrict_file,
    soft_limit,
)

FORMAT_VERSION = FORMAT_2
"""The format new logs are written in (see :mod:`eventlog.log.stored`); a log keeps its format."""
FORMATS = (FORMAT_1, FORMAT_2)
DICT_TRAIN_AFTER = 2000
"""A format-2 log trains its compression dictionary once it holds this many events."""
DICT_SAMPLES = 2000
DEFAULT_MAP_SIZE = 32 * 1024**3
"""Address space reserved up front (the file is sparse); doubled on MapFullError."""
READ_CHUNK = 1024
"""Events per read transaction in long scans: a long-lived reader pins freed pages."""
READ_CHUNK_BYTES = 4 << 20
"""A scan's read transaction also ends once its chunk holds this many bytes (at least one event)."""
RELEASE_EVERY_BYTES = 8 << 20
"""A scan hands the log pages it read back to the page cache after this many bytes (see
:mod:`eventlog.log.residency`): a rebuild of a 2 GB log stays a few dozen MB resident."""
DEFAULT_LOCK_TIMEOUT_S = 10.0
"""How long an append waits for another process's write to finish before WriterBusyError."""
READER_SWEEP_S = 1.0
"""How often a process that reads clears reader slots left by dead processes."""
OPEN_MOVED_RETRIES = 20
"""How many times an open follows ``current`` to a newer generation when the one it named was
retired under it (each time means another whole compaction finished meanwhile)."""
RETIRE_AWARE_LOCK = "dictionaries.lock"
"""In the log directory: every process of this version with the log open holds a shared flock on
it. A compression dictionary is only retired (dropped after re-encoding) when every process with
the log open holds it: a process of an earlier version could still append events compressed with
the retired dictionary, which nothing could then read."""
_DICT_RANGE = struct.Struct(">QQ")
"""``zdict:<id>:range``: the first and last seq of the events a dictionary was trained on."""
DICT_TOP = b"zdict_top"
"""In ``meta``: the highest dictionary id ever given (a retired dictionary's row is dropped by the
compaction that retires it, and its id must never name other bytes: a process that knew the old
dictionary would compress and read with it). Logs without the row count their ``zdict:<id>`` rows."""
COMMIT_DELAY_S = 0.0004
"""How long a leader waits for concurrent callers to queue before it commits (see _gather)."""
GROUP_MAX_EVENTS = 20_000
GROUP_MAX_BYTES = 64 * 1024 * 1024
DURABILITIES = ("sync", "nosync")

_SEQ = 8
_Thread = threading.Thread
"""Bound at import: an embedding runtime's tests may monkeypatch ``threading.Thread`` (Hermes'
run thread targets inline that way), which must not turn the reader sweep into an endless call."""
_live_logs: "weakref.WeakSet[_Environment]" = weakref.WeakSet()
ERASE_PENDING = b"erase:pending"
"""Meta key: the seq of an erase whose compaction and projection purge are not known done."""


def _mark_forked() -> None:
    for log in list(_live_logs):
        log._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def seq_key(seq: int) -> bytes:
    return seq.to_bytes(_SEQ, "big")


ZDICT_CHECK_S = 1.0
"""How often (seconds) appends look for a compression dictionary another process trained."""

VERSIONS_KEPT = 100_000
"""Streams whose version an LMDB log keeps in memory between appends (then it starts afresh)."""


def key_seq(key: bytes | memoryview) -> int:
    return int.from_bytes(bytes(key), "big")


class _HalfMadeLock(Exception):
    """An open met a lock table its first opener never finished making (all zeros)."""


HALF_MADE_WAIT_S = 1.0
"""How long an open retries a lock table of zeros (see _HalfMadeLock) before calling it damaged."""


class _LockReplaced(Exception):
    """Internal: lock.mdb changed under an open write transaction; the group is retried."""


def log_warn(message: str) -> None:
    import logging

    logging.getLogger("eventlog.log").warning(message)


class _Request:
    __slots__ = ("items", "payloads", "expected", "expected_head", "size", "owner", "wake", "done", "seqs", "error")

    def __init__(self, items: list[codec.Prepared], payloads: list[tuple[int, int, bytes]] | None,
                 expected: int | None, expected_head: int | None = None) -> None:
        self.items = items
        self.payloads = payloads  # format 2: each event's (codec, dictionary, data), made outside the txn
        self.expected = expected
        self.expected_head = expected_head
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


CURRENT = "current"
_RETIRED = "/proc/eventlog/this-log-moved-to-a-generation-folder"
"""Where a retired first-layout data.mdb/lock.mdb points: a path nothing can create, so a program
of the first release that opens the old files fails loudly instead of starting an empty log."""


def generation_dir(log_dir: Path) -> Path:
    """The directory of the log's current environment: ``log_dir/<gN>`` as named by the
    ``log_dir/current`` symlink, else ``log_dir`` itself (a log never compacted)."""
    try:
        target = os.readlink(log_dir / CURRENT)
    except FileNotFoundError:
        return log_dir
    except OSError as e:
        raise StorageError(f"{log_dir / CURRENT} is not a symlink to a log generation ({e.strerror})",
                           hint="restore the profile's log/ directory from a backup") from e
    if not GENERATION_RE.fullmatch(target):
        raise StorageError(f"{log_dir / CURRENT} points at {target!r}, not a log generation",
                           hint="restore the profile's log/ directory from a backup")
    return log_dir / target


LOCK_MAGIC = 0xBEEFC0DE
"""The first four bytes of a sound LMDB lock file (lock.mdb: the lock table, no data)."""
LOCK_HINT = ("stop the processes that have this profile open, then delete {lock} (it holds no data: the next "
             "open makes a new one); data.mdb is intact")


def lock_file_magic(lock: Path) -> int | None:
    """The magic number of the lock file ``lock``, read with plain file I/O. Only for a lock file
    no environment of this process has open: closing the descriptor would cancel every fcntl
    lock the process holds on it (LMDB keeps some). None when it cannot be read."""
    try:
        with open(lock, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    return int.from_bytes(head, sys.byteorder) if len(head) == 4 else 0


def mapped_address(path: str) -> int | None:
    """Where this process maps the start of the file ``path`` (from /proc/self/maps; Linux),
    or None. Reads /proc only: never opens ``path``."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[2] == "00000000" and parts[5].rstrip("\n") == path:
                    return int(parts[0].split("-")[0], 16)
    except OSError:
        return None
    return None


def posix_lock_holders(path: Path) -> list[int]:
    """Pids of the other processes holding fcntl (POSIX) locks on ``path`` — LMDB's sign that
    they have its environment open — from /proc/locks (Linux; else empty)."""
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    pids = set()
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] in ("POSIX", "OFDLCK") and parts[2] != "->":
            dev_ino = parts[5].split(":")
            if len(dev_ino) == 3 and dev_ino[2].isdigit() and int(dev_ino[2]) == inode and parts[4].isdigit():
                pids.add(int(parts[4]))
    pids.discard(os.getpid())
    return sorted(p for p in pids if p > 0)


_own_memory: tuple[int, int] | None = None  # (pid, descriptor of /proc/self/mem)


def read_own_memory(addr: int, size: int) -> bytes | None:
    """``size`` bytes of this process's memory at ``addr`` (Linux), or None when unmapped or
    unavailable: a read of memory that cannot fault."""
    global _own_memory
    pid = os.getpid()
    try:
        if _own_memory is None or _own_memory[0] != pid:
            _own_memory = (pid, os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC))
        got = os.pread(_own_memory[1], size, addr)
    except OSError:
        return None
    return got if len(got) == size else None


def data_intact(env_dir: Path) -> tuple[int, str] | None:
    """The head recorded in data.mdb, read without the lock file (``lock=False``, read-only),
    or None when data.mdb itself cannot be read."""
    try:
        env = lmdb.open(str(env_dir), max_dbs=8, readonly=True, lock=False, subdir=True)
    except lmdb.Error:
        return None
    try:
        meta = env.open_db(b"meta", create=False)
        with env.begin() as txn:
            raw = txn.get(b"head", db=meta)
        return (key_seq(raw[:_SEQ]), bytes(raw[_SEQ:]).hex()) if raw else (0, codec.ZERO_HASH)
    except lmdb.Error:
        return None
    finally:
        env.close()


def _size_limited(path: Path | None) -> bool:
    """Whether this process's file-size limit (RLIMIT_FSIZE) is what a write of the log at
    ``path`` met (a data file within 4 MB of it): a write past it fails with EFBIG, which LMDB
    reports as "File too large" or an I/O error."""
    limit = soft_limit("RLIMIT_FSIZE")
    if limit is None:
        return False
    if path is None:
        return True
    try:
        names = [path / "data.mdb", *(path / n / "data.mdb" for n in os.listdir(path))]
    except OSError:
        return True
    return limit - max(map(_file_size, names), default=0) < 4 * 1024 * 1024


def _short_data_file(env: lmdb.Environment, p: Path) -> tuple[int, int] | None:
    """(size, size needed) when the data file of the environment just opened at ``p`` ends
    before the last page its meta page names (cut short by a copy, a restore or a full disk):
    LMDB maps the file and reads such a page as memory past its end, and the process dies of
    SIGBUS (exit 135, nothing said). None when every page is inside the file. Reads the meta
    page only (``info``, ``stat``); pages are written before the meta page that names them."""
    try:
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.stat(p / "data.mdb").st_size  # stat only: never an open of the live file
    except (lmdb.Error, OSError):
        return None
    return (size, need) if size < need else None


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
    if ("File too large" in text or "Input/output error" in text) and _size_limited(path):
        return DiskFullError(f"{action}: the log file reached this process's file-size limit (ulimit -f)",
                             hint="raise the limit (ulimit -f), then retry: nothing was written")
    limit = soft_limit("RLIMIT_AS") if "Cannot allocate memory" in text else None
    if limit is not None:
        # LMDB maps the whole map size (DEFAULT_MAP_SIZE) at open: address space, not memory (outside
        # audit, helper-87: under `ulimit -v` the open said "Cannot allocate memory" and to check the
        # disk and permissions).
        return StorageError(f"{action}: the log's memory map does not fit this process's address-space limit "
                            f"(ulimit -v: {limit // (1024 * 1024)} MiB)",
                            hint=f"raise the limit (`ulimit -v unlimited`: the map of {DEFAULT_MAP_SIZE >> 30} GiB "
                                 "reserves address space, only the pages read use memory) or open the log with a "
                                 "map_size that fits under it")
    if isinstance(e, (lmdb.ReadonlyError,)) or "Permission denied" in text or "Read-only" in text:
        return StorageError(
            f"{action}: the log directory or its lock file is not writable ({text})",
            hint="check the owner and permissions of the profile's log/ directory",
        )
    if isinstance(e, lmdb.InvalidError) or isinstance(e, lmdb.CorruptedError) or isinstance(e, lmdb.VersionMismatchError):
        return StorageError(f"{action}: the log file is not a valid LMDB environment ({text})",
                            hint="restore the profile's log/ from a backup or an export")
    return StorageError(f"{action}: {text}")


class _Pending:
    """The rows one write group adds, written by one ``putmulti`` per table before its commit."""

    __slots__ = ("events", "ids", "streams", "seq_of", "raw_of", "added", "claim", "ahead")

    def __init__(self) -> None:
        self.events: list[tuple[bytes, bytes]] = []
        self.ids: list[tuple[bytes, bytes]] = []
        self.streams: list[tuple[bytes, bytes]] = []
        self.seq_of: dict[bytes, bytes] = {}  # event id -> seq key, for ids repeated in the group
        self.raw_of: dict[bytes, bytes] = {}  # seq key -> stored value
        self.added: dict[str, int] = {}  # events added to each stream
        self.claim = 0  # idclaim as this group leaves it
        self.ahead: set[bytes] = set()  # this group's caller ids of the derived form naming seqs ahead

    def add(self, key: bytes, raw: bytes, event_id: bytes, session: str | None, row: bool = True) -> None:
        self.events.append((key, raw))
        if row:  # an id derived from its own seq has none
            self.ids.append((event_id, key))
            self.seq_of[event_id] = key
        self.raw_of[key] = raw
        if session is not None:
            self.streams.append((session.encode(), key))
            self.added[session] = self.added.get(session, 0) + 1


class _Environment:
    """One LMDB environment of this process, shared by every :class:`EventLog` handle opened on
    its directory (py-lmdb refuses a second open of one environment in one process). It holds
    the named databases, the group-commit queue and the reader sweep; closed with its last handle.
    """

    def __init__(self, path: Path, durability: str, profile: str | None, map_size: int, max_readers: int,
                 readonly: bool, lock_timeout: float) -> None:
        self.path = path
        self._damage_marker = os.path.join(str(path), log_damage.MARKER)  # asked before every append
        self.durability = durability
        self.profile = profile
        self.readonly = readonly
        """No handle may write: the environment is never upgraded to writable."""
        self.lock_timeout = lock_timeout
        self._pid = os.getpid()
        self._forked = False
        self._closed = False
        self._closing = False  # close() began: no new append is queued
        self.retiring = False
        """The last handle let go (set under ``_open_envs_lock``): a new open waits for :attr:`gone`."""
        self.gone = threading.Event()
        """Set when close() has finished: the environment's files may be opened again."""
        self._open_args = (map_size, max_readers, durability)
        self.env_dir = generation_dir(path)
        """Where the environment's files are: ``path/<generation>`` (named by ``path/current``)
        once the log was compacted, ``path`` itself before (the first release's layout)."""
        self._mu = threading.Lock()
        self._queue: deque[_Request] = deque()
        self._leader = False
        self._last_group = 0
        self._readers = 0
        self._resizing = False
        self._rcv = threading.Condition()
        self._appended = threading.Condition()
        self._sweep_lock = threading.Lock()
        self._writer_mu = threading.RLock()  # re-entrant: a writer may reopen (see _ensure_lock)
        # (pid, head) of a stopped writer-lock holder a write of this process gave up on, and the
        # log's head then: while it still holds the lock stopped and the head has not moved,
        # later writes give up on it at once (see _writing).
        self._stopped_writer: tuple[int, bytes | None] | None = None
        self._writer_fd: int | None = None
        self._aware_fd: int | None = None
        self.commits = 0
        """Write transactions committed in this environment by this process (group commit shares them)."""
        # Stream versions (event counts) as of the head in _versions_head, for the appends that
        # name an expected version: every change to the stream index moves the head, so while
        # the head is the one this process last wrote (or read) the counts need no lookup.
        self._versions: dict[str, int] = {}
        self._versions_head: bytes | None = None
        # meta ``idclaim`` as of the head in _claim_head (it changes only with the head).
        self._claim = 0
        self._claim_head: bytes | None = None
        self._zdict_checked = -ZDICT_CHECK_S
        self._dicts_env: Any = None  # the environment whose dictionaries are all known (_know_dicts)
        self.refs = 1
        self.format = FORMAT_VERSION
        self.compression = stored.Compression(self._load_dict)
        self._train_after = DICT_TRAIN_AFTER
        self._training = False
        self._trained: bytes | None = None
        self._trainer: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock_map: int | None = None
        # Held before LMDB's lock table is opened: a process with the table open but not this
        # lock is taken for an earlier version's (_unaware_pids), and one caught between the two
        # made an erase keep a dictionary that had learnt erased words (outside audit, helper-41).
        self._aware_fd = _hold_shared(self.path / RETIRE_AWARE_LOCK) if self.path.is_dir() else None
        try:
            for attempt in range(OPEN_MOVED_RETRIES):
                try:
                    self._open_first(readonly)
                    break
                except (StorageError, OSError):
                    # The generation ``current`` named was retired by another process's compaction
                    # while this one opened it: open the one it names now.
                    if attempt == OPEN_MOVED_RETRIES - 1 or generation_dir(path) == self.env_dir:
                        raise
        except BaseException:
            if self._aware_fd is not None:
                os.close(self._aware_fd)
            raise
        if self._aware_fd is None:  # a log made just now: its folder exists from here on
            self._aware_fd = _hold_shared(self.path / RETIRE_AWARE_LOCK)
        _live_logs.add(self)
        self._sweeper = _Thread(target=self._sweep, name="eventlog-reader-sweep", daemon=True)
        self._sweeper.start()

    def _open_first(self, readonly: bool) -> None:
        """Open the environment of the log's current generation and its named databases."""
        path = self.path
        self.env_dir = generation_dir(path)
        if self.env_dir != path and not (self.env_dir / "data.mdb").exists():
            # A compaction's folder has its data file before ``current`` names it: it was retired
            # since (the caller retries) -- never start an empty log in its place.
            raise StorageError(f"cannot open log at {path}: its generation {self.env_dir.name} has no data.mdb",
                               hint="restore the profile's log/ directory from a backup")
        # An existing log is opened read-only first: opening LMDB's named databases on a
        # writable environment takes the write lock, so a process stopped inside a write
        # transaction would block every reader that merely opens the log. The environment
        # becomes writable at this process's first write (_ensure_writable).
        self._env_readonly = readonly or (self.env_dir / "data.mdb").exists()
        map_size, max_readers, durability = self._open_args
        if not readonly:  # (a reader writes lock.mdb too: its slot in the reader table)
            for name in ("data.mdb", "lock.mdb"):
                give_owner_access(self.env_dir / name)
        try:
            env = self._open_env(self.env_dir, map_size, max_readers, durability, self._env_readonly)
        except StorageError:
            if not self._replace_garbage_lock_file():
                raise
            env = self._open_env(self.env_dir, map_size, max_readers, durability, self._env_readonly)
        try:
            env.reader_check()
        except lmdb.Error:
            pass
        if not readonly:
            for name in ("data.mdb", "lock.mdb"):
                restrict_file(self.env_dir / name)
        try:
            try:
                self._attach(env)
            except lmdb.NotFoundError:
                if readonly:
                    raise StorageError(f"{path} is not an eventlog log (its databases are missing)",
                                       hint="point at a profile's log/ directory") from None
                env.close()  # a log whose first open died before creating its databases
                self._env_readonly = False
                env = self._open_env(self.env_dir, map_size, max_readers, durability, False)
                self._attach(env)
            self._init_meta(self.profile)
        except lmdb.Error as e:
            env.close()
            raise storage_error(e, f"cannot open log at {path}") from e
        except BaseException:
            env.close()
            raise

    def _attach(self, env: lmdb.Environment, create: bool | None = None) -> None:
        """Open the named databases of ``env`` (creating them when it is writable, unless
        ``create`` is False: a reopen never makes a log, see :meth:`_open_current`)."""
        create = not self._env_readonly if create is None else create
        self._env = env
        for attempt in range(3):
            try:
                self._events = env.open_db(b"events", create=create)
                self._ids = env.open_db(b"ids", create=create)
                self._streams = env.open_db(b"streams", dupsort=True, dupfixed=True, create=create)
                self._meta = env.open_db(b"meta", create=create)
                break
            except lmdb.MapResizedError:
                # Another process grew the map past the size this one opened with: adopt it (this
                # environment is new, no transaction of it is open).
                if attempt == 2:
                    raise
                env.set_mapsize(0)
        self._lock_path = str(self.env_dir / "lock.mdb")
        # What ``current`` must read for this environment to still be the log's (None: no link).
        self._current_link = str(self.path / CURRENT)
        self._current_target = None if self.env_dir == self.path else self.env_dir.name
        st = os.stat(self._lock_path)
        self._lock_id = (st.st_dev, st.st_ino)
        self._lock_map = mapped_address(os.path.realpath(self._lock_path))

    # ---------------------------------------------------------------- a lock table overwritten with garbage

    def _replace_garbage_lock_file(self) -> bool:
        """At open (no environment of this process has the file open): when lock.mdb is not a
        lock table but data.mdb is intact, replace it — alone, or raise a StorageError naming
        the processes to stop. Returns False when the lock file is not the problem."""
        lock = self.env_dir / "lock.mdb"
        magic = lock_file_magic(lock)
        if magic is None or magic == LOCK_MAGIC or data_intact(self.env_dir) is None:
            return False
        holders = posix_lock_holders(lock)
        if holders:
            who = f"process {holders[0]} has" if len(holders) == 1 else f"processes {', '.join(map(str, holders))} have"
            raise StorageError(f"the log's lock table {lock} is damaged ({who} it open)", hint=LOCK_HINT.format(lock=lock))
        with self._flocked_writer():
            if lock_file_magic(lock) not in (None, LOCK_MAGIC):
                log_warn(f"{lock} was not a lock table (overwritten?); replacing it (data.mdb is intact)")
                _unlink(lock)
        return True

    def _lock_table_garbage(self) -> bool:
        """True when the lock table this process has mapped no longer starts with LMDB's magic
        (overwritten in place): locking its mutexes could hang or abort the process. Read
        through /proc/self/mem, so a mapping another thread has just closed reads as unknown
        (False) instead of faulting."""
        addr = self._lock_map
        if addr is None:
            return False
        head = read_own_memory(addr, 4)
        return head is not None and int.from_bytes(head, sys.byteorder) != LOCK_MAGIC

    def _recover_lock_table(self, *, flocked: bool = False) -> None:
        """The mapped lock table is garbage: remove lock.mdb (under the writer lock — taken here
        unless ``flocked`` — so no writer of any process is mid-commit) and reopen on a fresh
        one; other processes rejoin it at their next read or write (see :meth:`_ensure_lock`).
        Raises a StorageError with the right hint when that cannot be done."""
        lock = Path(self._lock_path)

        def replace() -> None:
            if self._lock_table_garbage() and not self._lock_replaced():
                log_warn(f"{lock} was overwritten (not a lock table any more); replacing it (data.mdb is intact)")
                _unlink(lock)

        try:
            if flocked:
                replace()
            else:
                with self._flocked_writer():
                    replace()
        except WriterBusyError as e:
            raise StorageError(f"the log's lock table {lock} is damaged", hint=LOCK_HINT.format(lock=lock)) from e
        self._ensure_lock()

    @contextmanager
    def _flocked_writer(self) -> Iterator[None]:
        """The writer lock's flock alone (not LMDB's mutex), waiting at most ``lock_timeout``."""
        fd = self._writer_lock_fd()
        self._flock_until(fd, time.monotonic() + self.lock_timeout)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _flock_until(self, fd: int, deadline: float) -> None:
        """Take the exclusive flock on ``fd``, polling with a growing pause (0.5 to 10 ms) until
        ``deadline``; then raise :class:`WriterBusyError` naming the holder."""
        if not flock_until(fd, deadline):
            raise self._busy()

    def _sweep(self) -> None:
        """Clear reader slots of dead processes every READER_SWEEP_S, even while idle, so a
        table filled by SIGKILLed readers frees itself for every process that opens the log."""
        while not self._stopping.wait(READER_SWEEP_S):
            with self._sweep_lock:
                if self._closed or self._forked or self._pid != os.getpid():
                    return
                if self._lock_table_garbage():  # never lock a garbage mutex; the next read replaces it
                    continue
                try:
                    self._env.reader_check()
                except lmdb.Error:
                    pass

    # ---------------------------------------------------------------- writing: lock and upgrade

    @contextmanager
    def _writing(self, follow: bool = True) -> Iterator[None]:
        """Hold the log's writer lock: a flock on ``writer.lock`` taken before LMDB's own write
        mutex (which cannot time out). A process stopped while writing keeps it; then this
        waits at most ``lock_timeout`` seconds and raises :class:`WriterBusyError` naming it.

        Inside, the environment is the log's current one (``follow``): another process may have
        compacted the log since this one last read, and a write into the retired generation —
        or a compaction copying it — would lose every event written since in the new one. The
        append path passes False: it checks inside its own write transaction (_write_group)."""
        deadline = time.monotonic() + self.lock_timeout
        if not self._writer_mu.acquire(timeout=max(0.0, self.lock_timeout)):
            raise self._busy()
        try:
            if self._closed:  # close() held the lock meanwhile: the environment is gone
                raise ClosedError("the event log is closed")
            fd = self._writer_lock_fd()
            self._flock_or_remember(fd, deadline)
            try:
                if self._lock_table_garbage():  # LMDB's write mutex lives there: never lock garbage
                    self._recover_lock_table(flocked=True)
                self._ensure_writable()
                if follow:  # no compaction can start while the flock is held
                    self._ensure_lock()
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._writer_mu.release()

    def _flock_or_remember(self, fd: int, deadline: float) -> None:
        """:meth:`_flock_until` for a write, which gives up at once on a stopped holder an earlier
        write of this process already waited ``lock_timeout`` for, while that process still holds
        the lock stopped and the log's head has not moved since: a call that writes several
        times (a LangGraph step's checkpoint, then its writes) waited the whole timeout for each
        write, 2-3 times 10 s for one ``invoke`` (outside audit, helper-82)."""
        known = self._stopped_writer
        if known is not None:
            holder = flock_holder(self.path / "writer.lock")
            if holder == known[0] and process_state(holder) == "stopped" and self._raw_head() == known[1]:
                if flock_until(fd, time.monotonic()):
                    self._stopped_writer = None
                    return
                raise WriterBusyError(self.path, holder, self.lock_timeout, again=True)
            self._stopped_writer = None
        try:
            self._flock_until(fd, deadline)
        except WriterBusyError as e:
            if e.stopped and e.pid is not None:
                self._stopped_writer = (e.pid, self._raw_head())
            raise

    def _raw_head(self) -> bytes | None:
        """The stored head record (seq and hash), or None when there is none or it cannot be read."""
        try:
            with self._read() as txn:
                head = txn.get(b"head", db=self._meta)
                return bytes(head) if head is not None else None
        except (lmdb.Error, EventLogError):
            return None

    def _writer_lock_fd(self) -> int:
        if self._writer_fd is None:
            path = self.path / "writer.lock"
            try:
                self._writer_fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            except OSError as e:
                if e.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT):  # room, not a fault: nothing written
                    raise DiskFullError(f"cannot write the log at {self.path}: {e.strerror}",
                                        hint="make the file system writable (or free space), then retry: "
                                             "nothing was written; reads go on") from e
                if isinstance(e, PermissionError):
                    raise denied(e, "cannot open the log's writer lock", path) from e
                raise StorageError(f"cannot open the log's writer lock {path}: {e.strerror}",
                                   hint="check the owner and permissions of the profile's log/ directory") from e
        return self._writer_fd

    def _busy(self) -> WriterBusyError:
        holder = flock_holder(self.path / "writer.lock")
        return WriterBusyError(self.path, holder, self.lock_timeout)

    def _ensure_writable(self) -> None:
        """Reopen the read-only environment for writing (the writer lock is held), in the
        log's current generation: another process may have compacted it since this one last
        read (the folder opened then is gone, and no compaction can start while the lock is held)."""
        if not self._env_readonly:
            return
        if self.readonly:
            raise StorageError("this event log was opened read-only", hint="open it without readonly=True to append")
        moved = False
        with self._exclusive():
            if not self._env_readonly:
                return
            with self._sweep_lock:
                self._lock_map = None
                self._env.close()
                self._env_readonly = False
                before = self.env_dir
                self._open_current(False)
                moved = self.env_dir != before
        self._remove_leftovers()
        if moved:
            self._init_meta(self.profile)  # a compaction may have migrated the format

    def _begin_write(self) -> lmdb.Transaction:
        """LMDB's write transaction (the writer lock is held), picking up a map another process
        grew past this one's size first (:class:`StorageError` when LMDB refuses)."""
        for attempt in range(3):
            try:
                return self._env.begin(write=True)
            except lmdb.MapResizedError as e:
                if attempt == 2:
                    raise storage_error(e, "cannot write the log") from e
                with self._exclusive():
                    self._env.set_mapsize(0)
            except lmdb.Error as e:
                raise storage_error(e, "cannot write the log", self.path) from e
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- open / close

    @property
    def usable(self) -> bool:
        """Open, and in the process that opened it."""
        return not self._closed and not self._forked and self._pid == os.getpid()

    # ---------------------------------------------------------------- compaction

    def compact(self) -> dict[str, Any]:
        """Rewrite the log into a new file holding only its live pages, and switch to it.

        LMDB never shrinks its file and never zeroes the pages it frees. This copies every
        record into a new environment in a new generation folder (a format-1 log is rewritten
        in format 2 on the way: a verified migration), checks that the copy holds the same chain
        up to the same head, syncs it, and points ``current`` at it; every process reopens on it
        at its next read or write, and the previous files are removed (a process still reading
        them keeps its open copy until then). Writers wait meanwhile (the writer lock and LMDB's
        own mutex are held); readers do not. Crash-safe: until ``current`` moves, the log is the
        old files; a leftover folder is removed by the next write (or compaction). (LMDB's own compacting
        copy is not used: in LMDB 0.9.36 it crashes on a DUPFIXED database with more than one
        page of duplicates, which the ``streams`` table has.) Returns bytes before and after.
        """
        self._check()
        with self._writing():
            old_dir = self.env_dir
            if old_dir == self.path:
                # The first release's layout: its processes know no generation folder and would
                # go on writing into the retired file, acknowledged and lost (outside audit,
                # helper-41). Every process of a later release holds dictionaries.lock.
                earlier = [pid for pid in self._unaware_pids() if pid != -1]
                if earlier:
                    raise EarlierProcessError(
                        "log", f"process(es) {', '.join(map(str, earlier))} of an earlier eventlog (or another LMDB "
                               "program) have the log open, and a compaction would lose what they write",
                        hint="stop them (or let them finish), then run `eventlog compact`; nothing was changed")
            before = _file_size(old_dir / "data.mdb")
            txn = self._begin_write()  # LMDB's mutex as well: no writer of any version meanwhile
            made: list[Path] = []  # what this compaction made, removed unless ``current`` names it
            try:
                head = txn.get(b"head", db=self._meta)
                names = os.listdir(self.path)
                for name in names:
                    if name.endswith(".tmp"):
                        _remove_tree(self.path / name)
                numbers = [int(n[1:]) for n in names if GENERATION_RE.fullmatch(n)]
                gen = f"g{max(numbers, default=0) + 1}"
                tmp = self.path / f"{gen}.tmp"
                made += [tmp, self.path / gen, self.path / f"{CURRENT}.tmp"]
                make_dir(tmp)
                self._copy_into(tmp, txn)
                restrict_file(tmp / "data.mdb")
                hand_over(tmp / "data.mdb")
                fsync_file(tmp / "data.mdb")  # a new file nothing has open
                result = verify_environment(tmp)
                expect = (key_seq(head[:_SEQ]), head[_SEQ:].hex()) if head else (0, codec.ZERO_HASH)
                if not result.ok or (result.head_seq, result.head_hash) != expect:
                    raise IntegrityError(f"the compacted copy of the log does not verify ({result.reason}); "
                                         "the log was left as it was",
                                         hint="run `eventlog log verify` on the log itself")
                os.rename(tmp, self.path / gen)
                fsync_dir(self.path)
                link = self.path / f"{CURRENT}.tmp"
                _unlink(link)
                os.symlink(gen, link)
                os.replace(link, self.path / CURRENT)
                made = []  # in force
                fsync_dir(self.path)
            except (lmdb.Error, OSError) as e:
                # A full disk most of all (the copy needs as much room as the live log): the log
                # stays as it was, and the partial copy goes rather than keeping what room is left.
                raise _compaction_error(e, self.path) from e
            finally:
                txn.abort()
                for leftover in made:
                    if leftover.is_symlink():
                        _unlink(leftover)
                    else:
                        _remove_tree(leftover)
            self._retire(old_dir)
        self._ensure_lock()  # this process moves to the new generation now
        return {"bytes_before": before, "bytes_after": _file_size(self.env_dir / "data.mdb"),
                "generation": self.env_dir.name}

    def _copy_into(self, target: Path, txn: lmdb.Transaction) -> None:
        """Copy every record the write transaction ``txn`` sees into a new environment at
        ``target``, in format 2 (re-encoding format-1 events, with a dictionary trained first)."""
        upgrade = self.format != FORMAT_2
        compression = self.compression
        if upgrade:
            compression = stored.Compression(lambda _id: None)
            trained = self._train_on(txn)
            if trained is not None:
                compression.use(1, trained)
        ids = [] if upgrade else self._dict_ids(txn)
        retired = {d for d in ids if txn.get(b"zdict:%d:tainted" % d, db=self._meta) is not None}
        unranged = [d for d in ids if d not in retired and txn.get(b"zdict:%d:range" % d, db=self._meta) is None]
        if unranged and self._holds_stubs(txn):
            # A dictionary trained before ranges were recorded, in a log holding erased events:
            # an earlier release's erase marked nothing (outside audit, helper-41: its words stayed
            # in the dictionary through every later compaction). It may have learnt from them.
            retired.update(unranged)
        if retired:
            unaware = self._unaware_pids()
            if unaware:  # they may still append with it: keep it (marked) for a later compaction
                log_warn(f"the log's compression dictionary still holds fragments of erased events: "
                         f"process(es) {', '.join(map(str, unaware)) if unaware != [-1] else '(unknown)'} "
                         "of an earlier eventlog (or another LMDB program) have the log open; run `eventlog compact` "
                         "once they have closed it")
                retired = set()
        recode: tuple[stored.Compression, stored.Compression] | None = None
        new_dict: tuple[int, bytes, int, int] | None = None
        if retired:
            known = {d: bytes(txn.get(b"zdict:%d" % d, db=self._meta) or b"") for d in ids}
            old_codec = stored.Compression(lambda d: known.get(d))
            new_codec = stored.Compression(lambda _id: None)
            fresh = self._train_clean(txn, old_codec)
            if fresh is not None:
                new_id = self._top_dict_id(txn) + 1
                new_codec.use(new_id, fresh[0])
                new_dict = (new_id, *fresh)
            recode = (old_codec, new_codec)
        size = max(self._env.info()["map_size"], DEFAULT_MAP_SIZE)
        dst = lmdb.open(str(target), map_size=size, max_dbs=8, subdir=True, sync=False, metasync=False, lock=False,
                        mode=FILE_MODE, readahead=False)
        try:
            d_events, d_ids, d_meta = (dst.open_db(n) for n in (b"events", b"ids", b"meta"))
            d_streams = dst.open_db(b"streams", dupsort=True, dupfixed=True)
            for src_db, dst_db, dup in ((self._ids, d_ids, False), (self._streams, d_streams, True),
                                        (self._events, d_events, False)):
                cur = txn.cursor(db=src_db)
                more = cur.first()
                while more:
                    # db=dst_db: py-lmdb before 3.0 picks the append flag (MDB_APPENDDUP for a
                    # dupsort table) by the transaction's default table, not the cursor's; with
                    # the main table it refused every second stream entry of a key as out of order.
                    with dst.begin(write=True, db=dst_db) as out:
                        put = out.cursor(db=dst_db)
                        n = 0
                        while more and n < 20_000:
                            key, value = cur.key(), cur.value()
                            if upgrade and src_db is self._events and value[:1] == b"{":
                                value = stored.pack_sealed(key_seq(key), codec.decode(value), bytes(value), compression)
                            elif recode is not None and src_db is self._events:
                                value = stored.recoded(bytes(value), *recode, retired) or value
                            # The source cursor walks keys (and duplicates) in order: append them.
                            if not put.put(key, value, append=True, dupdata=dup):
                                raise StorageError("copying the log failed: a record out of order")
                            n += 1
                            more = cur.next()
            with dst.begin(write=True) as out:
                for key, value in txn.cursor(db=self._meta):
                    if retired and key[:6] == b"zdict:" and int(bytes(key)[6:].split(b":")[0]) in retired:
                        continue  # a dictionary that learnt from erased events: not carried over
                    out.put(key, value, db=d_meta)
                if retired:
                    # the retired ids stay used for good, whatever comes next
                    out.put(DICT_TOP, b"%d" % (self._top_dict_id(txn) if new_dict is None else new_dict[0]), db=d_meta)
                    if new_dict is not None:
                        new_id, raw_dict, lo, hi = new_dict
                        out.put(b"zdict:%d" % new_id, raw_dict, db=d_meta)
                        out.put(b"zdict:%d:range" % new_id, _DICT_RANGE.pack(lo, hi), db=d_meta)
                        out.put(b"zdict", b"%d" % new_id, db=d_meta)
                    else:  # too little left to learn from: new events go without a dictionary
                        out.delete(b"zdict", db=d_meta)
                if upgrade:
                    out.put(b"format", FORMAT_2, db=d_meta)
                    if compression.current:
                        out.put(b"zdict:1", self._trained or b"", db=d_meta)
                        out.put(b"zdict", b"1", db=d_meta)
            dst.sync(True)
        finally:
            dst.close()

    def _train_clean(self, txn: lmdb.Transaction, reader: stored.Compression) -> tuple[bytes, int, int] | None:
        """A dictionary trained on the data of the last DICT_SAMPLES events ``txn`` sees that are
        not erased (format 2, read with ``reader``), with the seq range of its samples; None when
        there is too little to learn from."""
        datas: list[bytes] = []
        cur = txn.cursor(db=self._events)
        more = cur.last()
        lo = hi = 0
        while more and len(datas) < DICT_SAMPLES:
            value = bytes(cur.value())
            if value[:1] == bytes((stored.KIND_EVENT,)):
                data = stored.envelope(key_seq(cur.key()), value, reader).get("data")
                datas.append(codec.canonical(data))
                lo, hi = key_seq(cur.key()), hi or key_seq(cur.key())
            more = cur.prev()
        trained = stored.train(datas)
        return None if trained is None else (trained, lo, hi)

    def _train_on(self, txn: lmdb.Transaction) -> bytes | None:
        """A dictionary trained on the data of the last DICT_SAMPLES events ``txn`` sees (format 1)."""

        datas: list[bytes] = []
        cur = txn.cursor(db=self._events)
        more = cur.last()
        while more and len(datas) < DICT_SAMPLES:
            value = bytes(cur.value())
            if value[:1] == b"{":
                datas.append(codec.canonical(codec.decode(value).get("data")))
            more = cur.prev()
        self._trained = stored.train(datas)
        return self._trained

    def _retire(self, old_dir: Path) -> None:
        """Remove what the previous generation left (its folder, or the first layout's files)."""
        for name in ("data.mdb", "lock.mdb"):
            # The first layout's files (this compaction's, or an earlier one killed before it
            # got here: they would keep the old pages, erased words included, for good).
            if old_dir == self.path or (os.path.lexists(self.path / name) and not os.path.islink(self.path / name)):
                link = self.path / f".{name}.retired.tmp"
                _unlink(link)
                os.symlink(_RETIRED, link)
                os.replace(link, self.path / name)
        keep = generation_dir(self.path).name
        for name in os.listdir(self.path):
            if GENERATION_RE.fullmatch(name) and name != keep:
                _remove_tree(self.path / name)
        fsync_dir(self.path)

    def _remove_leftovers(self) -> None:
        """What a compaction killed part-way left (the writer lock is held, so none is running):
        its ``g<N>.tmp`` copy, a generation ``current`` does not name, and the first layout's
        files once ``current`` names a generation (a process of the first release would write
        into them, acknowledged and lost). Each a whole copy of the log: removed at a process's
        first write instead of waiting for the next compaction, which may never come."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        keep = self.env_dir.name if self.env_dir != self.path else None
        links = {f"{CURRENT}.tmp", ".data.mdb.retired.tmp", ".lock.mdb.retired.tmp"}  # its temporary symlinks
        stray = [n for n in names if (n.endswith(".tmp") and GENERATION_RE.fullmatch(n[:-4]))
                 or (GENERATION_RE.fullmatch(n) and n != keep) or n in links]
        first = keep is not None and any(
            os.path.lexists(self.path / n) and not os.path.islink(self.path / n) for n in ("data.mdb", "lock.mdb"))
        if not stray and not first:
            return
        if generation_dir(self.path) != self.env_dir:
            return  # not this process's to judge: it moves at its next read or write
        for name in stray:
            if name in links:
                _unlink(self.path / name)
            else:
                _remove_tree(self.path / name)
        if keep is not None:
            self._retire(self.env_dir)
        else:
            fsync_dir(self.path)

    def _open_current(self, readonly: bool) -> None:
        """Open and attach the environment of the log's current generation (this process's
        previous one is closed), setting :attr:`env_dir` to it. Another process's compaction
        may retire the folder ``current`` named between reading the link and opening it
        (readers do not hold compactions back): then the link names a newer one, opened instead."""
        for attempt in range(OPEN_MOVED_RETRIES):
            self.env_dir = generation_dir(self.path)
            env = None
            try:
                # never create: a folder retired meanwhile must not come back as an empty log
                # (LMDB makes a new data file in a folder emptied but not yet removed: its
                # tables are missing, and the link, read again, names the newer generation)
                env = self._open_env(self.env_dir, *self._open_args, readonly, create=False)
                self._attach(env, create=False)
                return
            except (StorageError, OSError, lmdb.Error) as e:
                if env is not None:
                    env.close()
                if generation_dir(self.path) == self.env_dir or attempt == OPEN_MOVED_RETRIES - 1:
                    if isinstance(e, lmdb.Error):
                        raise storage_error(e, f"cannot open log at {self.path}") from e
                    raise

    @staticmethod
    def _open_env(p: Path, map_size: int, max_readers: int, durability: str, readonly: bool,
                  create: bool = True) -> lmdb.Environment:
        # py-lmdb begins a read transaction while opening: with the reader table full of slots
        # of dead processes, wait for a live process's sweep (READER_SWEEP_S) before giving up;
        # when another process grew the log past the map size just read from it, open again.
        # A lock table that is not one yet (its first opener was killed while making it: the
        # others opening meanwhile read zeros) is made again by the next opener that has it alone.
        deadline = time.monotonic() + 3 * READER_SWEEP_S
        half_made_until = time.monotonic() + HALF_MADE_WAIT_S
        while True:
            try:
                return _Environment._open_env_once(p, map_size, max_readers, durability, readonly, create,
                                                   time.monotonic() < half_made_until)
            except (lmdb.ReadersFullError, lmdb.MapResizedError, _HalfMadeLock) as e:
                if isinstance(e, _HalfMadeLock):
                    time.sleep(random.uniform(0.001, 0.01))  # apart from the others retrying
                elif time.monotonic() > deadline:
                    raise storage_error(e, f"cannot open log at {p}") from e
                else:
                    time.sleep(0.05 if isinstance(e, lmdb.ReadersFullError) else 0)

    @staticmethod
    def _open_env_once(p: Path, map_size: int, max_readers: int, durability: str, readonly: bool,
                       create: bool = True, retry_half_made: bool = False) -> lmdb.Environment:
        made = [n for n in ("data.mdb", "lock.mdb") if not os.path.lexists(p / n)] if os.geteuid() == 0 else []
        try:
            env = lmdb.open(
                str(p),
                map_size=map_size,
                max_dbs=8,
                max_readers=max_readers,
                subdir=True,
                sync=durability == "sync",
                metasync=durability == "sync",
                readonly=readonly,
                create=create and not readonly,
                mode=FILE_MODE,
                readahead=False,
                lock=True,
            )
        except (lmdb.ReadersFullError, lmdb.MapResizedError):
            raise
        except lmdb.Error as e:
            if retry_half_made and isinstance(e, lmdb.InvalidError) and lock_file_magic(p / "lock.mdb") == 0:
                raise _HalfMadeLock() from e  # the failed open left no environment of ours on it
            err = storage_error(e, f"cannot open log at {p}")
            if "Permission denied" in str(e):
                err = _denied_log(p, readonly, create) or err
            try:
                size = os.path.getsize(p / "data.mdb")
            except OSError:
                size = -1
            if 0 <= size < 2 * 4096 and not isinstance(err, DiskFullError):  # less than its two meta pages
                err = StorageError(f"cannot open log at {p}: its data file data.mdb is truncated ({size} bytes)",
                                   hint="restore the profile's log/ from a backup or an export")
            raise err from e
        for name in made:  # by LMDB just now, in a run with sudo
            hand_over(p / name)
        short = _short_data_file(env, p)
        if short is not None:
            env.close()
            raise StorageError(f"cannot open log at {p}: its data file data.mdb is truncated ({short[0]} bytes): "
                               f"its pages end at byte {short[1]}",
                               hint="restore the profile's log/ from a backup or an export")
        return env

    def _init_meta(self, profile: str | None) -> None:
        with self._read() as txn:  # a map another process grew is picked up there
            fmt, stored_profile, current = (None if v is None else bytes(v) for v in
                                            (txn.get(k, db=self._meta) for k in (b"format", b"profile", b"zdict")))
        if fmt is not None and fmt not in FORMATS:
            raise StorageError(f"log format {fmt!r} is not supported by this version (reads {FORMATS})",
                               hint="upgrade eventlog")
        if stored_profile is not None and self.profile is None:
            self.profile = stored_profile.decode()
        if fmt is None and not self._env_readonly:
            with self._env.begin(write=True) as txn:
                txn.put(b"format", FORMAT_VERSION, db=self._meta, overwrite=False)
                if profile is not None:
                    txn.put(b"profile", profile.encode(), db=self._meta, overwrite=False)
            fmt = FORMAT_VERSION
        self.format = fmt or FORMAT_VERSION
        if current is not None:
            self._adopt_dict(int(current))
        else:
            self.compression.current = 0  # a compaction retired the one this process used

    # ---------------------------------------------------------------- stored values (formats 1 and 2)

    def _load_dict(self, dict_id: int) -> bytes | None:
        with self._read() as txn:
            raw = txn.get(b"zdict:%d" % dict_id, db=self._meta)
        return None if raw is None else bytes(raw)

    def _know_dicts(self, txn: lmdb.Transaction) -> None:
        """Have every dictionary of this generation in memory before values read in ``txn`` are
        decoded after it: another process's compaction may retire one meanwhile, and this
        process (another thread) move to the generation that no longer has it. Checked with one
        lookup: all are loaded when the environment changed or the current one is unknown (a
        dictionary of this generation was current once, or was there when it was first read)."""
        if self.format != FORMAT_2:
            return
        current = txn.get(b"zdict", db=self._meta)
        if self._dicts_env is self._env and (current is None or self.compression.knows(int(current))):
            return
        for dict_id in self._dict_ids(txn):
            if not self.compression.knows(dict_id):
                raw = txn.get(b"zdict:%d" % dict_id, db=self._meta)
                if raw is not None:
                    self.compression.know(dict_id, bytes(raw))
        self._dicts_env = self._env

    def _adopt_dict(self, dict_id: int) -> None:
        if dict_id and dict_id != self.compression.current:
            raw = self._load_dict(dict_id)
            if raw is not None:
                self.compression.use(dict_id, raw)

    def _envelope(self, seq: int, value: bytes) -> dict[str, Any]:
        try:
            return stored.envelope(seq, value, self.compression)
        except ValueError as e:
            raise IntegrityError(f"event {seq} of the log is damaged: {e}",
                                 hint="run `eventlog log verify`; restore the log from a backup or an export") from e

    def _canonical(self, seq: int, value: bytes) -> bytes:
        """Canonical bytes of a stored value; an undecodable one is passed through as stored,
        so that the chain check names it (it is not canonical JSON)."""
        try:
            return stored.canonical_bytes(seq, value, self.compression)
        except ValueError:
            return value

    def train_dictionary(self, samples: int = DICT_SAMPLES) -> int:
        """Train a zstd dictionary on the data of the log's last ``samples`` events and make new
        events use it; returns its id (0 when there is too little to learn from). Stored in the
        log (``meta``), never changed once written: every process reads the same one."""

        for _ in range(3):
            mark = self.erase_mark()
            head = self.head()[0]
            first = max(1, head - samples + 1)
            trained = stored.train([codec.canonical(env["data"]) for env in self.read(first, head) if "data" in env])
            if trained is None:
                return 0
            dict_id = self._store_dict(trained, first, head, mark)
            if dict_id:
                self._adopt_dict(dict_id)
                return dict_id
        return 0

    def _store_dict(self, trained: bytes, first: int, head: int, mark: int) -> int:
        """Store a dictionary trained on events ``first``..``head`` read while the erase mark
        was ``mark``; 0 (nothing stored) when an erase committed since: its samples may hold what
        that erase took out, and the erase, not knowing the dictionary, could not mark it."""
        with self._writing(), self._begin_write() as txn:
            now = txn.get(b"erased", db=self._meta)
            if (int(now) if now else 0) != mark:
                return 0
            dict_id = self._top_dict_id(txn) + 1  # never an id a retired dictionary had
            txn.put(b"zdict:%d" % dict_id, trained, db=self._meta)
            txn.put(b"zdict:%d:range" % dict_id, _DICT_RANGE.pack(first, head), db=self._meta)
            txn.put(b"zdict", b"%d" % dict_id, db=self._meta)
            txn.put(DICT_TOP, b"%d" % dict_id, db=self._meta)
        return dict_id

    def _top_dict_id(self, txn: lmdb.Transaction) -> int:
        """The highest dictionary id the log ever gave (0: none)."""
        current = txn.get(b"zdict", db=self._meta)
        top = txn.get(DICT_TOP, db=self._meta)
        return max([int(current) if current else 0, int(top) if top else 0, *self._dict_ids(txn)])

    def _maybe_train(self, head: int) -> None:
        """Start training a dictionary in the background once a format-2 log without one has
        DICT_TRAIN_AFTER events (one attempt per threshold, doubled after a failure)."""
        if self.format != FORMAT_2 or self.compression.current or head < self._train_after or self._training:
            return
        self._training = True

        def train() -> None:
            try:
                if not self.train_dictionary():
                    self._train_after *= 2
            except Exception as e:  # closed meanwhile, or the disk: events stay compressed without one
                if not self._stopping.is_set():
                    self._train_after *= 2
                    log_warn(f"training the log's compression dictionary failed: {e}")
            finally:
                self._training = False

        self._trainer = _Thread(target=train, name="eventlog-train-dict", daemon=True)
        self._trainer.start()

    def close(self) -> None:
        """Close the environment. Later calls raise :class:`ClosedError`.

        Never under a transaction of this process: closing LMDB's descriptors while another
        thread is inside a commit is undefined (a descriptor number reused meanwhile gets the
        commit's pages). Appends queued but not yet being committed raise ClosedError (nothing
        written); the group being committed and any other write or read transaction finish
        first, then the environment closes."""
        if self._closed:
            return
        try:
            self._close()
        finally:
            self.gone.set()

    def _close(self) -> None:
        self._stopping.set()
        if not self._forked and self._pid == os.getpid():
            me = threading.current_thread()
            for thread in (self._trainer, self._sweeper):  # no thread outlives the last handle
                if thread is not None and thread is not me and thread.is_alive():
                    thread.join(5.0)
        with self._mu:
            self._closing = True  # appends from now on are refused, queued ones fail uncommitted
        with self._appended:
            while True:
                with self._mu:
                    if not self._leader and not self._queue:
                        break
                self._appended.wait(0.05)
        with self._writer_mu:  # no write transaction of this process is open (erase, compaction, ...)
            with self._rcv:
                self._closed = True  # read transactions from now on are refused
                while self._readers:
                    self._rcv.wait()
            with self._sweep_lock:
                if not self._forked and self._pid == os.getpid():
                    self._lock_map = None
                    self._env.close()
                if self._writer_fd is not None:
                    os.close(self._writer_fd)  # our own flock file, never a database file
                    self._writer_fd = None
                if self._aware_fd is not None:
                    os.close(self._aware_fd)
                    self._aware_fd = None
        with self._appended:
            self._appended.notify_all()

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
            if self._closed:  # checked with the count: close() waits for the readers it counts
                raise ClosedError("the event log is closed")
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
                except lmdb.Error:
                    # A lock table overwritten in place reads as "Invalid argument": replace it
                    # (no transaction of ours may be open meanwhile) and try again, once.
                    if attempt == 2 or not self._lock_table_garbage():
                        raise
                    with self._rcv:
                        self._readers -= 1
                    try:
                        self._recover_lock_table()
                    finally:
                        with self._rcv:
                            self._readers += 1
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
            while self._resizing:  # one exclusive section at a time: two would both see no reader
                self._rcv.wait()
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

    def append(self, events: Iterable[Any], expected_version: int | None = None, *,
               expected_head: int | None = None) -> list[int]:
        """Append ``events`` atomically and return their seqs.

        Each event is ``{"type", "session"?, "data", "id"?, "v"?}``. The batch is all or nothing.
        ``expected_version``: the number of events the caller believes the (single) session
        stream of this batch holds; a mismatch raises :class:`ConcurrencyError` and writes
        nothing. ``expected_head``: the seq the caller believes the log ends at (its events
        would follow it); checked inside the write transaction, a mismatch raises
        :class:`HeadMovedError` and writes nothing — for a caller whose events were derived from
        a read model of the whole log at that seq (a read transaction can see an older head
        than a writer does: a process killed inside its commit leaves its last event readable
        only once the next writer has recovered LMDB's lock). An event whose id is already
        stored with the same content is not written again: its original seq is returned. The
        same id with other content raises :class:`DuplicateEventError`. Returns only once the events are durable under the
        log's durability. Invalid input raises :class:`ValidationError` naming the field.
        """
        self._check()
        items = prepare_batch(events, expected_version)
        if not items:
            return []
        log_damage.refuse_if_damaged(self, "append refused")  # a known broken chain takes no more events
        payloads = [self.compression.compress(it.data_bytes) for it in items] if self.format == FORMAT_2 else None
        req = _Request(items, payloads, expected_version, expected_head)
        with self._mu:
            if self._closing:
                raise ClosedError("the event log is closed")
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
            if self._closing:  # close() is waiting for the queue: these were never begun
                for r in group:
                    r.seqs, r.error = [], ClosedError("the event log was closed before this append was committed")
            else:
                try:
                    self._commit_group(group)
                except BaseException as e:
                    # KeyboardInterrupt or SystemExit (a signal handler) in the thread leading the
                    # group: its other callers would have returned the seqs their events were
                    # given before the commit, as if stored (second-round audit, helper-57, found
                    # on the PostgreSQL log's group commit of the same shape).
                    for r in group:
                        r.seqs, r.error = [], interrupted(str(self.path), e, r.items)
                    raise
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
        try:
            with self._writing(follow=False):
                self._commit_group_locked(group)
        except Exception as e:  # the lock or the upgrade failed: every caller of the group hears it
            err = e if isinstance(e, EventLogError) else (
                storage_error(e, "append failed", self.path) if isinstance(e, lmdb.Error)
                else StorageError(f"append failed: {e!r}"))
            if err is not e:
                err.__cause__ = e
            for r in group:
                r.seqs, r.error = [], err

    def _commit_group_locked(self, group: list[_Request]) -> None:
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
        # The group's rows go in with one putmulti per table at the end: py-lmdb releases the
        # GIL around every call (and every row of a putmulti), and with other threads busy each
        # release makes this thread -- which holds the write lock -- wait for it back; a
        # putmulti row costs a quarter of a put's wait (docs/ADAPTERS.md), other calls are few.
        env = self._env
        txn = env.begin(write=True)
        try:
            if self._lock_replaced():  # removed after the check: retry the group on the new table
                raise _LockReplaced()
            head = txn.get(b"head", db=self._meta)
            start = key_seq(head[:_SEQ]) if head else 0
            seq, prev = (start, head[_SEQ:].hex()) if head else (0, codec.ZERO_HASH)
            if head != self._versions_head or len(self._versions) > VERSIONS_KEPT:
                self._versions.clear()
                self._versions_head = head
            pending = _Pending()
            if head is None or head != self._claim_head:
                found_claim = txn.get(b"idclaim", db=self._meta)
                self._claim, self._claim_head = (int(found_claim) if found_claim else 0), head
            claim = pending.claim = self._claim
            ids_cur = txn.cursor(db=self._ids)
            stream_cur = txn.cursor(db=self._streams)
            ev_cur = txn.cursor(db=self._events)
            newer = 0
            now = time.monotonic()
            if self.format == FORMAT_2 and now - self._zdict_checked >= ZDICT_CHECK_S:
                self._zdict_checked = now
                current = txn.get(b"zdict", db=self._meta)  # another process trained one: use it next time
                if current is not None and int(current) != self.compression.current:
                    newer = int(current)
            for r in group:
                if (r.payloads is None and self.format == FORMAT_2) or (
                        r.payloads is not None and any(d and d != self.compression.current for _, d, _ in r.payloads)):
                    # prepared before a compaction migrated the log to format 2, or compressed
                    # before one retired that dictionary (this env is the new one)
                    r.payloads = [self.compression.compress(it.data_bytes) for it in r.items]
                fresh = self._plan(r, txn, ids_cur, stream_cur, pending, seq)
                for i, it in fresh:
                    seq += 1
                    ts = time.time_ns()
                    if not it.caller_id:
                        it, ts = self._derive(it, seq, ts, ids_cur, pending)
                    raw, digest = codec.seal(it, seq, ts, prev)
                    if r.payloads is not None:
                        c, d, payload = r.payloads[i]
                        raw = stored.pack_parts(it.type, it.v, it.session, it.id, ts, prev, digest, c, d, payload)
                    pending.add(seq_key(seq), raw, it.id.encode(), it.session, row=it.caller_id)
                    prev = digest
                    r.seqs[i] = seq
            if seq == start:
                txn.abort()  # refusals and replays write nothing, not even the head
                return
            n = len(pending.events)
            if ev_cur.putmulti(pending.events, append=True)[1] != n:
                raise StorageError(f"seqs {start + 1}..{seq} could not be appended (key out of order)")
            if pending.ids and ids_cur.putmulti(pending.ids, overwrite=False)[1] != len(pending.ids):
                raise StorageError("an event id appeared twice inside one transaction")
            if pending.claim != claim:
                txn.put(b"idclaim", b"%d" % pending.claim, db=self._meta)
            if pending.streams and stream_cur.putmulti(pending.streams)[1] != len(pending.streams):
                raise StorageError(f"the stream index refused seqs {start + 1}..{seq}")
            new_head = seq_key(seq) + bytes.fromhex(prev)
            txn.put(b"head", new_head, db=self._meta)
            txn.commit()
        except BaseException:
            txn.abort()
            raise
        for stream, n in pending.added.items():
            if stream in self._versions:
                self._versions[stream] += n
        self._versions_head = self._claim_head = new_head
        self._claim = pending.claim
        self.commits += 1
        if newer:
            self._adopt_dict(newer)
        self._maybe_train(seq)

    def _lock_replaced(self) -> bool:
        """True when the environment this process has open is no longer the log's: lock.mdb was
        deleted or replaced, or a compaction moved the log to another generation."""
        # Only os.stat/readlink: opening and closing lock.mdb would cancel LMDB's own fcntl locks.
        # Every append asks: plain strings first, the Path-level check only when they differ.
        try:
            target: str | None = os.readlink(self._current_link)
        except FileNotFoundError:
            target = None
        except OSError:
            target = ""  # not a link: generation_dir below says what is wrong
        if target != self._current_target and generation_dir(self.path) != self.env_dir:
            return True
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
        if not os.path.isdir(self.path):
            # The whole log is gone, not its lock file: no reopen can find it. Each call said
            # "lock.mdb was deleted or replaced; reopening" and failed to open, and the calls
            # after it met a closed environment (outside audit, helper-54).
            raise StorageError(f"the log at {self.path} is gone: its directory was removed while it was open",
                               hint="the profile's files were deleted: restore its log/ from a backup; this handle "
                                    "can neither read nor write it")
        # The reopen holds the writer mutex: py-lmdb's close() waits for a write transaction
        # open in another thread, and a compaction moves ``current`` while it still holds its
        # own (a reader closing then hung). Threads that see the change together reopen one
        # after the other: the second finds the new environment in place and leaves it alone.
        with self._writer_mu:
            with self._exclusive():
                if not self._lock_replaced():
                    return
                if generation_dir(self.path) == self.env_dir:
                    log_warn(f"{self._lock_path} was deleted or replaced; reopening the log on the current lock file")
                with self._sweep_lock:
                    self._lock_map = None
                    self._env.close()
                    self._open_current(self._env_readonly)
            self._init_meta(self.profile)  # a compaction may have migrated the format

    def _plan(
        self,
        r: _Request,
        txn: lmdb.Transaction,
        ids_cur: lmdb.Cursor,
        stream_cur: lmdb.Cursor,
        pending: _Pending,
        last: int,
    ) -> list[tuple[int, codec.Prepared]]:
        """Decide what of request ``r`` to write, as ``(input index, event)`` pairs.

        Sets ``r.seqs`` (one slot per input event, stored seqs already filled in for replayed
        ids) or ``r.error``; returns ``[]`` when nothing is to be written. ``pending``: what
        earlier requests of this group write (not in the tables yet); ``last``: the seq they
        end at. A new caller id of the derived form that names a seq not written yet raises
        ``pending.claim`` to it (see :meth:`_derive`).
        """
        if r.expected_head is not None and r.expected_head != last:
            r.seqs, r.error = [], HeadMovedError(r.expected_head, last)
            return []
        r.seqs = [0] * len(r.items)
        fresh: list[tuple[int, codec.Prepared]] = []
        for i, it in enumerate(r.items):
            found: bytes | memoryview | None = None
            if it.caller_id:
                id_key = it.id.encode()
                found = pending.seq_of.get(id_key)
                named = codec.derived_seq(it.id)
                if found is None and named:
                    if named <= last:
                        found = self._derived_at(txn, it.id, named, pending)
                    else:
                        pending.claim = max(pending.claim, named)
                        pending.ahead.add(id_key)  # the rows come later than its own request's events
                if found is None:
                    found = ids_cur.get(id_key)
            if found is None:
                fresh.append((i, it))
                continue
            value = pending.raw_of.get(bytes(found)) or txn.get(found, db=self._events)
            stored_env = self._envelope(key_seq(found), bytes(value)) if value is not None else {}
            if not it.same_content(stored_env):
                r.seqs, r.error = [], DuplicateEventError(it.id, key_seq(found))
                return []
            r.seqs[i] = key_seq(found)
        if fresh and r.expected is not None:
            stream = r.items[0].session
            assert stream is not None
            # The count as of the head this group started from (kept, or looked up: the group's
            # own rows are not in the table yet), plus what earlier requests of the group add.
            base = self._versions.get(stream)
            if base is None:
                if stream_cur.set_key(stream.encode()):
                    first_key = bytes(stream_cur.value())
                    base = stream_cur.count()
                    last_key = bytes(stream_cur.value()) if stream_cur.last_dup() else first_key
                    if self._is_erased(txn, first_key) and self._is_erased(txn, last_key):
                        # An erased stream (its first and last events are stubs) is not the stream
                        # the caller counted, though an erase changes no count: refused (not
                        # cached: the next append asks again).
                        r.seqs, r.error = [], ConcurrencyError(stream, r.expected, base)
                        return []
                else:
                    base = 0
                self._versions[stream] = base
            actual = base + pending.added.get(stream, 0)
            if actual != r.expected:
                r.seqs, r.error = [], ConcurrencyError(stream, r.expected, actual)
                return []
        return fresh

    def _holds_stubs(self, txn: lmdb.Transaction) -> bool:
        """Whether any event of the log is an erased one (one pass over the stored values' first
        bytes; a first-format value is looked at as text)."""
        kind = bytes((stored.KIND_ERASED,))
        for value in txn.cursor(db=self._events).iternext(keys=False, values=True):
            head = bytes(value[:1])
            if head == kind or (head == b"{" and b'"erased":true' in bytes(value)):
                return True
        return False

    def _is_erased(self, txn: lmdb.Transaction, key: bytes) -> bool:
        """Whether the event at ``key`` is an erased one (a stub)."""
        value = txn.get(key, db=self._events)
        if value is None:
            return False
        if self.format == FORMAT_2:
            return bytes(value[:1]) == bytes((stored.KIND_ERASED,))
        try:
            return codec.is_stub(codec.decode(bytes(value)))
        except ValueError:
            return False

    def _derive(self, it: codec.Prepared, seq: int, ts: int, ids_cur: lmdb.Cursor,
                pending: _Pending) -> tuple[codec.Prepared, int]:
        """Event ``it`` (appended without an id) under the id derived from ``seq`` and ``ts``,
        and that ts. Up to ``pending.claim`` a caller may have taken the same id (its index row
        says so, or ``pending.ahead`` when it is written in this group, maybe later in the same
        request): then the next nanosecond's, which is the event's ts too."""
        eid = codec.derived_id(ts, seq)
        while seq <= pending.claim and (eid.encode() in pending.ahead or ids_cur.get(eid.encode()) is not None):
            ts += 1
            eid = codec.derived_id(ts, seq)
        return it.with_id(eid), ts

    def _derived_at(self, txn: lmdb.Transaction, eid: str, seq: int,
                    pending: _Pending | None = None) -> bytes | None:
        """The key of event ``seq`` (written, or earlier in this group) when its id is ``eid``."""
        key = seq_key(seq)
        value: bytes | memoryview | None = None if pending is None else pending.raw_of.get(key)
        if value is None:
            value = txn.get(key, db=self._events)
        return key if value is not None and stored.id_of(bytes(value)) == eid else None

    def erase(self, seqs: Sequence[int], data: dict[str, Any], streams: Sequence[str] = ()) -> int:
        """Replace the events at ``seqs`` (and every event of ``streams``) by their erased form
        and append the ``log.erased`` record, in one write transaction; returns its seq (0: every
        seq was erased already). The replaced values' bytes stay in pages LMDB freed:
        :meth:`compact` removes them."""
        self._check()
        wanted = check_erase_seqs(seqs)
        with self._writing():
            txn = self._begin_write()
            try:
                if streams:  # read here, under the write lock: nothing appended since is left out
                    more, cur = set(wanted), txn.cursor(db=self._streams)
                    for name in streams:
                        if cur.set_key(str(name).encode()):
                            more.update(key_seq(bytes(k)) for k in cur.iternext_dup())
                    wanted = sorted(more)
                def envelope_at(q: int) -> dict[str, Any] | None:
                    value = txn.get(seq_key(q), db=self._events)
                    return None if value is None else self._envelope(q, bytes(value))

                kept = erasable(wanted, envelope_at, lambda env: (env["seq"], env["hash"], self._stub_value(env)))
                listed: list[list[Any]] = [[q, digest] for q, digest, _ in kept]
                stubs = [(seq_key(q), stub) for q, _, stub in kept]
                del kept
                if not listed:
                    txn.abort()
                    return 0
                p = codec.prepare(erase_event(listed, data), log_type=True)
                head = txn.get(b"head", db=self._meta)
                start, prev = (key_seq(head[:_SEQ]), bytes(head[_SEQ:]).hex()) if head else (0, codec.ZERO_HASH)
                seq, ts = start + 1, time.time_ns()
                raw, digest = codec.seal(p, seq, ts, prev)
                if self.format == FORMAT_2:
                    c, d, payload = self.compression.compress(p.data_bytes)
                    raw = stored.pack_parts(p.type, p.v, p.session, p.id, ts, prev, digest, c, d, payload)
                key = seq_key(seq)
                if not txn.put(key, raw, db=self._events, append=True):
                    raise StorageError(f"seq {seq} could not be appended (key out of order)")
                txn.put(p.id.encode(), key, db=self._ids, overwrite=False)
                for k, v in stubs:
                    txn.put(k, v, db=self._events)
                txn.put(b"head", key + bytes.fromhex(digest), db=self._meta)
                txn.put(b"erased", b"%d" % seq, db=self._meta)  # the erase mark (see erase_mark)
                txn.put(ERASE_PENDING, b"%d" % seq, db=self._meta)  # until the files are clean
                self._taint_dicts(txn, [q for q, _ in listed])
                txn.commit()
            except lmdb.Error as e:
                txn.abort()
                raise storage_error(e, "erase failed", self.path) from e
            except BaseException:
                txn.abort()
                raise
        self.commits += 1
        with self._appended:
            self._appended.notify_all()
        return seq

    def _dict_ids(self, txn: lmdb.Transaction) -> list[int]:
        """The ids of the compression dictionaries stored in the log (``zdict:<id>`` rows)."""
        ids, cur = [], txn.cursor(db=self._meta)
        more = cur.set_range(b"zdict:")
        while more and cur.key()[:6] == b"zdict:":
            name = bytes(cur.key())[6:]
            if name.isdigit():
                ids.append(int(name))
            more = cur.next()
        return ids

    def _unaware_pids(self) -> list[int]:
        """Processes (pids) with this log open that do not hold the shared flock of
        :data:`RETIRE_AWARE_LOCK` — an earlier version's — other than this one; ``[-1]`` when
        that cannot be known (no /proc/locks). LMDB holds a POSIX lock on lock.mdb at the byte
        of each process's pid for as long as it has the environment open."""
        try:
            env_ino = os.stat(self.env_dir / "lock.mdb").st_ino
            aware_ino = os.stat(self.path / RETIRE_AWARE_LOCK).st_ino
            with open("/proc/locks", encoding="ascii", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return [-1]
        opened, aware = set(), set()
        for line in lines:
            parts = line.split()
            if len(parts) < 6 or parts[1] == "->":
                continue
            try:
                pid, ino = int(parts[4]), int(parts[5].rsplit(":", 1)[1])
            except (ValueError, IndexError):
                continue
            if ino == env_ino and parts[1] == "POSIX":
                opened.add(pid)
            elif ino == aware_ino and parts[1] == "FLOCK":
                aware.add(pid)
        return sorted(opened - aware - {os.getpid()})

    def _taint_dicts(self, txn: lmdb.Transaction, erased: list[int]) -> None:
        """Mark every dictionary that may have learnt from an erased event: its training samples'
        seq range holds one (a dictionary keeps fragments of what it was trained on), or it
        predates recording its range. The compaction an erase runs re-encodes the events that
        use it with a new dictionary and drops it, so no file keeps the erased text."""
        for dict_id in self._dict_ids(txn):
            found = txn.get(b"zdict:%d:range" % dict_id, db=self._meta)
            lo, hi = _DICT_RANGE.unpack(bytes(found)) if found is not None else (1, 2**63)
            if any(lo <= q <= hi for q in erased):
                txn.put(b"zdict:%d:tainted" % dict_id, b"1", db=self._meta)

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
        log_damage.refuse_if_damaged(self, "import refused")
        # LMDB's write lock serializes this transaction with group-commit leaders.
        try:
            with self._writing():
                for attempt in range(8):
                    try:
                        with self._begin_write() as txn:
                            self._put_sealed(txn, raws)
                        break
                    except lmdb.MapFullError:
                        if attempt == 7:
                            raise
                        self._grow_map()  # as an append does: no transaction of this process is open
        except lmdb.Error as e:
            raise storage_error(e, "import failed") from e
        with self._appended:
            self._appended.notify_all()
        return len(raws)

    def _put_sealed(self, txn: lmdb.Transaction, raws: Sequence[bytes]) -> None:
        """Write ``raws`` (see :meth:`append_sealed`) in the write transaction ``txn``."""
        head = txn.get(b"head", db=self._meta)
        seq, prev = (key_seq(head[:_SEQ]), head[_SEQ:].hex()) if head else (0, codec.ZERO_HASH)
        ids, streams, evs = (txn.cursor(db=d) for d in (self._ids, self._streams, self._events))
        claim = 0  # the highest seq not yet written that an imported id of the derived form names
        records: list[dict[str, Any]] = []
        for raw in raws:
            env = check_sealed(raw, seq + 1, prev)
            seq += 1
            if env.get("type") == codec.ERASED_TYPE:
                records.append(env)
            key = seq_key(seq)
            if self.format != FORMAT_2:
                value = bytes(raw)
            else:
                value = stored.pack_sealed(seq, env, raw, self.compression)
            if not evs.put(key, value, append=True):
                raise IntegrityError(f"seq {seq} could not be appended (key out of order)")
            eid = env["id"]
            if not self._sealed_id(txn, ids, eid, seq):
                raise IntegrityError(f"imported event {seq} has an already used id {eid!r}")
            claim = max(claim, codec.derived_seq(eid))
            if (session := env.get("session")) is not None:
                streams.put(session.encode(), key)
            prev = env["hash"]
        if claim > seq:
            found_claim = txn.get(b"idclaim", db=self._meta)
            if claim > (int(found_claim) if found_claim else 0):
                txn.put(b"idclaim", b"%d" % claim, db=self._meta)
        txn.put(b"head", seq_key(seq) + bytes.fromhex(prev), db=self._meta)
        if records:
            self._erase_imported(txn, records)

    def _erase_imported(self, txn: lmdb.Transaction, records: list[dict[str, Any]]) -> None:
        """Replace the events that imported erase ``records`` name and this log held before the
        import (see :func:`eventlog.log.base.named_unerased`) by their stubs, as :meth:`erase`
        does, in the import's transaction; the compaction and purge are then pending."""
        def envelope_at(q: int) -> dict[str, Any] | None:
            value = txn.get(seq_key(q), db=self._events)
            return None if value is None else self._envelope(q, bytes(value))

        last = max(int(r["seq"]) for r in records)
        txn.put(b"erased", b"%d" % last, db=self._meta)  # the erase mark (see erase_mark)
        envs = named_unerased(records, envelope_at)
        if not envs:
            return
        for env in envs:
            txn.put(seq_key(env["seq"]), self._stub_value(env), db=self._events)
        txn.put(ERASE_PENDING, b"%d" % last, db=self._meta)  # until the files are clean
        self._taint_dicts(txn, [env["seq"] for env in envs])

    def _stub_value(self, env: dict[str, Any]) -> bytes:
        """The stored value of ``env``'s stub in this log's format."""
        stub = codec.stub(env)
        return stored.pack_stub(stub) if self.format == FORMAT_2 else codec.canonical(stub)

    def _sealed_id(self, txn: lmdb.Transaction, ids: lmdb.Cursor, eid: str, seq: int) -> bool:
        """Index the id ``eid`` of imported event ``seq``; False when another event has it."""
        key, named = eid.encode(), codec.derived_seq(eid)
        if named == seq:  # derived from its own seq: found there, no row (unless a caller took it)
            return ids.get(key) is None
        if named and named < seq and self._derived_at(txn, eid, named) is not None:
            return False
        return bool(ids.put(key, seq_key(seq), overwrite=False))

    def event_seq(self, event_id: str) -> int | None:
        """The seq of the event with id ``event_id``, or None."""
        named = codec.derived_seq(event_id)
        key = _lookup_key(event_id)
        if key is None:
            return None
        with self._read() as txn:
            found: bytes | memoryview | None = self._derived_at(txn, event_id, named) if named else None
            if found is None:
                found = txn.get(key, db=self._ids)
        return None if found is None else key_seq(found)

    # ---------------------------------------------------------------- reads

    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last event; ``(0, 64 zeros)`` for an empty log.

        A writer killed inside its commit, after its meta page reached the file but before it
        told the lock table, leaves that commit invisible to read transactions until the next
        writer has recovered LMDB's lock (a third of SIGKILLs of a busy writer, measured) — yet
        durable, and seen by every writer. Deciding on a head one event short (a title another
        session already took, a message id) would acknowledge writes the fold then drops, so when
        the newest meta page is ahead of two read transactions in a row and the writer lock is
        free (its holder is dead), this recovers the lock (a write transaction begun and
        aborted) and reads again."""
        for attempt in range(3):
            with self._read() as txn:
                raw = txn.get(b"head", db=self._meta)
                seen = txn.id()
                newest = self._env.info()["last_txnid"]  # inside the read: close() waits for it
            if attempt == 2 or newest <= seen:
                break
            if attempt == 1 and not self.readonly:
                self._recover_dead_writer()
        if not raw:
            return 0, codec.ZERO_HASH
        return key_seq(raw[:_SEQ]), raw[_SEQ:].hex()

    def _recover_dead_writer(self) -> None:
        """Take LMDB's write lock once (begin a write transaction, abort it): a writer that died
        holding it is recovered, and its last commit becomes what read transactions see. Never
        waits: when the writer lock is held, its holder is alive (a dead process's flock is
        released with it) — perhaps stopped inside its commit, which then is not acknowledged
        yet — and the read stands (a reader never waits for a writer)."""
        if not self._writer_mu.acquire(blocking=False):
            return
        try:
            fd = self._writer_lock_fd()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return
            try:
                if self._lock_table_garbage():
                    return
                self._ensure_writable()
                self._begin_write().abort()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._writer_mu.release()

    def hash_at(self, seq: int) -> str | None:
        if seq < 1:
            return None
        with self._read() as txn:
            raw = txn.get(seq_key(seq), db=self._events)
            return None if raw is None else stored.hash_of(bytes(raw))

    def get(self, seq: int) -> dict[str, Any] | None:
        """The envelope at ``seq``, or ``None``."""
        if seq < 1:
            return None
        with self._read() as txn:
            raw = txn.get(seq_key(seq), db=self._events)
            if raw is not None:
                self._know_dicts(txn)
        return None if raw is None else self._envelope(seq, bytes(raw))

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        """Envelopes with ``from_seq <= seq <= to_seq`` in order (``raw=True``: ``(seq, bytes)``).

        Streams in bounded read transactions (:data:`READ_CHUNK` events or :data:`READ_CHUNK_BYTES`), so a long scan
        never pins the pages that writers free meanwhile.
        """
        for s, v in self._stored(from_seq, to_seq):
            yield (s, self._canonical(s, v)) if raw else self._envelope(s, v)

    def _stored(self, from_seq: int, to_seq: int | None) -> Iterator[tuple[int, bytes]]:
        """``(seq, stored value)`` in order, in bounded read transactions (see :meth:`read`)."""
        nxt = max(1, from_seq)
        since_release = 0
        while True:
            chunk: list[tuple[int, bytes]] = []
            chunk_bytes = 0
            with self._read() as txn:
                self._know_dicts(txn)
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
            yield from chunk
            if len(chunk) < READ_CHUNK and chunk_bytes < READ_CHUNK_BYTES:
                return
            nxt = chunk[-1][0] + 1

    def read_checked(self, from_seq: int, to_seq: int, prev: str
                     ) -> Iterator[tuple[int, bytes, dict[str, Any] | None, str | None]]:
        """``(seq, b"", envelope, None)`` for the events ``from_seq..to_seq``, each checked against
        the chain from ``prev`` (the hash of event ``from_seq - 1``) as it is read; at the
        first that fails, ``(seq, b"", None, reason)`` and the end. The caller checks that the seqs
        follow each other (a deleted event is a gap). The judgement of
        :func:`eventlog.log.damage.check_event` on ``read(raw=True)``, without building and
        decoding the canonical bytes of format-2 events (a rebuild spends half its time here)."""
        checked, check_event = stored.checked_envelope, log_damage.check_event
        compression = self.compression
        for seq, value in self._stored(from_seq, to_seq):
            found = checked(seq, value, prev, compression)
            env, reason = check_event(self._canonical(seq, value), seq, prev) if found is None else found
            yield seq, b"", env, reason
            if reason is not None or env is None:
                return
            prev = env["hash"]

    def release_pages(self) -> int:
        """Drop this process's mapping of the log pages it has touched (they stay in the page
        cache). Long scans call it every :data:`RELEASE_EVERY_BYTES`; returns bytes advised."""
        # Under the lock a close or reopen unmaps the file under: between reading where the file
        # is mapped and the madvise, the range could be unmapped and reused for other memory.
        with self._sweep_lock:
            if self._closed or self._forked:
                return 0
            return residency.release(str(self.env_dir / "data.mdb"))

    def _get_raw(self, txn: lmdb.Transaction, key: bytes) -> bytes | None:
        raw = txn.get(key, db=self._events)
        return None if raw is None else bytes(raw)

    def erase_mark(self) -> int:
        """The seq of the last ``log.erased`` record this release wrote (0: none)."""
        with self._read() as txn:
            raw = txn.get(b"erased", db=self._meta)
        return int(raw) if raw else 0

    def erase_pending(self) -> int:
        """The seq of an erase whose compaction and projection purge have not been confirmed
        done (0: none)."""
        with self._read() as txn:
            raw = txn.get(ERASE_PENDING, db=self._meta)
        return int(raw) if raw else 0

    def erase_finished(self, seq: int) -> None:
        """Forget the pending erase ``seq`` (a later erase's stays pending)."""
        with self._writing(), self._begin_write() as txn:
            if txn.get(ERASE_PENDING, db=self._meta) == b"%d" % seq:
                txn.delete(ERASE_PENDING, db=self._meta)

    def stream_version(self, session: str) -> int:
        """The number of events in ``session``'s stream (0 for an unknown session)."""
        key = _lookup_key(session)
        if key is None:
            return 0
        with self._read() as txn:
            cur = txn.cursor(db=self._streams)
            return cur.count() if cur.set_key(key) else 0

    def stream_state(self, session: str) -> tuple[int, int]:
        """``(stream_version(session), erase_mark())`` from one read transaction."""
        key = _lookup_key(session)
        with self._read() as txn:
            raw = txn.get(b"erased", db=self._meta)
            cur = txn.cursor(db=self._streams)
            version = cur.count() if key is not None and cur.set_key(key) else 0
        return version, int(raw) if raw else 0

    def read_session(self, session: str, *, after: int = 0) -> Iterator[dict[str, Any]]:
        """The envelopes of one session stream with ``seq > after``, in seq order, in bounded
        read transactions."""
        key = _lookup_key(session)
        while key is not None:
            chunk: list[tuple[int, bytes | None]] = []
            with self._read() as txn:
                self._know_dicts(txn)
                cur = txn.cursor(db=self._streams)
                found = cur.set_range_dup(key, seq_key(after + 1)) if after else cur.set_key(key)
                if found:
                    seqs = []
                    for v in cur.iternext_dup():
                        seqs.append(bytes(v))
                        if len(seqs) >= READ_CHUNK:
                            break
                    chunk = [(key_seq(k), self._get_raw(txn, k)) for k in seqs]
                    if seqs:
                        after = key_seq(seqs[-1])
            for seq, raw in chunk:
                if raw is not None:
                    yield self._envelope(seq, raw)
            if len(chunk) < READ_CHUNK:
                return

    def wait_appended(self, seconds: float) -> None:
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
        return f"_Environment({str(self.path)!r}, durability={self.durability!r}, refs={self.refs})"


def _denied_log(p: Path, readonly: bool, create: bool) -> StorageError | None:
    """What LMDB's 'Permission denied' opening the environment at ``p`` was about: its lock table
    (which every reader writes), its data file, or the folder (:class:`PermissionDeniedError`
    naming the file and the remedy), or None when none of them refuses now."""
    for name, write in (("lock.mdb", True), ("data.mdb", not readonly)):
        if os.path.lexists(p / name):
            found = access_problem(p / name, write=write)
            if found is not None:
                break
    else:
        found = access_problem(p, write=create and not readonly)
    if found is None:
        return None
    part, what, hint = found
    if part.name == "lock.mdb":
        what += " (LMDB's reader table: a reader of the log writes it too)"
    return PermissionDeniedError(f"cannot open log at {p}: {what}", hint=hint, path=str(part))


def _compaction_error(e: lmdb.Error | OSError, path: Path) -> StorageError:
    """The error of a compaction that failed before ``current`` moved (nothing was changed)."""
    if isinstance(e, lmdb.Error):
        return storage_error(e, "compacting the log failed, nothing was changed", path)
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return DiskFullError(f"compacting the log failed, nothing was changed: {e.strerror}",
                             hint="free disk space (a compaction needs room for a copy of the live log), then retry")
    return StorageError(f"compacting the log failed, nothing was changed: {e}",
                        hint="check the owner and permissions of the profile's log/ directory")


def _lookup_key(text: str) -> bytes | None:
    """``text`` as a key of the ``ids`` or ``streams`` table, or None when no key can be it
    (LMDB keys are 1-511 bytes; every stored id and stream id is 1-128 characters)."""
    key = text.encode()
    return key if 0 < len(key) <= _MAX_KEY else None


_MAX_KEY = 511


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _hold_shared(path: Path) -> int | None:
    """A shared flock on ``path`` (created 0600), held until the descriptor is closed; None when the
    file cannot be made (a read-only log: this process then counts as unaware, which only delays
    a dictionary's retirement)."""
    try:
        fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def verify_environment(env_dir: Path) -> VerifyResult:
    """Verify the chain of a log environment nothing else has open (a fresh compacted copy)."""
    env = lmdb.open(str(env_dir), max_dbs=8, readonly=True, lock=False, subdir=True)
    try:
        events, meta = env.open_db(b"events"), env.open_db(b"meta")

        def load(dict_id: int) -> bytes | None:
            with env.begin() as txn:
                raw = txn.get(b"zdict:%d" % dict_id, db=meta)
            return None if raw is None else bytes(raw)

        compression = stored.Compression(load)

        def canonical(nxt: int = 1) -> Iterator[tuple[int, bytes]]:
            while True:
                chunk: list[tuple[int, bytes]] = []
                with env.begin() as txn:
                    cur = txn.cursor(db=events)
                    if cur.set_range(seq_key(nxt)):
                        for k, v in cur:
                            chunk.append((key_seq(k), bytes(v)))
                            if len(chunk) >= READ_CHUNK:
                                break
                for seq, value in chunk:
                    try:
                        yield seq, stored.canonical_bytes(seq, value, compression)
                    except ValueError:
                        yield seq, value
                if len(chunk) < READ_CHUNK:
                    return
                nxt = chunk[-1][0] + 1

        def head() -> tuple[int, str]:
            with env.begin() as txn:
                raw = txn.get(b"head", db=meta)
            return (key_seq(raw[:_SEQ]), bytes(raw[_SEQ:]).hex()) if raw else (0, codec.ZERO_HASH)

        return verify_chain(canonical(), head, canonical)
    finally:
        env.close()


_open_envs: dict[str, _Environment] = {}
_open_envs_lock = threading.RLock()
"""Re-entrant: a garbage collection inside an open may run a finalizer that closes another handle."""


class EventLog(LogBase):
    """An append-only, hash-chained event log in one LMDB environment.

    Open with :meth:`open`; use as a context manager or call :meth:`close`. Thread-safe. Any
    number of handles may be open on one log in one process: they share one environment (and
    its group commit); each handle closes independently, and the environment closes with the
    last one. A handle used after its own ``close()`` raises :class:`ClosedError`.
    Not usable across ``fork()``: the child must open its own (raises
    :class:`ForkedEnvironmentError` otherwise).
    """

    def __init__(self, core: _Environment, profile: str | None, readonly: bool) -> None:
        self._core = core
        self.path: Path = core.path
        self.profile = profile if profile is not None else core.profile
        self.durability = core.durability
        self.readonly = readonly
        self._closed = False

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
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
    ) -> "EventLog":
        """Open (creating if needed) the log at directory ``path``.

        Opening never waits for a writer: an existing log is opened read-only and becomes
        writable at the first append. An append waits at most ``lock_timeout`` seconds for
        another process's write to finish, then raises :class:`WriterBusyError` naming that
        process (nothing is written). ``readonly=True``: appends raise :class:`StorageError`.

        ``durability="sync"`` (default): an append returns after its events are on disk and
        survive an OS crash or power loss. ``"nosync"``: survives a crash of the process only.
        A log already open in this process is shared: a weaker durability than the open one
        gets the stronger; a stronger one raises :class:`ValidationError` (close the other
        handles first). Raises :class:`StorageError` (with a hint) when the directory is unusable.
        """
        if durability not in DURABILITIES:
            raise ValidationError("durability", f"must be one of {DURABILITIES}")
        if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
            raise ValidationError("path", f"must be the path of a log directory, got {type(path).__name__}")
        if not str(os.fspath(path)).strip() or "\0" in str(os.fspath(path)):
            raise ValidationError("path", "is empty or holds a NUL character: give the log's directory")
        path_text(path, "path")
        for name, value, low in (("map_size", map_size, 1), ("max_readers", max_readers, 1),
                                 ("lock_timeout", lock_timeout, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low \
                    or (name != "lock_timeout" and (not isinstance(value, int) or value >= 1 << 63)):
                raise ValidationError(name, f"must be a number of at least {low}, got {value!r}")
        p = Path(path)
        refuse_network(p)  # never on NFS, SMB, sshfs, ... (eventlog.log.filesystem)
        if not readonly:
            try:
                make_dir(p)
            except PermissionError as e:
                raise denied(e, f"cannot create the log directory {p}") from e
            except OSError as e:
                raise StorageError(f"cannot create the log directory {p}: {e.strerror}",
                                   hint="check that the home directory is writable") from e
        key = os.path.realpath(p)
        while True:
            with _open_envs_lock:
                core = _open_envs.get(key)
                if core is not None and core.retiring and core._pid == os.getpid():
                    retiring = core  # waited for below, without the registry's lock
                else:
                    if core is not None and core._pid != os.getpid() and not core._closed:
                        raise ForkedEnvironmentError(p)
                    if core is not None and core.usable:
                        if durability == "sync" and core.durability != "sync":
                            raise ValidationError("durability", "this log is already open in this process with "
                                                  f"durability {core.durability!r}; close those handles to open it "
                                                  "with 'sync'")
                        if not readonly and core.readonly:
                            raise ValidationError("readonly", "this log is already open read-only in this process; "
                                                  "close those handles to open it for writing")
                        core.refs += 1
                    else:
                        try:
                            core = _open_envs[key] = _Environment(p, durability, profile, map_size, max_readers,
                                                                  readonly, lock_timeout)
                        except PermissionError as e:  # a file or folder of the log another user owns
                            raise denied(e, f"cannot open log at {p}", write=not readonly) from e
                    break
            # Another thread is closing this log's environment (it waits for the commits and reads
            # under way): a second one opened meanwhile would hold LMDB's files twice in one
            # process, which LMDB forbids. Wait for that close, then open anew.
            retiring.gone.wait(1.0)
        return cls(core, profile, readonly)

    def close(self) -> None:
        """Release this handle (idempotent); the environment closes with the last handle."""
        with _open_envs_lock:
            if self._closed:
                return
            self._closed = True
            core = self._core
            core.refs -= 1
            if core.refs > 0:
                return
            core.retiring = True  # no open reuses it; one that comes now waits for the close below
        try:
            core.close()
        finally:
            with _open_envs_lock:
                for key, found in list(_open_envs.items()):
                    if found is core:
                        del _open_envs[key]

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> _Environment:
        if self._closed:
            raise ClosedError("this event log handle is closed", hint="open the log again")
        return self._core

    def append(self, events: Iterable[Any], expected_version: int | None = None, *,
               expected_head: int | None = None) -> list[int]:
        """Append ``events`` atomically and return their seqs (see :meth:`eventlog.log.Log.append`;
        ``expected_head``, this backend's own: see :meth:`_Environment.append`)."""
        core = self._live()
        self._check_writable()
        return core.append(events, expected_version, expected_head=expected_head)

    def append_sealed(self, raws: Sequence[bytes]) -> int:
        """Append already-sealed events verbatim (see :meth:`_Environment.append_sealed`)."""
        core = self._live()
        self._check_writable()
        return core.append_sealed(raws)

    def _check_writable(self) -> None:
        if self.readonly:
            raise StorageError("this event log was opened read-only", hint="open it without readonly=True to append")

    def head(self) -> tuple[int, str]:
        return self._live().head()

    def get(self, seq: int) -> dict[str, Any] | None:
        return self._live().get(seq_arg(seq, "seq"))

    def hash_at(self, seq: int) -> str | None:
        """The hash recorded by the event at ``seq`` (None when there is none), read from its
        header without decoding its data."""
        return self._live().hash_at(seq_arg(seq, "seq"))

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        core = self._live()
        for item in core.read(seq_arg(from_seq, "from_seq"), seq_arg(to_seq, "to_seq", optional=True), raw=raw):
            if self._closed:
                raise ClosedError("this event log handle is closed", hint="open the log again")
            yield item

    def read_checked(self, from_seq: int, to_seq: int, prev: str
                     ) -> Iterator[tuple[int, bytes, dict[str, Any] | None, str | None]]:
        """Events checked against the chain as they are decoded (see
        :class:`eventlog.log.damage.Verified`, which calls it)."""
        core = self._live()
        for item in core.read_checked(from_seq, to_seq, prev):
            if self._closed:
                raise ClosedError("this event log handle is closed", hint="open the log again")
            yield item

    def read_session(self, session_id: str, *, after: int = 0) -> Iterator[dict[str, Any]]:
        return self._live().read_session(str_arg(session_id, "session_id"), after=max(0, seq_arg(after, "after")))

    def stream_version(self, session: str) -> int:
        return self._live().stream_version(str_arg(session, "session"))

    def stream_state(self, session: str) -> tuple[int, int]:
        """``(stream_version(session), erase_mark())`` as of one snapshot."""
        return self._live().stream_state(str_arg(session, "session"))

    def erase_pending(self) -> int:
        """The seq of the last erase whose log compaction and projection purge were not
        confirmed finished (0: none) — a process killed between the erase's commit and the end
        of its cleanup. :meth:`eventlog.sessions.SessionStore.finish_erase` (and a retried erase
        or ``compact``) finishes it; ``doctor`` reports it."""
        return self._live().erase_pending()

    def erase_finished(self, seq: int) -> None:
        """Record that the cleanup of erase ``seq`` is done (the log compacted after it and
        the projections purged)."""
        self._check_writable()
        self._live().erase_finished(seq)

    def erase_mark(self) -> int:
        """The seq of the last ``log.erased`` record (0: none; a record written by a release
        before this one is not counted). An erase rewrites events without changing any stream's
        version, so a cache that trusts a stream version also compares this mark."""
        return self._live().erase_mark()

    def event_seq(self, event_id: str) -> int | None:
        return self._live().event_seq(str_arg(event_id, "event_id"))

    def _wait_appended(self, seconds: float) -> None:
        self._live().wait_appended(seconds)

    def size_bytes(self) -> int:
        """Bytes used by the log's data file (pages in use, not the sparse map size)."""
        return self._live().size_bytes()

    def reader_check(self) -> int:
        """Clear reader slots of dead processes; returns how many were cleared."""
        return self._live().reader_check()

    def release_pages(self) -> int:
        """Drop this process's mapping of the log pages it has touched (see :mod:`eventlog.log.residency`)."""
        return self._live().release_pages()

    def erase(self, seqs: Sequence[int], data: dict[str, Any], *, compact: bool = True,
              streams: Sequence[str] = ()) -> int:
        """Erase the content of the events at ``seqs`` and of ``streams`` (see
        :meth:`eventlog.log.Log.erase`), then — unless ``compact=False`` — :meth:`compact` the log
        so no freed page keeps their bytes."""
        core = self._live()
        self._check_writable()
        seq = core.erase(seqs, data, [str_arg(x, "streams") for x in streams])
        if seq and compact:
            self.compact_after_erase()
        return seq

    def compact_after_erase(self) -> bool:
        """:meth:`compact` after an erase; False (with a warning) when a process of an earlier
        release stops it (:class:`EarlierProcessError`): the erase is recorded and its content
        gone from every read of this release, but the log's free pages keep it, and the log records the erase as
        pending (``doctor`` says so) until a later ``compact`` or erase finishes it."""
        try:
            self.compact()
        except EarlierProcessError as e:
            log_warn(f"the erase is recorded and its content gone from every read of this release, but the log was "
                     f"not compacted: {e.message}; until `eventlog compact` runs after they stop, its free pages keep "
                     "the erased bytes (and those earlier processes may show the session empty or call the log "
                     "damaged at its first erased event)")
            return False
        return True

    def compact(self) -> dict[str, Any]:
        """Rewrite the log file with only its live pages and switch every process to it
        (``{"bytes_before", "bytes_after", "generation"}``); see :meth:`_Environment.compact`.
        A log with a recorded damage is refused (:class:`IntegrityError`, nothing changed): the
        copy reads every event, the damaged one too (a damaged page aborts the process there)."""
        core = self._live()
        self._check_writable()
        log_damage.refuse_if_damaged(self, "compaction refused")
        return core.compact()

    @property
    def lock_timeout(self) -> float:
        """Seconds an append waits for another process's writer lock before WriterBusyError."""
        return float(self._core.lock_timeout)

    @property
    def commits(self) -> int:
        """Write transactions committed in this log by this process (group commit shares them)."""
        return self._core.commits

    @property
    def env_dir(self) -> Path:
        """The folder of the environment's files (``data.mdb``) this handle reads: ``path`` or
        the generation a compaction made (``path/current`` names it)."""
        return self._core.env_dir

    @property
    def _env(self) -> lmdb.Environment:
        return self._core._env

    @property
    def _readers(self) -> int:
        return self._core._readers

    def __repr__(self) -> str:
        return f"EventLog({str(self.path)!r}, durability={self.durability!r})"


__all__ = ["EventLog", "VerifyResult"]

"""The Hermes projection on disk: generation files behind the ``db_path`` symlink, its cursor,
its health check, its rebuild and its catch-up.

Layout, for ``db_path = <dir>/state.db``::

    <dir>/state.db -> state.db.eventlog/profiles/default/hermes/state.<gen>.v<P>.db   (symlink)
    <dir>/state.db.eventlog/                  an eventlog home (``eventlog --home`` works on it)
        profiles/default/log/                 the LMDB log: the source of truth
        profiles/default/hermes/              the Hermes projection's generations, its lease
            state.<gen>.v<P>.db (+ -wal, -shm)
            .generation                       last generation number issued

SQLite resolves the symlink when it opens ``db_path``, so the ``-wal``/``-shm`` it creates are
named after the generation file and can never pair with another generation. A rebuild writes a
new generation completely, then swaps the symlink atomically (new link + ``os.replace`` +
directory fsync). Connections on the old file keep reading it; the previous generation is kept,
older ones are removed. Every function that writes runs under the projection lease
(:class:`Lease`), a ``flock`` on the ``hermes/`` directory: one process at a time.

The projection stores its cursor — the seq and hash of the last event applied — in the same
transaction as the rows (table ``eventlog_projection``), with the projection version. A file
that is missing, unreadable, of another version, ahead of the log or derived from another log
(hash mismatch) is rebuilt on open.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from eventlog.adapters.hermes import schema
from eventlog.adapters.hermes.apply import apply
from eventlog.errors import WriterBusyError, process_state
from eventlog.profiles import FILE_MODE, atomic_write, flock_holder, give_owner_access, hand_over, make_dir

log = logging.getLogger("eventlog.adapters.hermes")

PROFILE = "default"
BATCH = 2000
"""Events applied per transaction during a rebuild or a long catch-up."""
STOPPED_GRACE_S = 1.0
"""How long the lease's holder must stay stopped (SIGSTOP, Ctrl-Z, a debugger) before a wait for
the lease gives up on it (the projector lease's rule): a holder resumed sooner is waited for."""
HOLDER_LOOK_S = 0.1
"""How often a wait for the lease looks at its holder's state."""


class Layout:
    """Where the files of one ``db_path`` live (see the module docstring)."""

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        p = Path(db_path)
        self.pointer = Path(os.path.realpath(p.parent)) / p.name
        self.home = self.pointer.parent / f"{p.name}.eventlog"
        self.profile = self.home / "profiles" / PROFILE
        self.log_dir = self.profile / "log"
        self.dir = self.profile / "hermes"
        self.original = self.pointer.parent / f"{p.name}.pre-eventlog"

    def relative(self, target: Path) -> str:
        return os.path.relpath(target, self.pointer.parent)

    def generation_path(self, gen: int) -> Path:
        return self.dir / f"state.{gen}.v{schema.PROJECTION_VERSION}.db"

    def current(self) -> Path | None:
        """The generation file the pointer names, if the pointer is one of ours."""
        try:
            target = os.readlink(self.pointer)
        except OSError:
            return None
        path = Path(os.path.normpath(self.pointer.parent / target))
        if path.parent != self.dir or not path.name.startswith("state."):
            return None
        return path

    def is_foreign_file(self) -> bool:
        """True when ``db_path`` is a database of Hermes' own (a file, or a link not ours)."""
        return os.path.lexists(self.pointer) and self.current() is None


_waiters: dict[tuple[int, int], "_Waiter"] = {}
"""The waiter a wait that gave up left, per lease directory (device, inode): the next wait of any
handle of this process takes it back."""
_waiters_mu = threading.Lock()


def _forget_waiters_after_fork() -> None:
    # The waiters' threads are the parent's: a child's waits make their own.
    global _waiters_mu
    _waiters_mu = threading.Lock()
    _waiters.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_waiters_after_fork)


class _Waiter:
    """A blocking ``flock`` on a descriptor of its own, in a thread of its own: the kernel queues
    the waiters of a lock and hands it over at once (polling with pauses let busy writers of other
    processes starve one: 0.6-1.6 s writes where the kernel's queue gave 30-50 ms). The caller
    waits on :attr:`got` and may walk away (:meth:`abandon`); a waiter given the lock once nobody
    wants it any more lets go of it at once."""

    def __init__(self, directory: Path) -> None:
        self.fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.got = threading.Event()
        self.error: OSError | None = None
        self.abandoned = False
        self.released = False
        self.mu = threading.Lock()
        threading.Thread(target=self._run, name="eventlog-hermes-lease", daemon=True).start()

    def _run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # waits in the kernel, GIL released
        except OSError as e:
            self.error = e
        with self.mu:
            if self.abandoned or self.error is not None:
                os.close(self.fd)  # releases the lock nobody waits for any more
                self.released = True
            self.got.set()

    def claim(self) -> bool:
        """Take the waiter back for a new wait: False when it has already let go, or when another
        wait has it (make another)."""
        with self.mu:
            if self.released or not self.abandoned:
                return False
            self.abandoned = False
            return True

    def abandon(self) -> bool:
        """Walk away; False when the lock came meanwhile (then it is the caller's after all)."""
        with self.mu:
            if self.got.is_set():
                return False
            self.abandoned = True
            return True

    def drop(self) -> None:
        """Let go of the lock this waiter got (close its descriptor): for a caller that walks
        away after :meth:`abandon` said the lock had come."""
        with self.mu:
            if not self.released:
                os.close(self.fd)
                self.released = True


class Lease:
    """The projection writer lease: an exclusive ``flock`` on the projection directory, shared
    by the threads of one process (re-entrant for the thread that holds it). Taking it waits for
    as long as its holder runs (a rebuild of a long log takes a while), but not for a holder that
    is stopped: :class:`~eventlog.errors.WriterBusyError` names it once it has stayed stopped for
    :data:`STOPPED_GRACE_S` (a Hermes write queued on a kernel flock behind a writer stopped with
    Ctrl-Z waited for as long as it stayed stopped: outside audit, helper-82). A wait that gave
    up leaves its waiter thread queued in the kernel (a blocking flock cannot be called off) until
    the holder lets go, then it lets go at once and ends; the next wait of any lease of this
    process on that directory takes it back, so a process keeps at most one such thread per
    directory, even after its handles are closed (one per closed handle before: helper-84)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._mutex = threading.RLock()
        self._depth = 0

    def __enter__(self) -> "Lease":
        self._mutex.acquire()
        try:
            if self._depth == 0:
                if self._fd is None:
                    self._fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self._wait()
            self._depth += 1
        except BaseException:
            self._mutex.release()
            raise
        return self

    def _wait(self) -> None:
        """Wait for the lease in the kernel's queue (:class:`_Waiter`), looking at its holder every
        HOLDER_LOOK_S: give up on one that has stayed stopped for STOPPED_GRACE_S."""
        st = os.stat(self.directory)
        key = (st.st_dev, st.st_ino)
        with _waiters_mu:
            w = _waiters.get(key)
            if w is None or not w.claim():
                w = _waiters[key] = _Waiter(self.directory)
        stopped: tuple[int, float] | None = None  # (holder, first seen stopped) of this stop
        try:
            while not w.got.wait(HOLDER_LOOK_S):
                holder = flock_holder(self.directory)
                now = time.monotonic()
                if holder is None or holder == os.getpid() or process_state(holder) != "stopped":
                    stopped = None  # running (or resumed, or another holder): waited for
                elif stopped is None or stopped[0] != holder:
                    stopped = (holder, now)
                elif now - stopped[1] >= STOPPED_GRACE_S and w.abandon():
                    raise WriterBusyError(self.directory, holder, STOPPED_GRACE_S, lock="the Hermes projection lease")
        except BaseException:
            # Whatever ends the wait (the give-up above, Ctrl-C's KeyboardInterrupt in the waiting
            # call) walks away from the waiter: a waiter left claimed took the lock once its holder
            # let go and kept it for nobody, every other process's writes queued behind it for as
            # long as this handle stayed open, and close() left it too (outside audit, helper-84).
            if not w.abandon():  # the lock came meanwhile: nobody here takes it
                w.drop()
            raise
        with _waiters_mu:
            if _waiters.get(key) is w:
                del _waiters[key]
        if w.error is not None:
            raise w.error
        old, self._fd = self._fd, w.fd  # the lock is the waiter's descriptor's
        if old is not None:
            os.close(old)

    def try_enter(self) -> bool:
        """Take the lease only if nobody holds it; never waits."""
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            if self._depth == 0:
                if self._fd is None:
                    self._fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self._mutex.release()
                    return False
            self._depth += 1
            return True
        except BaseException:
            self._mutex.release()
            raise

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._mutex.release()

    def close(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)  # also releases a flock still held
                self._fd = None


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync a finished generation no connection has open (a fresh descriptor, closed at once:
    no lock of a live connection can be on it)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_file(path: Path) -> None:
    """Delete a generation file and its sidecars (only files no pointer names)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def create_empty(path: Path) -> None:
    remove_file(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        hand_over(path, fd)  # (SQLite, run as root, gives a database's -wal and -shm its owner)
    finally:
        os.close(fd)


def connect(path: Path, *, readonly: bool = False, timeout: float = 30.0) -> sqlite3.Connection:
    """A connection to a projection file. The writer's has ``foreign_keys=ON`` (the fold needs
    Hermes' cascades) and ``synchronous=NORMAL`` (a lost tail is re-derived from the log)."""
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=timeout,
                               isolation_level=None)
    else:
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=timeout, isolation_level=None)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def read_cursor(conn: sqlite3.Connection) -> tuple[int, int, int, str]:
    """(projection_version, seq, hash_seq, hash); raises sqlite3.Error when the file is not a
    projection."""
    row = conn.execute(f"SELECT projection_version, seq, hash_seq, hash FROM {schema.CURSOR_TABLE} WHERE id = 1"
                       ).fetchone()
    if row is None:
        raise sqlite3.DatabaseError("projection cursor row is missing")
    return int(row[0]), int(row[1]), int(row[2]), str(row[3])


def read_seq(conn: sqlite3.Connection) -> int:
    return int(conn.execute(f"SELECT seq FROM {schema.CURSOR_TABLE} WHERE id = 1").fetchone()[0])


def write_cursor(conn: sqlite3.Connection, seq: int, hash_: str | None = None) -> None:
    """The cursor at ``seq``; with ``hash_`` (that event's hash) also the log identity."""
    if hash_ is None:
        conn.execute(f"UPDATE {schema.CURSOR_TABLE} SET seq = ? WHERE id = 1", (seq,))
    else:
        conn.execute(f"UPDATE {schema.CURSOR_TABLE} SET seq = ?, hash_seq = ?, hash = ? WHERE id = 1",
                     (seq, seq, hash_))


def problem(path: Path | None, eventlog: Any) -> str | None:
    """Why the generation at ``path`` cannot serve ``eventlog`` as it is (None: it can, perhaps
    after a catch-up)."""
    return examine(path, eventlog)[0]


def unwritable(path: Path) -> str | None:
    """Why the writer cannot write the projection ``path`` (or its ``-wal``/``-shm``), or None.
    A file of this user's whose mode keeps its owner out gets 0600 back first: SQLite makes the
    sidecars with the database's mode, so a projection made read-only (chmod 444) left a 0444
    ``-shm`` that failed every write with "attempt to write a readonly database", also once the
    database itself was writable again. A file of another user cannot be repaired here: the
    projection is then rebuilt as a new file of this user's (the log is untouched)."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        give_owner_access(p)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{p.name} cannot be used: {e.strerror}"
        if not os.access(p, os.R_OK | os.W_OK):
            return (f"{p.name} is not writable by this user (uid {os.geteuid()}; it belongs to uid {st.st_uid}, "
                    f"mode {stat.S_IMODE(st.st_mode):o})")
    return None


def examine(path: Path | None, eventlog: Any) -> tuple[str | None, tuple[int, int, int, str] | None]:
    """:func:`problem` and, when there is none, the cursor it read (:func:`read_cursor`), so that
    an open reads the file once."""
    if path is None:
        return "no projection", None
    if not path.exists():
        return f"{path.name} is missing", None
    why = unwritable(path)
    if why is not None:
        return why, None
    try:
        conn = connect(path, readonly=True)
    except sqlite3.Error as e:
        return f"cannot open {path.name}: {e}", None
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id != schema.APPLICATION_ID:
            return f"{path.name} is not a Hermes projection", None
        version, seq, hash_seq, hash_ = read_cursor(conn)
        conn.execute("SELECT id FROM sessions LIMIT 1").fetchall()
        objects = {f"{t} {n}" for t, n in conn.execute("SELECT type, name FROM sqlite_master")}
        hermes_versions = [v for (v,) in conn.execute("SELECT version FROM schema_version")]
    except sqlite3.Error as e:
        return f"{path.name} is unreadable: {e}", None
    finally:
        conn.close()
    missing = expected_objects() - objects
    if missing:
        return f"{path.name} lacks {', '.join(sorted(missing)[:3])} (changed behind the log's back)", None
    if hermes_versions != [schema.HERMES_SCHEMA_VERSION]:
        # Rolled back by plain SQL (a migration to be run again): raw readers and a plain Hermes
        # would take the file for an old one (outside audit, helper-53).
        return (f"{path.name} has Hermes schema_version {hermes_versions or 'none'} instead of "
                f"{schema.HERMES_SCHEMA_VERSION} (changed behind the log's back)", None)
    if version != schema.PROJECTION_VERSION:
        return (f"{path.name} is of projection version {version}, this program writes {schema.PROJECTION_VERSION}",
                None)
    head_seq, head_hash = eventlog.head()
    if seq > head_seq:
        return f"{path.name} is ahead of the log ({seq} > {head_seq})", None
    if hash_seq:
        env = eventlog.get(hash_seq)
        if env is None or env.get("hash") != hash_:
            return f"{path.name} was derived from another log (hash at seq {hash_seq} differs)", None
    return None, (version, seq, hash_seq, hash_)


_EXPECTED: set[str] = set()


def expected_objects() -> set[str]:
    """Tables, indexes and triggers every projection has ("type name"), from the DDL itself."""
    if not _EXPECTED:
        ref = sqlite3.connect(":memory:")
        try:
            schema.create(ref)
            _EXPECTED.update(f"{t} {n}" for t, n in ref.execute("SELECT type, name FROM sqlite_master"))
        finally:
            ref.close()
    return _EXPECTED


def apply_events(conn: sqlite3.Connection, envelopes: Iterable[dict[str, Any]]) -> tuple[int, str | None, int]:
    """Apply envelopes inside the caller's transaction. An event whose rows the rules refuse is
    skipped (its effects undone by a savepoint) and counted. Returns (last seq, its hash, skipped)."""
    last, last_hash, skipped = 0, None, 0
    for env in envelopes:
        conn.execute("SAVEPOINT ev")
        try:
            apply(conn, env)
        except (sqlite3.Error, ValueError, TypeError, OverflowError) as e:
            conn.execute("ROLLBACK TO ev")
            skipped += 1
            log.warning("hermes projection: event %s (%s) skipped: %s", env.get("seq"), env.get("type"), e)
        conn.execute("RELEASE ev")
        last, last_hash = int(env["seq"]), env.get("hash")
    return last, last_hash, skipped


class ErasedHere(Exception):
    """A ``log.erased`` record names sessions this projection still shows: an erase made outside
    the facade (``eventlog sessions erase``, ``retention``), whose words only a rebuild into a new
    generation takes out of the files."""


def _shows_erased(conn: sqlite3.Connection, env: dict[str, Any]) -> bool:
    data = env.get("data")
    named = data.get("sessions") if isinstance(data, dict) else None
    if env.get("type") != "log.erased" or not isinstance(named, list) or not named:
        return False
    from eventlog.adapters.hermes.events import map_session_id

    shown = {map_session_id(r[0]) for r in conn.execute("SELECT id FROM sessions")}
    return any(isinstance(s, str) and s in shown for s in named)


_DAMAGE_SAID: set[tuple[str, int]] = set()


def catch_up(conn: sqlite3.Connection, eventlog: Any, cursor: int, head: int, *, purge: bool = True) -> int:
    """Apply the log's events after ``cursor`` up to ``head`` in transactions of :data:`BATCH`
    events, each with its cursor; returns the seq reached. A batch is applied straight first;
    if one of its events is refused, the batch is applied again with each event in a savepoint
    (that event skipped, see :func:`apply_events`). ``purge``: raise :class:`ErasedHere` (the
    batch not applied) at an erase record naming sessions the projection shows.

    Only the verified prefix of the log is applied, as eventlog's own projections do
    (docs/RELIABILITY.md): each event is checked against the chain as it is read, and at the
    first that fails the catch-up stops short of ``head`` with the damage recorded (appends are
    refused from then on). It read the log unchecked, and served an event tampered with after it
    was written (outside audit, helper-55)."""
    from eventlog.log.damage import Verified

    while cursor < head:
        upto = min(head, cursor + BATCH)
        checked = Verified(eventlog, cursor + 1, upto, raw=False)
        envelopes = [env for _, _, env in checked]
        if checked.damage is not None:
            said = (str(getattr(eventlog, "path", "")), checked.damage.seq)
            if said not in _DAMAGE_SAID:  # once per damage and process: every write meets it
                _DAMAGE_SAID.add(said)
                log.warning("hermes projection: the log is damaged at seq %d (%s); serving what verifies before it",
                            checked.damage.seq, checked.damage.reason)
            head = cursor + len(envelopes)  # apply what verified, then stop
        if not envelopes:
            break
        if purge and any(_shows_erased(conn, env) for env in envelopes if env.get("type") == "log.erased"):
            raise ErasedHere()
        conn.execute("BEGIN IMMEDIATE")
        try:
            try:
                for env in envelopes:
                    apply(conn, env)
            except (sqlite3.Error, ValueError, TypeError, OverflowError):
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                apply_events(conn, envelopes)
            last = envelopes[-1]
            write_cursor(conn, int(last["seq"]), last.get("hash") or "")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        cursor = int(envelopes[-1]["seq"])
    return cursor


def next_generation(layout: Layout) -> Path:
    """A generation file name never issued before (a reused name could let a reader take a new
    file for the one it holds). Call only under the lease."""
    counter = layout.dir / ".generation"
    _remove_leftovers(layout)
    try:
        issued = int(counter.read_text().strip() or 0)
    except (OSError, ValueError):
        issued = 0
    for name in os.listdir(layout.dir):
        parts = name.split(".")
        if len(parts) >= 3 and parts[0] == "state" and parts[1].isdigit():
            issued = max(issued, int(parts[1]))
    gen = issued + 1
    with atomic_write(counter) as fp:  # 0600, as every file of a profile
        fp.write(f"{gen}\n".encode())
    return layout.generation_path(gen)


def _remove_leftovers(layout: Layout) -> None:
    """Remove what a process killed inside :func:`next_generation` or :func:`swap` left: the
    counter's temporary file, the temporary link beside ``db_path`` (named after its pid). Only
    a lease holder writes them, so under the lease every one found is a dead process's. A
    deployment whose processes are killed (a gateway restarted with SIGKILL) collected them one
    by one, the links among the user's files in the Hermes home (operator audit, helper-75)."""
    for directory, pattern in ((layout.dir, re.compile(r"\.\.generation\.\d+\.\d+\.tmp")),
                               (layout.pointer.parent, re.compile(rf"\.{re.escape(layout.pointer.name)}\.\d+\.tmp"))):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if pattern.fullmatch(name):
                try:
                    os.unlink(directory / name)
                except OSError:
                    pass


def rebuild(layout: Layout, eventlog: Any) -> Path:
    """Write a new generation from the whole log and point ``db_path`` at it. Under the lease."""
    make_dir(layout.dir)
    path = next_generation(layout)
    create_empty(path)
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=MEMORY")  # savepoints need a journal
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("BEGIN")
        schema.create(conn, fts_triggers=False)
        conn.execute("COMMIT")
        head, _ = eventlog.head()
        catch_up(conn, eventlog, 0, head, purge=False)
        conn.execute("BEGIN")
        schema.fill_fts(conn)
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
    fsync_file(path)
    swap(layout, path)
    return path


def swap(layout: Layout, path: Path) -> None:
    """Point ``db_path`` at generation ``path`` atomically and durably; drop generations older
    than the one replaced."""
    previous = layout.current()
    tmp = layout.pointer.parent / f".{layout.pointer.name}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(layout.relative(path), tmp)
    os.replace(tmp, layout.pointer)
    fsync_dir(layout.pointer.parent)
    keep = {path.name} | ({previous.name} if previous is not None else set())
    for name in os.listdir(layout.dir):
        if name.startswith("state.") and name.endswith(".db") and name not in keep:
            remove_file(layout.dir / name)

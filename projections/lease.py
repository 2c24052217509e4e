"""The projector lease: one process at a time writes a profile's projections.

A ``flock`` (never ``fcntl``/``lockf`` locks: closing any descriptor of a file cancels every
POSIX lock the process holds on it) taken on the profile directory itself. A lock *file* can
be deleted under its holder, and the next process would then lock a fresh file while the
holder still writes; the directory cannot vanish while the profile exists. ``projector.lock``
is still created, as the visible name of the lease. flock belongs to the open file
description, so threads of one process share it; a re-entrant thread lock serializes them.
The lock is released when the holder closes it or dies (SIGKILL included).

Also here: :class:`Presence` (who runs a follower), :class:`SchemaUse` (which program versions
are alive), and the flock helpers they share.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from eventlog.errors import LeaseError
from eventlog.profiles import access_problem, open_private

LOCK_NAME = "projector.lock"


class Lease:
    """Re-entrant, cross-process exclusive lease on ``<profile dir>/projector.lock``.

    ``on_release`` is called whenever this process lets the lease go — just before the
    outermost :meth:`release` unlocks it, and at :meth:`close` — with the in-process lock held,
    so no other thread of this process works under the lease meanwhile.
    """

    def __init__(self, directory: Path, on_release: Callable[[], None] | None = None) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._on_release = on_release
        self._mutex = threading.RLock()
        self._fd: int | None = None
        self._depth = 0
        self._owner: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            try:
                os.close(open_private(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC))
                self._fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except PermissionError as e:
                found = access_problem(e.filename or self.path)
                if found is None:
                    raise LeaseError(f"cannot open the projector lease {self.path}: {e.strerror}",
                                     hint="check that the profile directory is writable by this user") from e
                raise LeaseError(f"cannot open the projector lease: {found[1]}", hint=found[2]) from e
            except OSError as e:
                raise LeaseError(f"cannot open the projector lease in {self.directory}: {e.strerror}",
                                 hint="check that the profile directory is writable by this user") from e
        return self._fd

    @property
    def held(self) -> bool:
        """True when the calling thread holds the lease."""
        return self._depth > 0 and self._owner == threading.get_ident()

    def acquire(self, timeout: float | None = None, *, others: float | None = None) -> bool:
        """Take the lease; wait at most ``timeout`` seconds (None: forever, 0: don't wait).
        ``others``: wait at most that long once no thread of this process holds it (for another
        process). Returns False when it could not be taken in time."""
        if not self._mutex.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            return False
        if others is not None:
            timeout = others if timeout is None else min(timeout, others)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if self._depth > 0:
                self._depth += 1
                return True
            fd = self._open()
            delay = 0.0005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                except OSError as e:
                    raise LeaseError(f"cannot lock {self.directory}: {e.strerror}") from e
                if deadline is not None and time.monotonic() >= deadline:
                    self._mutex.release()
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.005)
            self._depth = 1
            self._owner = threading.get_ident()
            return True
        except BaseException:
            if self._depth == 0:
                self._mutex.release()
            raise

    def release(self) -> None:
        """Undo one :meth:`acquire`; the outermost one unlocks (after ``on_release``)."""
        if not self.held:
            raise LeaseError("the projector lease is not held by this thread")
        try:
            if self._depth == 1 and self._on_release is not None:
                self._on_release()
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                assert self._fd is not None
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._mutex.release()

    @contextmanager
    def hold(self, timeout: float | None = None, *, others: float | None = None) -> Iterator[None]:
        """Context manager; raises :class:`LeaseError` when not taken within ``timeout`` (see
        :meth:`acquire` for ``others``)."""
        if not self.acquire(timeout, others=others):
            raise LeaseError(
                f"another process has held the projector lease {self.path} for over {timeout} s",
                hint="a long rebuild may be running; retry later or check `eventlog doctor`",
            )
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        """Let the lease go for good (waits for this process's holder, if another thread)."""
        with self._mutex:
            try:
                if self._on_release is not None:
                    self._on_release()
            finally:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                    self._depth = 0
                    self._owner = None


FOLLOWER_NAME = "follower.lock"


def _flocked(path: Path, op: int) -> int | None:
    """An fd of ``path`` (created 0600 if missing) holding flock ``op``, or None when the file
    cannot be opened or the lock taken. Close the fd to release."""
    try:
        fd = open_private(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, op)
    except OSError:
        os.close(fd)
        return None
    return fd


def hold_shared(path: Path) -> int | None:
    """A shared flock on ``path``; waits only while someone holds it exclusively."""
    return _flocked(path, fcntl.LOCK_SH)


def try_exclusive(path: Path) -> int | None:
    """An exclusive flock on ``path`` if no process holds any flock on it, else None. Never waits."""
    return _flocked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)


class Presence:
    """Tells other processes that this one runs a projection follower.

    Each follower holds a *shared* ``flock`` on ``<profile dir>/follower.lock`` for as long as
    it follows; :func:`followed` tests for any such holder without waiting. One-shot readers use
    it to leave catching up to the follower (their reads then lag by at most the follower's
    bound) instead of applying the log themselves. The lock dies with its process, so a killed
    follower stops counting at once; a deleted file only makes readers catch up themselves.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / FOLLOWER_NAME
        self._fd: int | None = None
        self._mutex = threading.Lock()

    def announce(self) -> None:
        """Idempotent. When the lock cannot be taken, readers catch up themselves (only slower)."""
        with self._mutex:
            if self._fd is None:
                self._fd = hold_shared(self.path)

    def withdraw(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)  # releases the flock
                self._fd = None


def followed(directory: Path) -> bool:
    """True when some live process (this one included) runs a follower for the profile in
    ``directory``. Never waits and never creates a file."""
    try:
        fd = os.open(directory / FOLLOWER_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True  # a follower holds it shared
    finally:
        os.close(fd)  # also drops the probe's own lock, if it got one
    return False


def schema_lock_path(directory: Path, kind: str, schema: int) -> Path:
    return directory / f"{kind}.v{schema}.lock"


class SchemaUse:
    """Shared flocks on ``<kind>.v<schema>.lock``, one per projection kind, held by every
    Projector for its lifetime: "a process of this schema version may be reading its files".

    After a hot update the newer program can tell when the last process of an older version
    is gone (an exclusive flock on that version's lock file succeeds) and only then remove the
    older version's private pointer and files (:func:`projections.files.collect_superseded`).
    A lock that cannot be taken leaves this version unannounced (its files could then be
    removed early, and it would rebuild them).
    """

    def __init__(self, directory: Path, schemas: dict[str, int]) -> None:
        held = (hold_shared(schema_lock_path(directory, kind, schema)) for kind, schema in schemas.items())
        self._fds = [fd for fd in held if fd is not None]

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

"""Opening projection files with SQLite, telling a damaged file from a bug, and turning driver
errors into eventlog errors.

Writers (the lease holder only) open read-write; everyone else opens ``mode=ro`` and never
takes a write lock. :func:`converted` is the one place the projections turn an ``sqlite3``
error, an ``OSError`` or a ``ValueError`` into an :class:`~eventlog.errors.EventLogError`.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from eventlog.errors import EventLogError, ProjectionError

BUSY_TIMEOUT_S = 5.0

# SQLite result codes that mean "this file is damaged, missing or unusable", as opposed to a
# bug in a query. Extended codes share the primary code's name prefix.
_FAULT_PREFIXES = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR", "SQLITE_CANTOPEN",
                   "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH", "SQLITE_FULL")
_FAULT_TEXT = ("malformed", "not a database", "no such table", "vtable constructor failed",
               "unable to open", "disk i/o error", "readonly", "no such module", "fts5")


def uri(path: Path, mode: str = "ro") -> str:
    return f"file:{quote(str(path))}?mode={mode}"


def connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection (autocommit; BEGIN explicitly for a consistent multi-read)."""
    db = sqlite3.connect(uri(path), uri=True, isolation_level=None, check_same_thread=False,
                         timeout=BUSY_TIMEOUT_S)
    return db


def connect_rw(path: Path) -> sqlite3.Connection:
    """A read-write connection. Only the projector lease holder may open one."""
    db = sqlite3.connect(uri(path, "rw"), uri=True, isolation_level=None, check_same_thread=False,
                         timeout=BUSY_TIMEOUT_S)
    db.execute("PRAGMA synchronous = NORMAL")
    return db


def attach_ro(db: sqlite3.Connection, path: Path, name: str) -> None:
    db.execute("ATTACH DATABASE ? AS " + name, (uri(path),))


def attach_rw(db: sqlite3.Connection, path: Path, name: str) -> None:
    db.execute("ATTACH DATABASE ? AS " + name, (uri(path, "rw"),))
    # Derived data, rebuilt from the log after a power loss: a WAL commit need not fsync.
    db.execute(f"PRAGMA {name}.synchronous = NORMAL")


def is_fault(e: BaseException) -> bool:
    """True when ``e`` says a database file is damaged, missing or unusable."""
    if not isinstance(e, sqlite3.DatabaseError):
        return False
    name = getattr(e, "sqlite_errorname", "") or ""
    if name.startswith(_FAULT_PREFIXES):
        return True
    text = str(e).lower()
    return any(t in text for t in _FAULT_TEXT)


def status_of(e: BaseException) -> str:
    """The health status a fault reads as."""
    name = getattr(e, "sqlite_errorname", "") or ""
    text = str(e).lower()
    if name.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH", "SQLITE_READONLY")) \
            or "unable to open" in text:
        return "unreadable"
    return "corrupt"


DOCTOR_HINT = "run `eventlog doctor --fix`"


def converted(e: BaseException, action: str) -> EventLogError:
    """What ``e``, met while ``action`` (``"reading the projection"``), means to a caller: an
    :class:`EventLogError` (returned as is) or a :class:`ProjectionError` saying what failed and
    how to recover. The caller chains the cause: ``raise converted(e, action) from e``.

    ========================================  ==========================================
    ``e``                                     hint
    ========================================  ==========================================
    SQLITE_FULL ("database or disk is full")  free disk space (never read as corruption)
    SQLITE_BUSY / SQLITE_LOCKED ("locked")    another process holds the file: retry
    any other ``sqlite3.Error``               run ``eventlog doctor --fix``
    ``OSError``                               check permissions (with the OS's reason)
    ``ValueError`` and anything else          run ``eventlog doctor --fix``
    ========================================  ==========================================
    """
    if isinstance(e, EventLogError):
        return e
    if isinstance(e, sqlite3.Error):
        name = getattr(e, "sqlite_errorname", "") or ""
        text = str(e).lower()
        if name.startswith("SQLITE_FULL") or "disk is full" in text:
            return ProjectionError(f"{action} failed: the disk is full ({e})",
                                   hint="free some disk space and retry; the log is not affected")
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "is locked" in text:
            return ProjectionError(f"{action} failed: {e}", hint="another process holds the file; retry")
        return ProjectionError(f"{action} failed: {e}", hint=DOCTOR_HINT)
    if isinstance(e, OSError):
        where = f" ({e.filename})" if e.filename else ""
        return ProjectionError(f"{action} failed: {e.strerror or e}{where}",
                               hint="check that the profile directory and its files belong to this user")
    return ProjectionError(f"{action} failed: {e}", hint=DOCTOR_HINT)

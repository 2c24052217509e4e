"""Opening projection files with SQLite, and telling a damaged file from a bug.

Writers (the lease holder only) open read-write; everyone else opens ``mode=ro`` and never
takes a write lock.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

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

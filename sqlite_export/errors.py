"""The one place sqlite_export turns driver, OS and value errors into eventlog errors.

Exports write to files and streams, imports read foreign SQLite databases and JSONL: whatever
``sqlite3`` or the OS raises on the way leaves an export or import as an
:class:`~eventlog.errors.EventLogError`, cause chained (``raise converted(e, action) from e``).
"""
from __future__ import annotations

import errno
import sqlite3

from eventlog.errors import DiskFullError, EventLogError, StorageError

__all__ = ["converted", "not_a_database"]


def not_a_database(e: BaseException) -> bool:
    """True when SQLite says the file is not a database (or a damaged one)."""
    return isinstance(e, sqlite3.DatabaseError) and ("not a database" in str(e) or "malformed" in str(e))


def converted(e: BaseException, action: str, *, hint: str | None = None) -> EventLogError:
    """``e``, met while ``action`` (``"reading /x/state.db"``), as an :class:`EventLogError`.

    ==========================================  ======================  =========================
    ``e``                                       class                   hint (unless ``hint``)
    ==========================================  ======================  =========================
    an EventLogError                            unchanged
    ``sqlite3`` "not a database" / "malformed"  StorageError            how to check the file
    ``sqlite3`` "database or disk is full",     DiskFullError           free disk space
    ``OSError`` ENOSPC / EDQUOT
    any other ``sqlite3.Error``                 StorageError            permissions, or retry
    any other ``OSError``                       StorageError            permissions
    ``ValueError`` and anything else            StorageError            none
    ==========================================  ======================  =========================
    """
    if isinstance(e, EventLogError):
        return e
    if not_a_database(e):
        return StorageError(f"{action} failed: not a readable SQLite database ({e})",
                            hint="is it a SQLite database? `sqlite3 FILE .tables` shows its tables")
    full = (isinstance(e, sqlite3.Error) and "disk is full" in str(e).lower()) or \
        (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT))
    if full:
        return DiskFullError(f"{action} failed: no space left ({e})", hint="free some disk space and retry")
    if isinstance(e, sqlite3.Error):
        return StorageError(f"{action} failed: {e}",
                            hint=hint or "check the file's permissions, or stop the program writing it and retry")
    if isinstance(e, OSError):
        where = f" ({e.filename})" if e.filename else ""
        return StorageError(f"{action} failed: {e.strerror or e}{where}",
                            hint=hint or "check that the file and its directory are accessible to this user")
    return StorageError(f"{action} failed: {e}", hint=hint)

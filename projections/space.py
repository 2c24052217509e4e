"""Room to write: a full disk or a read-only file system is never mistaken for a damaged file.

SQLite says "database or disk is full" (SQLITE_FULL) when it runs out of room, but opening a
WAL database whose ``-shm`` cannot be grown says "disk I/O error", and on a read-only file
system "unable to open database file": read alone, each looks like a broken file, and a
rebuild would start and die. Projection code asks here first — :func:`out_of_room` for an
error met, :func:`cannot_write` before work that needs room — and then waits for space (the
projections serve what they have, flagged stale) instead of rebuilding.
"""
from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

from eventlog.profiles import soft_limit

LOW_SPACE_BYTES = 4 * 1024 * 1024
"""Below this much free space an I/O error on a projection file is taken for a full disk."""
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system (None: unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def read_only(path: str | os.PathLike[str]) -> bool:
    """True when nothing can be made in ``path``: a file system mounted read-only, or a directory
    this user may not write in (:func:`read_only_reason`)."""
    return read_only_reason(path) is not None


def read_only_reason(path: str | os.PathLike[str]) -> str | None:
    """``"read-only file system"``; for a directory this user may not write in (a profile made by
    another user, a ``chmod a-w``), the words that say so; None when ``path`` can be written.
    Either way the projections are served as they stand (a new file there cannot be made: a
    rebuild would only start and die, and the files are not damaged)."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
        if os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):
            st = os.stat(path)
            return (f"the directory {os.fspath(path)} is read-only for this user (uid {os.geteuid()}; "
                    f"mode {st.st_mode & 0o777:o}, owner uid {st.st_uid})")
    except OSError:
        pass
    return None


def remedy(why: str) -> str:
    """What to do about ``why`` (a reason :func:`cannot_write` gave), for a hint."""
    if "read-only for this user" in why:
        return "let this user write in that directory (chmod u+w, or run as its owner)"
    if "read-only" in why:
        return "make the file system writable"
    if "ulimit" in why:
        return "raise the file-size limit (ulimit -f)"
    return "free some disk space"


def cannot_write(path: str | os.PathLike[str]) -> str | None:
    """Why nothing can be written at ``path`` now (``"read-only file system"``, ``"the disk is
    full (N bytes free)"``), or None."""
    why = read_only_reason(path)
    if why is not None:
        return why
    limit = soft_limit("RLIMIT_FSIZE")
    # Writes past it fail with EFBIG, which SQLite reports as an I/O error; a limit far above
    # every file here is room (a rebuild writes a file about the size of the current one).
    if limit is not None and limit - largest_file(path) < LOW_SPACE_BYTES:
        return f"a file-size limit of {limit:,} bytes (ulimit -f)"
    free = free_bytes(path)
    if free is not None and free < LOW_SPACE_BYTES:
        return f"the disk is full ({free:,} bytes free)"
    return None


def largest_file(path: str | os.PathLike[str]) -> int:
    """The size of the largest file in directory ``path`` or its log (``log/data.mdb``, or the
    generation ``log/current`` names): stat only, never an open."""
    d = Path(path)
    candidates = [d / "log" / "data.mdb", d / "log" / "current" / "data.mdb"]
    try:
        candidates += [d / n for n in os.listdir(d)]
    except OSError:
        pass
    largest = 0
    for p in candidates:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            largest = max(largest, st.st_size)
    return largest


def out_of_room(e: BaseException, path: str | os.PathLike[str]) -> str | None:
    """Why ``e``, met on a file under ``path``, is a full disk or a read-only file system rather
    than damage (the words to report), or None when it is not."""
    if isinstance(e, OSError):
        if e.errno in _FULL_ERRNOS:
            return cannot_write(path) or "no space left on device"
        if e.errno == errno.EROFS:
            return "read-only file system"
        if e.errno in (errno.EACCES, errno.EPERM):
            return read_only_reason(path)
        return None
    if not isinstance(e, sqlite3.Error):
        return None
    name = getattr(e, "sqlite_errorname", "") or ""
    text = str(e).lower()
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return cannot_write(path) or "the disk is full"
    if name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_READONLY")) or "disk i/o error" in text \
            or "unable to open" in text or "readonly" in text:
        return cannot_write(path)
    return None


def directory_of(path: Path) -> Path:
    """The directory whose file system holds ``path`` (``path`` itself when it is one)."""
    return path if path.is_dir() else path.parent

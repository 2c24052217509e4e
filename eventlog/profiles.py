"""Where profiles live: ``$EVENTLOG_HOME/profiles/<profile>/``, and how files there are written.

Profile names are checked before any path is built, so a hostile name never touches the disk.
Directories are created 0700 and files 0600, whatever the process umask. A file that must be
whole or absent is written by :func:`atomic_write` (or built beside its name and moved in with
:func:`publish`): temporary file, fsync, rename, fsync of the directory.

This module sits below the log layer: everything that touches the disk may import it.
"""
from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from eventlog.errors import ProfileNameError, StorageError

PROFILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_PROFILE = "default"
DIR_MODE = 0o700
"""Every directory eventlog creates: private to its owner."""
FILE_MODE = 0o600
"""Every file eventlog creates under a profile: private to its owner."""
USER_FILE_MODE = 0o666
"""A file a user asked for outside the profiles (an export, a transcript): the umask decides."""


def validate_profile(name: object) -> str:
    """Return ``name`` if it is a valid profile name, else raise :class:`ProfileNameError`."""
    if type(name) is not str or not PROFILE_RE.fullmatch(name):
        raise ProfileNameError(
            "profile",
            f"{name!r} must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}",
            hint="use letters, digits, '_', '.', '-' (first a letter or digit), at most 64 characters",
        )
    return name


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The eventlog home: ``home``, else ``$EVENTLOG_HOME``, else ``~/.eventlog``."""
    if home is None:
        home = os.environ.get("EVENTLOG_HOME") or Path.home() / ".eventlog"
    return Path(home).expanduser().absolute()


def profile_dir(home: str | os.PathLike[str] | None, profile: str, *, create: bool = True) -> Path:
    """The directory of ``profile`` under ``home``; created 0700 (with its parents) if ``create``.

    Raises :class:`ProfileNameError` for a bad name (before any path is built) and
    :class:`StorageError` (the ``OSError`` chained) when the directory cannot be created."""
    validate_profile(profile)
    d = resolve_home(home) / "profiles" / profile
    if create:
        try:
            make_dir(d)
        except OSError as e:
            raise StorageError(f"cannot create the profile directory {d}: {e.strerror or e}",
                               hint="check that the home directory (--home, $EVENTLOG_HOME) is a writable directory") from e
    return d


def make_dir(path: Path) -> None:
    """Create ``path`` and missing parents with mode 0700 (existing directories are left alone)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(d, DIR_MODE)


def restrict_file(path: str | os.PathLike[str]) -> None:
    """Make an existing file 0600 (no-op if it is gone)."""
    try:
        os.chmod(path, FILE_MODE)
    except FileNotFoundError:
        pass


def list_profiles(home: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the profiles that exist under ``home``."""
    root = resolve_home(home) / "profiles"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and PROFILE_RE.fullmatch(p.name))


# ---- durable, all-or-nothing file writes ------------------------------------------------------

def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync a finished file. Never on a live database file: closing a descriptor of it would
    cancel the process's POSIX locks on it (DESIGN, "Known hazards")."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory, making the renames and creations inside it durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """A hidden name beside ``path`` no other process or thread of this one is using."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def publish(tmp: Path, path: Path) -> None:
    """Move the finished ``tmp`` (already synced, or a symlink) over ``path`` atomically, then
    fsync the directory: after a crash ``path`` is the old file or the new one, never a mix."""
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextmanager
def atomic_write(path: str | os.PathLike[str], *, mode: int = FILE_MODE) -> Iterator[BinaryIO]:
    """Write ``path`` all or nothing: yields a binary file beside it; when the block ends without
    an exception the data is synced and renamed over ``path`` (then the directory is synced).
    On an exception the temporary file is removed and ``path`` is left as it was.

    ``mode`` applies to a newly created file (``FILE_MODE``: 0600 whatever the umask;
    ``USER_FILE_MODE``: what the umask allows)."""
    target = Path(path)
    tmp = temp_path(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        if mode == FILE_MODE:
            os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as fp:
            yield fp
            fp.flush()
            os.fsync(fp.fileno())
        publish(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def flock_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid holding an exclusive flock on ``path`` (a file or a directory), from /proc/locks
    (Linux; None elsewhere, or when nobody holds one). Reads /proc only: never opens ``path``."""
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("->" marks a waiter)
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[2] != "->":
            dev_ino = parts[5].split(":")
            if len(dev_ino) == 3 and dev_ino[2].isascii() and dev_ino[2].isdigit() and int(dev_ino[2]) == inode:
                return int(parts[4]) if parts[4].isascii() and parts[4].isdigit() else None
    return None

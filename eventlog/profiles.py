"""Where profiles live: ``$EVENTLOG_HOME/profiles/<profile>/``, and how files there are written.

Profile names are checked before any path is built, so a hostile name never touches the disk.
Directories are created 0700 and files 0600, whatever the process umask. A file that must be
whole or absent is written by :func:`atomic_write` (or built beside its name and moved in with
:func:`publish`): temporary file, fsync, rename, fsync of the directory.

This module sits below the log layer: everything that touches the disk may import it.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shlex
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from eventlog.errors import IntegrityError, PermissionDeniedError, ProfileNameError, StorageError, ValidationError

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


HOME_HINT = "give a directory (--home DIR or $EVENTLOG_HOME), or leave both unset for ~/.eventlog"


def path_text(value: str | os.PathLike[str], field: str, hint: str | None = None) -> str:
    """The text of a path eventlog is given, or :class:`ValidationError` naming ``field``: bytes,
    a NUL character, or text that is not UTF-8 (a lone surrogate, or undecodable bytes of a
    command-line argument) — LMDB and SQLite take UTF-8 paths only."""
    try:
        text = os.fspath(value)
    except TypeError:
        raise ValidationError(field, f"must be a path, got {type(value).__name__}", hint=hint) from None
    if isinstance(text, bytes):
        raise ValidationError(field, "must be a str path, not bytes", hint=hint)
    if "\0" in text:
        raise ValidationError(field, "contains a NUL character", hint=hint)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, "is not valid UTF-8 text (eventlog's files need UTF-8 paths)",
                              hint=hint or "choose a path of UTF-8 characters") from None
    return text


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The eventlog home: ``home``, else ``$EVENTLOG_HOME``, else ``~/.eventlog``.

    Raises :class:`ValidationError` (field ``home``) for a value that cannot be a home: empty
    (``''`` would mean the current directory; an empty ``$EVENTLOG_HOME`` too), holding a NUL
    character, or naming a path whose nearest existing part is not a directory (``/dev/null``,
    ``<file>/sub``). Touches nothing: only ``stat`` calls."""
    if home is None:
        env = os.environ.get("EVENTLOG_HOME")
        home = Path.home() / ".eventlog" if env is None else env
        where = "$EVENTLOG_HOME" if env is not None else "home"
    else:
        where = "home"
    text = path_text(home, "home", HOME_HINT)  # a path, str, no NUL, UTF-8
    if text == "":
        raise ValidationError("home", f"{where} is empty", hint=HOME_HINT)
    path = Path(text).expanduser().absolute()
    probe = path
    while True:
        try:
            st = os.stat(probe)
        except (FileNotFoundError, NotADirectoryError):  # climb to the part that exists
            if probe.parent == probe:
                break
            probe = probe.parent
            continue
        except OSError as e:
            raise ValidationError("home", f"{probe} cannot be used: {e.strerror}", hint=HOME_HINT) from None
        if not stat.S_ISDIR(st.st_mode):
            raise ValidationError("home", f"{probe} is not a directory", hint=HOME_HINT)
        break
    return path


def profile_dir(home: str | os.PathLike[str] | None, profile: str, *, create: bool = True) -> Path:
    """The directory of ``profile`` under ``home``; created 0700 (with its parents) if ``create``.

    Raises :class:`ProfileNameError` for a bad name (before any path is built) and
    :class:`StorageError` (the ``OSError`` chained) when the directory cannot be created."""
    validate_profile(profile)
    d = resolve_home(home) / "profiles" / profile
    if create:
        try:
            make_dir(d)
        except PermissionError as e:
            raise denied(e, f"cannot create the profile directory {d}") from e
        except OSError as e:
            raise StorageError(f"cannot create the profile directory {d}: {e.strerror or e}",
                               hint="check that the home directory (--home, $EVENTLOG_HOME) is a writable directory") from e
    return d


GENERATION_RE = re.compile(r"g[1-9][0-9]{0,8}")
"""A log generation folder's name (``log/g<N>``, named by ``log/current`` once compacted)."""


def refuse_lost_log(d: Path) -> None:
    """Refuse to open a profile whose log is gone while its projections remain — its ``log/``
    directory, or the data file in it (``log/data.mdb``, or the generation ``log/current``
    names): a new, empty log would be created and the projections rebuilt from it, losing the
    only copy of the profile's sessions left. :class:`IntegrityError` says what to restore."""
    log_dir = d / "log"
    generations: list[str] = []
    if log_dir.is_dir():
        if os.path.lexists(log_dir / "current") or (log_dir / "data.mdb").is_file():
            return  # a generation named by ``current`` without its data file is the log's own refusal
        try:
            generations = sorted((n for n in os.listdir(log_dir) if GENERATION_RE.fullmatch(n)),
                                 key=lambda n: int(n[1:]))
        except OSError:
            pass
        lost = f"{log_dir} holds no data.mdb" + (" and no current link" if generations else "")
    else:
        lost = f"{log_dir} is missing"
    if generations:  # the data is there: only the link to it went (outside audit, helper-42)
        raise IntegrityError(
            f"profile {d.name!r} has lost its log's current link ({lost}); its newest generation is "
            f"{log_dir / generations[-1]}",
            hint=f"restore the link: ln -s {generations[-1]} {log_dir / 'current'} (or log/ from a backup)")
    if _has_projections(d) or _has_projections(d / "hermes"):
        raise IntegrityError(
            f"profile {d.name!r} has lost its log ({lost}) but its projections are still there",
            hint=f"restore log/ from a backup (or, if this profile keeps its log on PostgreSQL, give --log-url); "
                 f"to start the profile anew, move {d} aside first (a new log would replace what the projections "
                 "hold)")


def _has_projections(d: Path) -> bool:
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return any(n in ("state.db", "fts.db") or (n.startswith(("state.", "fts.")) and n.endswith(".db")) for n in names)


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
        hand_over(d)


def hand_over(path: str | os.PathLike[str], fd: int | None = None) -> None:
    """A file or folder this process just made (``fd``: open on it), given to the owner of the
    folder it is in when this process is root and that folder is another user's: a command run
    with ``sudo`` on a user's profile (a compaction, an erase, a rebuild, the first ``init``)
    left files of root's that the user's own processes could not open. Nothing happens
    otherwise, nor to a link, a file with other links (it may be anything) or a file that is not
    root's; the ownership is changed on the descriptor, or without following a link. Callers
    pass only what they made (``O_EXCL``, or a name that did not exist before)."""
    if os.geteuid() != 0:
        return
    try:
        folder = os.stat(os.path.dirname(os.path.abspath(path)))
        if folder.st_uid == 0:
            return
        st = os.fstat(fd) if fd is not None else os.lstat(path)
        if st.st_uid != 0 or stat.S_ISLNK(st.st_mode) or (not stat.S_ISDIR(st.st_mode) and st.st_nlink != 1):
            return
        if fd is not None:
            os.fchown(fd, folder.st_uid, folder.st_gid)
        else:
            os.chown(path, folder.st_uid, folder.st_gid, follow_symlinks=False)
    except OSError:
        pass  # the owner's file is still usable by root: only the user's next run would say so


def soft_limit(name: str) -> int | None:
    """This process's soft limit ``name`` of :mod:`resource` (``"RLIMIT_AS"``: ``ulimit -v``,
    ``"RLIMIT_FSIZE"``: ``ulimit -f``) in bytes; None when there is none or it cannot be read."""
    try:
        import resource

        limit = resource.getrlimit(getattr(resource, name))[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return None if limit == resource.RLIM_INFINITY else int(limit)


def restrict_file(path: str | os.PathLike[str]) -> None:
    """Make an existing file 0600 (no-op if it is gone, or if its mode cannot be changed here:
    a read-only file system, another owner's file; ``eventlog doctor`` reports such modes)."""
    try:
        if stat.S_IMODE(os.stat(path).st_mode) != FILE_MODE:
            os.chmod(path, FILE_MODE)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EPERM, errno.EACCES):
            raise


def _account(uid: int) -> str | None:
    """The login name of ``uid``, or None for a uid without an account (a container)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid without an account."""
    name = _account(uid)
    return f"{name} (uid {uid})" if name is not None else f"uid {uid}"


def _profile_root(path: Path) -> Path | None:
    """The profile folder ``path`` is in (or is), or None when it is not under ``profiles/``."""
    for p in (path, *path.parents):
        if p.parent.name == "profiles" and PROFILE_RE.fullmatch(p.name):
            return p
    return None


def _eventlog_part(target: Path) -> Path:
    """The part of ``target`` that is eventlog's own: the home holding its profile (the folder
    with ``profiles/`` in it) when ``target`` is in one, else ``target`` itself (a log directory
    given by path); the folders above it are the system's or another account's."""
    root = _profile_root(target)
    return root.parent.parent if root is not None else target


def access_problem(path: str | os.PathLike[str], *, write: bool = True) -> tuple[Path, str, str] | None:
    """Why this process may not use ``path`` (a file or folder eventlog keeps), as ``(the part
    that refuses, what, hint)``: the first part of the path, from ``/`` down, that this user may not enter (a
    folder on the way), read, or write (``path`` itself, or the folder a missing ``path`` would
    be made in; ``write=False``: read only). Either it belongs to another user (a command run
    with sudo, a backup restored as root, a profile copied from another account) -- the hint
    gives it back with ``chown -R`` when it is in eventlog's own part of the path (the home, a
    profile, a log directory; never a folder above it) -- or its mode keeps its owner out (the hint: ``chmod``).
    None when nothing on the way refuses (root, or ``path`` is usable now). The hint never says
    to delete anything: these files may hold the only copy of the data (the log, a ``-wal``)."""
    target = Path(os.path.abspath(os.fspath(path)))
    for p in (*reversed(target.parents), target):
        last = p == target
        try:
            st = os.stat(p)
        except FileNotFoundError:  # made by the open: the folder it goes in must take it
            p = p.parent
            st = os.stat(p)
            last, write = True, True
        except OSError:
            return None
        is_dir = stat.S_ISDIR(st.st_mode)
        if not last and not is_dir:
            return None
        need = os.X_OK if not last else (os.R_OK | (os.W_OK if write else 0) | (os.X_OK if is_dir else 0))
        if os.access(p, need, effective_ids=os.access in os.supports_effective_ids):
            if last:
                return None
            continue
        me = os.geteuid()
        if st.st_uid != me:
            owner = chown_owner(me, os.getegid())
            whole = _profile_root(p) or p
            chown = f"sudo chown -R {owner} {shlex.quote(str(whole))} (delete nothing: its files hold the data)"
            ours = _eventlog_part(target)
            if p != ours and ours not in p.parents:
                # A folder above eventlog's own (/etc, /usr/local, another account's home): a
                # `chown -R` of it would take over what is not eventlog's to give.
                chown = ""
            if st.st_uid == 0:
                hint = (f"if it should be this user's (a command run with sudo, a restored backup, a copied profile), "
                        f"give it back: {chown}" if chown else
                        "it is not eventlog's to give: choose a folder this user may write (for the home: --home, "
                        "EVENTLOG_HOME), or have its owner let this user in")
            else:  # a profile of another account: using it as that account is the first answer
                name = _account(st.st_uid)
                them = f"sudo -u {shlex.quote(name)}" if name is not None else f"sudo -u '#{st.st_uid}'"
                hint = (f"run eventlog as its owner ({them} ...) or read a copy its owner exports"
                        + (f"; if it should be this user's (a profile copied from that account): {chown}" if chown else
                           "; or choose a folder this user may write (for the home: --home, EVENTLOG_HOME)"))
            return (p, f"{p} belongs to {user_name(st.st_uid)}, not to this user, {user_name(me)}", hint)
        bits = "rwx" if is_dir else "rw"
        return (p, f"{p} is mode {stat.S_IMODE(st.st_mode):o}: its owner (this user) may not "
                f"{'enter, read or write' if is_dir else 'read or write'} it",
                f"chmod u+{bits} {shlex.quote(str(p))} (delete nothing: its files hold the data)")
    return None


def chown_owner(uid: int, gid: int) -> str:
    """``name:`` for ``chown`` (the user and their login group), or ``uid:gid`` without a name."""
    name = _account(uid)
    return f"{name}:" if name is not None else f"{uid}:{gid}"


def denied(e: OSError, action: str, path: str | os.PathLike[str] | None = None, *,
           write: bool = True) -> StorageError:
    """:class:`PermissionDeniedError` for ``e`` (an ``EACCES``/``EPERM`` met while ``action``),
    naming the file or folder that refuses and the command that gives access back
    (:func:`access_problem`); the caller chains ``e``."""
    where = path if path is not None else e.filename
    found = access_problem(where, write=write) if where is not None else None
    if found is None:
        at = f" ({where})" if where is not None else ""
        return PermissionDeniedError(f"{action}: {e.strerror or e}{at}",
                                     hint="check the owner and permissions of the profile's files (`eventlog doctor`)",
                                     path=None if where is None else str(where))
    part, what, hint = found
    return PermissionDeniedError(f"{action}: {what}", hint=hint, path=str(part))


def give_owner_access(path: str | os.PathLike[str]) -> bool:
    """Make a file of this user's whose mode keeps its owner out (``chmod 000``, ``chmod a-w``,
    a copy that lost its modes) 0600 again, saying so; True when it was changed. A file of
    another user, a link, a folder or one already usable is left as it is (False): only the
    owner's own bits are restored, nothing is read, moved or deleted."""
    try:
        st = os.lstat(path)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or stat.S_IMODE(st.st_mode) & FILE_MODE == FILE_MODE):
            return False
        os.chmod(path, FILE_MODE)
    except OSError:
        return False
    logging.getLogger("eventlog").warning("%s was mode %o, which kept its owner (this user) out; made %o",
                                          path, stat.S_IMODE(st.st_mode), FILE_MODE)
    return True


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


def open_private(path: str | os.PathLike[str], flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` of a file of the profile (a lock file, most often created here) that never
    follows a symlink: one found in its place (a hostile or mistaken link, dangling or not) is
    removed — the link, never what it points at — and the file made where it belongs. Raises
    ``OSError`` as ``os.open`` does otherwise."""
    if flags & os.O_CREAT and os.geteuid() == 0:
        try:  # made here: a run with sudo gives it to the owner of the folder (hand_over)
            fd = os.open(path, flags | os.O_EXCL | os.O_NOFOLLOW, mode)
        except OSError:
            pass
        else:
            hand_over(path, fd)
            return fd
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except PermissionError:
        if not give_owner_access(path):
            raise
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno != errno.ELOOP or not os.path.islink(path):
            raise
    logging.getLogger("eventlog").warning("%s was a symbolic link (to %r); replaced by the file it stands for",
                                          path, os.readlink(path))
    os.unlink(path)
    return os.open(path, flags | os.O_NOFOLLOW, mode)


@contextmanager
def atomic_write(path: str | os.PathLike[str], *, mode: int = FILE_MODE) -> Iterator[BinaryIO]:
    """Write ``path`` all or nothing: yields a binary file beside it; when the block ends without
    an exception the data is synced and renamed over ``path`` (then the directory is synced).
    On an exception the temporary file is removed and ``path`` is left as it was.

    ``mode`` applies to a newly created file (``FILE_MODE``: 0600 whatever the umask;
    ``USER_FILE_MODE``: what the umask allows)."""
    target = Path(path)
    tmp = temp_path(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        if mode == FILE_MODE:
            os.fchmod(fd, FILE_MODE)
            hand_over(tmp, fd)
        with os.fdopen(fd, "wb") as fp:
            yield fp
            fp.flush()
            os.fsync(fp.fileno())
        publish(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def flock_until(fd: int, deadline: float) -> bool:
    """Take the exclusive flock on ``fd``, polling with a growing pause (0.5 to 10 ms) until
    ``deadline`` (``time.monotonic()``); False when it was still held then. Never blocks past
    it: a holder that is stopped (SIGSTOP) costs a waiter its deadline, not forever."""
    delay = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)


def flock_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid holding an exclusive flock on ``path`` (a file or a directory), from /proc/locks
    (Linux; None elsewhere, or when nobody holds one). Reads /proc only: never opens ``path``.

    A lock is ``path``'s when its device and inode are ``path``'s: inode numbers repeat across file
    systems (two tmpfs mounts both start at 2), and matched by the inode alone another file
    system's lock named its holder -- a stopped process there made doctor, reads and writers
    take this lock for held by a stopped process. Where the device does not read the same in
    /proc/locks as in stat() (btrfs subvolumes), an inode-only match is taken when all such
    matches name one process, else the holder is unknown (None)."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    device = (os.major(st.st_dev), os.minor(st.st_dev))
    others: set[int | None] = set()
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("->" marks a waiter)
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[2] != "->":
            dev_ino = parts[5].split(":")
            if len(dev_ino) == 3 and dev_ino[2].isascii() and dev_ino[2].isdigit() and int(dev_ino[2]) == st.st_ino:
                pid = int(parts[4]) if parts[4].isascii() and parts[4].isdigit() else None
                try:
                    if (int(dev_ino[0], 16), int(dev_ino[1], 16)) == device:
                        return pid
                except ValueError:
                    pass
                others.add(pid)
    return others.pop() if len(others) == 1 else None

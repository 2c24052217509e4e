"""Where projection files live and how a new generation replaces the old one.

A projection is reached through a *pointer*: a symlink (``state.db``, ``fts.db``) naming a
versioned file ``<kind>.<gen>.v<schema>.db`` in the same directory. SQLite resolves the symlink
when it opens, so its ``-wal``/``-shm`` are named after the versioned file and can never pair
with another generation. A rebuild writes a new versioned file completely, syncs it, then
replaces the pointer atomically (temporary symlink + ``os.replace`` + directory fsync).

**No leftovers.** Every process that has a generation open holds a shared ``flock`` on its
lock file ``<kind>.<gen>.v<schema>.lock`` (:func:`hold`; never the database file itself: closing
any descriptor of it would cancel SQLite's fcntl locks). A generation no pointer names is
deleted as soon as nobody holds it (:func:`collect_generation` takes the lock exclusively, or
leaves it): by the builder right after a swap, by the last process that lets go of it, and by a
sweep (:func:`collect`) at open and heal for what a killed process left. Deletion removes the
database file first, then its ``-wal``/``-shm``, the lock file last, so a deletion killed
halfway leaves only files the next sweep recognises and removes. A build that died before its
swap holds nothing any more and is collected the same way.

A process whose schema is older than the one the canonical pointer names (a hot update is
under way) uses a private pointer ``<kind>.v<schema>.db`` instead, so both versions keep
working, each on its own file. Every process holds ``<kind>.v<schema>.lock`` shared for as long
as it runs; once no process of an older version is left, the newer program's next open removes
that version's private pointer and file (:func:`collect_superseded`).

Nothing here opens a database file with plain file I/O except :func:`create_empty` and
:func:`fsync_file`, which only touch a new file no connection has open.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

# The one place private directories are made and files written atomically (re-exported here).
from eventlog.profiles import DIR_MODE as DIR_MODE
from eventlog.profiles import FILE_MODE as FILE_MODE
from eventlog.profiles import atomic_write, hand_over, open_private
from eventlog.profiles import fsync_dir as fsync_dir
from eventlog.profiles import fsync_file as fsync_file
from eventlog.profiles import make_dir as make_dir
from eventlog.profiles import publish as publish
from eventlog.profiles import temp_path as temp_path

_log = logging.getLogger("eventlog.projections")

KINDS = ("state", "fts")
_GEN_RE = re.compile(r"(state|fts)\.([0-9]+)\.v([0-9]+)\.db")
_GEN_FILE_RE = re.compile(r"(state|fts)\.([0-9]+)\.v([0-9]+)\.(?:db|db-wal|db-shm|db-journal|lock)")
SIDECARS = ("", "-wal", "-shm", "-journal")


@dataclass(frozen=True)
class Generation:
    """One versioned projection file."""

    kind: str
    gen: int
    schema: int
    path: Path

    @property
    def name(self) -> str:
        return self.path.name


def parse(path: Path) -> Generation | None:
    """The generation a file name denotes, or None when it is not a generation file."""
    m = _GEN_RE.fullmatch(path.name)
    if not m:
        return None
    return Generation(m.group(1), int(m.group(2)), int(m.group(3)), path)


def canonical_pointer(directory: Path, kind: str) -> Path:
    return directory / f"{kind}.db"


def private_pointer(directory: Path, kind: str, schema: int) -> Path:
    return directory / f"{kind}.v{schema}.db"


def read_pointer(pointer: Path) -> Generation | None:
    """The generation ``pointer`` names, or None when it is missing, not a symlink, or names
    something that is not a generation file of this directory (the file itself may be gone)."""
    try:
        target = os.readlink(pointer)
    except OSError:
        return None
    if "/" in target:
        return None
    g = parse(pointer.parent / target)
    if g is None or g.kind != pointer.name.split(".", 1)[0]:
        return None
    return g


def pointer_for(directory: Path, kind: str, schema: int) -> Path:
    """The pointer a process of ``schema`` uses: the canonical one unless it names a newer
    schema, then this schema's private pointer."""
    canon = canonical_pointer(directory, kind)
    g = read_pointer(canon)
    if g is not None and g.schema > schema:
        return private_pointer(directory, kind, schema)
    return canon


def generations(directory: Path, kind: str) -> list[Generation]:
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        g = parse(directory / name)
        if g is not None and g.kind == kind:
            out.append(g)
    return sorted(out, key=lambda g: g.gen)


def next_generation(directory: Path, kind: str, schema: int) -> Generation:
    """A generation number never issued before in this directory (a reused name could let a
    reader mistake a new file for the one it holds). Records it in ``.<kind>.generation``.
    Call only while holding the projector lease."""
    counter = directory / f".{kind}.generation"
    try:
        issued = int(counter.read_text().strip() or 0)
    except (OSError, ValueError):
        issued = 0
    top = max([issued, *(g.gen for g in generations(directory, kind))])
    for name in referenced(directory, kind):
        g = parse(directory / name)
        if g is not None:
            top = max(top, g.gen)
    gen = top + 1
    with atomic_write(counter) as fp:
        fp.write(f"{gen}\n".encode())
    return Generation(kind, gen, schema, directory / f"{kind}.{gen}.v{schema}.db")


def remove_file(path: Path) -> None:
    """Delete a generation file and its sidecars. Only for files no pointer names."""
    for suffix in SIDECARS:
        try:
            os.unlink(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def create_empty(path: Path) -> None:
    """Create ``path`` empty with mode 0600 (SQLite gives its -wal/-shm the same mode).
    Any leftover of that name (a crashed build) is removed first."""
    remove_file(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        hand_over(path, fd)  # (SQLite, run as root, gives a database's -wal and -shm its owner)
    finally:
        os.close(fd)


def swap_pointer(pointer: Path, target: Generation) -> None:
    """Make ``pointer`` name ``target`` atomically and durably."""
    tmp = temp_path(pointer)
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target.name, tmp)
    publish(tmp, pointer)


def drop_pointer(pointer: Path) -> None:
    """Remove ``pointer`` durably (a missing one is fine): its projection reads as missing."""
    try:
        os.unlink(pointer)
    except FileNotFoundError:
        return
    fsync_dir(pointer.parent)


def referenced(directory: Path, kind: str) -> set[str]:
    """Names of the generation files any pointer of ``kind`` names."""
    out: set[str] = set()
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if name == f"{kind}.db" or re.fullmatch(rf"{kind}\.v[0-9]+\.db", name):
            try:
                target = os.readlink(directory / name)
            except OSError:
                continue
            out.add(target)
    return out


# ---- holding and collecting generations ----------------------------------------------------------

def lock_path(g: Generation) -> Path:
    return g.path.with_name(f"{g.kind}.{g.gen}.v{g.schema}.lock")


def _lock_fd(path: Path, op: int, create: bool) -> int | None:
    """An fd of ``path`` holding flock ``op`` on a file still linked there, or None (missing,
    unlinked meanwhile, or the lock not taken)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = open_private(path, flags)
    except OSError:
        return None
    try:
        fcntl.flock(fd, op)
        if os.fstat(fd).st_nlink > 0:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def hold(g: Generation) -> int | None:
    """A shared hold on generation ``g``: while the returned fd is open no process deletes its
    files. None when ``g`` has been (or is being) collected. A lock file missing while a pointer
    names ``g`` (removed by hand) is made again. Release with :func:`release`.

    Never waits: the only exclusive holder of a generation's lock is :func:`collect_generation`,
    deleting a generation no pointer names, and a reader that had read the pointer just before a
    swap waited for it -- for as long as the collecting process stayed stopped (SIGSTOP) there
    (outside audit, helper-82). Such a generation is being collected: None, and the caller reads
    the pointer again."""
    fd = _lock_fd(lock_path(g), fcntl.LOCK_SH | fcntl.LOCK_NB, create=False)
    if fd is None and g.name in referenced(g.path.parent, g.kind) and g.path.exists():
        fd = _lock_fd(lock_path(g), fcntl.LOCK_SH | fcntl.LOCK_NB, create=True)
    return fd


def hold_pointed(pointer: Path) -> tuple[int | None, Generation | None]:
    """The generation ``pointer`` names, held (:func:`hold`): when the one it named was
    collected between reading the pointer and taking the hold, the pointer is read again.
    ``(None, g)`` when ``g``'s files are missing; ``(None, None)`` when the pointer is."""
    g = read_pointer(pointer)
    for _ in range(20):
        if g is None:
            return None, None
        fd = hold(g)
        if fd is not None:
            return fd, g
        now = read_pointer(pointer)
        if now == g:
            break
        g = now
    return None, g


def release(fd: int | None, g: Generation | None) -> None:
    """Let go of a hold; if no pointer names ``g`` and nobody else holds it, delete it now."""
    if fd is None:
        return
    os.close(fd)
    if g is not None and read_pointer(canonical_pointer(g.path.parent, g.kind)) != g:
        try:
            collect_generation(g)
        except OSError:
            pass  # the next sweep


def create_generation(g: Generation) -> int:
    """Create ``g``'s lock file (held shared: a running build is never collected) and an empty
    database file with mode 0600. Returns the hold; :func:`release` it after the swap."""
    for _ in range(10):
        fd = _lock_fd(lock_path(g), fcntl.LOCK_SH, create=True)
        if fd is not None:
            create_empty(g.path)
            return fd
    raise OSError(f"cannot lock the new generation {g.name}")


def collect_generation(g: Generation) -> bool:
    """Delete generation ``g`` (database file, then sidecars, then lock file) if no pointer
    names it and no process holds it. Never waits. Returns True when it was deleted."""
    directory = g.path.parent
    if g.name in referenced(directory, g.kind):
        return False
    fd = _lock_fd(lock_path(g), fcntl.LOCK_EX | fcntl.LOCK_NB, create=True)
    if fd is None:
        return False
    try:
        if g.name in referenced(directory, g.kind):
            return False
        remove_file(g.path)
        os.unlink(lock_path(g))
        fsync_dir(directory)
        return True
    except FileNotFoundError:
        return True
    except OSError as e:  # best effort: an old generation that cannot go stops nothing
        _log.warning("cannot delete the superseded projection file %s (%s): left in place", g.path, e.strerror or e)
        return False
    finally:
        os.close(fd)


def generation_files(directory: Path) -> dict[tuple[str, int, int], list[str]]:
    """Every file of every generation (database, sidecars, lock), by (kind, gen, schema)."""
    out: dict[tuple[str, int, int], list[str]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        m = _GEN_FILE_RE.fullmatch(name)
        if m:
            out.setdefault((m.group(1), int(m.group(2)), int(m.group(3))), []).append(name)
    return out


def remove_replaced(directory: Path, schemas: dict[str, int]) -> list[str]:
    """Delete every generation of this program's schemas that no pointer names, with its
    sidecars and lock file, *even one a process still holds* (after an erase nothing may keep
    the words: a holder keeps reading its open copy until it lets go; the names are gone).
    An older program version's private pointers go first and its generations with them, even
    while a process of that version runs: such a version may know nothing of erases, so its
    files would keep the words and it would go on serving them (its catch-up skips the erase
    record); it rebuilds from the log, where the content is gone, or refuses a log it cannot
    read. A newer version's files are left to it (it purges them itself).
    Returns the names deleted. Call only under the projector lease."""
    removed = []
    for pointer, _kind, _old in superseded_pointers(directory, schemas):
        try:
            os.unlink(pointer)
            removed.append(pointer.name)
        except FileNotFoundError:
            pass
    for (kind, gen, schema), _names in sorted(generation_files(directory).items()):
        if kind not in schemas or schema > schemas[kind]:
            continue
        g = Generation(kind, gen, schema, directory / f"{kind}.{gen}.v{schema}.db")
        if g.name in referenced(directory, kind):
            continue
        remove_file(g.path)
        try:
            os.unlink(lock_path(g))
        except FileNotFoundError:
            pass
        removed.append(g.name)
    removed += sweep_scratch(directory)  # an import's copy of its source, left by a killed import
    if removed:
        fsync_dir(directory)
    return removed


_SCRATCH_RE = re.compile(r"\.((?:hermes-)?import)-(?:([0-9]+)-)?[a-z0-9_]+")
SCRATCH_STALE_S = 86400.0
"""A scratch folder whose name carries no pid (an earlier release made it) is stale this old."""


def scratch_prefix(kind: str) -> str:
    """The name prefix of an import's scratch folder (``kind``: ``hermes-import``, ``import``),
    carrying the pid of its process so :func:`sweep_scratch` can tell one whose process died."""
    return f".{kind}-{os.getpid()}-"


def sweep_scratch(directory: Path, *, every: str | None = None) -> list[str]:
    """Remove the scratch folders imports left in ``directory`` when their process died:
    ``.hermes-import-<pid>-*`` (``eventlog import --format hermes``) and ``.import-<pid>-*`` (the
    Hermes switch) each hold a whole copy of the source database while the import runs, and one
    killed kept it under the profile for good, through every erase of its sessions (outside
    audit, helper-52). A folder whose process is alive stays; one whose name has no pid (an
    earlier release's) once it is a day old. ``every``: a kind (``import``) whose every maker
    holds a lock the caller holds, so all folders of that kind are stale. Returns the names
    removed."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _SCRATCH_RE.fullmatch(name)
        if m is None:
            continue
        path = directory / name
        try:
            if not path.is_dir() or path.is_symlink():
                continue
            if m.group(1) != every:
                if m.group(2) is not None:
                    if _alive(int(m.group(2))):
                        continue
                elif time.time() - path.stat().st_mtime < SCRATCH_STALE_S:
                    continue
        except (OSError, ValueError, OverflowError):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(name)
            _log.warning("removed %s: the scratch copy of an import whose process stopped", path)
    return removed


_TEMP_RE = re.compile(r"\.(?:(?:state|fts)(?:\.v[0-9]+)?\.db|\.(?:state|fts)\.generation)\.([0-9]+)\.[0-9]+\.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def collect(directory: Path, schemas: dict[str, int]) -> list[str]:
    """Sweep: delete every generation of this program's schemas (``schemas[kind]``) that no
    pointer names and nobody holds, every such generation of an older schema once no process of
    that version is left (a rebuild after a hot update replaced it: gone as soon as the swap,
    not at the next process's open), what a deletion killed halfway left, and the temporary
    pointers and generation counters of processes that died writing them (older versions'
    private pointers: :func:`collect_superseded`). Returns the names deleted."""
    from projections.lease import schema_lock_path, try_exclusive

    removed = []
    for (kind, gen, schema), _names in sorted(generation_files(directory).items()):
        if kind not in schemas or schema > schemas[kind]:
            continue
        g = Generation(kind, gen, schema, directory / f"{kind}.{gen}.v{schema}.db")
        if schema == schemas[kind]:
            if collect_generation(g):
                removed.append(g.name)
            continue
        # An older version may not hold generation locks: its own schema lock says whether a
        # process of it is left.
        fd = try_exclusive(schema_lock_path(directory, kind, schema))
        if fd is None:
            continue
        try:
            if collect_generation(g):
                removed.append(g.name)
        finally:
            os.close(fd)
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    for name in names:
        m = _TEMP_RE.fullmatch(name)
        if m and not _alive(int(m.group(1))):
            try:
                os.unlink(directory / name)
                removed.append(name)
            except OSError:
                pass
    return removed + sweep_scratch(directory)


_PRIVATE_RE = re.compile(r"(state|fts)\.v([0-9]+)\.db")


def superseded_pointers(directory: Path, schemas: dict[str, int]) -> list[tuple[Path, str, int]]:
    """``(pointer, kind, schema)`` of the private pointers left by program versions older than
    ``schemas[kind]`` (one directory listing)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        m = _PRIVATE_RE.fullmatch(name)
        if m and m.group(1) in schemas and int(m.group(2)) < schemas[m.group(1)]:
            out.append((directory / name, m.group(1), int(m.group(2))))
    return out


def collect_superseded(directory: Path, schemas: dict[str, int]) -> list[str]:
    """Remove the private pointer of every older schema version that no live process uses any
    more (see :class:`projections.lease.SchemaUse`); then sweep (:func:`collect`: every
    generation file no pointer names and nobody holds, of such a version too). ``schemas``: this
    program's schema per kind. Returns the names removed."""
    from projections.lease import schema_lock_path, try_exclusive

    removed: list[str] = []
    for pointer, kind, old in superseded_pointers(directory, schemas):
        fd = try_exclusive(schema_lock_path(directory, kind, old))
        if fd is None:
            continue  # a process of that version is alive: its files stay
        try:
            os.unlink(pointer)
            removed.append(pointer.name)
            fsync_dir(directory)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    return removed + collect(directory, schemas)

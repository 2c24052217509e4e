"""Where projection files live and how a new generation replaces the old one.

A projection is reached through a *pointer*: a symlink (``state.db``, ``fts.db``) naming a
versioned file ``<kind>.<gen>.v<schema>.db`` in the same directory. SQLite resolves the symlink
when it opens, so its ``-wal``/``-shm`` are named after the versioned file and can never pair
with another generation. A rebuild writes a new versioned file completely, syncs it, then
replaces the pointer atomically (temporary symlink + ``os.replace`` + directory fsync).
Connections opened on the old file keep reading it; the previous generation is kept, older
unreferenced ones are deleted.

A process whose schema is older than the one the canonical pointer names (a hot update is
under way) uses a private pointer ``<kind>.v<schema>.db`` instead, so both versions keep
working, each on its own file. Every process holds ``<kind>.v<schema>.lock`` shared for as long
as it runs; once no process of an older version is left, the newer program's next open removes
that version's private pointer and file (:func:`collect_superseded`).

Nothing here opens a database file with plain file I/O except :func:`create_empty` and
:func:`fsync_file`, which only touch a new file no connection has open.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# The one place private directories are made and files written atomically (re-exported here).
from eventlog.profiles import DIR_MODE as DIR_MODE
from eventlog.profiles import FILE_MODE as FILE_MODE
from eventlog.profiles import atomic_write
from eventlog.profiles import fsync_dir as fsync_dir
from eventlog.profiles import fsync_file as fsync_file
from eventlog.profiles import make_dir as make_dir
from eventlog.profiles import publish as publish
from eventlog.profiles import temp_path as temp_path

KINDS = ("state", "fts")
_GEN_RE = re.compile(r"(state|fts)\.([0-9]+)\.v([0-9]+)\.db")
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


def collect_garbage(directory: Path, kind: str, keep: set[str]) -> list[str]:
    """Delete generation files of ``kind`` that no pointer names and that are not in ``keep``
    (the generation a swap just replaced). Call only while holding the projector lease."""
    live = referenced(directory, kind) | keep
    removed = []
    for g in generations(directory, kind):
        if g.name not in live:
            remove_file(g.path)
            removed.append(g.name)
    return removed


def collect_abandoned(directory: Path, kind: str) -> list[str]:
    """Delete generation files newer than every pointer's: leftovers of a build that died
    before its swap. Call only while holding the projector lease (no build is running)."""
    live = referenced(directory, kind)
    if not live:
        return []
    top = max((g.gen for g in generations(directory, kind) if g.name in live), default=0)
    removed = []
    for g in generations(directory, kind):
        if g.gen > top and g.name not in live:
            remove_file(g.path)
            removed.append(g.name)
    return removed


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
    more (see :class:`projections.lease.SchemaUse`), with the generation file it named unless
    another pointer still names it. ``schemas``: this program's schema per kind. Returns the
    names removed."""
    from projections.lease import schema_lock_path, try_exclusive

    removed: list[str] = []
    for pointer, kind, old in superseded_pointers(directory, schemas):
        fd = try_exclusive(schema_lock_path(directory, kind, old))
        if fd is None:
            continue  # a process of that version is alive: its files stay
        try:
            g = read_pointer(pointer)
            os.unlink(pointer)
            removed.append(pointer.name)
            if g is not None and g.name not in referenced(directory, kind):
                remove_file(g.path)
                removed.append(g.name)
            fsync_dir(directory)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    return removed

"""Which filesystem a log directory is on — LMDB must never be on a network filesystem.

LMDB coordinates its processes through a lock file mapped into memory and POSIX locks, and
reads its data through a shared memory map. On NFS, SMB, sshfs, 9p (WSL's Windows drives) and
their kin those are not coherent between hosts, and not always even between the processes of
one host: two writers on two hosts each see their own copy of the lock table and both commit
(the "second writer corrupts the file" failure eventlog exists to prevent). SQLite's answer
there is a journal fallback; LMDB has none. So a log refuses to open on such a filesystem —
before creating anything there — and names the filesystem, its mount point and the way out: a
local disk, or the PostgreSQL log for a profile shared between hosts.

The mount table is read from ``/proc/self/mountinfo`` (Linux). Where it cannot be read (other
systems), nothing is refused. ``EVENTLOG_ALLOW_NETWORK_FS=1`` opens the log anyway, for one
host, at the user's own risk (LMDB's own documentation forbids it).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from eventlog.errors import StorageError

MOUNTINFO = "/proc/self/mountinfo"
ALLOW_ENV = "EVENTLOG_ALLOW_NETWORK_FS"

NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "ncp", "9p", "afs", "coda", "ceph", "glusterfs", "lustre",
    "beegfs", "orangefs", "pvfs2", "davfs", "vboxsf", "vmhgfs", "prl_fs", "fuse.sshfs", "fuse.s3fs",
    "fuse.rclone", "fuse.gcsfuse", "fuse.goofys", "fuse.blobfuse", "fuse.blobfuse2", "fuse.juicefs",
    "fuse.glusterfs", "fuse.ceph-fuse", "fuse.ceph", "fuse.davfs", "fuse.smbnetfs", "fuse.curlftpfs",
    "fuse.mountpoint-s3", "fuse.vmhgfs-fuse", "fuse.afpfs",
})
"""Kernel filesystem types (FUSE ones as ``fuse.<subtype>``, as the mount table names them) whose
files are served from another machine or a hypervisor's host share."""

_local: set[tuple[str, str]] = set()
"""Paths found on a local filesystem in this process: a store opened again (the adapters open
the shared store per session) does not read the mount table again (~0.1-0.3 ms)."""

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """A mount table field: space, tab, newline and backslash are written as octal escapes."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _resolved(path: Path) -> str:
    """``path`` with its nearest existing ancestor's links resolved (the log directory and its
    parents may not exist yet; what does not exist cannot be a link nor a mount point)."""
    p = Path(os.path.abspath(path))
    rest: list[str] = []
    while not os.path.lexists(p) and p.parent != p:
        rest.append(p.name)
        p = p.parent
    return os.path.join(os.path.realpath(p), *reversed(rest))


def mount_of(path: str | os.PathLike[str], mountinfo: str = MOUNTINFO) -> tuple[str, str] | None:
    """``(mount point, filesystem type)`` of the mount ``path`` is on, or None if the mount
    table cannot be read. The deepest mount point containing the path wins; of two at the same
    point, the later mounted (it hides the earlier)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    target = _resolved(Path(path))
    best: tuple[str, str] | None = None
    for line in lines:
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        fstype = line.split(" - ", 1)[1].split(" ", 1)[0]
        inside = point == "/" or target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best


def network_mount(path: str | os.PathLike[str], mountinfo: str = MOUNTINFO) -> tuple[str, str] | None:
    """``(mount point, filesystem type)`` if ``path`` is on a network filesystem, else None."""
    found = mount_of(path, mountinfo)
    if found is None:
        return None
    fstype = found[1].lower()
    return found if fstype in NETWORK_TYPES or fstype.split(".", 1)[0] in NETWORK_TYPES else None


def refuse_network(path: str | os.PathLike[str], mountinfo: str = MOUNTINFO) -> None:
    """Raise :class:`StorageError` if the log directory ``path`` is on a network filesystem
    (unless ``EVENTLOG_ALLOW_NETWORK_FS=1``)."""
    if os.environ.get(ALLOW_ENV) == "1":
        return
    key = (os.path.abspath(path), mountinfo)  # a relative path is another directory after a chdir
    if key in _local:
        return
    found = network_mount(path, mountinfo)
    if found is None:
        if len(_local) >= 4096:
            _local.clear()
        _local.add(key)
        return
    point, fstype = found
    raise StorageError(
        f"the log directory {os.fspath(path)} is on a network filesystem ({fstype}, mounted at {point}): "
        "LMDB's locks and memory map are not shared correctly there, and writers on two hosts would "
        "corrupt the log; nothing was opened or written",
        hint="keep the eventlog home (EVENTLOG_HOME, or a Hermes home the facade serves) on a local disk, "
             "or share a profile between hosts through the PostgreSQL log (EVENTLOG_LOG_URL, docs/POSTGRES.md); "
             "to keep a backup on a share, write an export there (`eventlog export FILE`, restored with "
             f"`eventlog import FILE`); to open it anyway on one host, at your own risk, set {ALLOW_ENV}=1")

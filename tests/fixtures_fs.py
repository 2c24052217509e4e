"""Small real file systems for tests: a tmpfs for full-disk tests, and a FUSE mount that the
mount table calls a network share. Both need root and CAP_SYS_ADMIN; a test is skipped, saying
why, where they cannot be mounted."""
from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"12m"``) mounted at ``where`` for the block; unmounted after
    (lazily when something still holds it)."""
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {r.stderr.strip() or r.returncode}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


# FUSE kernel protocol, as much as a mount whose root directory is empty needs (linux/fuse.h).
_IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
_INIT_OUT = struct.Struct("<IIIIHHIIHHI7I")  # major .. flags2, then 7 reserved words (64 bytes)
_ATTR_OUT = struct.Struct("<QII" + "QQQQQQ" + "IIIIIIIIII")  # valid, valid_nsec, dummy, then fuse_attr
_LOOKUP, _FORGET, _GETATTR, _INIT, _INTERRUPT, _DESTROY, _BATCH_FORGET = 1, 2, 3, 26, 36, 38, 42


def _serve_fuse(fd: int) -> None:
    """Answer the kernel until the mount goes: the root is an empty directory, and every other
    request is refused (ENOENT for a lookup, ENOSYS for the rest)."""
    while True:
        try:
            request = os.read(fd, 1 << 18)
        except OSError:  # ENODEV: unmounted
            return
        _, opcode, unique, nodeid, *_ = _IN_HEADER.unpack_from(request)
        if opcode in (_FORGET, _BATCH_FORGET, _INTERRUPT):
            continue  # no reply expected
        body, error = b"", -errno.ENOSYS
        if opcode == _INIT:
            body, error = _INIT_OUT.pack(7, 31, 0, 0, 16, 12, 1 << 16, 1, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0), 0
        elif opcode == _GETATTR and nodeid == 1:
            now = int(time.time())
            body, error = _ATTR_OUT.pack(1, 0, 0, 1, 0, 0, now, now, now, 0, 0, 0, stat.S_IFDIR | 0o755, 2,
                                         0, 0, 0, 4096, 0), 0
        elif opcode == _LOOKUP:
            error = -errno.ENOENT
        elif opcode == _DESTROY:
            error = 0
        try:
            os.write(fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(body), error, unique) + body)
        except OSError:
            return


@contextmanager
def fuse_mount(where: Path, subtype: str) -> Iterator[Path]:
    """A real FUSE mount at ``where`` whose mount table entry reads ``fuse.<subtype>`` — what
    sshfs (``subtype="sshfs"``), rclone or s3fs mounts show — served by a thread of this process
    (an empty root directory, nothing can be created in it). Needs root and /dev/fuse; the test
    is skipped, saying why, where it cannot be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as e:
        pytest.skip(f"no FUSE here (/dev/fuse: {e.strerror})")
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}".encode()
    if libc.mount(b"audit-share", os.fsencode(where), f"fuse.{subtype}".encode(), 0, options) != 0:
        os.close(fd)
        pytest.skip(f"cannot mount a FUSE file system here (needs root): {os.strerror(ctypes.get_errno())}")
    server = threading.Thread(target=_serve_fuse, args=(fd,), name="fuse-share", daemon=True)
    server.start()
    try:
        yield where
    finally:
        libc.umount2(os.fsencode(where), 2)  # MNT_DETACH
        server.join(5)
        os.close(fd)

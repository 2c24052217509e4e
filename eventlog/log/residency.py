"""Keeping a long scan of the log from inflating the process's resident set.

LMDB serves reads straight from its memory map, so every page a scan touches stays mapped in
this process until the kernel needs the memory back. Those pages are shared page cache, not
private memory, but the kernel counts them in the process's RSS (and its peak, ``VmHWM``): a
rebuild that reads a 2 GB log would report a 2 GB footprint. :func:`release` tells the kernel
(``madvise(MADV_DONTNEED)``) that this process is done with its mapping of a file; the pages
stay in the page cache and the next access maps them in again. Safe on a read-only shared
mapping, which is how LMDB maps a file unless ``writemap`` is set (eventlog never sets it).

Linux only; elsewhere, or when anything fails, it does nothing: residency is an optimisation.
"""
from __future__ import annotations

import os
import sys
from typing import Any

MADV_DONTNEED = 4

_libc: Any = None


def _madvise() -> Any:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        # ctypes is loaded on the first release, not on import: one-shot commands never pay for it.
        # CDLL(None) is the process itself, where libc's madvise already is (no find_library,
        # which runs a compiler or ldconfig in a subprocess).
        import ctypes

        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _libc.madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            return None
    return _libc


def mappings(path: str) -> list[tuple[int, int]]:
    """The address ranges where this process maps the file ``path`` (from /proc/self/maps)."""
    target = os.path.realpath(path)
    out = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].rstrip("\n") == target:
                    lo, hi = parts[0].split("-")
                    out.append((int(lo, 16), int(hi, 16)))
    except OSError:
        return []
    return out


def release(path: str) -> int:
    """Unmap from this process's page tables the resident pages of every mapping of ``path``.
    Returns the number of bytes of address range advised (0 when nothing was done)."""
    libc = _madvise()
    if libc is None:
        return 0
    done = 0
    for lo, hi in mappings(path):
        if libc.madvise(lo, hi - lo, MADV_DONTNEED) == 0:
            done += hi - lo
    return done

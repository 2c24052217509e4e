"""The generic log: hash-chained, append-only events with one writer. Knows no sessions.

``Log`` is the protocol every backend implements; ``EventLog`` is the LMDB backend (the
default, loaded on first use), ``MemoryLog`` the in-memory reference. See :mod:`eventlog.log.base`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventlog.log.base import Log, LogBase, VerifyResult

if TYPE_CHECKING:
    from eventlog.log.lmdb import EventLog
    from eventlog.log.memory import MemoryLog

__all__ = ["EventLog", "Log", "LogBase", "MemoryLog", "VerifyResult"]

_LAZY = {"EventLog": "eventlog.log.lmdb", "MemoryLog": "eventlog.log.memory"}


def __getattr__(name: str) -> Any:
    # Backends load on first use: `import eventlog.log` stays cheap and never pulls in LMDB.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eventlog.log' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

"""eventlog: an event-sourced, append-only session store for AI-agent runtimes.

``from eventlog import SessionStore, EventLog`` loads what it names on first use, so that
``import eventlog.log`` (the generic log) never pulls in the session domain or SQLite.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventlog import errors
from eventlog.errors import EventLogError

if TYPE_CHECKING:
    from eventlog.log.lmdb import EventLog
    from eventlog.sessions.store import SessionStore

__all__ = ["EventLog", "EventLogError", "SessionStore", "errors"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "SessionStore":
        from eventlog.sessions.store import SessionStore

        return SessionStore
    if name == "EventLog":
        from eventlog.log.lmdb import EventLog

        return EventLog
    raise AttributeError(f"module 'eventlog' has no attribute {name!r}")

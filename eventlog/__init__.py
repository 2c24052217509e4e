"""eventlog: an event-sourced, append-only session store for AI-agent runtimes."""
from __future__ import annotations

from eventlog import errors
from eventlog.errors import EventLogError
from eventlog.log import EventLog
from eventlog.store import SessionStore

__all__ = ["EventLog", "EventLogError", "SessionStore", "errors"]
__version__ = "0.1.0"

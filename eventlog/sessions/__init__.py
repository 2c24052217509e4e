"""The session domain: the event catalogue, the reference fold and the SessionStore facade."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventlog.sessions.store import SessionStore

__all__ = ["SessionStore"]


def __getattr__(name: str) -> Any:
    if name == "SessionStore":
        from eventlog.sessions.store import SessionStore

        return SessionStore
    raise AttributeError(f"module 'eventlog.sessions' has no attribute {name!r}")

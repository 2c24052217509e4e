"""eventlog behind Hermes Agent's ``SessionDB`` (hermes-agent 0.19.0).

``eventlog.adapters.hermes.SessionDB`` is a drop-in for ``hermes_state.SessionDB``: every write
is an event in an eventlog log kept beside ``db_path``, and ``db_path`` itself becomes a
projection with Hermes' own schema. :func:`install` makes an installed Hermes use it; see
docs/HERMES.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventlog.adapters.hermes.db import SessionDB

__all__ = ["SessionDB", "install"]


def __getattr__(name: str) -> Any:
    if name == "SessionDB":
        from eventlog.adapters.hermes.db import SessionDB

        return SessionDB
    if name == "install":
        from eventlog.adapters.hermes.installing import install

        return install  # (its module is not called ``install``: importing it would shadow the function)
    raise AttributeError(f"module 'eventlog.adapters.hermes' has no attribute {name!r}")

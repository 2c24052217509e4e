"""Read models derived from the event log: state.db, the FTS index, the projector.

- :class:`Projector` writes and heals a profile's projections (one process at a time, by
  lease), applies the log in batches, rebuilds on demand or as of a point.
- :class:`Reader` answers the read-model queries of docs/EVENTS.md from ``mode=ro``
  connections.
"""
from __future__ import annotations

from projections.projector import Projector
from projections.queries import Reader
from projections.schema import FTS_SCHEMA, STATE_SCHEMA

__all__ = ["Projector", "Reader", "STATE_SCHEMA", "FTS_SCHEMA"]

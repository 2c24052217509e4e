"""The events the Hermes adapter writes, and how their data holds SQL values exactly.

Every ``SessionDB`` mutation becomes one or more events. An event records what the caller asked
for with every value Hermes would have bound to SQLite (already encoded the way Hermes encodes
it: JSON text of tool calls, the ``"\\x00json:"`` content sentinel, scrubbed surrogates) and
every value the call chose itself (``time.time()``, the message id). :func:`.apply.apply`
replays it against the projection; replay is deterministic, so a rebuild gives back the same
rows, byte for byte.

Types
-----
Where the meaning is the one of eventlog's session catalogue the catalogue's name is used
(``session.created``, ``message.appended``, ``session.titled``, ``session.ended``,
``session.reopened``, ``session.archived``/``session.unarchived``, ``session.meta_updated``,
``usage.recorded``); their data uses the catalogue's field names where the values agree and
other names for Hermes' encodings (``tool_calls_json``, ``content_json``, ``model_config_json``),
so eventlog's own fold reads what it understands and ignores the rest. Everything else is
``hermes.<name>`` (see :data:`HERMES_TYPES` and docs/HERMES.md).

Values
------
The codec and the import mapping live in :mod:`sqlite_export.hermes` (layers point down).
Event data is JSON. SQL values that JSON cannot hold are tagged: ``{"$b": base64}`` for bytes,
``{"$f": "inf"|"-inf"}`` for infinite floats; NaN becomes null (SQLite stores NaN as NULL).
A value SQLite cannot bind raises what ``sqlite3`` raises for it (``ProgrammingError``,
``OverflowError``, ``UnicodeEncodeError``) before anything is appended.
"""
from __future__ import annotations

import sqlite_export.hermes as _codec

CORE_TYPES = frozenset({
    "session.created", "message.appended", "session.titled", "session.ended", "session.reopened",
    "session.archived", "session.unarchived", "session.meta_updated", "usage.recorded",
})
HERMES_TYPES = frozenset({
    "hermes.session_enriched", "hermes.peer_recorded", "hermes.expiry_flag_set",
    "hermes.routing_saved", "hermes.routing_replaced", "hermes.routing_restated", "hermes.routing_upserted",
    "hermes.routing_deleted",
    "hermes.session_reset", "hermes.repo_roots_backfilled",
    "hermes.compression_cooldown_set", "hermes.compression_cooldown_cleared", "hermes.fallback_streak_set",
    "hermes.compression_lock_acquired", "hermes.compression_lock_refreshed", "hermes.compression_lock_released",
    "hermes.model_config_set", "hermes.system_prompt_set", "hermes.billing_route_set",
    "hermes.usage_totals_set", "hermes.sessions_deleted", "hermes.sessions_finalized",
    "hermes.title_cleared", "hermes.messages_replaced", "hermes.messages_compacted",
    "hermes.api_content_set", "hermes.messages_rewound", "hermes.messages_restored",
    "hermes.messages_cleared", "hermes.sessions_imported", "hermes.parents_attached",
    "hermes.meta_set", "hermes.topic_tables_created", "hermes.topic_mode_enabled",
    "hermes.topic_mode_disabled", "hermes.topic_bound", "hermes.topic_unbound",
    "hermes.handoff_requested", "hermes.handoff_claimed", "hermes.handoff_completed", "hermes.handoff_failed",
    "hermes.rows_imported", "hermes.rows_written",
})
TYPES = CORE_TYPES | HERMES_TYPES
VERSION = 1
"""Every ``hermes.*`` type is at version 1; catalogue types carry the catalogue's version."""


sql_value = _codec.sql_value
from_json = _codec.from_json
event = _codec.hermes_event
"""``event(type, session_id, data, event_id=None)``: the input event for ``EventLog.append``; the
Hermes session id is the envelope's ``session`` when eventlog's stream ids can hold it, else
``h-<sha1 prefix>`` there and the real id as ``data["sid"]``."""
session_of = _codec.hermes_session_of
map_session_id = _codec.map_session_id
"""The stream of a Hermes session id (itself, or ``h-<sha1>`` when eventlog's ids cannot hold it)."""

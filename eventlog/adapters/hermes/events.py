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
Event data is JSON. SQL values that JSON cannot hold are tagged: ``{"$b": base64}`` for bytes,
``{"$f": "inf"|"-inf"}`` for infinite floats; NaN becomes null (SQLite stores NaN as NULL).
A value SQLite cannot bind raises what ``sqlite3`` raises for it (``ProgrammingError``,
``OverflowError``, ``UnicodeEncodeError``) before anything is appended.
"""
from __future__ import annotations

import base64
import math
import re
import sqlite3
from typing import Any

SESSION_ID_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

CORE_TYPES = frozenset({
    "session.created", "message.appended", "session.titled", "session.ended", "session.reopened",
    "session.archived", "session.unarchived", "session.meta_updated", "usage.recorded",
})
HERMES_TYPES = frozenset({
    "hermes.session_enriched", "hermes.peer_recorded", "hermes.expiry_flag_set",
    "hermes.routing_saved", "hermes.routing_replaced", "hermes.routing_deleted",
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
    "hermes.rows_imported",
})
TYPES = CORE_TYPES | HERMES_TYPES
VERSION = 1
"""Every type above is at version 1."""


def sql_value(value: Any, field: str = "value") -> Any:
    """``value`` as it can travel in event data, or what ``sqlite3`` would raise for it."""
    t = type(value)
    if value is None or t is str or t is bool:
        if t is str:
            _check_text(value)
        return value
    if t is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return value
    if t is float:
        if math.isfinite(value):
            return value
        return None if math.isnan(value) else {"$f": "inf" if value > 0 else "-inf"}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return sql_value(int(value), field)
    if isinstance(value, float):
        return sql_value(float(value), field)
    if isinstance(value, str):
        return sql_value(str.__str__(value), field)
    raise sqlite3.ProgrammingError(f"Error binding parameter {field}: type '{t.__name__}' is not supported")


def _check_text(text: str) -> None:
    if not text.isascii():
        text.encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate, as sqlite3 would


def from_json(value: Any) -> Any:
    """The SQL value a piece of event data stands for (the inverse of :func:`sql_value`)."""
    if type(value) is dict:
        if "$b" in value:
            return base64.b64decode(value["$b"])
        if "$f" in value:
            return math.inf if value["$f"] == "inf" else -math.inf
    return value


def envelope_session(session_id: Any) -> str | None:
    """The envelope's ``session`` for a Hermes session id: the id itself when eventlog's stream
    ids can hold it, else None (the id then travels in the data as ``sid``)."""
    if type(session_id) is str and SESSION_ID_RE.fullmatch(session_id):
        return session_id
    return None


def event(type_: str, session_id: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The input event for ``EventLog.append``: the Hermes session id in the envelope (or, when it
    cannot be a stream id, as ``data["sid"]``)."""
    stream = envelope_session(session_id) if session_id is not None else None
    if session_id is not None and stream is None:
        data["sid"] = sql_value(session_id, "session_id")
    return {"type": type_, "session": stream, "data": data, "v": VERSION}


def session_of(envelope: dict[str, Any]) -> Any:
    """The Hermes session id an envelope is about (inverse of :func:`event`)."""
    data = envelope.get("data")
    if type(data) is dict and "sid" in data:
        return from_json(data["sid"])
    return envelope.get("session")

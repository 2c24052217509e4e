"""Migration in: a Hermes Agent ``state.db`` becomes events, losslessly.

:func:`hermes_events` turns every row of a Hermes database (hermes-agent 0.19.0, schema 22, or
an older one) into events; :func:`import_hermes` appends them to a profile's log, once:
event ids are derived from the source, so importing the same file again appends nothing and a
later copy of it appends what is new. The Hermes adapter (``eventlog.adapters.hermes``) uses the
same events for its one-time switch, and its projection of them gives back the source's rows
exactly: values, types, message ids, session rowids, the AUTOINCREMENT counter.

Events (see docs/HERMES.md):

* each session -> ``session.created`` with every column as stored (``model_config`` as
  ``model_config_json``), its rowid and ``imported: true``; a title -> ``session.titled``; an end
  -> ``session.ended``; an archived session -> ``session.archived`` (``imported: true``: for the
  Hermes projection the row already says so); a pinned or hidden one (columns of other schemas
  than Hermes 0.19's) -> ``session.pinned`` / ``session.hidden``. Parent links follow as
  ``hermes.parents_attached`` once every session exists.
* each message -> ``message.appended`` with every column as stored (its Hermes id; JSON columns
  as ``<name>_json`` text, structured content as ``content_json``), ``imported: true``.
* each ``session_model_usage`` row -> ``usage.recorded`` with its task and api_call_count,
  ``imported: true`` (one event per row: per-model, per-route, per-task accounting survives).
* the other tables (``state_meta``, ``gateway_routing``, ``compression_locks``,
  ``async_delegations``, the Telegram topic tables) and ``sqlite_sequence`` ->
  ``hermes.rows_imported``.

eventlog's own fold reads what it understands of these (sessions, titles, ends, messages, usage)
and skips the rest; odd stored values (a TEXT timestamp, a BLOB) are kept as they are and read as
unknown there, never a crash.

:func:`import_hermes` (``eventlog import --format hermes``) also keeps the profile showing what
Hermes shows: a run of messages Hermes no longer shows (``active = 0``) is hidden by a
``messages.rewound``; the source is read whole before anything is appended (a damaged file
appends nothing); a source session whose id the profile uses for another session refuses the
import. On a later import of a newer copy: new sessions, messages and rows are appended; a session
imported before gets the title and end the source shows now (``session.titled``,
``session.reopened``, ``session.ended``, whose ids name the stream position they follow, so the
same file imported again appends nothing); a message, usage row or shown session column whose
stored values changed keeps its first import (one warning each).

Reading the source never writes it: it is copied with SQLite's backup API from a ``mode=ro``
connection (one with a ``-wal`` but no ``-shm``, or with a hot ``-journal`` a killed writer left,
by copying its files; one in WAL mode with no ``-wal`` with ``immutable=1``; one another process
holds locked is refused), see :func:`open_source` and :func:`snapshot_source`.

SQL values travel in event data as JSON; what JSON cannot hold is tagged: ``{"$b": base64}`` for
bytes, ``{"$f": "inf"|"-inf"}`` for infinite floats (NaN is NULL in SQLite already).
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import shutil
import sqlite3
import tempfile
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from eventlog.errors import (
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    EventTooLargeError,
    StorageError,
    ValidationError,
)

CURRENT_VERSIONS = {"message.appended": 2}
"""Catalogue versions of the catalogue types these events use where not 1 (tests keep this in
step with ``eventlog.sessions.events.CURRENT_VERSIONS``; not imported here to keep the Hermes
adapter's start cheap)."""

Progress = Callable[[int, int], None]
MAX_WARNINGS = 1000
ROWS_PER_EVENT = 500
BYTES_PER_EVENT = 4 << 20
EVENTS_PER_APPEND = 256
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_ID_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")

# Columns of Hermes 0.19.0 (schema 22) this mapping carries, per table; a source of an older
# schema simply lacks some.
SESSION_COLUMNS = (
    "id", "source", "user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json",
    "expiry_finalized", "model", "model_config", "system_prompt", "parent_session_id", "started_at", "ended_at",
    "end_reason", "message_count", "tool_call_count", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens", "reasoning_tokens", "cwd", "git_branch", "git_repo_root", "billing_provider",
    "billing_base_url", "billing_mode", "estimated_cost_usd", "actual_cost_usd", "cost_status", "cost_source",
    "pricing_version", "title", "api_call_count", "handoff_state", "handoff_platform", "handoff_error",
    "compression_failure_cooldown_until", "compression_failure_error", "compression_fallback_streak",
    "profile_name", "rewind_count", "archived",
)
MESSAGE_COLUMNS = (
    "id", "session_id", "role", "content", "tool_call_id", "tool_calls", "tool_name", "effect_disposition",
    "timestamp", "token_count", "finish_reason", "reasoning", "reasoning_content", "reasoning_details",
    "codex_reasoning_items", "codex_message_items", "platform_message_id", "observed", "active", "compacted",
    "api_content",
)
JSON_COLUMNS = frozenset({"tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items"})
USAGE_COLUMNS = (
    "session_id", "model", "billing_provider", "billing_base_url", "billing_mode", "task", "api_call_count",
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
    "estimated_cost_usd", "actual_cost_usd", "cost_status", "cost_source", "first_seen", "last_seen",
)
ROW_TABLES: dict[str, tuple[str, ...]] = {
    "state_meta": ("key", "value"),
    "gateway_routing": ("scope", "session_key", "entry_json", "updated_at"),
    "compression_locks": ("session_id", "holder", "acquired_at", "expires_at"),
    "async_delegations": (
        "delegation_id", "origin_session", "origin_ui_session_id", "parent_session_id", "state", "dispatched_at",
        "completed_at", "updated_at", "event_json", "result_json", "delivery_state", "delivery_attempts",
        "delivered_at", "owner_pid", "owner_started_at", "task_json", "delivery_claim", "delivery_claimed_at"),
    "telegram_dm_topic_mode": (
        "chat_id", "user_id", "enabled", "activated_at", "updated_at", "has_topics_enabled",
        "allows_users_to_create_topics", "capability_checked_at", "intro_message_id", "pinned_message_id"),
    "telegram_dm_topic_bindings": (
        "chat_id", "thread_id", "user_id", "session_key", "session_id", "managed_mode", "linked_at", "updated_at"),
}
CONTENT_JSON_PREFIX = "\x00json:"


# ---- SQL values in event data -------------------------------------------------------------------

_BASE_TYPES = frozenset({type(None), bool, str, int, float, bytes})


def sql_value(value: Any, field: str = "value") -> Any:
    """``value`` as it can travel in event data, or what ``sqlite3`` would raise binding it
    (``ProgrammingError``, ``OverflowError``, ``UnicodeEncodeError``). A type with an adapter
    registered in ``sqlite3`` (the standard library's for ``datetime``/``date``: ISO text; any a
    program registers), or a ``__conform__`` method, is bound as what that gives, as sqlite3
    binds it in Hermes' process."""
    t = type(value)
    adapter = sqlite3.adapters.get((t, sqlite3.PrepareProtocol))
    if adapter is not None:
        value = adapter(value)
        t = type(value)
    elif t not in _BASE_TYPES and hasattr(value, "__conform__"):
        conformed = value.__conform__(sqlite3.PrepareProtocol)
        if conformed is not None:
            value, t = conformed, type(conformed)
    if value is None or t is bool:
        return value
    if t is str:
        if not value.isascii():
            value.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError, as in sqlite3
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


def from_json(value: Any) -> Any:
    """The SQL value a piece of event data stands for (the inverse of :func:`sql_value`)."""
    if type(value) is dict:
        if "$b" in value:
            return base64.b64decode(value["$b"])
        if "$f" in value:
            return math.inf if value["$f"] == "inf" else -math.inf
    return value


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


def map_session_id(raw: str) -> str:
    """The eventlog stream id of a Hermes session id: itself when eventlog's stream ids can hold
    it, else ``h-<sha1 prefix>`` (the Hermes id then travels in the data as ``sid``)."""
    return raw if _ID_RE.fullmatch(raw) else "h-" + _sha(raw)[:20]


def hermes_event(type_: str, session_id: Any, data: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    """An input event for ``Log.append`` about Hermes session ``session_id`` (None: profile-wide);
    a catalogue type carries the catalogue's current version (so no upcaster rewrites it)."""
    stream = None
    if session_id is not None and type(session_id) is not str:
        bound = sql_value(session_id, "session_id")
        if type(bound) is str:  # a str subclass, or a type sqlite3 adapts to text: the same id as that text
            session_id = bound
    if session_id is not None:
        if type(session_id) is str and _ID_RE.fullmatch(session_id):
            stream = session_id
        else:
            data["sid"] = sql_value(session_id, "session_id")
            stream = map_session_id(session_id) if isinstance(session_id, str) else "h-" + _sha(repr(session_id))[:20]
    ev: dict[str, Any] = {"type": type_, "session": stream, "data": data, "v": CURRENT_VERSIONS.get(type_, 1)}
    if event_id is not None:
        ev["id"] = event_id
    return ev


def hermes_session_of(envelope: dict[str, Any]) -> Any:
    """The Hermes session id an envelope is about (inverse of :func:`hermes_event`)."""
    data = envelope.get("data")
    if type(data) is dict and "sid" in data:
        return from_json(data["sid"])
    return envelope.get("session")


def _eid(*parts: Any) -> str:
    return "hi:" + _sha("\x1f".join(repr(p) for p in parts))[:40]


# ---- reading the source -------------------------------------------------------------------------

def _uri(path: Path, **params: str) -> str:
    from urllib.parse import quote

    return f"file:{quote(str(path.resolve()))}?" + "&".join(f"{k}={v}" for k, v in params.items())


def open_source(path: Path, tmp: Path) -> sqlite3.Connection:
    """A read-only view of a Hermes database that never writes it (nor its sidecars)."""
    if any(Path(f"{path}{s}").exists() for s in ("-wal", "-shm", "-journal")):
        try:
            with closing(sqlite3.connect(_uri(path, mode="ro"), uri=True)) as src:
                # The read lock first, waiting at most the busy timeout: backup() retries a source
                # another process holds locked without end (a writer stopped or hung in the middle
                # of a transaction hung the import for as long as it stayed so).
                src.execute("BEGIN")
                src.execute("SELECT count(*) FROM sqlite_master").fetchone()
                out = sqlite3.connect(tmp / "snapshot.db")
                src.backup(out)
                return out
        except sqlite3.Error as e:
            wal, shm, journal = Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")
            if wal.exists() and not shm.exists():
                # A -wal without -shm: no process has it open, so copying the files is safe.
                shutil.copyfile(path, tmp / "copy.db")
                shutil.copyfile(wal, tmp / "copy.db-wal")
                return sqlite3.connect(tmp / "copy.db")
            # Python 3.10's errors carry no name (3.11 added sqlite_errorname): SQLite's words then
            name = getattr(e, "sqlite_errorname", None)
            rollback = name == "SQLITE_READONLY_ROLLBACK" or (name is None and "readonly database" in str(e))
            if journal.exists() and rollback:
                # A hot journal: a writer died mid-transaction and no process holds a lock (SQLite
                # checked), so the read-only open could not roll it back. The copy of both files
                # is rolled back on its first read, and the original is left as it is.
                shutil.copyfile(path, tmp / "copy.db")
                shutil.copyfile(journal, tmp / "copy.db-journal")
                return sqlite3.connect(tmp / "copy.db")
            raise
    try:
        with closing(sqlite3.connect(_uri(path, mode="ro"), uri=True)) as probe:
            probe.execute("PRAGMA locking_mode=EXCLUSIVE")
            probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        # A lock another process holds is a writer at work, whose changes may already be in the
        # file (a spilled cache): read regardless of locks (immutable), the file could be half
        # written. Only a WAL database nobody has open (no -shm to read it through) is read so.
        if "not a database" in str(e) or "malformed" in str(e) or "locked" in str(e):
            raise
        return sqlite3.connect(_uri(path, mode="ro", immutable="1"), uri=True)  # WAL mode, nobody has it open
    return sqlite3.connect(_uri(path, mode="ro"), uri=True)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _has_rowid(conn: sqlite3.Connection, table: str) -> bool:
    try:
        conn.execute(f'SELECT rowid FROM "{table}" LIMIT 1').fetchall()
        return True
    except sqlite3.OperationalError:
        return False


# ---- the events --------------------------------------------------------------------------------

def _values(names: list[str], row: Any) -> dict[str, Any]:
    return {n: sql_value(v, n) for n, v in zip(names, row)}


CORE_JSON_LIMIT = 64 * 1024
"""Structured values up to this size are also given decoded, for eventlog's own fold."""


def _decoded(text: Any, *kinds: type) -> Any:
    """``text`` parsed when it is JSON of one of ``kinds`` and small, else None."""
    if not isinstance(text, str) or len(text) > CORE_JSON_LIMIT:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    try:
        orjson.dumps(value)
    except TypeError:
        return None
    return value if isinstance(value, kinds) else None


def _json_problem(text: Any, *kinds: type) -> str | None:
    """Why a JSON text column's value will read as null (not valid JSON, JSON text holding JSON
    text, JSON of another kind), or None (NULL, valid, or too large to be decoded here)."""
    if not isinstance(text, str) or len(text) > CORE_JSON_LIMIT or not text.strip():
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return "is not valid JSON"
    if isinstance(value, kinds):
        return None
    if isinstance(value, str):
        try:
            json.loads(value)
        except (ValueError, RecursionError):
            pass
        else:
            return "is double-encoded JSON (JSON text holding JSON text)"
    wanted = " or ".join("an array" if k is list else "an object" for k in kinds)
    return f"is JSON but not {wanted}"


def _warn_json(values: dict[str, Any], columns: dict[str, tuple[tuple[type, ...], str]], where: str,
               warn: Callable[[str], None] | None) -> None:
    """Warn of each of ``columns`` (name: (the JSON kinds it holds, what becomes of its text))
    whose JSON will not be read."""
    if warn is None:
        return
    for column, (kinds, kept) in columns.items():
        why = _json_problem(values.get(column), *kinds)
        if why is not None:
            warn(f"{where}: {column} {why}; {kept}")


_KEPT = "its text is kept as stored, and it reads as null"
SESSION_JSON: dict[str, tuple[tuple[type, ...], str]] = {"model_config": ((dict,), _KEPT)}
MESSAGE_JSON: dict[str, tuple[tuple[type, ...], str]] = {
    "tool_calls": ((list,), _KEPT),
    "display_metadata": ((dict,), "it is dropped (only an object is carried)"),
}


NOT_NULL: dict[str, dict[str, Any]] = {
    "sessions": {"source": "unknown", "started_at": 0.0, "compression_fallback_streak": 0, "rewind_count": 0,
                 "archived": 0},
    "messages": {"role": "unknown", "timestamp": 0.0, "active": 1, "compacted": 0},
    "session_model_usage": {"model": "unknown", "billing_provider": "", "billing_base_url": "", "billing_mode": "",
                            "task": "", "api_call_count": 0, "input_tokens": 0, "output_tokens": 0,
                            "cache_read_tokens": 0, "cache_write_tokens": 0, "reasoning_tokens": 0,
                            "estimated_cost_usd": 0.0, "actual_cost_usd": 0.0},
}
"""Columns Hermes 0.19.0 declares NOT NULL, and what an older database's NULL in them becomes
(Hermes' own defaults: 'unknown' source and role, active 1...)."""


def _fill_not_null(table: str, values: dict[str, Any], where: str, warn: Callable[[str], None] | None) -> None:
    for column, fallback in NOT_NULL[table].items():
        if column in values and values[column] is None:
            values[column] = fallback
            if warn is not None:
                warn(f"{where}: {column} is NULL, which Hermes' schema refuses; imported as {fallback!r}")


def session_events(names: list[str], row: Any, rowid: int,
                   warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The events of one sessions row (the row itself, then what eventlog's fold reads of it)."""
    values = _values(names, row)
    _fill_not_null("sessions", values, f"session {values.get('id')!r}", warn)
    sid = from_json(values.pop("id"))
    data = {("model_config_json" if k == "model_config" else k): v for k, v in values.items() if k in SESSION_COLUMNS}
    data.update(imported=True, rowid=rowid)
    _warn_json(values, SESSION_JSON, f"session {sid!r} (sessions row {rowid})", warn)
    config = _decoded(values.get("model_config"), dict)
    if config is not None:
        data["model_config"] = config  # for eventlog's fold; the projection uses model_config_json
    out = [hermes_event("session.created", sid, data, _eid("created", sid))]
    title = values.get("title")
    if isinstance(title, str) and title:
        out.append(hermes_event("session.titled", sid, {"title": title, "source": "user", "imported": True},
                                _eid("title", sid, title)))
    if values.get("ended_at") is not None:
        ended = {"ended_at": values["ended_at"], "reason": values.get("end_reason"), "imported": True}
        out.append(hermes_event("session.ended", sid, ended, _eid("ended", sid, values["ended_at"],
                                                                   values.get("end_reason"))))
    if values.get("archived"):
        out.append(hermes_event("session.archived", sid, {"imported": True}, _eid("archived", sid)))
    for column, kind in (("pinned", "session.pinned"), ("hidden", "session.hidden")):
        if values.get(column):  # columns of other schemas than Hermes 0.19's (which has neither)
            out.append(hermes_event(kind, sid, {"imported": True}, _eid(column, sid)))
    return out


def message_event(names: list[str], row: Any, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    values = _values(names, row)
    _fill_not_null("messages", values, f"session {values.get('session_id')!r} message {values.get('id')}", warn)
    sid = from_json(values.pop("session_id", None))
    _warn_json(values, MESSAGE_JSON, f"session {sid!r} message {values.get('id')!r}", warn)
    data: dict[str, Any] = {"imported": True}
    for k, v in values.items():
        if k not in MESSAGE_COLUMNS:
            continue
        if k in JSON_COLUMNS:
            data[k + "_json"] = v
        elif k == "content" and isinstance(v, str) and v.startswith(CONTENT_JSON_PREFIX):
            data["content_json"] = v[len(CONTENT_JSON_PREFIX):]
        else:
            data[k] = v
    # Decoded copies for eventlog's fold (the projection uses the *_json text as stored).
    calls = _decoded(values.get("tool_calls"), list)
    if calls is not None:
        data["tool_calls"] = calls
    if "content_json" in data:
        parts = _decoded(data["content_json"], list, dict)
        if parts is not None:
            data["content"] = parts
    # A column of other schemas than Hermes 0.19's (which has none such), decoded for eventlog's
    # fold and read models; the Hermes projection leaves it out with the table's other strangers.
    display = _decoded(values.get("display_metadata"), dict)
    if display is not None:
        data["display_metadata"] = display
    return hermes_event("message.appended", sid, data, _eid("msg", sid, values.get("id")))


def usage_event(names: list[str], row: Any, warn: Callable[[str], None] | None = None,
                rowid: int | None = None) -> dict[str, Any]:
    """The event of one ``session_model_usage`` row; its id derives from the row's key (session,
    model, route, task), and also from its ``rowid`` when given (a row whose key an earlier row
    has: an older table without Hermes' primary key)."""
    values = _values(names, row)
    _fill_not_null("session_model_usage", values, f"session {values.get('session_id')!r} usage", warn)
    sid = from_json(values.pop("session_id", None))
    data = {k: v for k, v in values.items() if k in USAGE_COLUMNS}
    data.update(imported=True, provider=values.get("billing_provider"))
    key = tuple(values.get(k) for k in ("model", "billing_provider", "billing_base_url", "billing_mode", "task"))
    return hermes_event("usage.recorded", sid, data, _eid("usage", sid, *key) if rowid is None
                        else _eid("usage", sid, *key, "rowid", rowid))


def hermes_events(conn: sqlite3.Connection, warn: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Every row of a Hermes database as events (see the module docstring), in an order whose
    replay satisfies Hermes' foreign keys; messages and usage rows of sessions the database does
    not hold (Hermes' foreign keys would refuse them) are left out, each reported to ``warn``.
    Raises ``sqlite3.DatabaseError`` when the file cannot be read."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "sessions" not in tables:
        return
    # A sessions row whose id is NULL (its PRIMARY KEY is not an INTEGER one, so SQLite lets it
    # be) is addressed by no Hermes call and can be no session here: it is left out.
    known = {r[0] for r in conn.execute("SELECT id FROM sessions WHERE id IS NOT NULL")}
    orphans: dict[Any, list[Any]] = {}
    names = _columns(conn, "sessions")
    links: list[list[Any]] = []
    parent_at = names.index("parent_session_id") if "parent_session_id" in names else -1
    id_at = names.index("id")
    title_at = names.index("title") if "title" in names else -1
    # Titles are unique in Hermes: of a title several rows hold (an old database), the newest row
    # keeps it, as Hermes' own repair does when it restores the unique index.
    keeper = dict(conn.execute("SELECT title, MAX(rowid) FROM sessions WHERE title IS NOT NULL AND id IS NOT NULL GROUP BY title"
                               " HAVING COUNT(*) > 1").fetchall()) if title_at >= 0 else {}
    for row in conn.execute(f"SELECT rowid, {', '.join(names)} FROM sessions ORDER BY rowid"):
        rowid, values = row[0], row[1:]
        if values[id_at] is None:
            if warn is not None:
                warn(f"sessions row {rowid} has no id (NULL): no Hermes call can address it; it was left out")
            continue
        if keeper and values[title_at] in keeper and keeper[values[title_at]] != rowid:
            if warn is not None:
                warn(f"session {values[id_at]!r}: title {values[title_at]!r} is held by a newer session too;"
                     " imported without it (Hermes keeps titles unique)")
            values = (*values[:title_at], None, *values[title_at + 1:])
        if parent_at >= 0 and values[parent_at] is not None:
            links.append([sql_value(values[id_at]), sql_value(values[parent_at])])
        yield from session_events(names, values, rowid, warn)
    for i in range(0, len(links), ROWS_PER_EVENT * 4):
        chunk = links[i:i + ROWS_PER_EVENT * 4]
        yield hermes_event("hermes.parents_attached", None, {"links": chunk}, _eid("links", chunk))
    if "messages" in tables:
        names = _columns(conn, "messages")
        at = names.index("session_id") if "session_id" in names else -1
        for row in conn.execute(f"SELECT {', '.join(names)} FROM messages ORDER BY rowid"):
            if at < 0 or row[at] not in known:
                orphans.setdefault(row[at] if at >= 0 else None, []).append(row[0] if names[0] == "id" else "?")
                continue
            yield message_event(names, row, warn)
    if "session_model_usage" in tables:
        names = _columns(conn, "session_model_usage")
        at = names.index("session_id") if "session_id" in names else -1
        keys: set[str] = set()
        for rowid, *row in conn.execute(f"SELECT rowid, {', '.join(names)} FROM session_model_usage ORDER BY rowid"):
            if at < 0 or row[at] not in known:
                orphans.setdefault(row[at] if at >= 0 else None, []).append("usage")
                continue
            ev = usage_event(names, row, warn)
            if ev["id"] in keys:  # no primary key (an older table), or NULLs that read as Hermes' defaults
                ev = usage_event(names, row, None, rowid)
                if warn is not None:
                    warn(f"{_label(ev)}: usage row {rowid} has the session, model, route and task of an earlier row"
                         " (Hermes keeps one row per key); imported as a record of its own")
            keys.add(ev["id"])
            yield ev
    if warn is not None:
        for sid, left in orphans.items():
            shown = ", ".join(str(r) for r in left[:20]) + (" ..." if len(left) > 20 else "")
            warn(f"session {sid!r} is not in the source: its rows ({shown}) were left out (orphans)")
    for table, declared in ROW_TABLES.items():
        if table not in tables:
            continue
        names = [c for c in _columns(conn, table) if c in declared]
        order = " ORDER BY rowid" if _has_rowid(conn, table) else ""
        rows: list[list[Any]] = []
        size = 0
        emitted = False
        for row in conn.execute(f"SELECT {', '.join(names)} FROM {table}{order}"):
            rows.append([sql_value(v) for v in row])
            size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
            if len(rows) >= ROWS_PER_EVENT or size >= BYTES_PER_EVENT:
                yield _rows_event(table, names, rows)
                rows, size, emitted = [], 0, True
        if rows or (not emitted and table.startswith("telegram_")):  # opted-in topic tables exist even empty
            yield _rows_event(table, names, rows)
    if "sqlite_sequence" in tables:
        seqs = [[n, s] for n, s in conn.execute("SELECT name, seq FROM sqlite_sequence") if n == "messages"]
        if seqs:
            yield _rows_event("sqlite_sequence", ["name", "seq"], seqs)


def _rows_event(table: str, names: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return hermes_event("hermes.rows_imported", None, {"table": table, "columns": names, "rows": rows},
                        _eid("rows", table, names, rows))


# ---- the import ----------------------------------------------------------------------------------

@dataclass
class ImportReport:
    """What an import did: ``sessions``/``messages``/``usage`` rows newly imported, ``events``
    appended in all, ``already_present`` events a previous import had stored, ``changed`` source
    rows that differ from their first import (kept as first imported; each also warned),
    ``skipped`` rows too large for one event, ``rewinds`` ``messages.rewound`` events that hide
    the messages Hermes no longer shows, ``updates`` title, end and reopen events that gave
    sessions imported before the source's current state, ``deleted_here`` source sessions this
    profile deleted or erased after an earlier import (none of their rows imported again),
    ``not_in_source`` sessions an earlier import brought that the source no longer holds (kept)."""

    sessions: int = 0
    messages: int = 0
    usage: int = 0
    events: int = 0
    already_present: int = 0
    changed: int = 0
    skipped: int = 0
    rewinds: int = 0
    updates: int = 0
    deleted_here: int = 0
    not_in_source: int = 0
    warnings: list[str] = field(default_factory=list)
    warning_count: int = 0

    def warn(self, text: str) -> None:
        self.warning_count += 1
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(text)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _count(conn: sqlite3.Connection, tables: set[str]) -> int:
    total = 0
    for t in ("sessions", "messages", "session_model_usage"):
        if t in tables:
            total += int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
    return total


def snapshot_source(source: Path, into: Path) -> None:
    """Copy the Hermes database at ``source`` to ``into`` (a read-only open and SQLite's backup
    API: the original and its sidecars are never written). Every pass of an import reads this one
    private copy, so they all see the same rows, and Hermes' own ``SessionDB`` may migrate it."""
    scratch = into.parent / "source"  # where open_source may copy a live file (not ``into``)
    scratch.mkdir(exist_ok=True)
    try:
        src = open_source(source, scratch)  # read-only, creating no -wal/-shm beside the original
        try:
            dest = sqlite3.connect(str(into))
            try:
                src.backup(dest)
            finally:
                dest.close()
        finally:
            src.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def hermes_session_db() -> Any:
    """Hermes' own ``SessionDB`` class when hermes-agent is installed here, else None (eventlog's
    facade, once installed, keeps Hermes' class as ``hermes_state.HermesSessionDB``)."""
    try:
        import hermes_state
    except ImportError:
        return None
    cls = getattr(hermes_state, "HermesSessionDB", None) or getattr(hermes_state, "SessionDB", None)
    return None if cls is None or str(getattr(cls, "__module__", "")).startswith("eventlog.") else cls


def hermes_upgrade(path: Path, session_db: Any = None) -> None:
    """Open the private copy at ``path`` with Hermes' own ``SessionDB`` (``session_db``, else
    :func:`hermes_session_db`) when Hermes is installed: its migrations, backfills and repairs run
    there, so an import holds what Hermes would show after opening the file (an old database
    gets, e.g., the usage rows of schema 17). The switch and ``eventlog import`` both do this."""
    cls = session_db if session_db is not None else hermes_session_db()
    if cls is not None:
        cls(db_path=path).close()


COUNTED = frozenset({"session.created", "message.appended", "usage.recorded"})
ECHOES = frozenset({"session.titled", "session.ended", "session.archived"})
"""What ``session_events`` adds to a session's row for eventlog's fold: appended with a session's
first import; a session imported before gets its current title and end from :func:`_reconcile`."""
SESSION_SHOWN = ("source", "model", "model_config_json", "cwd", "git_repo_root", "git_branch", "parent_session_id",
                 "user_id", "chat_id", "chat_type", "thread_id")
"""The columns of a sessions row whose change since the first import is reported (kept as first
imported); its title and end are brought up to date, its counters are derived in eventlog."""
ACTIVITY = frozenset({"active", "compacted"})
"""Message columns a later import follows with ``messages.rewound`` rather than reporting."""


@dataclass
class _Source:
    """What a session of the source shows (as its ``session.created`` data holds it)."""

    stream: str
    sid: Any
    started_at: Any
    title: Any
    ended_at: Any
    end_reason: Any
    active: int = 0  # messages Hermes shows (active = 1)


@dataclass
class _Plan:
    earlier: set[str] = field(default_factory=set)  # imported before and live: brought up to date
    gone: set[str] = field(default_factory=set)  # imported before, deleted or erased here since


class _Counter:
    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def step(self) -> None:
        self.done += 1
        if self.progress is not None and self.done % 1000 == 0:
            self.progress(self.done, self.total)


def _is_active(data: dict[str, Any]) -> bool:
    """Whether Hermes shows a message (its reads ask ``active = 1``). A database from before the
    column (no ``active`` key) shows every message: Hermes' own migration adds the column as 1."""
    value = data.get("active", 1)
    return type(value) in (int, float, bool) and value == 1


def import_hermes(target: Any, source_path: str | os.PathLike[str], *, progress: Progress | None = None,
                  upgrade: Callable[[Path], None] | None = None) -> ImportReport:
    """Bring the Hermes database at ``source_path`` into ``target`` (a ``SessionStore``, whose
    log is used, or any ``Log``); never writes the source.

    The source is copied (:func:`snapshot_source`; ``upgrade(path)`` then runs on the copy: the
    CLI passes Hermes' own ``SessionDB``, whose migrations bring an old database up to date) and
    read whole before anything is appended: a source SQLite cannot read (a damaged page) raises
    :class:`StorageError` naming it, with nothing appended; so does a source session whose id the
    profile uses for another session (:class:`ConflictError` naming the ids: an import never
    writes onto another history). Events a previous import stored are skipped (their ids derive
    from the source rows); a session imported before gets the source's current title and end,
    and messages Hermes no longer shows (``active = 0``) are hidden with ``messages.rewound``.
    Raises :class:`ValidationError` (field ``"source"``) for a missing file or one without a
    ``sessions`` table."""
    path = Path(source_path)
    if not path.is_file():
        raise ValidationError("source", f"{path} does not exist or is not a file")
    log = getattr(target, "log", target)
    report = ImportReport()
    where = getattr(log, "path", None)
    scratch = Path(where).parent if isinstance(where, (str, os.PathLike)) else None
    from projections.files import scratch_prefix  # (lazily: the Hermes adapter's start stays cheap)

    with tempfile.TemporaryDirectory(prefix=scratch_prefix("hermes-import"),
                                     dir=scratch if scratch is not None and scratch.is_dir() else None) as tmp:
        copy = Path(tmp) / "snapshot.db"
        try:
            snapshot_source(path, copy)
        except sqlite3.Error as e:
            raise StorageError(f"cannot open {path} read-only: {e}",
                               hint="check the file's permissions, or stop Hermes and retry") from e
        if upgrade is not None:
            try:
                upgrade(copy)
            except sqlite3.DatabaseError as e:
                raise _damaged(path, e) from e
            except Exception as e:  # Hermes' own code, on a copy: whatever it raises is one error of ours
                raise StorageError(f"Hermes could not open a copy of {path}: {type(e).__name__}: {e}; nothing was "
                                   "imported", hint="the source is unchanged; an environment without hermes-agent "
                                                    "imports the file as it is, without Hermes' migrations") from e
        with closing(sqlite3.connect(copy)) as conn:
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            except sqlite3.DatabaseError as e:
                raise StorageError(f"cannot read {path}: {e}",
                                   hint="is it a SQLite database? `sqlite3 FILE .tables` shows its tables") from e
            if "sessions" not in tables or "id" not in _columns(conn, "sessions"):
                raise ValidationError("source", f"{path} has no sessions table with an id column; "
                                      "it does not look like a Hermes state.db")
            try:
                total = 2 * _count(conn, tables)
                counter = _Counter(progress, total)
                found = _survey(conn, report, counter)  # every row read before anything is appended
            except sqlite3.DatabaseError as e:
                raise _damaged(path, e) from e
            fresh = log.head()[0] == 0
            plan = _Plan() if fresh else _plan(target, log, found, report, path)
            try:
                _append_rows(conn, log, plan, report, counter)
            except sqlite3.DatabaseError as e:  # pragma: no cover - the survey read every row already
                raise _damaged(path, e) from e
    if not fresh:
        _reconcile(target, log, found, plan, report)
    if progress is not None:
        progress(total, total)
    return report


def _damaged(path: Path, e: Exception) -> StorageError:
    import shlex

    return StorageError(f"cannot read {path}: {e}; nothing was imported",
                        hint=f"the source file is damaged, not this profile: `sqlite3 {shlex.quote(str(path))} "
                             ".recover | sqlite3 RECOVERED.db` makes a readable copy to import")


def _survey(conn: sqlite3.Connection, report: ImportReport, counter: _Counter) -> dict[str, _Source]:
    """The first pass: every event built (so every row read, and every warning given), the
    sessions kept with what they show."""
    found: dict[str, _Source] = {}
    for ev in hermes_events(conn, report.warn):
        kind = ev["type"]
        if kind in COUNTED:
            counter.step()
        if kind == "session.created":
            d = ev["data"]
            found[ev["session"]] = _Source(ev["session"], hermes_session_of(ev), d.get("started_at"), d.get("title"),
                                           d.get("ended_at"), d.get("end_reason"))
        elif kind == "message.appended" and _is_active(ev["data"]):
            s = found.get(ev["session"])
            if s is not None:
                s.active += 1
    return found


def _plan(target: Any, log: Any, found: dict[str, _Source], report: ImportReport, path: Path) -> _Plan:
    """Which source sessions the profile holds from an earlier import; :class:`ConflictError`
    when a source session's id is used here by another session."""
    live = _live_sessions(target, log)
    plan = _Plan()
    conflicts: list[Any] = []
    for stream, s in found.items():
        seq = log.event_seq(_eid("created", s.sid))
        if seq is None:
            if log.stream_version(stream) > 0:
                conflicts.append(s.sid)
            continue
        if stream not in live:
            plan.gone.add(stream)
            report.deleted_here += 1
            report.warn(f"session {s.sid!r} was imported before and has since been deleted or erased in this profile;"
                        " none of its rows were imported again")
            continue
        stored = (log.get(seq) or {}).get("data")
        if not isinstance(stored, dict) or stored.get("started_at") != s.started_at:
            conflicts.append(s.sid)  # the same id, another session: imported from another Hermes database
            continue
        plan.earlier.add(stream)
    if conflicts:
        shown = ", ".join(repr(c) for c in conflicts[:10]) + (f" and {len(conflicts) - 10} more"
                                                               if len(conflicts) > 10 else "")
        raise ConflictError("source", f"{path} holds sessions whose ids this profile uses for other sessions "
                            f"({shown}); nothing was imported",
                            hint="import it into a new profile (--profile NAME): an import never writes onto "
                                 "another session's history")
    return plan


def _append_rows(conn: sqlite3.Connection, log: Any, plan: _Plan, report: ImportReport, counter: _Counter) -> None:
    """The second pass: what the log does not hold yet, appended in batches; a run of messages
    Hermes no longer shows is hidden by a ``messages.rewound`` of its first, before the next
    message of the session Hermes shows."""
    batch: list[dict[str, Any]] = []
    runs: dict[str, dict[str, Any]] = {}  # session -> the first message of its current inactive run

    def flush() -> None:
        nonlocal batch
        if batch:
            report.events += append_batch(log, batch, report)
        batch = []

    def rewind(first: dict[str, Any], blocked: bool) -> None:
        sid, mid = hermes_session_of(first), first["data"].get("id")
        eid = _eid("rewound", sid, mid)
        if log.event_seq(eid) is not None:
            report.already_present += 1
            return
        if blocked:
            report.warn(f"session {sid!r}: messages from {mid} on are inactive in Hermes, but messages after them that"
                        " it shows were imported before; eventlog hides a message only with every later one, so"
                        " they stay visible")
            return
        flush()  # the rewind names the message by its seq
        seq = log.event_seq(first["id"])
        if seq is not None:
            batch.append(hermes_event("messages.rewound", sid, {"message_id": seq, "imported": True}, eid))
            report.rewinds += 1

    for ev in hermes_events(conn):
        kind, stream = ev["type"], ev["session"]
        if kind in COUNTED:
            counter.step()
        if stream is not None and stream in plan.gone:
            continue
        if kind == "message.appended":
            if not _is_active(ev["data"]):
                runs.setdefault(stream, ev)
            elif stream in runs:
                rewind(runs.pop(stream), blocked=log.event_seq(ev["id"]) is not None)
        elif runs:  # the messages are done: each session's last run hides the rest of it
            for first in runs.values():
                rewind(first, blocked=False)
            runs.clear()
        seq = log.event_seq(ev["id"])
        if kind in ECHOES and stream in plan.earlier:
            report.already_present += seq is not None
            continue
        if seq is not None:
            report.already_present += 1
            _compare(ev, log.get(seq), report)
            continue
        if kind == "session.created":  # appended alone, onto an empty stream only
            flush()
            if not _create(log, ev, report):
                plan.gone.add(stream)  # the id went to another session meanwhile: none of its rows go there
                continue
            report.sessions += 1
            continue
        batch.append(ev)
        report.messages += kind == "message.appended"
        report.usage += kind == "usage.recorded"
        if len(batch) >= EVENTS_PER_APPEND:
            flush()
    for first in runs.values():
        rewind(first, blocked=False)
    flush()


def _compare(ev: dict[str, Any], stored: dict[str, Any] | None, report: ImportReport) -> None:
    """Report a source row that changed since its first import (which is kept)."""
    old, new = (stored or {}).get("data"), ev["data"]
    if not isinstance(old, dict):  # erased
        return
    if ev["type"] == "session.created":
        keys = [k for k in SESSION_SHOWN if old.get(k) != new.get(k)]
        if keys:
            report.changed += 1
            report.warn(f"{_label(ev)}: {', '.join(keys)} changed since it was first imported; the first import is kept")
        return
    if ev["type"] == "message.appended":
        old = {k: v for k, v in old.items() if k not in ACTIVITY}
        new = {k: v for k, v in new.items() if k not in ACTIVITY}
        if "display_metadata" not in old:  # imported before display_metadata was carried: not a change
            new.pop("display_metadata", None)
    if old != new:
        report.changed += 1
        report.warn(f"{_label(ev)} changed since it was first imported; the first import is kept")


SESSIONS_PAGE = 1000


def _live_sessions(target: Any, log: Any) -> dict[str, tuple[Any, Any, Any, Any]]:
    """Every live session of the profile as its read model shows it now: id -> (title,
    ended_at, end_reason, message_count)."""
    from eventlog.sessions.store import FoldReadModel, SessionStore

    reads: Any
    if isinstance(target, SessionStore):
        target.sync(timeout=None)
        reads = target
    else:
        reads = FoldReadModel(log)
    out: dict[str, tuple[Any, Any, Any, Any]] = {}
    for pinned in (False, True):  # pinned ones follow every page: taken apart, all at once
        offset = 0
        while True:
            page = reads.list_sessions(archived=None, pinned=pinned, hidden=None,
                                       limit=None if pinned else SESSIONS_PAGE, offset=offset)
            for s in page:
                out[s["id"]] = (s["title"], s["ended_at"], s["end_reason"], s["message_count"])
            if pinned or len(page) < SESSIONS_PAGE:
                break
            offset += SESSIONS_PAGE
    return out


def _reconcile(target: Any, log: Any, found: dict[str, _Source], plan: _Plan, report: ImportReport) -> None:
    """Give each source session the title and end the source shows where eventlog shows another
    (a rename back to an earlier title, a swap, a reopen, a new end), idempotently: each event's
    id names the stream position it follows. Warns about what the catalogue cannot express."""
    from eventlog.sessions.events import next_title
    from eventlog.sessions.rules import as_str, as_time, title_claim

    live = _live_sessions(target, log)
    title_of = {sid: row[0] for sid, row in live.items()}
    holder = {title: sid for sid, title in title_of.items() if title is not None}
    out: list[dict[str, Any]] = []
    added: dict[str, int] = {}

    def add(s: _Source, kind: str, data: dict[str, Any], key: Any) -> None:
        n = log.stream_version(s.stream) + added.get(s.stream, 0)
        added[s.stream] = added.get(s.stream, 0) + 1
        out.append(hermes_event(kind, s.sid, data, _eid("update", kind, s.sid, key, n)))

    def retitle(s: _Source, title: str, raw: Any) -> None:
        old = title_of.get(s.stream)
        if old is not None and holder.get(old) == s.stream:
            del holder[old]
        title_of[s.stream], holder[title] = title, s.stream
        add(s, "session.titled", {"title": raw, "source": "user", "imported": True}, title)

    wanted: dict[str, tuple[_Source, str]] = {}
    for stream, s in found.items():
        if stream in plan.gone or stream not in live:
            continue
        title, ended_at, end_reason, count = live[stream]
        have = (ended_at, end_reason)
        if s.ended_at is None:
            if have != (None, None):
                add(s, "session.reopened", {"imported": True}, None)
        elif have != (as_time(s.ended_at, None), as_str(s.end_reason)):  # as eventlog's fold reads an end
            if have != (None, None) or _ended_in_log(log, stream):
                add(s, "session.reopened", {"imported": True}, None)
            add(s, "session.ended", {"ended_at": s.ended_at, "reason": s.end_reason, "imported": True},
                (s.ended_at, s.end_reason))
        claim = title_claim(s.title, "user")
        if claim is None and title is not None:
            report.warn(f"session {s.sid!r}: Hermes shows no title; eventlog keeps {title!r} (no event of the "
                        "catalogue removes a title)")
        elif claim is not None and claim[0] != title:
            wanted[stream] = (s, claim[0])
        if isinstance(count, int) and count < s.active:
            report.warn(f"session {s.sid!r}: eventlog shows {count} of the {s.active} messages Hermes shows; an earlier"
                        " import hid the others (Hermes restored them since?) and eventlog cannot show them again")

    def in_cycle(start: str) -> bool:
        seen, at = {start}, holder.get(wanted[start][1])
        while at is not None and at in wanted and at not in seen:
            seen.add(at)
            at = holder.get(wanted[at][1])
        return at == start

    while wanted:
        free = [stream for stream, (s, t) in wanted.items() if holder.get(t) in (None, stream)]
        for stream in free:
            s, t = wanted.pop(stream)
            retitle(s, t, s.title)
        if free:
            continue
        cycle = next((stream for stream in wanted if in_cycle(stream)), None)
        if cycle is None:
            break
        # Titles that move round a cycle (a swap): one steps aside under a free title first.
        s, _ = wanted[cycle]
        spare = next_title(title_of[cycle], set(holder) | {t for _, t in wanted.values()})
        retitle(s, spare, spare)
    for stream, (s, t) in wanted.items():
        report.warn(f"session {s.sid!r}: its Hermes title {t!r} is held by session {holder.get(t)!r} in this profile;"
                    " not set")

    for i in range(0, len(out), EVENTS_PER_APPEND):
        n = append_batch(log, out[i:i + EVENTS_PER_APPEND], report)
        report.events += n
        report.updates += n

    missing = []
    for sid in live:
        if sid in found:
            continue
        events = log.read_session(sid)
        first = next(iter(events), None)
        getattr(events, "close", lambda: None)()
        if first is not None and first.get("id") == _eid("created", hermes_session_of(first)):
            missing.append(hermes_session_of(first))
    if missing:
        report.not_in_source = len(missing)
        shown = ", ".join(repr(m) for m in missing[:10]) + (" ..." if len(missing) > 10 else "")
        report.warn(f"{len(missing)} sessions an earlier import brought are not in this source ({shown}): they are kept"
                    " (an import deletes nothing: a session deleted in Hermes cannot be told from one of another"
                    " database); `eventlog sessions delete ID` deletes one")


def _ended_in_log(log: Any, stream: str) -> bool:
    """Whether the last end or reopen of the session's stream is an end (an end whose time and
    reason read as unknown looks like no end at all)."""
    ended = False
    for env in log.read_session(stream):
        if env.get("type") == "session.ended":
            ended = True
        elif env.get("type") == "session.reopened":
            ended = False
    return ended


def _create(log: Any, ev: dict[str, Any], report: ImportReport) -> bool:
    """Append a source session's ``session.created`` on condition that its stream is still
    empty (``expected_version=0``): a session another process created with this id since
    :func:`_plan` looked is not merged with the source's. False (warned, skipped) then."""
    try:
        report.events += _append(log, [ev], report, expected_version=0)
    except ConcurrencyError:
        if log.event_seq(ev["id"]) is not None:  # a concurrent import of the same source stored it
            report.already_present += 1
            return True
        report.skipped += 1
        report.warn(f"session {hermes_session_of(ev)!r}: another session with this id was created in this profile "
                    "while the import ran; this session and its rows were not imported (import the file into a new "
                    "profile to keep both)")
        return False
    return True


def append_batch(log: Any, batch: list[dict[str, Any]], report: ImportReport) -> int:
    """Append an import batch; an event the log refuses as a duplicate or as too large is then
    appended alone (a message too large keeps the part of its content that fits, warned), so one
    row never costs the others."""
    return _append(log, batch, report)


def _append(log: Any, batch: list[dict[str, Any]], report: ImportReport, expected_version: int | None = None) -> int:
    """:func:`append_batch`, on condition that the batch's one stream holds ``expected_version``
    events (:class:`ConcurrencyError` otherwise, nothing appended)."""
    if not batch:
        return 0
    try:
        return len(log.append(batch, expected_version))
    except (DuplicateEventError, EventTooLargeError):  # one at a time, to keep all the others
        n = 0
        for ev in batch:
            try:
                log.append([ev], expected_version)
                n += 1
            except DuplicateEventError:  # a concurrent import stored it meanwhile
                pass
            except EventTooLargeError:
                smaller = _cut(ev)
                if smaller is None:
                    report.skipped += 1
                    report.warn(f"{_label(ev)} does not fit in one event (16 MiB); skipped")
                    continue
                log.append([smaller[0]], expected_version)
                n += 1
                report.warn(f"{_label(ev)}: {smaller[1]}")
        return n


def _fitting(text: str, budget: int) -> str:
    """The longest prefix of ``text`` (of its first 8 MiB) whose JSON encoding takes at most
    ``budget`` bytes (a control character is six bytes encoded)."""
    text = text.encode("utf-8")[: 8 << 20].decode("utf-8", "ignore")
    if len(orjson.dumps(text)) > budget:  # binary search
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(orjson.dumps(text[:mid])) <= budget:
                lo = mid
            else:
                hi = mid - 1
        text = text[:lo]
    return text


def _cut(ev: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """``ev`` made to fit in one event, and what was cut (for the warning), or None when no text
    of it is the problem. A message keeps the first 8 MiB of its content, less when its JSON is
    longer than its text; a session's row keeps the part of its longest texts (a system prompt;
    at most their first 8 MiB) that fits: a session left out would leave its messages about no session, and the profile
    refusing the next import of the file as another session's."""
    from eventlog.log.codec import MAX_EVENT_BYTES

    limit = MAX_EVENT_BYTES - 4096
    if ev["type"] == "session.created":
        data = dict(ev["data"])
        cut: list[str] = []
        for key in sorted((k for k, v in data.items() if _cuttable(v)), key=lambda k: -len(orjson.dumps(data[k]))):
            over = len(orjson.dumps(data, default=str)) - limit
            if over <= 0:
                break
            data[key], kept = _cut_value(data[key], max(0, len(orjson.dumps(data[key])) - over))
            cut.append(f"{key} (first {kept} kept)")
        if not cut or len(orjson.dumps(data, default=str)) > limit:
            return None
        return {**ev, "data": data}, f"larger than one event holds; cut: {', '.join(cut)}"
    if ev["type"] != "message.appended":
        return None
    data = {k: v for k, v in ev["data"].items() if k not in ("content", "content_json")}
    text = ev["data"].get("content_json", ev["data"].get("content"))
    if not _cuttable(text):
        return None
    data["content"], kept = _cut_value(text, limit - len(orjson.dumps(data, default=str)))
    return {**ev, "data": data}, f"content larger than one event holds; its first {kept} were kept"


def _cuttable(value: Any) -> bool:
    """Whether ``value`` (event data of a cell) is a text or a BLOB (``{"$b": base64}``)."""
    return isinstance(value, str) or (type(value) is dict and set(value) == {"$b"} and isinstance(value["$b"], str))


def _cut_value(value: Any, budget: int) -> tuple[Any, str]:
    """A text or BLOB cell (see :func:`_cuttable`) cut to a prefix whose JSON takes at most
    ``budget`` bytes (a text: of its first 8 MiB), and what was kept (for the warning)."""
    if isinstance(value, str):
        text = _fitting(value, budget)
        return text, f"{len(text.encode('utf-8')):,} bytes"
    blob = base64.b64decode(value["$b"])[: 8 << 20]
    keep = max(0, (budget - len(orjson.dumps({"$b": ""}))) // 4 * 3)  # base64: 4 characters per 3 bytes
    return {"$b": base64.b64encode(blob[:keep]).decode("ascii")}, f"{len(blob[:keep]):,} bytes (a BLOB)"


def _label(ev: dict[str, Any]) -> str:
    sid = hermes_session_of(ev)
    data = ev["data"]
    if ev["type"] == "message.appended":
        return f"session {sid!r} message {data.get('id')}"
    if ev["type"] == "usage.recorded":
        return f"session {sid!r} usage of model {data.get('model')!r} task {data.get('task')!r}"
    if ev["type"] == "hermes.rows_imported":
        return f"rows of {data.get('table')}"
    return f"session {sid!r} ({ev['type']})"

"""The LangGraph checkpoint events and their read model: pure data, no LangGraph import.

Events (namespace ``langgraph``, each in the stream of the thread's session, see
:func:`thread_session`):

``langgraph.checkpoint_put``   thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                               checkpoint {type, data}, metadata {type, data}, channel_versions,
                               blobs [{channel, version, type, data}], run_id, source, step
``langgraph.writes_put``       thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                               writes [{idx, channel, type, data}]
``langgraph.thread_deleted``   thread_id
``langgraph.runs_deleted``     thread_id, run_ids
``langgraph.thread_copied``    v2: thread_id (the target), source_thread_id, and the source's rows
                               as the copy read them: checkpoints [{checkpoint_ns, checkpoint_id,
                               parent_checkpoint_id, run_id, checkpoint, metadata,
                               channel_versions}], blobs [{checkpoint_ns, channel, version, type,
                               data}], writes [{checkpoint_ns, checkpoint_id, task_id, task_path,
                               idx, channel, type, data}] (a large thread: several events in one
                               batch, each with part of the rows); v1 (logs of earlier releases):
                               thread_id, source_thread_id only
``langgraph.thread_pruned``    thread_id, strategy (keep_latest | delete)

Serialized values are the saver's ``(type, bytes)`` pairs with the bytes in standard base64
(``data``; null for the ``empty`` marker of a channel without a value): 4/3 of the raw size
plus padding in the log (the log's zstd compression takes part of it back); the read model
keeps the raw bytes. ``run_id``, ``source`` and ``step`` repeat plain metadata values so an
audit of the log can read them without the serializer.

A copy carries its rows (v2) because a copy that only named its source (v1) was rebuilt from the
source's rows: an erase of the source (``delete_thread`` with ``erase_deleted``,
``SessionStore.erase_session``, ``retention``) emptied them, and the copy read as missing after the
projections were rebuilt (found by an outside audit). A v1 event of an older log is still applied
as it was: the source's rows as the read model holds them at that point of the log.

Read model ``langgraph`` (tables ``langgraph_*`` in the projection database): checkpoints,
channel blobs and pending writes keyed as LangGraph keys them, plus the LangGraph message ids
already mirrored into each thread's session (``langgraph_messages``, from the mirror's own
``message.appended`` events) and the threads' sessions (``langgraph_sessions``: the thread each
``lg:`` session was created for, and whether it was deleted). :func:`apply` is called for every
event of the log in order and ignores what it does not know; it never raises on odd stored data.

A thread whose session is deleted (``session.deleted`` in its stream: ``eventlog sessions
delete``, :meth:`SessionStore.delete_session`) is gone from the read model:
its rows are dropped as by ``thread_deleted``, and any ``langgraph.*`` event in its stream after
that is ignored (an outside audit found such a thread still served, and every bulk operation
over it failing). Version 2 of the read model; version 1 kept the rows of deleted sessions.
"""
from __future__ import annotations

import base64
import binascii
import re
import sqlite3
from typing import Any

import orjson

from eventlog.adapters._ids import map_id
from eventlog.errors import ValidationError
from eventlog.sessions.extensions import EventType, Extension, ReadModel

NAMESPACE = "langgraph"
MESSAGE_KIND = "langgraph:message"
MAX_TEXT = 65536
_B64_RE = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


def thread_session(thread_id: str) -> str:
    """The eventlog session (and stream) of a LangGraph thread: ``lg:<thread_id>``, or
    ``lg:h-<sha256>`` for a thread id that does not fit eventlog's id rules."""
    return map_id(thread_id, field="thread_id", domain="langgraph", prefix="lg:")[0]


def encode_blob(kind: str, raw: bytes) -> dict[str, Any]:
    return {"type": kind, "data": base64.b64encode(raw).decode("ascii")}


def version_key(version: Any) -> str:
    """How a channel version (str, int or float) is keyed in the read model."""
    return orjson.dumps(version).decode()


# ---------------------------------------------------------------- validation (writers)

def _text(data: dict[str, Any], name: str, *, optional: bool = False, empty: bool = True, where: str = "") -> None:
    value = data.get(name)
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise ValidationError(where + name, f"must be a string, got {type(value).__name__}")
    if len(value) > MAX_TEXT or (not empty and not value):
        raise ValidationError(where + name, f"must be {'1' if not empty else '0'}-{MAX_TEXT} characters")


def _blob(value: Any, field: str, *, nullable: bool = False) -> None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ValidationError(field, "must be {type, data} with a string type")
    data = value.get("data")
    if data is None and nullable:
        return
    if not isinstance(data, str) or len(data) % 4 or not _B64_RE.fullmatch(data.encode("ascii", "replace")):
        raise ValidationError(f"{field}.data", "must be standard base64 text")


def _scalar_version(value: Any, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValidationError(field, "a channel version must be a string or a number")


def check_put(data: dict[str, Any]) -> dict[str, Any]:
    for name in ("thread_id", "checkpoint_ns"):
        _text(data, name)
    _text(data, "checkpoint_id", empty=False)
    _text(data, "parent_checkpoint_id", optional=True)
    _blob(data.get("checkpoint"), "checkpoint")
    _blob(data.get("metadata"), "metadata")
    versions = data.get("channel_versions")
    if not isinstance(versions, dict):
        raise ValidationError("channel_versions", "must be an object")
    for k, v in versions.items():
        _scalar_version(v, f"channel_versions.{k}")
    blobs = data.get("blobs")
    if not isinstance(blobs, list):
        raise ValidationError("blobs", "must be a list")
    for i, b in enumerate(blobs):
        if not isinstance(b, dict) or not isinstance(b.get("channel"), str):
            raise ValidationError(f"blobs[{i}].channel", "must be a string")
        _scalar_version(b.get("version"), f"blobs[{i}].version")
        _blob(b, f"blobs[{i}]", nullable=True)
    _text(data, "run_id", optional=True)
    return data


def check_writes(data: dict[str, Any]) -> dict[str, Any]:
    for name in ("thread_id", "checkpoint_ns", "task_path"):
        _text(data, name)
    for name in ("checkpoint_id", "task_id"):
        _text(data, name, empty=False)
    writes = data.get("writes")
    if not isinstance(writes, list) or not writes:
        raise ValidationError("writes", "must be a non-empty list")
    for i, w in enumerate(writes):
        if not isinstance(w, dict) or not isinstance(w.get("channel"), str):
            raise ValidationError(f"writes[{i}].channel", "must be a string")
        if isinstance(w.get("idx"), bool) or not isinstance(w.get("idx"), int):
            raise ValidationError(f"writes[{i}].idx", "must be an integer")
        _blob(w, f"writes[{i}]")
    return data


def check_thread(data: dict[str, Any]) -> dict[str, Any]:
    _text(data, "thread_id")
    return data


def check_runs(data: dict[str, Any]) -> dict[str, Any]:
    _text(data, "thread_id")
    runs = data.get("run_ids")
    if not isinstance(runs, list) or not all(isinstance(r, str) for r in runs):
        raise ValidationError("run_ids", "must be a list of strings")
    return data


def _list(data: dict[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    if not isinstance(value, list):
        raise ValidationError(name, "must be a list")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValidationError(f"{name}[{i}]", "must be an object")
    return value


def check_copy(data: dict[str, Any]) -> dict[str, Any]:
    """A ``thread_copied`` v2: the target, the source and the rows copied (see :func:`copy_parts`)."""
    _text(data, "thread_id")
    _text(data, "source_thread_id")
    for i, c in enumerate(_list(data, "checkpoints")):
        where = f"checkpoints[{i}]."
        _text(c, "checkpoint_ns", where=where)
        _text(c, "checkpoint_id", empty=False, where=where)
        _text(c, "parent_checkpoint_id", optional=True, where=where)
        _text(c, "run_id", optional=True, where=where)
        _blob(c.get("checkpoint"), where + "checkpoint")
        _blob(c.get("metadata"), where + "metadata")
        versions = c.get("channel_versions")
        if not isinstance(versions, dict):
            raise ValidationError(where + "channel_versions", "must be an object")
        for k, v in versions.items():
            _scalar_version(v, f"{where}channel_versions.{k}")
    for i, b in enumerate(_list(data, "blobs")):
        where = f"blobs[{i}]."
        _text(b, "checkpoint_ns", where=where)
        if not isinstance(b.get("channel"), str):
            raise ValidationError(where + "channel", "must be a string")
        _scalar_version(b.get("version"), where + "version")
        _blob(b, f"blobs[{i}]", nullable=True)
    for i, w in enumerate(_list(data, "writes")):
        where = f"writes[{i}]."
        for name in ("checkpoint_ns", "task_path"):
            _text(w, name, where=where)
        if not isinstance(w.get("channel"), str):
            raise ValidationError(where + "channel", "must be a string")
        for name in ("checkpoint_id", "task_id"):
            _text(w, name, empty=False, where=where)
        if isinstance(w.get("idx"), bool) or not isinstance(w.get("idx"), int):
            raise ValidationError(where + "idx", "must be an integer")
        _blob(w, f"writes[{i}]")
    return data


def check_prune(data: dict[str, Any]) -> dict[str, Any]:
    _text(data, "thread_id")
    if data.get("strategy") not in ("keep_latest", "delete"):
        raise ValidationError("strategy", "must be 'keep_latest' or 'delete'")
    return data


# ---------------------------------------------------------------- the read model

DDL = [
    """CREATE TABLE langgraph_checkpoints (
        thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
        parent_checkpoint_id TEXT, run_id TEXT, seq INTEGER NOT NULL,
        checkpoint_type TEXT, checkpoint BLOB, metadata_type TEXT, metadata BLOB, channel_versions TEXT,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)) WITHOUT ROWID""",
    "CREATE INDEX langgraph_checkpoints_run ON langgraph_checkpoints (run_id) WHERE run_id IS NOT NULL",
    "CREATE INDEX langgraph_checkpoints_id ON langgraph_checkpoints (checkpoint_id)",
    """CREATE TABLE langgraph_blobs (
        thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
        type TEXT, data BLOB,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)) WITHOUT ROWID""",
    """CREATE TABLE langgraph_writes (
        thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL, idx INTEGER NOT NULL, channel TEXT, type TEXT, data BLOB, task_path TEXT,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)) WITHOUT ROWID""",
    """CREATE TABLE langgraph_messages (
        session_id TEXT NOT NULL, message_key TEXT NOT NULL, seq INTEGER NOT NULL,
        PRIMARY KEY (session_id, message_key)) WITHOUT ROWID""",
    """CREATE TABLE langgraph_sessions (
        session_id TEXT NOT NULL PRIMARY KEY, thread_id TEXT NOT NULL, gone INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID""",
]
VERSION = 2
"""Of the read model: 2 drops a thread whose session is deleted (see the module's docstring)."""


def _b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _pair(value: Any) -> tuple[str | None, bytes | None]:
    if not isinstance(value, dict):
        return None, None
    return _s(value.get("type")), _b64(value.get("data"))


def _put(conn: sqlite3.Connection, seq: int, d: dict[str, Any]) -> None:
    tid, ns, cid = _s(d.get("thread_id")), _s(d.get("checkpoint_ns")), _s(d.get("checkpoint_id"))
    if tid is None or ns is None or cid is None:
        return
    versions = d.get("channel_versions")
    ctype, cdata = _pair(d.get("checkpoint"))
    mtype, mdata = _pair(d.get("metadata"))
    conn.execute("INSERT OR REPLACE INTO langgraph_checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (tid, ns, cid, _s(d.get("parent_checkpoint_id")), _s(d.get("run_id")), seq, ctype, cdata, mtype, mdata,
                  orjson.dumps(versions if isinstance(versions, dict) else {}).decode()))
    blobs = d.get("blobs")
    rows = []
    for b in blobs if isinstance(blobs, list) else []:
        if isinstance(b, dict) and isinstance(b.get("channel"), str) and "version" in b:
            rows.append((tid, ns, b["channel"], version_key(b["version"]), _s(b.get("type")), _b64(b.get("data"))))
    conn.executemany("INSERT OR REPLACE INTO langgraph_blobs VALUES (?, ?, ?, ?, ?, ?)", rows)


def _writes(conn: sqlite3.Connection, d: dict[str, Any]) -> None:
    key = tuple(_s(d.get(k)) for k in ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id"))
    writes = d.get("writes")
    if None in key or not isinstance(writes, list):
        return
    for w in writes:
        idx = w.get("idx") if isinstance(w, dict) else None
        if isinstance(idx, bool) or not isinstance(idx, int):
            continue
        # Idempotent per (task_id, idx): a regular write is stored once; the special channels
        # (negative idx: error, interrupt, resume, scheduled) keep their latest value.
        verb = "INSERT OR IGNORE" if idx >= 0 else "INSERT OR REPLACE"
        conn.execute(f"{verb} INTO langgraph_writes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (*key, idx, _s(w.get("channel")), _s(w.get("type")), _b64(w.get("data")), _s(d.get("task_path"))))


def _drop_thread(conn: sqlite3.Connection, tid: str, session: Any) -> None:
    for table in ("langgraph_checkpoints", "langgraph_blobs", "langgraph_writes"):
        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (tid,))
    if isinstance(session, str):
        conn.execute("DELETE FROM langgraph_messages WHERE session_id = ?", (session,))


def _drop_checkpoints(conn: sqlite3.Connection, keys: list[tuple[Any, ...]]) -> None:
    conn.executemany("DELETE FROM langgraph_writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?", keys)
    conn.executemany("DELETE FROM langgraph_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                     keys)


def _runs_deleted(conn: sqlite3.Connection, d: dict[str, Any]) -> None:
    tid, runs = _s(d.get("thread_id")), d.get("run_ids")
    if tid is None or not isinstance(runs, list):
        return
    for run in (r for r in runs if isinstance(r, str)):
        keys = conn.execute("SELECT thread_id, checkpoint_ns, checkpoint_id FROM langgraph_checkpoints "
                            "WHERE thread_id = ? AND run_id = ?", (tid, run)).fetchall()
        _drop_checkpoints(conn, keys)


def _b64_text(raw: Any) -> str | None:
    return base64.b64encode(raw).decode("ascii") if isinstance(raw, bytes) else None


COPY_PART_BYTES = 4 << 20
"""About how many encoded bytes of rows one ``thread_copied`` event carries: a larger thread is
copied as several events in one atomic batch (one row alone is always small enough: each came
from one event under the log's 16 MiB limit)."""


def copy_parts(conn: sqlite3.Connection, source: str, target: str) -> list[dict[str, Any]]:
    """The data of the ``thread_copied`` (v2) events that copy thread ``source``'s rows, as
    ``conn`` holds them, to ``target``: values as base64, as in the other events, so that
    :func:`apply` stores the same bytes again. Empty when the source has no row at all (pending
    writes without a checkpoint, or blobs left by ``delete_for_runs``, are copied too: writes may
    arrive before their checkpoint). Read it in one transaction of ``conn`` for a consistent copy."""
    checkpoints = [{"checkpoint_ns": ns, "checkpoint_id": cid, "parent_checkpoint_id": parent, "run_id": run,
                    "checkpoint": {"type": ctype, "data": _b64_text(cdata)},
                    "metadata": {"type": mtype, "data": _b64_text(mdata)},
                    "channel_versions": orjson.loads(versions) if versions else {}}
                   for ns, cid, parent, run, ctype, cdata, mtype, mdata, versions in conn.execute(
                       "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, checkpoint_type, checkpoint, "
                       "metadata_type, metadata, channel_versions FROM langgraph_checkpoints WHERE thread_id = ? "
                       "ORDER BY checkpoint_ns, checkpoint_id", (source,))]
    blobs = [{"checkpoint_ns": ns, "channel": ch, "version": orjson.loads(v), "type": t, "data": _b64_text(d)}
             for ns, ch, v, t, d in conn.execute(
                 "SELECT checkpoint_ns, channel, version, type, data FROM langgraph_blobs WHERE thread_id = ? "
                 "ORDER BY checkpoint_ns, channel, version", (source,))]
    writes = [{"checkpoint_ns": ns, "checkpoint_id": cid, "task_id": task, "task_path": path, "idx": idx,
               "channel": ch, "type": t, "data": _b64_text(d)}
              for ns, cid, task, idx, ch, t, d, path in conn.execute(
                  "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path FROM langgraph_writes "
                  "WHERE thread_id = ? ORDER BY checkpoint_ns, checkpoint_id, task_id, idx", (source,))]
    if not (checkpoints or blobs or writes):
        return []
    parts: list[dict[str, Any]] = []
    part: dict[str, Any] = {}
    size = 0
    for name, rows in (("checkpoints", checkpoints), ("blobs", blobs), ("writes", writes)):
        for row in rows:
            n = len(orjson.dumps(row))
            if not part or (size and size + n > COPY_PART_BYTES):
                part = {"thread_id": target, "source_thread_id": source, "checkpoints": [], "blobs": [], "writes": []}
                parts.append(part)
                size = 0
            part[name].append(row)
            size += n
    return parts


def _copied_rows(conn: sqlite3.Connection, seq: int, d: dict[str, Any]) -> None:
    """A ``thread_copied`` v2: the rows it carries, stored for its target as the copy read them
    (a row the target has already is replaced, as v1 did)."""
    dst = _s(d.get("thread_id"))
    if dst is None:
        return
    rows: list[tuple[Any, ...]] = []
    for c in _dicts(d.get("checkpoints")):
        ns, cid = _s(c.get("checkpoint_ns")), _s(c.get("checkpoint_id"))
        if ns is None or cid is None:
            continue
        versions = c.get("channel_versions")
        rows.append((dst, ns, cid, _s(c.get("parent_checkpoint_id")), _s(c.get("run_id")), seq,
                     *_pair(c.get("checkpoint")), *_pair(c.get("metadata")),
                     orjson.dumps(versions if isinstance(versions, dict) else {}).decode()))
    conn.executemany("INSERT OR REPLACE INTO langgraph_checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.executemany("INSERT OR REPLACE INTO langgraph_blobs VALUES (?, ?, ?, ?, ?, ?)", [
        (dst, b["checkpoint_ns"], b["channel"], version_key(b["version"]), _s(b.get("type")), _b64(b.get("data")))
        for b in _dicts(d.get("blobs"))
        if isinstance(b.get("checkpoint_ns"), str) and isinstance(b.get("channel"), str) and "version" in b])
    conn.executemany("INSERT OR REPLACE INTO langgraph_writes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
        (dst, w["checkpoint_ns"], w["checkpoint_id"], w["task_id"], w["idx"], _s(w.get("channel")), _s(w.get("type")),
         _b64(w.get("data")), _s(w.get("task_path")))
        for w in _dicts(d.get("writes"))
        if all(isinstance(w.get(k), str) for k in ("checkpoint_ns", "checkpoint_id", "task_id"))
        and isinstance(w.get("idx"), int) and not isinstance(w.get("idx"), bool)])


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _copied(conn: sqlite3.Connection, d: dict[str, Any]) -> None:
    """A ``thread_copied`` v1 (logs of earlier releases): the source's rows as they are now."""
    dst, src = _s(d.get("thread_id")), _s(d.get("source_thread_id"))
    if dst is None or src is None or dst == src:
        return
    conn.execute("INSERT OR REPLACE INTO langgraph_checkpoints SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
                 "run_id, seq, checkpoint_type, checkpoint, metadata_type, metadata, channel_versions "
                 "FROM langgraph_checkpoints WHERE thread_id = ?", (dst, src))
    conn.execute("INSERT OR REPLACE INTO langgraph_blobs SELECT ?, checkpoint_ns, channel, version, type, data "
                 "FROM langgraph_blobs WHERE thread_id = ?", (dst, src))
    conn.execute("INSERT OR REPLACE INTO langgraph_writes SELECT ?, checkpoint_ns, checkpoint_id, task_id, idx, channel, "
                 "type, data, task_path FROM langgraph_writes WHERE thread_id = ?", (dst, src))


def _pruned(conn: sqlite3.Connection, d: dict[str, Any], session: Any) -> None:
    tid, strategy = _s(d.get("thread_id")), d.get("strategy")
    if tid is None:
        return
    if strategy == "delete":
        for table in ("langgraph_checkpoints", "langgraph_blobs", "langgraph_writes"):
            conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (tid,))
        return
    if strategy != "keep_latest":
        return
    namespaces = [r[0] for r in conn.execute(
        "SELECT DISTINCT checkpoint_ns FROM langgraph_checkpoints WHERE thread_id = ?", (tid,))]
    for ns in namespaces:
        latest, versions = conn.execute(
            "SELECT checkpoint_id, channel_versions FROM langgraph_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
            "ORDER BY checkpoint_id DESC LIMIT 1", (tid, ns)).fetchone()
        keys = conn.execute("SELECT thread_id, checkpoint_ns, checkpoint_id FROM langgraph_checkpoints "
                            "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id <> ?", (tid, ns, latest)).fetchall()
        _drop_checkpoints(conn, keys)
        try:
            kept = orjson.loads(versions) if isinstance(versions, str) else {}
        except orjson.JSONDecodeError:
            kept = {}
        wanted = {(str(ch), version_key(v)) for ch, v in kept.items()} if isinstance(kept, dict) else set()
        stale = [(tid, ns, ch, v) for ch, v in conn.execute(
            "SELECT channel, version FROM langgraph_blobs WHERE thread_id = ? AND checkpoint_ns = ?", (tid, ns))
            if (ch, v) not in wanted]
        conn.executemany("DELETE FROM langgraph_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? "
                         "AND version = ?", stale)


def _mirrored(conn: sqlite3.Connection, seq: int, session: Any, d: dict[str, Any]) -> None:
    if d.get("display_kind") != MESSAGE_KIND or not isinstance(session, str):
        return
    meta = d.get("display_metadata")
    key = meta.get("langgraph_id") if isinstance(meta, dict) else None
    if isinstance(key, str):
        conn.execute("INSERT OR IGNORE INTO langgraph_messages VALUES (?, ?, ?)", (session, key, seq))


def session_thread(session: str, data: dict[str, Any]) -> str | None:
    """The thread an ``lg:`` session was created for (``data``: its ``session.created`` data):
    the one its ``model_config`` names, or the id the session's name spells; None when neither
    maps to the session (not a thread's session)."""
    config = data.get("model_config")
    named = config.get("langgraph") if isinstance(config, dict) else None
    candidates = [named.get("thread_id") if isinstance(named, dict) else None, session[3:]]
    for tid in candidates:
        if isinstance(tid, str):
            try:
                if thread_session(tid) == session:
                    return tid
            except ValidationError:
                continue
    return None


def _session_created(conn: sqlite3.Connection, session: Any, data: dict[str, Any]) -> None:
    if isinstance(session, str) and session.startswith("lg:"):
        tid = session_thread(session, data)
        if tid is not None:
            conn.execute("INSERT OR IGNORE INTO langgraph_sessions VALUES (?, ?, 0)", (session, tid))


def _session_deleted(conn: sqlite3.Connection, session: Any) -> None:
    if not isinstance(session, str) or not session.startswith("lg:"):
        return
    row = conn.execute("SELECT thread_id FROM langgraph_sessions WHERE session_id = ?", (session,)).fetchone()
    if row is not None:
        _drop_thread(conn, row[0], session)
        conn.execute("UPDATE langgraph_sessions SET gone = 1 WHERE session_id = ?", (session,))


def _gone(conn: sqlite3.Connection, session: Any) -> bool:
    return isinstance(session, str) and conn.execute(
        "SELECT 1 FROM langgraph_sessions WHERE session_id = ? AND gone", (session,)).fetchone() is not None


def apply(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
    """Fold one log event into the ``langgraph_*`` tables (every event is offered; most are ignored)."""
    kind, data, seq, session = env.get("type"), env.get("data"), env.get("seq"), env.get("session")
    if not isinstance(kind, str) or not isinstance(seq, int):
        return
    if kind == "session.deleted":
        _session_deleted(conn, session)
        return
    if not isinstance(data, dict) or env.get("erased"):
        return
    if kind == "message.appended":
        _mirrored(conn, seq, session, data)
        return
    if kind == "session.created":
        _session_created(conn, session, data)
        return
    if not kind.startswith("langgraph.") or _gone(conn, session):
        return
    if kind == "langgraph.checkpoint_put":
        _put(conn, seq, data)
    elif kind == "langgraph.writes_put":
        _writes(conn, data)
    elif kind == "langgraph.thread_deleted" and isinstance(data.get("thread_id"), str):
        _drop_thread(conn, data["thread_id"], session)
    elif kind == "langgraph.runs_deleted":
        _runs_deleted(conn, data)
    elif kind == "langgraph.thread_copied":
        if env.get("v", 1) == 1:
            _copied(conn, data)
        else:
            _copied_rows(conn, seq, data)
    elif kind == "langgraph.thread_pruned":
        _pruned(conn, data, session)


class ThreadEventType(EventType):
    """A ``langgraph.*`` type: its data checked by ``validate``, and the event refused outside
    the stream of its thread (:func:`thread_session` of ``data.thread_id``), so that a thread's
    stream version counts every event that changes the thread's rows (the saver relies on it)."""

    def check(self, data: Any, session: str | None) -> dict[str, Any]:
        out = super().check(data, session)
        tid = out.get("thread_id")
        if isinstance(tid, str) and session != thread_session(tid):
            raise ValidationError("thread_id", f"the event's session must be its thread's, {thread_session(tid)!r}")
        return out


EXTENSION = Extension(
    namespace=NAMESPACE,
    event_types=[
        ThreadEventType("langgraph.checkpoint_put", version=1, validate=check_put, upcasters={}),
        ThreadEventType("langgraph.writes_put", version=1, validate=check_writes, upcasters={}),
        ThreadEventType("langgraph.thread_deleted", version=1, validate=check_thread, upcasters={}),
        ThreadEventType("langgraph.runs_deleted", version=1, validate=check_runs, upcasters={}),
        # v2 carries the rows; v1 (no upcaster: its rows are the source's when it is applied)
        # is applied as it was.
        ThreadEventType("langgraph.thread_copied", version=2, validate=check_copy, upcasters={}),
        ThreadEventType("langgraph.thread_pruned", version=1, validate=check_prune, upcasters={}),
    ],
    read_models=[ReadModel(name=NAMESPACE, version=VERSION, ddl=DDL, apply=apply)],
)

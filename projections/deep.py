"""``eventlog doctor --deep``: the projections compared with the log itself.

The reference fold (:class:`eventlog.sessions.fold.Fold`) is recomputed from the log — the
verified prefix up to state.db's cursor, read as a stream — and every read model is compared
with what state.db answers, table by table and session by session, by digest. A row changed
behind the projector's back (a SQL edit, a bad page that still parses) is found, and the
first differing session and row are named. Reads only: through ``mode=ro`` connections.

Cost: one pass over the log and one query per session and table; the fold holds the profile's
state in memory while it runs.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable

import orjson

from eventlog.log import Log
from eventlog.sessions.fold import MESSAGE_KEYS, REACTION_KEYS, SESSION_KEYS, USAGE_KEYS, Fold
from projections.queries import Reader
from projections.site import ZERO_HASH
from projections.verified import Verified

TABLES = ("sessions", "messages", "usage", "reactions", "fts")


def _pick(rows: Iterable[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in keys} for r in rows]


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()


def _session_views(q: Any, sid: str) -> dict[str, Any]:
    """What a read model (the fold or a reader) answers about one session, per table."""
    session = q.get_session(sid)
    messages = q.get_messages(sid, include_inactive=True) if session is not None else []
    return {
        "sessions": _pick([session], SESSION_KEYS) if session is not None else [],
        "messages": _pick(messages, MESSAGE_KEYS),
        "usage": _pick(q.get_usage(sid), USAGE_KEYS) if session is not None else [],
        "reactions": [{"message_id": m["id"], "rows": _pick(q.get_reactions(m["id"]), REACTION_KEYS)}
                      for m in messages],
    }


def _first_row(table: str, expected: list[Any], found: list[Any]) -> dict[str, Any]:
    """The first row of two lists that differs, and its first differing field."""
    for i in range(max(len(expected), len(found))):
        a = expected[i] if i < len(expected) else None
        b = found[i] if i < len(found) else None
        if a == b:
            continue
        row = (a or b or {}).get("id", (a or b or {}).get("message_id", i)) if isinstance(a or b, dict) else i
        field = None
        if isinstance(a, dict) and isinstance(b, dict):
            field = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), None)
            a, b = (a.get(field), b.get(field)) if field is not None else (a, b)
        return {"row": row, "field": field, "log": _short(a), "projection": _short(b)}
    return {"row": None, "field": None, "log": None, "projection": None}


def _short(value: Any) -> Any:
    text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    return value if len(text) <= 200 else text[:197] + "..."


def deep_check(log: Log, reader: Reader, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Compare the projections ``reader`` reads with the fold of ``log`` up to their cursor.

    Returns ``{"ok", "compared_seq", "tables": {name: {"ok", "log", "projection"}},
    "first_difference": {"table", "session", "row", "field", "log", "projection"} | None,
    "detail"}`` (digests are sha256 hex of the per-session digests in session order)."""
    state_seq, fts_seq = reader.cursors()
    fold = Fold()
    events = Verified(log, 1, state_seq, ZERO_HASH)
    for n, env in enumerate(events, 1):
        fold.apply(env)
        if progress is not None and n % 5000 == 0:
            progress(n, state_seq)
    out: dict[str, Any] = {"ok": True, "compared_seq": state_seq, "tables": {}, "first_difference": None,
                           "detail": ""}
    if events.damage is not None:
        out.update(ok=False, detail=f"the log is damaged at seq {events.damage.seq} ({events.damage.reason}), "
                                    f"before the projections' cursor {state_seq}: they cannot be checked past it")
        return out
    ids = sorted({s["id"] for s in fold.list_sessions(archived=None, pinned=None, hidden=None, limit=None)}
                 | {s["id"] for s in reader.list_sessions(archived=None, pinned=None, hidden=None, limit=None)})
    per_table: dict[str, list[tuple[str, str, str]]] = {t: [] for t in TABLES}
    first: dict[str, Any] | None = None
    for sid in ids:
        want, got = _session_views(fold, sid), _session_views(reader, sid)
        for table in TABLES[:-1]:
            a, b = _digest(want[table]), _digest(got[table])
            per_table[table].append((sid, a, b))
            if a != b and first is None:
                first = {"table": table, "session": sid, **_first_row(table, want[table], got[table])}
    indexed = _fts_documents(reader)
    if indexed is None:
        out["tables"]["fts"] = {"ok": None, "log": None, "projection": None, "detail": "no usable index to compare"}
    elif fts_seq != state_seq:
        out["tables"]["fts"] = {"ok": None, "log": None, "projection": None,
                                "detail": f"the index is at seq {fts_seq}, state.db at {state_seq}: not compared"}
    else:
        # The word index is contentless (it keeps no text to compare): its documents are counted
        # against the fold's messages of live sessions, as recorded and as the index holds them.
        expected = sum(len(fold.get_messages(sid, include_inactive=True)) for sid in ids
                       if fold.get_session(sid) is not None)
        recorded, held = indexed
        ok = expected == recorded == held
        out["tables"]["fts"] = {"ok": ok, "log": expected, "projection": held, "recorded": recorded}
        if not ok and first is None:
            first = {"table": "fts", "session": None, "row": None, "field": "documents", "log": expected,
                     "projection": held}
    for table, rows in per_table.items():
        if table == "fts" and table in out["tables"]:
            continue
        a = hashlib.sha256("".join(f"{s}:{d}\n" for s, d, _ in rows).encode()).hexdigest()
        b = hashlib.sha256("".join(f"{s}:{d}\n" for s, _, d in rows).encode()).hexdigest()
        out["tables"][table] = {"ok": a == b, "log": a, "projection": b, "sessions": len(rows)}
    out["first_difference"] = first
    out["ok"] = first is None and all(t["ok"] is not False for t in out["tables"].values())
    if first is not None and first["session"] is None:
        out["detail"] = (f"{first['table']} differs from the log: {first['field']} {first['projection']!r}, "
                         f"the log says {first['log']!r}")
    elif first is not None:
        out["detail"] = (f"{first['table']} differ from the log: session {first['session']!r}, row {first['row']!r}"
                         + (f", field {first['field']!r}" if first["field"] else ""))
    return out


def _fts_documents(reader: Reader) -> tuple[int, int] | None:
    """The index's document count as recorded in its meta and as its word index holds it
    (FTS5's averages record), or None without a usable index."""
    from projections.health import averaged_rows

    def read(db: Any) -> tuple[int, int] | None:
        schema = reader.fts_schema
        if schema is None:
            return None
        found = db.execute(f"SELECT value FROM {schema}.meta WHERE key = 'documents'").fetchone()
        recorded = found[0] if found is not None and isinstance(found[0], int) else -1
        return recorded, averaged_rows(db, schema)
    return reader.run_read(read)

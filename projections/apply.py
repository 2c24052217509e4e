"""The fold rules of docs/EVENTS.md, applied to the state.db tables.

:class:`Applier` is the SQL twin of :class:`eventlog.sessions.fold.Fold`: for every event sequence the
tables it writes answer the queries exactly as the fold does. It works inside a transaction
the caller opens and commits; :meth:`Applier.flush` must run before the commit.

Speed: the two events that dominate a log, ``message.appended`` and ``usage.recorded``, are
applied to an in-memory copy of the rows they touch (session counters, usage rows) and
written back in bulk by :meth:`flush`; every other event flushes first and then works on the
tables directly (the cached rows are kept, except by the two that change them in SQL:
``session.deleted`` and ``messages.rewound``). Sums are still computed one event at a time in log order, so float totals
are bit-identical to the fold's whatever the batch sizes.
"""
from __future__ import annotations

import logging
import sqlite3
from typing import Any, Callable, Iterable

import orjson

from eventlog.sessions.events import CURRENT_VERSIONS, Handler, check_handlers, upcast
from eventlog.sessions.rules import (
    COSTS,
    CREATED_TEXT,
    FLAG_EVENTS,
    FLAGS,
    INHERITED,
    INT64_MAX,
    MAX_COST,
    MAX_TIME,
    META_TEXT,
    TOKENS,
    OddValues,
    as_int,
    as_number,
    as_str,
    as_time,
    event_time,
    json_text,
    lineage,
    lineage_root,
    outranked,
    title_claim,
)
from eventlog.sessions.rules import descendants as _descendants

log = logging.getLogger("eventlog.projections")
_MESSAGE_TEXT = ("role", "tool_name", "tool_call_id", "finish_reason", "reasoning", "display_kind")

def upcaster() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``eventlog.sessions.events.upcast``, skipped for envelopes already at the current version (it
    would only copy them; the applier never changes an envelope)."""
    current = CURRENT_VERSIONS

    def up(env: dict[str, Any]) -> dict[str, Any]:
        v, t = env.get("v", 1), env.get("type")
        if type(v) is int and isinstance(t, str) and current.get(t) == v:
            return env
        return upcast(env)

    return up


def store_int(v: int) -> int | str:
    """Token totals may outgrow SQLite's 64-bit integers: store those as decimal text."""
    return v if v <= INT64_MAX else str(v)


def load_int(v: Any) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return 0


def usage_key(model: str | None, provider: str | None, task: str | None) -> str:
    return orjson.dumps([model, provider, task]).decode()


_COUNTER_COLS = ("message_count", "tool_call_count", "last_activity_at", *TOKENS, *COSTS)
_SELECT_COUNTERS = f"SELECT {', '.join(_COUNTER_COLS)} FROM sessions WHERE id = ?"
_UPDATE_COUNTERS = f"UPDATE sessions SET {', '.join(c + ' = ?' for c in _COUNTER_COLS)} WHERE id = ?"
_USAGE_COLS = ("model", "provider", "task", *TOKENS, *COSTS, "records")
_SELECT_USAGE = f"SELECT {', '.join(_USAGE_COLS)} FROM usage WHERE session_id = ? AND ukey = ?"
_UPSERT_USAGE = (f"INSERT OR REPLACE INTO usage (session_id, ukey, {', '.join(_USAGE_COLS)}) "
                 f"VALUES ({', '.join('?' * (2 + len(_USAGE_COLS)))})")
_MESSAGE_COLS = ("id", "session_id", "role", "content", "content_json", "tool_calls", "tool_name",
                 "tool_call_id", "timestamp", "token_count", "finish_reason", "reasoning",
                 "reasoning_details", "display_kind", "display_metadata", "active", "n_tool_calls")
_INSERT_MESSAGE = (f"INSERT INTO messages ({', '.join(_MESSAGE_COLS)}) "
                   f"VALUES ({', '.join('?' * len(_MESSAGE_COLS))})")
_SESSION_INSERT_COLS = ("id", *CREATED_TEXT, "model_config", "started_at", "last_activity_at",
                        *FLAGS, "profile_name", "created_seq")
_INSERT_SESSION = (f"INSERT INTO sessions ({', '.join(_SESSION_INSERT_COLS)}) "
                   f"VALUES ({', '.join('?' * len(_SESSION_INSERT_COLS))})")


class Applier:
    """Applies upcast-or-raw envelopes in log order to the state tables of ``db``."""

    def __init__(self, db: sqlite3.Connection, profile_name: str | None = None) -> None:
        self.db = db
        self.profile_name = profile_name
        self.upcast = upcaster()
        self.seq = 0
        self.hash: str | None = None
        self._counters: dict[str, list[Any] | None] = {}
        self._dirty: set[str] = set()
        self._usage: dict[tuple[str, str], list[Any]] = {}
        self._usage_dirty: set[tuple[str, str]] = set()
        self._messages: list[tuple[Any, ...]] = []
        self.skipped: dict[str, int] = {}
        self.odd = OddValues(log)
        """Values of known fields this applier shows as unknown (a time that is not one, a count
        that is not an integer, ...), warned about naming the session (writers validate; such
        values come from imports and old logs)."""
        """Events of types this program does not project (a newer program's, an extension's),
        by type; added to the ``skipped_types`` meta row at the next flush (shown by doctor)."""

    # ---- entry points ---------------------------------------------------------------------

    def apply_all(self, envelopes: Iterable[dict[str, Any]]) -> None:
        for env in envelopes:
            self.apply(env)
        self.flush()

    def apply(self, envelope: dict[str, Any]) -> None:
        """Fold one envelope through :data:`HANDLERS` (the caller's transaction must be open).
        Types this program does not know are skipped, as the fold skips them. Never raises on
        odd data."""
        if not isinstance(envelope, dict):
            return
        env = self.upcast(envelope)
        seq, sid, kind = as_int(env.get("seq"), 1), env.get("session"), env.get("type")
        if seq is None:
            return
        self.seq = seq
        h = env.get("hash")
        self.hash = h if type(h) is str else None
        if env.get("erased") is True and "data" not in env:
            return  # an erased event: its content is gone, as if it had never been appended
        if kind == "log.erased":
            self.flush()
            self._erased(env.get("data"), seq)
            return
        if type(sid) is not str or type(kind) is not str:
            if not isinstance(sid, str) or not isinstance(kind, str):
                return
        handler = HANDLERS.get(kind)
        if handler is None:
            self.skipped[kind] = self.skipped.get(kind, 0) + 1
            return
        data = env.get("data")
        if type(data) is not dict:
            data = data if isinstance(data, dict) else {}
        handler.apply(self, sid, seq, data, event_time(env.get("ts")))

    def flush(self, *, keep_cache: bool = False) -> None:
        """Write the buffered rows of the hot path to the tables. The cached rows are then
        dropped (the next event may change the tables behind them) unless ``keep_cache``:
        between two hot-path events nothing else writes them."""
        if self.skipped:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'skipped_types'").fetchone()
            counts = orjson.loads(row[0]) if row and isinstance(row[0], (str, bytes)) else {}
            for kind, n in self.skipped.items():
                counts[kind] = int(counts.get(kind, 0)) + n
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('skipped_types', ?)",
                            (orjson.dumps(counts, option=orjson.OPT_SORT_KEYS).decode(),))
            self.skipped = {}
        if self._messages:
            self.db.executemany(_INSERT_MESSAGE, self._messages)
            self._messages = []
        if self._dirty:
            rows = []
            for sid in self._dirty:
                c = self._counters[sid]
                assert c is not None
                rows.append((*c[:3], *(store_int(v) for v in c[3:8]), *c[8:], sid))
            self.db.executemany(_UPDATE_COUNTERS, rows)
            self._dirty = set()
        if self._usage_dirty:
            self.db.executemany(_UPSERT_USAGE, [
                (sid, ukey, *u[:3], *(store_int(v) for v in u[3:8]), *u[8:])
                for (sid, ukey), u in ((k, self._usage[k]) for k in self._usage_dirty)])
            self._usage_dirty = set()
        if not keep_cache:
            self._usage = {}
            self._counters = {}

    # ---- hot path ---------------------------------------------------------------------------

    def _load(self, sid: str) -> list[Any] | None:
        try:
            return self._counters[sid]
        except KeyError:
            pass
        row = self.db.execute(_SELECT_COUNTERS, (sid,)).fetchone()
        c = None
        if row is not None:
            c = list(row)
            for i in range(3, 8):
                c[i] = load_int(c[i])
        self._counters[sid] = c
        return c

    def _appended(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        # The hottest path of a rebuild: the fold's coercions, inlined for the common types.
        c = self._counters[sid] if sid in self._counters else self._load(sid)
        if c is None:
            return
        g = data.get
        texts = (g("role"), g("tool_name"), g("tool_call_id"), g("finish_reason"), g("reasoning"), g("display_kind"))
        role, tool_name, tool_call_id, finish_reason, reasoning, display_kind = [
            v if type(v) is str else None for v in texts]
        for i, v in enumerate(texts):  # the hot path: the values already read, not read again
            if v is not None and type(v) is not str:
                self.odd.add(sid, seq, _MESSAGE_TEXT[i], v)
        content = g("content")
        content_json = 0
        if content is not None and type(content) is not str:
            content = json_text(content, list, dict)
            content_json = 0 if content is None else 1
            if content is None:
                self.odd.add(sid, seq, "content", g("content"))
        calls = g("tool_calls")
        calls_text, n_calls = None, 0
        if calls is not None:
            calls_text = json_text(calls, list)
            if calls_text is not None:
                n_calls = len(calls)
            else:
                self.odd.add(sid, seq, "tool_calls", calls)
        stamp = g("timestamp")
        if stamp is None:
            stamp = now
        elif type(stamp) is not float or not 0.0 <= stamp <= MAX_TIME:
            raw, stamp = stamp, as_number(stamp, 0.0, MAX_TIME)
            if stamp is None:
                self.odd.add(sid, seq, "timestamp", raw)
        tokens = g("token_count")
        if tokens is not None:
            raw, tokens = tokens, as_int(tokens, 0)
            if tokens is None:
                self.odd.add(sid, seq, "token_count", raw)
        details = g("reasoning_details")
        if details is not None:
            details = json_text(details, list, dict)
            if details is None:
                self.odd.add(sid, seq, "reasoning_details", g("reasoning_details"))
        display = g("display_metadata")
        if display is not None:
            display = json_text(display, dict)
            if display is None:
                self.odd.add(sid, seq, "display_metadata", g("display_metadata"))
        self._messages.append((seq, sid, role, content, content_json, calls_text, tool_name, tool_call_id, stamp,
                               tokens, finish_reason, reasoning, details, display_kind, display, 1, n_calls))
        c[0] += 1
        c[1] += n_calls
        if stamp is not None and (c[2] is None or stamp > c[2]):
            c[2] = stamp
        self._dirty.add(sid)

    def _usage_recorded(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        c = self._load(sid)
        if c is None:
            return
        model, provider, task = as_str(data.get("model")), as_str(data.get("provider")), as_str(data.get("task"))
        ukey = usage_key(model, provider, task)
        u = self._usage.get((sid, ukey))
        if u is None:
            row = self.db.execute(_SELECT_USAGE, (sid, ukey)).fetchone()
            if row is None:
                u = [model, provider, task, 0, 0, 0, 0, 0, None, None, 0]
            else:
                u = list(row)
                for i in range(3, 8):
                    u[i] = load_int(u[i])
            self._usage[(sid, ukey)] = u
        u[10] += 1
        for i, name in enumerate(TOKENS):
            raw = data.get(name)
            add = as_int(raw, 0)
            if add is None:
                if raw is not None:
                    self.odd.add(sid, seq, name, raw)
                add = 0
            c[3 + i] += add
            u[3 + i] += add
        for i, name in enumerate(COSTS):
            raw = data.get(name)
            cost = as_number(raw, 0.0, MAX_COST)
            if cost is None and raw is not None:
                self.odd.add(sid, seq, name, raw)
            if cost is not None:
                c[8 + i] = (c[8 + i] or 0.0) + cost
                u[8 + i] = (u[8 + i] or 0.0) + cost
        self._dirty.add(sid)
        self._usage_dirty.add((sid, ukey))

    # ---- session events: each flushes the hot path's buffers first ----------------------------

    def _settled_live(self, sid: str, *, keep_cache: bool = True) -> bool:
        """Flush the buffered rows, then say whether ``sid`` is a live session. The cached
        counters and usage rows stay valid unless the caller changes them in SQL itself
        (``keep_cache=False``: deletes and rewinds)."""
        self.flush(keep_cache=keep_cache)
        return self._live(sid)

    def _live(self, sid: str) -> bool:
        return self.db.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None

    def _created(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        self.flush(keep_cache=True)
        self._counters.pop(sid, None)  # a "no such session" cached for an event before this one
        if self._live(sid) or self.db.execute("SELECT 1 FROM tombstones WHERE id = ?", (sid,)).fetchone():
            return
        row = {key: as_str(data.get(key)) for key in CREATED_TEXT}
        self.odd.texts(sid, seq, data, CREATED_TEXT)
        config = json_text(data.get("model_config"), dict)
        if config is None and data.get("model_config") is not None:
            self.odd.add(sid, seq, "model_config", data.get("model_config"))
        flags = (0, 0, 0)
        parent = row["parent_session_id"]
        if parent is not None:
            p = self.db.execute(
                f"SELECT {', '.join(INHERITED)} FROM sessions WHERE id = ?", (parent,)).fetchone()
            if p is not None:
                for key, value in zip(INHERITED, p):
                    if row[key] is None:
                        row[key] = value
                flags = self.db.execute(f"SELECT {', '.join(FLAGS)} FROM sessions WHERE id = ?",
                                        (self._root(parent),)).fetchone()
        started = as_time(data.get("started_at"), now)
        if started is None and data.get("started_at") is not None:
            self.odd.add(sid, seq, "started_at", data.get("started_at"))
        self.db.execute(_INSERT_SESSION, (
            sid, *(row[k] for k in CREATED_TEXT), config,
            started, started, *flags, self.profile_name, seq))
        if "title" in data:
            self.odd.texts(sid, seq, data, ("title",))
            self._titled(sid, data.get("title"), data.get("title_source"))

    def _flagged(self, sid: str, flag: str, value: bool) -> None:
        if self._settled_live(sid):
            self.db.executemany(f"UPDATE sessions SET {flag} = ? WHERE id = ?",
                                [(int(value), m) for m in self._lineage(sid)])

    def _retitled(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if self._settled_live(sid):
            self.odd.texts(sid, seq, data, ("title",))
            self._titled(sid, data.get("title"), data.get("source"))

    def _titled(self, sid: str, title: Any, source: Any) -> None:
        claim = title_claim(title, source)
        if claim is None:
            return
        title, source = claim
        holder = self.db.execute("SELECT id FROM sessions WHERE title = ? LIMIT 1", (title,)).fetchone()
        if holder is not None and holder[0] != sid:
            return
        current = self.db.execute("SELECT title_source FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
        if outranked(current, source):
            return
        self.db.execute("UPDATE sessions SET title = ?, title_source = ? WHERE id = ?", (title, source, sid))

    def _session_ended(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if self._settled_live(sid):
            ended = as_time(data.get("ended_at"), now)
            if ended is None and data.get("ended_at") is not None:
                self.odd.add(sid, seq, "ended_at", data.get("ended_at"))
            self.db.execute(
                "UPDATE sessions SET ended = 1, ended_at = ?, end_reason = ? WHERE id = ? AND ended = 0",
                (ended, as_str(data.get("reason")), sid))

    def _reopened(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if self._settled_live(sid):
            self.db.execute("UPDATE sessions SET ended = 0, ended_at = NULL, end_reason = NULL WHERE id = ?", (sid,))

    def _meta_updated(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if not self._settled_live(sid):
            return
        sets: list[tuple[str, Any]] = [(k, as_str(data[k])) for k in META_TEXT if k in data]
        self.odd.texts(sid, seq, data, META_TEXT)
        if "model_config" in data:
            sets.append(("model_config", json_text(data["model_config"], dict)))
            if sets[-1][1] is None and data["model_config"] is not None:
                self.odd.add(sid, seq, "model_config", data["model_config"])
        if "tool_names" in data:
            names = data["tool_names"]
            value = [n for n in names if isinstance(n, str)] if isinstance(names, list) else None
            sets.append(("tool_names", None if value is None else orjson.dumps(value).decode()))
        if sets:
            self.db.execute(f"UPDATE sessions SET {', '.join(k + ' = ?' for k, _ in sets)} WHERE id = ?",
                            (*(v for _, v in sets), sid))

    def _deleted(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if not self._settled_live(sid, keep_cache=False):
            return
        db = self.db
        for m in [sid, *_descendants(sid, self._children)]:
            # The search index may hold these messages: it needs what it was given to let them go.
            db.execute("INSERT INTO fts_pending (id, seq, content, tool_name, tool_calls) "
                       "SELECT id, ?, content, tool_name, tool_calls FROM messages WHERE session_id = ?", (seq, m))
            db.execute("DELETE FROM reactions WHERE session_id = ?", (m,))
            db.execute("DELETE FROM usage WHERE session_id = ?", (m,))
            db.execute("DELETE FROM messages WHERE session_id = ?", (m,))
            db.execute("DELETE FROM sessions WHERE id = ?", (m,))
            db.execute("INSERT OR REPLACE INTO tombstones (id, deleted_seq) VALUES (?, ?)", (m, seq))

    def _erased(self, data: Any, seq: int) -> None:
        """The log's erase record: the rows of the sessions it names go (their events are stubs
        now, so a build from the start never makes them), and their messages' indexed values go to
        ``fts_pending`` so the search index drops their documents. The connection deletes
        securely (SQLite overwrites what it frees)."""
        names = data.get("sessions") if isinstance(data, dict) else None
        db = self.db
        db.execute("PRAGMA secure_delete = ON")
        # The search index's segments and the WAL may still hold the words these deletions
        # leave: the file is due for a purge (a build from the log) unless it was built after
        # this record (``rebuilt_at``, see projections.heal).
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('erase_applied', ?)", (seq,))
        for sid in names if isinstance(names, list) else []:
            if not isinstance(sid, str):
                continue
            # The search index needs what it was given to let the documents go (see _deleted);
            # the pending rows are purged by the same catch-up's index sync.
            db.execute("INSERT OR REPLACE INTO fts_pending (id, seq, content, tool_name, tool_calls) "
                       "SELECT id, ?, content, tool_name, tool_calls FROM messages WHERE session_id = ?", (seq, sid))
            db.execute("DELETE FROM reactions WHERE session_id = ?", (sid,))
            db.execute("DELETE FROM usage WHERE session_id = ?", (sid,))
            db.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
            db.execute("DELETE FROM sessions WHERE id = ?", (sid,))
            db.execute("INSERT OR REPLACE INTO tombstones (id, deleted_seq) VALUES (?, ?)", (sid, seq))

    def _rewound(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        mid = as_int(data.get("message_id"))
        if not self._settled_live(sid, keep_cache=False) or mid is None:
            return
        target = self.db.execute("SELECT active FROM messages WHERE id = ? AND session_id = ?", (mid, sid)).fetchone()
        if target is None or not target[0]:
            return
        n, calls = self.db.execute(
            "SELECT count(*), coalesce(sum(n_tool_calls), 0) FROM messages "
            "WHERE session_id = ? AND id >= ? AND active = 1", (sid, mid)).fetchone()
        self.db.execute("UPDATE messages SET active = 0 WHERE session_id = ? AND id >= ? AND active = 1", (sid, mid))
        self.db.execute("UPDATE sessions SET message_count = message_count - ?, "
                        "tool_call_count = tool_call_count - ? WHERE id = ?", (n, calls, sid))

    def _reaction_set(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if self._settled_live(sid):
            self._react(sid, seq, data, as_str(data.get("emoji")), setting=True)

    def _reaction_removed(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if self._settled_live(sid):
            self._react(sid, seq, data, None, setting=False)

    def _react(self, sid: str, seq: int, data: dict[str, Any], emoji: str | None, *, setting: bool) -> None:
        mid = as_int(data.get("message_id"))
        author = as_str(data.get("author"))
        if mid is None or author is None:
            return
        if self.db.execute("SELECT 1 FROM messages WHERE id = ? AND session_id = ?", (mid, sid)).fetchone() is None:
            return
        current = self.db.execute("SELECT emoji FROM reactions WHERE message_id = ? AND author = ?",
                                  (mid, author)).fetchone()
        if setting:
            if emoji is None:
                return
            if current is not None and current[0] == emoji:
                self.db.execute("DELETE FROM reactions WHERE message_id = ? AND author = ?", (mid, author))
            else:
                self.db.execute("INSERT OR REPLACE INTO reactions (message_id, author, emoji, set_seq, seen, "
                                "session_id) VALUES (?, ?, ?, ?, 0, ?)", (mid, author, emoji, seq, sid))
        elif current is not None:
            self.db.execute("DELETE FROM reactions WHERE message_id = ? AND author = ?", (mid, author))

    def _reactions_seen(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        up_to = as_int(data.get("up_to"))
        if self._settled_live(sid) and up_to is not None:
            self.db.execute("UPDATE reactions SET seen = 1 WHERE session_id = ? AND set_seq <= ?", (sid, up_to))

    # ---- lineage (the walk is rules.lineage; links are looked up among live sessions) ------------

    def _parent(self, sid: str) -> str | None:
        return live_parent(self.db, sid)

    def _children(self, sid: str) -> list[str]:
        return live_children(self.db, sid)

    def _root(self, sid: str) -> str:
        return lineage_root(sid, self._parent)

    def _lineage(self, sid: str) -> list[str]:
        return lineage(sid, self._parent, self._children)


def live_parent(db: sqlite3.Connection, sid: str) -> str | None:
    """The live parent of a session in ``db``'s state tables, or None."""
    row = db.execute("SELECT p.id FROM sessions s JOIN sessions p ON p.id = s.parent_session_id WHERE s.id = ?",
                     (sid,)).fetchone()
    return None if row is None else str(row[0])


def live_children(db: sqlite3.Connection, sid: str) -> list[str]:
    """The live sessions whose parent is ``sid`` (a session naming itself excluded)."""
    return [r[0] for r in db.execute("SELECT id FROM sessions WHERE parent_session_id = ? AND id != ?", (sid, sid))]


def lineage_of(db: sqlite3.Connection, sid: str) -> list[str]:
    """:func:`eventlog.sessions.rules.lineage` over ``db``'s state tables ([] for a session that is not live)."""
    if db.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None:
        return []
    return lineage(sid, lambda s: live_parent(db, s), lambda s: live_children(db, s))


def _flag_handler(flag: str, value: bool) -> Handler:
    def apply(applier: Applier, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        applier._flagged(sid, flag, value)

    return Handler(1, apply)


HANDLERS: dict[str, Handler] = {
    "session.created": Handler(1, Applier._created),
    "session.ended": Handler(1, Applier._session_ended),
    "session.reopened": Handler(1, Applier._reopened),
    "session.titled": Handler(1, Applier._retitled),
    **{kind: _flag_handler(flag, value) for kind, (flag, value) in FLAG_EVENTS.items()},
    "session.meta_updated": Handler(1, Applier._meta_updated),
    "session.deleted": Handler(1, Applier._deleted),
    "message.appended": Handler(2, Applier._appended),
    "message.reaction_set": Handler(1, Applier._reaction_set),
    "message.reaction_removed": Handler(1, Applier._reaction_removed),
    "reactions.seen": Handler(1, Applier._reactions_seen),
    "messages.rewound": Handler(1, Applier._rewound),
    "usage.recorded": Handler(1, Applier._usage_recorded),
}
"""The applier's dispatch table, the SQL twin of :data:`eventlog.sessions.fold.HANDLERS` (a plain
mapping: a new type adds an entry to both, or the missing side fails at import).
``message.appended`` and ``usage.recorded`` buffer their rows (see the module docstring); every
other handler flushes first."""
check_handlers("the projections' applier (projections.apply.HANDLERS)", HANDLERS)

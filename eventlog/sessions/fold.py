"""The reference fold: session events in, read models out — the executable form of docs/EVENTS.md.

:class:`Fold` is pure and in memory. The SQLite projection must answer every query exactly as
the fold does for the same events (search: the same set of message ids). The fold never raises
on odd stored data: a value of the wrong type reads as unknown (null), see EVENTS.md "Decisions".
"""
from __future__ import annotations

import logging
from copy import deepcopy as _copy
from typing import Any, Iterable

import orjson

from eventlog.sessions import events
from eventlog.sessions.events import Handler
from eventlog.sessions.reads import typed_read
from eventlog.sessions.rules import (
    COSTS,
    CREATED_TEXT,
    DEFAULT_SOURCE,
    FLAG_EVENTS,
    FLAGS,
    INHERITED,
    MAX_COST,
    META_TEXT,
    TOKENS,
    OddValues,
    as_int,
    as_number,
    as_str,
    as_time,
    event_time,
    json_text,
    normalize_title,
    outranked,
    title_claim,
    workspace_scope,
)
from eventlog.sessions.rules import descendants as _descendants
from eventlog.sessions.rules import lineage as _lineage
from eventlog.sessions.rules import lineage_root as _lineage_root

_log = logging.getLogger("eventlog.sessions")

SESSION_KEYS = (
    "id", "source", "model", "model_config", "title", "title_source", "started_at", "ended_at",
    "end_reason", "message_count", "tool_call_count", *TOKENS, *COSTS, "cwd", "git_repo_root",
    "git_branch", "parent_session_id", "user_id", "chat_id", "chat_type", "thread_id", "tool_names",
    *FLAGS, "last_activity_at",
)
MESSAGE_KEYS = (
    "id", "session_id", "role", "content", "tool_calls", "tool_name", "tool_call_id", "timestamp",
    "token_count", "finish_reason", "reasoning", "reasoning_details", "display_kind",
    "display_metadata", "active",
)
USAGE_KEYS = ("session_id", "model", "provider", "task", *TOKENS, *COSTS, "records")
REACTION_KEYS = ("message_id", "author", "emoji", "set_seq", "seen")


def _json(v: Any, *kinds: type) -> Any:
    """A fresh copy of a stored JSON list/object (as orjson stores it), or null."""
    text = json_text(v, *kinds)
    return None if text is None else orjson.loads(text)


# ---- search text: what a query word is matched against ----------------------------------

def content_text(content: Any) -> str:
    """Text of a message's content: the string itself, or the string values of a list/object
    in document order joined by newlines (keys excluded)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    stack = [content]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return "\n".join(parts)


def tool_calls_text(tool_calls: Any) -> str:
    """``orjson.dumps(tool_calls)`` as text, or "" when there are none."""
    if not tool_calls:
        return ""
    try:
        return orjson.dumps(tool_calls).decode()
    except TypeError:
        return ""


def search_text(message: dict[str, Any]) -> str:
    """The searchable text of a message: content text, tool name and tool-calls JSON."""
    return "\n".join((content_text(message.get("content")), as_str(message.get("tool_name")) or "",
                      tool_calls_text(message.get("tool_calls"))))


def search_terms(query: Any) -> list[str]:
    """The whitespace-separated words of ``query``, lower-cased, punctuation kept exactly as
    typed (``C++`` is the term ``c++``, ``"x"`` the term ``"x"``). A message matches when it
    contains every term."""
    if not isinstance(query, str):
        return []
    return [word.lower() for word in query.split()]


ERASED = "log.erased"
"""The log's own erase record (eventlog.log.codec.ERASED_TYPE)."""


class Fold:
    """Applies upcast session events in log order and answers the read-model queries.

    ``seq`` is the seq of the last applied envelope (0 before any). Every query returns
    fresh dicts and lists that the caller may change.
    """

    def __init__(self, *, warn: bool = False) -> None:
        self.seq = 0
        self.warn = warn
        """Warn about each value a query will show as unknown (:class:`OddValues`); a store that
        reads through the fold asks for it, a comparison (doctor --deep) does not."""
        self.odd = OddValues(_log)
        self._sessions: dict[str, dict[str, Any]] = {}  # live sessions only
        self._ever: set[str] = set()
        self._ended: set[str] = set()
        self._titles: dict[str, str] = {}  # title -> live holder
        self._messages: dict[int, dict[str, Any]] = {}
        self._session_messages: dict[str, list[int]] = {}
        self._reactions: dict[int, dict[str, dict[str, Any]]] = {}  # message -> author -> row
        self._usage: dict[str, dict[tuple[Any, Any, Any], dict[str, Any]]] = {}

    # ---- applying ---------------------------------------------------------------------

    def apply_all(self, envelopes: Iterable[dict[str, Any]]) -> None:
        for envelope in envelopes:
            self.apply(envelope)

    def apply(self, envelope: dict[str, Any]) -> None:
        """Fold one envelope through :data:`HANDLERS`. Types this program does not know (a newer
        program's, an extension's), a non-string session, a non-integer seq and events for
        sessions that are not live are ignored; never raises on odd data."""
        if not isinstance(envelope, dict):
            return
        env = events.upcast(envelope)
        seq, sid, kind = as_int(env.get("seq"), 1), env.get("session"), env.get("type")
        if seq is None:
            return
        self.seq = seq
        if env.get("erased") is True and "data" not in env:
            return  # an erased event: its content is gone, as if it had never been appended
        if kind == ERASED:
            self._erased(env.get("data"))
            return
        if not isinstance(sid, str) or not isinstance(kind, str):
            return
        handler = HANDLERS.get(kind)
        if handler is None:
            return
        data = env.get("data")
        handler.apply(self, sid, seq, data if isinstance(data, dict) else {}, event_time(env.get("ts")))

    def _erased(self, data: Any) -> None:
        """The log's erase record: the sessions it names vanish (their events are stubs now, so a
        fold from the start never sees them either), and their ids stay taken, as the
        projection's tombstones keep them: a later creation of one (only a restored whole chain
        can hold it) is ignored by both."""
        names = data.get("sessions") if isinstance(data, dict) else None
        for sid in names if isinstance(names, list) else []:
            if isinstance(sid, str):
                if sid in self._sessions:
                    self._forget(sid)
                self._ever.add(sid)

    # One method per event type: (session, seq, data, event time). All but _created apply
    # only to a live session.

    def _created(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if sid in self._ever:
            return
        self._ever.add(sid)
        row: dict[str, Any] = dict.fromkeys(SESSION_KEYS)
        row.update({key: as_str(data.get(key)) for key in CREATED_TEXT})
        row.update(dict.fromkeys(("message_count", "tool_call_count", *TOKENS), 0))
        row.update(dict.fromkeys(FLAGS, False), id=sid, model_config=_json(data.get("model_config"), dict))
        self._odd(sid, seq, data, (*CREATED_TEXT, "title"), {"model_config": row["model_config"]})
        row["started_at"] = row["last_activity_at"] = as_time(data.get("started_at"), now)
        if self.warn and row["started_at"] is None and data.get("started_at") is not None:
            self.odd.add(sid, seq, "started_at", data.get("started_at"))
        parent = row["parent_session_id"]
        if parent is not None and parent in self._sessions:
            for key in INHERITED:
                if row[key] is None:
                    row[key] = self._sessions[parent][key]
            root = self._sessions[self._root(parent)]
            row.update({flag: root[flag] for flag in FLAGS})
        self._sessions[sid] = row
        self._session_messages[sid] = []
        self._usage[sid] = {}
        if "title" in data:
            self._titled(row, data.get("title"), data.get("title_source"))

    def _odd(self, sid: str, seq: int, data: dict[str, Any], texts: Any, read: dict[str, Any] | None = None) -> None:
        """Warnings for values of the wrong type (:class:`OddValues`), as the SQL applier gives."""
        if self.warn:
            self.odd.texts(sid, seq, data, texts)
            self.odd.unread(sid, seq, data, read or {})

    def _flagged(self, sid: str, seq: int, data: dict[str, Any], now: float | None, flag: str, value: bool) -> None:
        for member in self.lineage(sid):
            self._sessions[member][flag] = value

    def _retitled(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        row = self._sessions.get(sid)
        if row is not None:
            self._odd(sid, seq, data, ("title",))
            self._titled(row, data.get("title"), data.get("source"))

    def _titled(self, row: dict[str, Any], title: Any, source: Any) -> None:
        claim = title_claim(title, source)
        if claim is None:
            return
        title, source = claim
        holder = self._titles.get(title)
        if (holder is not None and holder != row["id"]) or outranked(row["title_source"], source):
            return
        if row["title"] is not None and self._titles.get(row["title"]) == row["id"]:
            del self._titles[row["title"]]
        row["title"], row["title_source"] = title, source
        self._titles[title] = row["id"]

    def _session_ended(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        row = self._sessions.get(sid)
        if row is not None and sid not in self._ended:
            self._ended.add(sid)
            row["ended_at"] = as_time(data.get("ended_at"), now)
            row["end_reason"] = as_str(data.get("reason"))
            if self.warn and row["ended_at"] is None and data.get("ended_at") is not None:
                self.odd.add(sid, seq, "ended_at", data.get("ended_at"))

    def _reopened(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        row = self._sessions.get(sid)
        if row is not None:
            self._ended.discard(sid)
            row["ended_at"] = row["end_reason"] = None

    def _meta_updated(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        row = self._sessions.get(sid)
        if row is None:
            return
        for key in META_TEXT:
            if key in data:
                row[key] = as_str(data[key])
        if "model_config" in data:
            row["model_config"] = _json(data["model_config"], dict)
        self._odd(sid, seq, data, META_TEXT, {"model_config": row["model_config"]} if "model_config" in data else {})
        if "tool_names" in data:
            names = data["tool_names"]
            row["tool_names"] = [n for n in names if isinstance(n, str)] if isinstance(names, list) else None

    def _deleted(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        if sid in self._sessions:
            children = self._children()
            for member in [sid, *_descendants(sid, lambda s: children.get(s, ()))]:
                self._forget(member)

    def _appended(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        row = self._sessions.get(sid)
        if row is None or seq in self._messages:
            return
        content = data.get("content")
        msg = {
            "id": seq, "session_id": sid, "role": as_str(data.get("role")),
            "content": content if isinstance(content, str) else _json(content, list, dict),
            "tool_calls": _json(data.get("tool_calls"), list),
            "tool_name": as_str(data.get("tool_name")), "tool_call_id": as_str(data.get("tool_call_id")),
            "timestamp": as_time(data.get("timestamp"), now),
            "token_count": as_int(data.get("token_count"), 0),
            "finish_reason": as_str(data.get("finish_reason")), "reasoning": as_str(data.get("reasoning")),
            "reasoning_details": _json(data.get("reasoning_details"), list, dict),
            "display_kind": as_str(data.get("display_kind")),
            "display_metadata": _json(data.get("display_metadata"), dict), "active": True,
        }
        if self.warn:
            self._odd(sid, seq, data, ("role", "tool_name", "tool_call_id", "finish_reason", "reasoning",
                                       "display_kind"),
                      {name: msg[name] for name in ("content", "tool_calls", "reasoning_details", "display_metadata")})
            for name in ("timestamp", "token_count"):
                if msg[name] is None and data.get(name) is not None:
                    self.odd.add(sid, seq, name, data.get(name))
        self._messages[seq] = msg
        self._session_messages[sid].append(seq)
        row["message_count"] += 1
        row["tool_call_count"] += len(msg["tool_calls"] or [])
        stamp, last = msg["timestamp"], row["last_activity_at"]
        if stamp is not None and (last is None or stamp > last):
            row["last_activity_at"] = stamp

    def _rewound(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        row = self._sessions.get(sid)
        target = self._message_of(sid, data.get("message_id")) if row is not None else None
        if row is None or target is None or not target["active"]:
            return
        for mid in self._session_messages[sid]:
            msg = self._messages[mid]
            if mid >= target["id"] and msg["active"]:
                msg["active"] = False
                row["message_count"] -= 1
                row["tool_call_count"] -= len(msg["tool_calls"] or [])

    def _reaction_set(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        emoji = as_str(data.get("emoji"))
        if emoji is not None:
            self._react(sid, seq, data, emoji)

    def _reaction_removed(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        self._react(sid, seq, data, None)

    def _react(self, sid: str, seq: int, data: dict[str, Any], emoji: str | None) -> None:
        target = self._message_of(sid, data.get("message_id")) if sid in self._sessions else None
        author = as_str(data.get("author"))
        if target is None or author is None:
            return
        mine = self._reactions.setdefault(target["id"], {})
        current = mine.pop(author, None)  # removed, and retracted when the emoji is the same
        if emoji is not None and (current is None or current["emoji"] != emoji):
            mine[author] = {"emoji": emoji, "set_seq": seq, "seen": False}

    def _reactions_seen(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        up_to = as_int(data.get("up_to"))
        if sid not in self._sessions or up_to is None:
            return
        for mid in self._session_messages[sid]:
            for reaction in self._reactions.get(mid, {}).values():
                if reaction["set_seq"] <= up_to:
                    reaction["seen"] = True

    def _usage_recorded(self, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        row = self._sessions.get(sid)
        if row is None:
            return
        key = (as_str(data.get("model")), as_str(data.get("provider")), as_str(data.get("task")))
        usage = self._usage[sid].get(key)
        if usage is None:
            usage = dict(zip(("session_id", "model", "provider", "task"), (sid, *key)))
            usage.update(dict.fromkeys(TOKENS, 0), **dict.fromkeys(COSTS), records=0)
            self._usage[sid][key] = usage
        usage["records"] += 1
        if self.warn:
            for name in TOKENS:
                if data.get(name) is not None and as_int(data.get(name), 0) is None:
                    self.odd.add(sid, seq, name, data.get(name))
            for name in COSTS:
                if data.get(name) is not None and as_number(data.get(name), 0.0, MAX_COST) is None:
                    self.odd.add(sid, seq, name, data.get(name))
        for target in (row, usage):
            for name in TOKENS:
                target[name] += as_int(data.get(name), 0) or 0
            for name in COSTS:
                cost = as_number(data.get(name), 0.0, MAX_COST)
                if cost is not None:
                    target[name] = (target[name] or 0.0) + cost

    def _forget(self, sid: str) -> None:
        row = self._sessions.pop(sid)
        if row["title"] is not None and self._titles.get(row["title"]) == sid:
            del self._titles[row["title"]]
        for mid in self._session_messages.pop(sid):
            self._messages.pop(mid, None)
            self._reactions.pop(mid, None)
        self._usage.pop(sid, None)
        self._ended.discard(sid)

    # ---- lineage (the walk is rules.lineage; links are looked up among live sessions) --------

    def _parent(self, sid: str) -> str | None:
        parent: str | None = self._sessions[sid]["parent_session_id"]
        return parent if parent in self._sessions else None

    def _root(self, sid: str) -> str:
        return _lineage_root(sid, self._parent)

    def _children(self) -> dict[str, list[str]]:
        children: dict[str, list[str]] = {}
        for child, row in self._sessions.items():
            parent = row["parent_session_id"]
            if parent in self._sessions and parent != child:
                children.setdefault(parent, []).append(child)
        return children

    def lineage(self, session_id: str) -> list[str]:
        """Live members of the session's lineage: the root first, then its descendants by id."""
        if not isinstance(session_id, str) or session_id not in self._sessions:
            return []
        children = self._children()
        return _lineage(session_id, self._parent, lambda s: children.get(s, ()))

    # ---- helpers for writers -------------------------------------------------------------

    def is_live(self, session_id: str) -> bool:
        return isinstance(session_id, str) and session_id in self._sessions

    def title_holder(self, title: str) -> str | None:
        """The live session holding ``title`` (compared after normalize_title), if any."""
        return self._titles.get(normalize_title(title)) if isinstance(title, str) else None

    def titles(self) -> set[str]:
        """Every title held by a live session."""
        return set(self._titles)

    def message_session(self, message_id: int) -> str | None:
        """The live session a message belongs to (active or not), or None."""
        msg = self._messages.get(message_id) if as_int(message_id) is not None else None
        return msg["session_id"] if msg else None

    def current_reaction(self, message_id: int, author: str) -> str | None:
        if as_int(message_id) is None or not isinstance(author, str):
            return None
        reaction = self._reactions.get(message_id, {}).get(author)
        return reaction["emoji"] if reaction else None

    def _message_of(self, sid: str, message_id: Any) -> dict[str, Any] | None:
        mid = as_int(message_id)
        msg = self._messages.get(mid) if mid is not None else None
        return msg if msg is not None and msg["session_id"] == sid else None

    # ---- queries ----------------------------------------------------------------------------

    # Every read checks its call against its signature (eventlog.sessions.reads.typed_read).

    @typed_read
    def get_session(self, session_id: str) -> dict[str, Any] | None:
        row = self._sessions.get(session_id)
        return _copy(row) if row else None

    @typed_read
    def list_sessions(self, *, source: str | None = None, archived: bool | None = False,
                      pinned: bool | None = None, hidden: bool | None = False, children: bool = True,
                      workspace: str | None = None, limit: int | None = 50,
                      offset: int = 0) -> list[dict[str, Any]]:
        """Sessions matching every filter, by last activity (null last) then id, both descending;
        the page ``[offset:offset+limit]`` (``limit=None``: all), then the matching pinned sessions
        outside the page, in the same order."""
        def matches(row: dict[str, Any]) -> bool:
            for flag, wanted in zip(FLAGS, (archived, pinned, hidden)):
                if wanted is not None and row[flag] != bool(wanted):
                    return False
            if source is not None and (row["source"] if row["source"] is not None else DEFAULT_SOURCE) != source:
                return False
            if not children and row["parent_session_id"] is not None:
                return False
            if workspace is not None:
                path, under = workspace_scope(workspace)
                return any(p is not None and (p == path or p.startswith(under))
                           for p in (row["git_repo_root"], row["cwd"]))
            return True

        rows = sorted((r for r in self._sessions.values() if matches(r)), key=lambda r: r["id"], reverse=True)
        rows.sort(key=lambda r: (r["last_activity_at"] is None, -(r["last_activity_at"] or 0.0)))
        end = None if limit is None else offset + limit
        page = rows[offset:end]
        shown = {r["id"] for r in page}
        page += [r for r in rows if r["pinned"] and r["id"] not in shown]
        return [_copy(r) for r in page]

    @typed_read
    def get_messages(self, session_id: str, *, include_inactive: bool = False, limit: int | None = None,
                     before: int | None = None, after: int | None = None,
                     newest_first: bool = False) -> list[dict[str, Any]]:
        """The session's messages (active only unless asked) with ``after < id < before``, in
        chronological order (newest first if asked). With ``limit``: the first ``limit`` of them
        when paging forward (``after`` given, ``before`` not), else the latest ``limit``."""
        if not self.is_live(session_id):
            return []
        out = [self._messages[m] for m in sorted(self._session_messages[session_id])
               if (include_inactive or self._messages[m]["active"]) and (after is None or m > after)
               and (before is None or m < before)]
        if limit is not None:
            out = out[:limit] if after is not None and before is None else out[len(out) - min(limit, len(out)):]
        if newest_first:
            out.reverse()
        return [_copy(m) for m in out]

    @typed_read
    def get_usage(self, session_id: str) -> list[dict[str, Any]]:
        """Usage rows of a live session ordered by (model, provider, task), nulls first."""
        rows = self._usage.get(session_id, {}) if self.is_live(session_id) else {}
        order = sorted(rows, key=lambda k: tuple((part is not None, part or "") for part in k))
        return [dict(rows[k]) for k in order]

    @typed_read
    def get_reactions(self, message_id: int) -> list[dict[str, Any]]:
        """Current reactions on a message of a live session, by author."""
        if self.message_session(message_id) is None:
            return []
        return [self._reaction(message_id, a) for a in sorted(self._reactions.get(message_id, {}))]

    def unseen_reactions(self, session_id: str) -> list[dict[str, Any]]:
        """The session's reactions not yet seen, by (message_id, author)."""
        if not self.is_live(session_id):
            return []
        return [self._reaction(m, a) for m in sorted(self._session_messages[session_id])
                for a in sorted(self._reactions.get(m, {})) if not self._reactions[m][a]["seen"]]

    def _reaction(self, message_id: int, author: str) -> dict[str, Any]:
        return {"message_id": message_id, "author": author, **self._reactions[message_id][author]}

    @typed_read
    def search(self, query: str, *, role: str | None = None, source: str | None = None,
               session_id: str | None = None, limit: int | None = 20) -> list[dict[str, Any]]:
        """Active messages of live, non-hidden sessions containing every term of ``query``
        (case-insensitive substring of :func:`search_text`), by id descending, at most ``limit``."""
        terms = search_terms(query)
        found: list[dict[str, Any]] = []
        if not terms:
            return found
        for mid in sorted(self._messages, reverse=True):
            if limit is not None and len(found) >= limit:
                break
            msg = self._messages[mid]
            row = self._sessions[msg["session_id"]]
            if not msg["active"] or row["hidden"]:
                continue
            if (role is not None and msg["role"] != role) or (session_id is not None and row["id"] != session_id):
                continue
            if source is not None and (row["source"] if row["source"] is not None else DEFAULT_SOURCE) != source:
                continue
            text = search_text(msg).lower()
            if all(term in text for term in terms):
                found.append(_copy(msg))
        return found

    @typed_read
    def stats(self) -> dict[str, Any]:
        """Totals over live root sessions: no parent, a parent that is not live, or itself."""
        roots = [row for s, row in sorted(self._sessions.items())
                 if row["parent_session_id"] in (None, s) or row["parent_session_id"] not in self._sessions]
        out: dict[str, Any] = {"sessions": len(roots), "messages": 0, "by_source": {}}
        out.update(dict.fromkeys(TOKENS, 0), **dict.fromkeys(COSTS))
        for row in roots:
            bucket = out["by_source"].setdefault(row["source"] if row["source"] is not None else DEFAULT_SOURCE,
                                                 {"sessions": 0, "messages": 0})
            bucket["sessions"] += 1
            bucket["messages"] += row["message_count"]
            out["messages"] += row["message_count"]
            for name in TOKENS:
                out[name] += row[name]
            for name in COSTS:
                if row[name] is not None:
                    out[name] = (out[name] or 0.0) + row[name]
        return out



def _flag_handler(flag: str, value: bool) -> Handler:
    def apply(fold: Fold, sid: str, seq: int, data: dict[str, Any], now: float | None) -> None:
        fold._flagged(sid, seq, data, now, flag, value)

    return Handler(1, apply)


HANDLERS: dict[str, Handler] = {
    "session.created": Handler(1, Fold._created),
    "session.ended": Handler(1, Fold._session_ended),
    "session.reopened": Handler(1, Fold._reopened),
    "session.titled": Handler(1, Fold._retitled),
    **{kind: _flag_handler(flag, value) for kind, (flag, value) in FLAG_EVENTS.items()},
    "session.meta_updated": Handler(1, Fold._meta_updated),
    "session.deleted": Handler(1, Fold._deleted),
    "message.appended": Handler(2, Fold._appended),
    "message.reaction_set": Handler(1, Fold._reaction_set),
    "message.reaction_removed": Handler(1, Fold._reaction_removed),
    "reactions.seen": Handler(1, Fold._reactions_seen),
    "messages.rewound": Handler(1, Fold._rewound),
    "usage.recorded": Handler(1, Fold._usage_recorded),
}
"""The fold's dispatch table: event type -> how it is folded (a plain mapping: a new type adds
an entry here and in the projections' applier, or both fail at import)."""
events.check_handlers("the reference fold (eventlog.sessions.fold.HANDLERS)", HANDLERS)

__all__ = ["Fold", "HANDLERS", "SESSION_KEYS", "MESSAGE_KEYS", "USAGE_KEYS", "REACTION_KEYS",
           "content_text", "tool_calls_text", "search_text", "search_terms"]

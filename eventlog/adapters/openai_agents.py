"""OpenAI Agents SDK memory on eventlog: :class:`EventlogSession` (the SDK's ``Session`` protocol).

Needs eventlog's ``[openai-agents]`` extra (``pip install -e '.[openai-agents]'`` in its clone). ::

    session = EventlogSession("chat-42")            # profile "default" under $EVENTLOG_HOME
    result = await Runner.run(agent, "Hi", session=session)

Storage: every item is one ``message.appended`` event of the session, so ``eventlog sessions``,
``search``, ``stats``, ``export`` and ``log verify`` see agent conversations like any other.
An item keeps its exact JSON: its main payload (``content``, else ``output``, ``arguments`` or
``summary``: the first that is a string, list or object) becomes the message's content (what
search and transcripts show) and the rest of the item is kept in ``display_metadata``
(``{"item": rest, "content_key": key}``); ``display_kind`` is ``openai_agents:<type>``.
The log keeps canonical JSON (object keys sorted), so the order of the keys of every object
in the item that were not sorted already is kept too, as a permutation of its sorted keys
(``"key_order": [[path, permutation], ...]``): items come back in the SDK's own key order.
Roles: user/assistant/system/tool as given, ``developer`` -> system, items of a ``*_output``
type -> tool, other items without a role (function calls, reasoning, ...) -> assistant. The
item read back is always rebuilt from the stored item, never from the role.

``pop_item`` and ``clear_session`` are rewinds (``messages.rewound``): the items leave the
session's history but stay in the log for audit. Concurrent pops each take a different item
(``expected_version`` on the session's stream, retried on conflict).

Session ids: any string up to 65,536 characters (see :mod:`eventlog.adapters._ids`): an id
that is a valid eventlog id is used as is; any other (empty, NUL, spaces, too long, ...) maps
to ``h-<sha256>`` and the original is kept in the session's ``model_config`` as
``{"openai_agents": {"session_id": original}}``; :func:`session_key` gives the mapping.

Bad input: an item that is not a JSON object of finite JSON values (NaN, a non-string key, an
object) raises :class:`eventlog.errors.ValidationError` naming ``items[i]...``; an item whose
main text exceeds 8 MiB raises ValidationError, one whose event exceeds 16 MiB raises
:class:`eventlog.errors.EventTooLargeError`. Nothing of a refused ``add_items`` call is stored
(one call is one atomic batch). A session used after :meth:`EventlogSession.close` raises
:class:`eventlog.errors.ClosedError`; calls running when it closes complete first.

Reads come from the session's stream in the log, never from the projections (see
:meth:`EventlogSession._refresh`), so they neither wait for another process's rebuild nor
trust projections that lag the log.

``wrapper=``: every method accepts the SDK's run-context wrapper and ignores it (the history
is the same in every context scope).
"""
from __future__ import annotations

import asyncio
import bisect
import os
import re
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterable, TypeVar

import orjson

from eventlog.adapters import missing_extra

try:
    from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
except ModuleNotFoundError as e:
    missing_extra(e, "openai-agents", ("agents", "openai"))

from eventlog.adapters import _shared
from eventlog.adapters._ids import incarnation_id, map_id
from eventlog.errors import (
    ClosedError,
    ConcurrencyError,
    ConflictError,
    EventTooLargeError,
    NotFoundError,
    ValidationError,
)
from eventlog.log import Log
from eventlog.log.codec import MAX_DEPTH, MAX_EVENT_BYTES
from eventlog.profiles import DEFAULT_PROFILE, validate_profile
from eventlog.sessions import events
from eventlog.sessions.rules import as_int, as_str
from eventlog.sessions.store import SessionStore

__all__ = ["EventlogSession", "session_key", "item_to_message", "message_to_item"]

SOURCE = "openai-agents"
KIND_PREFIX = "openai_agents:"
_PAYLOAD_KEYS = ("content", "output", "arguments", "summary")
_ENVELOPE_ROOM = 1024  # type, session, seq, ts, hashes and the tool fields around the item
_T = TypeVar("_T")


MOVE_ON_TRIES = 5
"""How many incarnations one ``add_items`` follows when each refuses it (each was erased meanwhile)."""


def session_key(session_id: str) -> str:
    """The eventlog session id that stores the SDK session ``session_id``."""
    return map_id(session_id, field="session_id", domain="openai_agents")[0]


def _role(item: dict[str, Any]) -> str:
    role = item.get("role")
    if role in ("user", "assistant", "system", "tool"):
        return str(role)
    if role == "developer":
        return "system"
    kind = item.get("type")
    if isinstance(kind, str) and kind.endswith("_output"):
        return "tool"
    return "user" if role is not None else "assistant"


def _short(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= 1024 else None


def _key_orders(value: Any, path: list[Any], out: list[list[Any]]) -> list[list[Any]]:
    """``[path, permutation]`` for each object in ``value`` whose keys are not in sorted order
    (the log keeps canonical JSON, whose objects come back sorted): the permutation lists, for
    each key in the caller's order, its place among the sorted keys. Not past the log's depth
    limit (an item nested deeper, or holding itself, is the store's to refuse: ValidationError)."""
    if len(path) > MAX_DEPTH:
        return out
    if isinstance(value, dict):
        keys = list(value)
        if not all(type(k) is str for k in keys):
            return out  # not JSON: the store's validator refuses it, naming the field
        ordered = sorted(keys)
        if keys != ordered:
            place = {k: i for i, k in enumerate(ordered)}
            out.append([list(path), [place[k] for k in keys]])
        children: Any = value.items()
    elif isinstance(value, (list, tuple)):  # a tuple is stored as a JSON list
        children = enumerate(value)
    else:
        return out
    for k, v in children:
        if isinstance(v, (dict, list, tuple)):
            path.append(k)
            _key_orders(v, path, out)
            path.pop()
    return out


def _restore_order(item: dict[str, Any], orders: Any) -> dict[str, Any]:
    """``item`` with each recorded object's keys back in the order :func:`_key_orders` saw
    (an entry that no longer fits the item is skipped: the item stays equal either way)."""
    if not isinstance(orders, list):
        return item
    root: Any = item
    for entry in orders:
        try:
            path, perm = entry
            parent, target = None, root
            for step in path:
                parent, target = target, target[step]
            if not isinstance(target, dict):
                continue
            ordered = sorted(target)
            if sorted(perm) != list(range(len(ordered))):
                continue
            again = {ordered[i]: target[ordered[i]] for i in perm}
        except (TypeError, KeyError, IndexError, ValueError):
            continue
        if parent is None:
            root = again
        else:
            parent[path[-1]] = again
    return dict(root)


def item_to_message(item: Any, index: int = 0) -> dict[str, Any]:
    """The ``append_messages`` fields that store one SDK item (see the module docstring)."""
    if not isinstance(item, dict):
        raise ValidationError(f"items[{index}]", f"must be a dict (an input item), got {type(item).__name__}")
    kind = item.get("type")
    kind_name = kind if isinstance(kind, str) and kind else ("message" if "role" in item else "item")
    rest = dict(item)
    key = next((k for k in _PAYLOAD_KEYS if isinstance(item.get(k), (str, list, dict))), None)
    content = rest.pop(key) if key is not None else None
    message: dict[str, Any] = {
        "role": _role(item),
        "content": content,
        "display_kind": (KIND_PREFIX + kind_name)[:1024],
        "display_metadata": {"item": rest, "content_key": key},
    }
    orders = _key_orders(item, [], [])
    if orders:
        message["display_metadata"]["key_order"] = orders
    call_id = _short(item.get("call_id"))
    if call_id is not None:
        message["tool_call_id"] = call_id
    if kind_name == "function_call" and _short(item.get("name")) is not None:
        message["tool_name"] = item["name"]
    try:  # measured whole, the copied call id and name included (an outside audit found an item
        # that passed without them and then failed as ValidationError('items[0].data'))
        size = len(orjson.dumps(message))
    except (TypeError, orjson.JSONEncodeError):
        size = 0  # not JSON: the validator names the field
    if size + _ENVELOPE_ROOM > MAX_EVENT_BYTES:
        raise EventTooLargeError(f"items[{index}]", "the item's event would exceed 16 MiB")
    return message


def message_to_item(message: dict[str, Any]) -> dict[str, Any] | None:
    """The SDK item a stored message holds, or None for a message this adapter did not write."""
    meta = message.get("display_metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("item"), dict):
        return None
    kind = message.get("display_kind")
    if not isinstance(kind, str) or not kind.startswith(KIND_PREFIX):
        return None
    item = dict(meta["item"])
    key = meta.get("content_key")
    if isinstance(key, str):
        item[key] = message.get("content")
    item = {k: item[k] for k in sorted(item)}  # as the log has it, the content key in its place
    return _restore_order(item, meta.get("key_order")) if "key_order" in meta else item


_MESSAGE_FIELD = re.compile(r"^(?:messages\[(\d+)\]|events\[(\d+)\]\.data)(?:\.(.*))?$")


def _message_events(key: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``message.appended`` events that ``append_messages`` would write for ``messages``."""
    return [{"type": "message.appended", "session": key, "data": {k: v for k, v in m.items() if v is not None}}
            for m in messages]


def _item_field(field: str, messages: list[dict[str, Any]]) -> str:
    """The store's name for a refused message field (``messages[i].content``,
    ``events[i].data.display_metadata.item.x``) as the path in the caller's item (``items[i]``,
    ``items[i].output``, ``items[i].x``)."""
    m = _MESSAGE_FIELD.match(field)
    if m is None:
        return field
    i = int(m.group(1) or m.group(2))
    rest = m.group(3)
    if rest is None or rest == "display_metadata.item":  # the item's own keys (or the item itself)
        return f"items[{i}]"
    if rest.startswith("display_metadata.item."):
        rest = rest[len("display_metadata.item."):]
    elif rest == "content" or rest.startswith(("content.", "content[")):
        meta = messages[i].get("display_metadata") if i < len(messages) else None
        key = meta.get("content_key") if isinstance(meta, dict) else None
        if isinstance(key, str):
            rest = key + rest[len("content"):]
    return f"items[{i}].{rest}"


class _History:
    """The session's stream as read from the log, folded (immutable: a change makes a new one).

    ``version``: how many events of the stream were folded — the stream as read, never a
    version looked up elsewhere, so an ``expected_version`` taken from it refuses any change
    made since; ``last``: the seq of the last of them; ``mark``: the log's erase mark the read
    was made under (an erase changes no version); ``created``: the stream holds the session's
    creation; ``live``: created and not deleted since; ``parent``: the parent its creation
    names; ``ids``/``items``: the active messages, oldest first, each with its item as JSON
    bytes (None for a message this adapter did not write); ``size``: bytes held, roughly.
    ``floor``: 0 for the whole history; else only its tail was read — the active messages with
    ids above ``floor`` are exactly ``ids``, the ones below are not known."""

    __slots__ = ("version", "last", "mark", "created", "live", "parent", "ids", "items", "size", "floor")

    def __init__(self, version: int, last: int, mark: int | None, created: bool, live: bool, parent: str | None,
                 ids: list[int], items: list[bytes | None], size: int, floor: int = 0) -> None:
        self.version = version
        self.last = last
        self.mark = mark
        self.created = created
        self.live = live
        self.parent = parent
        self.ids = ids
        self.items = items
        self.size = size
        self.floor = floor

    @property
    def gone(self) -> bool:
        """The session existed and was deleted or erased (by its own stream)."""
        return self.created and not self.live

    def holds(self, need: int | None) -> bool:
        """Whether the latest ``need`` items (None: all) are known."""
        if not self.floor or need == 0 or not self.live:
            return True
        if need is None:
            return False
        found = 0
        for raw in reversed(self.items):
            found += raw is not None
            if found >= need:
                return True
        return False

    def better_than(self, other: "_History | None") -> bool:
        """Read further into the stream than ``other`` (or as far, knowing more of it)."""
        return other is None or (self.version, -self.floor) > (other.version, -other.floor)

    def grown(self, added: int, last: int, ids: list[int], items: list[bytes | None]) -> "_History":
        """This history after ``added`` more events of the stream, the last at ``last``, that
        appended the messages ``ids`` (and nothing else that changes the history)."""
        size = self.size + sum(len(b) for b in items if b is not None) + 16 * len(ids)
        return _History(self.version + added, last, self.mark, self.created, self.live, self.parent,
                        self.ids + ids, self.items + items, size, self.floor)

    def rewound(self, seq: int, at: int) -> "_History":
        """This history after its own rewind (appended at ``seq``) from its message ``ids[at]``."""
        size = self.size - sum(16 + len(b or b"") for b in self.items[at:])
        return _History(self.version + 1, seq, self.mark, self.created, self.live, self.parent,
                        self.ids[:at], self.items[:at], size, self.floor)


class _Unknown(Exception):
    """A tail of the stream does not decide the history: a rewind names a message below it
    while messages above it are active (whether they stay so depends on that one), or the
    session's creation is in it. ``floor``: where a read that decides it may begin."""

    def __init__(self, floor: int) -> None:
        super().__init__(floor)
        self.floor = floor


def _stored_item(data: dict[str, Any]) -> bytes | None:
    """The item a stored ``message.appended`` holds, as JSON bytes; its fields read as the
    reference fold reads them (docs/EVENTS.md "Odd stored values": a value of the wrong type
    is null). Values decoded from the log are plain JSON, so they encode again as they are."""
    content = data.get("content")
    meta = data.get("display_metadata")
    return _encoded({"content": content if isinstance(content, (str, list, dict)) else None,
                     "display_kind": as_str(data.get("display_kind")),
                     "display_metadata": meta if isinstance(meta, dict) else None})


def _fold_stream(base: _History | None, envelopes: Iterable[dict[str, Any]], mark: int | None,
                 floor: int = 0) -> _History:
    """``base`` (None: nothing read yet) with the stream's next ``envelopes`` applied, by the
    rules of the reference fold (:class:`eventlog.sessions.fold.Fold`, docs/EVENTS.md) for the
    messages of one session: events before its creation, a second creation and everything
    after its deletion change nothing; a rewind of an active message makes it and every later
    message inactive (inactive ones never come back, so only the active ones are kept); an
    erased event leaves the session gone for good (the store erases whole streams, and the
    log's erase record, which the fold follows, names the session). Checked against the fold
    on generated streams (tests/test_adapter_openai_agents_log.py).

    ``floor`` (with no ``base``): the envelopes are the stream's events after seq ``floor``, and
    the session was live (created, not deleted) at ``floor``; a tail history results, and
    :class:`_Unknown` when the tail does not decide it (see :class:`_History`)."""
    tail = base is None and floor > 0
    if base is None:
        version = last = size = 0
        created = live = tail
        parent: str | None = None
        ids: list[int] = []
        items: list[bytes | None] = []
    else:
        version, last, size, floor = base.version, base.last, base.size, base.floor
        created, live, parent = base.created, base.live, base.parent
        ids, items = list(base.ids), list(base.items)
    for env in envelopes:
        version += 1
        seq = as_int(env.get("seq"), 1)
        if seq is None:
            continue
        last = seq
        kind = env.get("type")
        if env.get("erased") is True and "data" not in env:
            # Erased: a store erases whole streams (and its record names the session), so the
            # session is gone for good — nothing of it is shown, and nothing later revives it.
            created, live, ids, items, size = True, False, [], [], 0
            continue
        if kind == "message.appended":
            if live:
                data = events.upcast(env).get("data")
                raw = _stored_item(data) if isinstance(data, dict) else _stored_item({})
                ids.append(seq)
                items.append(raw)
                size += 16 + (len(raw) if raw is not None else 0)
            continue
        data = env.get("data")
        if not isinstance(data, dict):
            data = {}
        if kind == "messages.rewound" and live:
            target = as_int(data.get("message_id"))
            if target is not None and 0 < target <= floor:
                if ids:
                    raise _Unknown(target - 1)
                continue  # whatever it hides is below the tail
            at = bisect.bisect_left(ids, target) if target is not None else len(ids)
            if at < len(ids) and ids[at] == target:
                size -= sum(16 + (len(b) if b is not None else 0) for b in items[at:])
                del ids[at:], items[at:]
        elif kind == "session.created" and tail:
            raise _Unknown(0)  # created after the floor: what came before it is not the session's
        elif kind == "session.created" and not created:
            created = live = True
            parent = as_str(data.get("parent_session_id"))
        elif kind == "session.deleted" and live:
            live = False
            ids, items, size = [], [], 0
    return _History(version, last, mark, created, live, parent, ids, items, size, floor if live else 0)


TAIL_SPANS = (256, 4096, 65536, 1 << 20)
"""How far back from the log head (in seqs, of every session) the successive reads of a stream's
tail begin, until the tail holds the items asked for (then the whole stream is read)."""


def _encoded(message: dict[str, Any]) -> bytes | None:
    item = message_to_item(message)
    return None if item is None else orjson.dumps(item)


SHARED_HISTORY_BYTES = 64 * 1024 * 1024
"""How many bytes of histories this process keeps between :class:`EventlogSession` objects."""

ENTRY_BYTES = 512
"""What one kept history costs beside its items (the entry, its key, the history object): an
empty history (a cleared session, a gone incarnation) costs that much of the budget too, so the
number of entries stays bounded (it counted 0: one entry for every such session ever seen)."""


class _Histories:
    """The latest history read or written in this process for each (open profile, session), so
    that a new :class:`EventlogSession` object — a server makes one per request — starts from
    it and reads only the stream's events after it. Least recently used out beyond ``budget``
    bytes; everything read under an older erase mark is dropped once a newer one is seen (the
    erased words leave memory with the next read)."""

    def __init__(self, budget: int = SHARED_HISTORY_BYTES) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, str], tuple[weakref.ref[object], _History]] = OrderedDict()
        self._marks: dict[int, tuple[weakref.ref[object], int]] = {}  # per profile: the highest erase mark seen
        self._bytes = 0

    def get(self, profile: object, key: str, mark: int | None) -> _History | None:
        with self._lock:
            self._see_mark(profile, mark)
            found = self._entries.get((id(profile), key))
            if found is None or found[0]() is not profile or found[1].mark != mark:
                return None
            self._entries.move_to_end((id(profile), key))
            return found[1]

    def put(self, profile: object, key: str, h: _History) -> None:
        with self._lock:
            self._see_mark(profile, h.mark)
            k = (id(profile), key)
            old = self._entries.get(k)
            if old is not None and old[0]() is profile and old[1].mark == h.mark and not h.better_than(old[1]):
                return
            self._pop(k)
            if h.size + ENTRY_BYTES > self.budget or (h.mark or 0) < self._mark_of(profile):
                return
            self._entries[k] = (weakref.ref(profile), h)
            self._bytes += h.size + ENTRY_BYTES
            while self._bytes > self.budget:
                self._pop(next(iter(self._entries)))

    def drop(self, profile: object, key: str) -> None:
        with self._lock:
            self._pop((id(profile), key))

    def _mark_of(self, profile: object) -> int:
        found = self._marks.get(id(profile))
        return found[1] if found is not None and found[0]() is profile else 0  # (an id is reused once freed)

    def _see_mark(self, profile: object, mark: int | None) -> None:
        if mark is None or mark <= self._mark_of(profile):
            return
        pid = id(profile)
        self._marks = {p: m for p, m in self._marks.items() if m[0]() is not None}
        self._marks[pid] = (weakref.ref(profile), mark)
        for k, (ref, h) in list(self._entries.items()):
            if k[0] == pid and (ref() is not profile or (h.mark or 0) < mark):
                self._pop(k)

    def _pop(self, k: tuple[int, str]) -> None:
        old = self._entries.pop(k, None)
        if old is not None:
            self._bytes -= old[1].size + ENTRY_BYTES


_HISTORIES = _Histories()


class EventlogSession:
    """An OpenAI Agents SDK session stored in an eventlog profile.

    ``session_id``: any string (see :func:`session_key`). ``home``/``profile``: the store, as
    everywhere in eventlog (``$EVENTLOG_HOME`` or ``~/.eventlog``). ``session_settings``: a
    ``SessionSettings`` or a dict of its fields (``limit``: how many of the latest items
    ``get_items()`` returns when it is given no limit). ``log``: where the profile's events
    live, as for :meth:`SessionStore.open` (a ``postgresql://`` URL, an LMDB log directory or a
    Log object; default ``$EVENTLOG_LOG_URL``, else the LMDB log under ``home``).

    Sessions of one (home, profile, log) share one store in the process, opened on first use and
    closed with the last session. Every method runs its blocking work in a worker thread. The
    history is read from the log itself (the source of truth), never from the projections, so
    no read waits for another process's rebuild nor trusts a projection that lags the log.
    """

    session_settings: SessionSettings | None

    def __init__(self, session_id: str, *, home: str | os.PathLike[str] | None = None, profile: str = DEFAULT_PROFILE,
                 session_settings: SessionSettings | dict[str, Any] | None = None,
                 log: str | os.PathLike[str] | Log | None = None) -> None:
        key, hashed = map_id(session_id, field="session_id", domain="openai_agents")
        validate_profile(profile)
        self._log = _shared.check_log(log)
        self.session_id = session_id
        self.session_settings = (coerce_session_settings(session_settings) if session_settings is not None
                                 else SessionSettings())
        self.key = key
        """The eventlog session id of this session: of its current incarnation (an erase —
        ``clear_session(erase=True)`` or any other — or a deletion ends one; the session goes on
        in a new one)."""
        self._hashed = hashed
        self._incarnation = 0
        self._home = home
        self._profile = profile
        self._store: SessionStore | None = None
        self._calls = 0  # calls running in worker threads: the store is given back after the last
        self._closed = False
        self._lock = threading.Lock()
        self._history: _History | None = None
        self._history_lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def _enter(self) -> SessionStore:
        """The store, for one call: counted until :meth:`_leave`, so that :meth:`close` never
        gives the store back (and the last handle never closes the log) under a running call."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"EventlogSession {self.key!r} is closed")
            if self._store is None:
                self._store = _shared.acquire(self._home, self._profile, log=self._log)
            self._calls += 1
            return self._store

    def _open(self) -> SessionStore:
        """The store (opened on first use), for a caller outside the session's own calls (tests)."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"EventlogSession {self.key!r} is closed")
            if self._store is None:
                self._store = _shared.acquire(self._home, self._profile, log=self._log)
            return self._store

    def _leave(self) -> None:
        with self._lock:
            self._calls -= 1
            store = self._store if self._closed and not self._calls else None
            if store is not None:
                self._store = None
        if store is not None:
            _shared.release(store)

    def _creation_fields(self) -> dict[str, Any]:
        """The session's fields: its source, and the SDK id it stands for when the key does not
        spell it (a hashed id, a later incarnation)."""
        fields: dict[str, Any] = {"source": SOURCE}
        if self._hashed or self._incarnation:
            origin: dict[str, Any] = {"session_id": self.session_id}
            if self._incarnation:
                origin["incarnation"] = self._incarnation
            fields["model_config"] = {"openai_agents": origin}
        return fields

    def _first_write(self, store: SessionStore, key: str, messages: list[dict[str, Any]]) -> list[int] | None:
        """The session's creation and its first items in one atomic batch, appended at stream
        version 0; their ids, or None when another writer created the session first. Two appends
        left an empty session when a process was killed between them (outside audit)."""
        created = {"type": "session.created", "session": key, "data": self._creation_fields()}
        try:
            seqs = store.append_events([created, *_message_events(key, messages)], expected_version=0)
        except (ConcurrencyError, ConflictError):  # created meanwhile: appended as to any existing session
            return None
        return seqs[1:]

    def _next_incarnation(self) -> None:
        self._incarnation += 1
        self.key = self._incarnation_key(self._incarnation)
        self._history = None

    def _incarnation_key(self, n: int) -> str:
        """The eventlog session id of this session's incarnation ``n`` (0: the first)."""
        return incarnation_id(self.session_id, domain="openai_agents", incarnation=n) if n else \
            session_key(self.session_id)

    def _keep(self, store: SessionStore, h: _History) -> None:
        self._history = h
        _HISTORIES.put(_shared.profile_of(store), self.key, h)

    def _refresh(self, store: SessionStore, need: int | None = None) -> _History:
        """The session's history as the log holds it now — at least its latest ``need`` items
        (None: all of it) — following the session past every incarnation that is gone (erased
        or deleted, here or in any other process). Caller holds ``_history_lock``.

        Read from the log, incrementally: the stream version (one LMDB lookup) and the erase
        mark say whether anything changed since the history this object — or another one of
        this process — last read or wrote; if so only the stream's events after it are read
        and folded (all of them after an erase). With nothing read before, only as much of the
        stream's tail as holds the ``need`` latest items is read (:meth:`_tail`). A history is
        labelled with the version it was read up to, never with one looked up elsewhere."""
        profile = _shared.profile_of(store)
        while True:
            version, mark = store.version_and_erase_mark(self.key)
            h = self._history if self._history is not None and self._history.mark == mark else None
            shared = _HISTORIES.get(profile, self.key, mark)
            if shared is not None and shared.better_than(h):
                h = shared
            fresh: _History | None = None
            if h is not None and h.version >= version:
                fresh = h
            elif h is not None:
                try:
                    fresh = _fold_stream(h, store.log.read_session(self.key, after=h.last), mark)
                except _Unknown:
                    fresh = None
            if fresh is not None and not fresh.holds(need):
                fresh = None
            if fresh is None and need is not None and version:
                fresh = self._tail(store, need, mark, version)
            if fresh is None:
                fresh = _fold_stream(None, store.log.read_session(self.key), mark)
                if fresh.live and fresh.parent is not None and store.gone(self.key):
                    # an ancestor's deletion, which a release before the descendants' own
                    # tombstones wrote into the ancestor's stream alone
                    fresh = _History(fresh.version, fresh.last, mark, True, False, fresh.parent, [], [], 0)
            if fresh is not h and store.erase_mark() != mark:
                continue  # an erase landed during the read: what was read may mix before and after
            if fresh.gone:
                # kept too: a new object of the process (a server makes one per request) passes
                # the gone incarnation with one version lookup instead of folding its whole
                # stream again (outside audit, helper-56: 0.4 s a request for 20,000 items)
                self._keep(store, fresh)
                self._next_incarnation()
                continue
            self._keep(store, fresh)
            return fresh

    def _tail(self, store: SessionStore, need: int, mark: int | None, version: int) -> _History | None:
        """The stream read from its end back only as far as its latest ``need`` items (a tail
        history, see :class:`_History`), or None when the tail cannot decide them (the caller
        then reads the whole stream).

        A tail alone cannot tell whether the session was deleted before it (a deletion hides
        what later writers appended): the projections as they stand — no wait — say up to which
        seq the session was live (:func:`_shared.projected_live`; they must hold the log's last
        erase, which leaves an erased stream no event that is not erased), and the tail begins
        at or before it. A rewind in the tail that names a message before it, with messages
        after it still active, or the session's creation inside it, makes the read begin
        further back. Successive reads begin :data:`TAIL_SPANS` seqs before the log head."""
        known = _shared.projected_live(store, self.key)
        if not known or known < (mark or 0):
            return None  # not live there, or they may not hold the last erase yet (it purges them)
        head = store.log.head()[0]
        for span in TAIL_SPANS:
            floor = min(known, head - span)
            while floor > 0:
                try:
                    h = _fold_stream(None, store.log.read_session(self.key, after=floor), mark, floor)
                    break
                except _Unknown as e:
                    floor = e.floor
            if floor <= 0 or store.version(self.key) != version:
                return None  # the whole stream, or appended to meanwhile (the count read is unknown)
            if h.holds(need):
                return _History(version, h.last, mark, h.created, h.live, h.parent, h.ids, h.items, h.size, h.floor)
        return None

    def _after_own_write(self, store: SessionStore, before: _History, key: str, added: int, ids: list[int],
                         items: list[bytes | None], created: bool = False) -> None:
        """Bring the history along with this object's own write (``added`` events, the messages
        ``ids``; ``created``: the session's creation among them) when nothing else wrote in
        between: the stream then grew by exactly those events."""
        with self._history_lock:
            h = self._history
            if h is not before or self.key != key or store.version(key) != h.version + added:
                return  # someone else wrote too: the next read refreshes from the log
            if created:
                h = _History(h.version, h.last, h.mark, True, True, None, h.ids, h.items, h.size)
            self._keep(store, h.grown(added, ids[-1], ids, items))

    def _rewind(self, store: SessionStore, h: _History, message_id: int) -> int:
        """Rewind the session from ``message_id`` (an active message of ``h``) at the stream
        version ``h`` was read at: ConcurrencyError, nothing written, if the stream changed."""
        event = {"type": "messages.rewound", "session": self.key, "data": {"message_id": message_id}}
        seq: int = _shared.append_counted(store, [event], h.version)[0]
        return seq

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(self._run, fn, *args)

    def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        store = self._enter()
        try:
            return fn(store, *args)
        finally:
            self._leave()

    # ------------------------------------------------------------------ Session protocol

    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> list[Any]:
        """The session's items, oldest first: the latest ``limit`` (else ``session_settings.limit``)
        or all. A limit of 0 gives none; a negative limit gives all."""
        if limit is not None and (type(limit) is not int):
            raise ValidationError("limit", f"must be an integer or None, got {type(limit).__name__}")
        effective = resolve_session_limit(limit, self.session_settings)
        if effective is not None and effective < 0:
            effective = None
        return await self._call(self._get_items, effective)

    def _get_items(self, store: SessionStore, limit: int | None) -> list[Any]:
        if limit == 0:
            return []
        with self._history_lock:
            items = self._refresh(store, limit).items
        out: list[Any] = []
        for raw in reversed(items):  # the latest `limit` of this adapter's items
            if raw is not None:
                out.append(orjson.loads(raw))
                if limit is not None and len(out) >= limit:
                    break
        out.reverse()
        return out

    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        """Append ``items`` in order, as one atomic batch. The items are read (converted to
        messages) in the worker thread: the caller must not change them until the call returns."""
        if self._closed:
            raise ClosedError(f"EventlogSession {self.key!r} is closed")
        if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
            raise ValidationError("items", f"must be a list of input items, got {type(items).__name__}")
        batch = list(items)  # only the list is copied on the loop: a large item costs the loop nothing
        if not batch:
            return
        await _shared.settled(self._call(self._add_items, batch))

    def _add_items(self, store: SessionStore, items: list[Any]) -> None:
        messages = [item_to_message(item, i) for i, item in enumerate(items)]
        checked = False
        for attempt in range(MOVE_ON_TRIES + 2):
            with self._history_lock:
                before = self._refresh(store, 0)  # the incarnation the session is at now
                key = self.key
            first = before.version == 0
            if first and not checked:  # a refused first batch leaves nothing behind, not even the session
                try:
                    store.check_events(_message_events(key, messages))
                except ValidationError as e:
                    raise type(e)(_item_field(e.field, messages), e.problem) from None
                checked = True
            try:
                ids = self._first_write(store, key, messages) if first else store.append_messages(key, messages)
            except ValidationError as e:
                raise type(e)(_item_field(e.field, messages), e.problem) from None
            except NotFoundError:
                # Erased or deleted (by another process) since this object last looked: the
                # session goes on in its next incarnation, unless it was not gone after all.
                if attempt >= MOVE_ON_TRIES - 1 or not store.gone(key):
                    raise
                continue
            if ids is not None:
                break
            # else another writer created the session first: read it, and append to it
        else:  # the session's creation raced every time: say so rather than loop on
            raise ConcurrencyError(key, 0, before.version)
        try:  # as a read gives them back (key order kept): the items themselves, one encode each
            encoded: list[bytes | None] = [orjson.dumps(item) for item in items]
        except (TypeError, orjson.JSONEncodeError):  # text the store cleaned (lone surrogates): read it back
            return
        self._after_own_write(store, before, key, len(ids) + (1 if first else 0), ids, encoded, created=first)

    async def pop_item(self, *, wrapper: Any = None) -> Any | None:
        """Remove the latest item from the history (a rewind: the log keeps it) and return it;
        None when the session has none."""
        return await _shared.settled(self._call(self._pop_item))

    def _pop_item(self, store: SessionStore) -> Any | None:
        while True:
            with self._history_lock:
                h = self._refresh(store, 1)
                # The latest of this adapter's items; messages other writers put after it go too.
                at = next((i for i in range(len(h.items) - 1, -1, -1) if h.items[i] is not None), None)
                if at is None:
                    return None
                try:
                    seq = self._rewind(store, h, h.ids[at])
                except ConcurrencyError:
                    continue  # the stream moved on (an add, another pop, an erase): look again
                self._keep(store, h.rewound(seq, at))
                return orjson.loads(h.items[at])  # type: ignore[arg-type]

    async def clear_session(self, *, wrapper: Any = None, erase: bool = False) -> None:
        """Remove every item from the history: a rewind from the first one (the log keeps them
        for audit), or with ``erase=True`` an erase (:meth:`SessionStore.erase_session`): the
        items are gone from every file, an audit record stays, and the session goes on, empty,
        in its next incarnation (a new eventlog session: an erased id stays taken; see
        docs/ADAPTERS.md). On a session that was never written it does nothing."""
        await _shared.settled(self._call(self._erase if erase else self._clear))

    def _erase(self, store: SessionStore) -> None:
        with self._history_lock:
            now = self._refresh(store, 0)  # the incarnation the session is at now
            # An earlier incarnation a plain deletion ended (`eventlog sessions delete`) still
            # holds its words in the log: they go too (outside audit, helper-52).
            for key in map(self._incarnation_key, range(self._incarnation)):
                if any(not env.get("erased") for env in store.log.read_session(key)):
                    store.erase_session(key, "EventlogSession.clear_session(erase=True)")
            if not now.version:
                return  # never written: nothing to erase, and the id stays free (as a clear of nothing)
            key = self.key
            try:
                store.erase_session(key, "EventlogSession.clear_session(erase=True)")
            finally:
                _HISTORIES.drop(_shared.profile_of(store), key)
            self._history = None
            self._refresh(store)  # the session goes on, empty, under its next incarnation's id

    def _clear(self, store: SessionStore) -> None:
        while True:
            with self._history_lock:
                h = self._refresh(store)
                if not h.ids:
                    return
                try:
                    seq = self._rewind(store, h, h.ids[0])
                except ConcurrencyError:
                    continue
                self._keep(store, _History(h.version + 1, seq, h.mark, h.created, h.live, h.parent, [], [], 0))
                return

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Give back this session's share of the store (idempotent); later calls raise ClosedError.
        Calls already running finish first: the store is given back when the last one ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            store = self._store if not self._calls else None
            if store is not None:
                self._store = None
        if store is not None:
            _shared.release(store)

    def __enter__(self) -> "EventlogSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "EventlogSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def __repr__(self) -> str:
        return f"EventlogSession({self.session_id!r}, profile={self._profile!r})"

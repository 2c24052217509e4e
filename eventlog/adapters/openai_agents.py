"""OpenAI Agents SDK memory on eventlog: :class:`EventlogSession` (the SDK's ``Session`` protocol).

Needs ``pip install 'eventlog[openai-agents]'``. ::

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
:class:`eventlog.errors.ClosedError`.

``wrapper=``: every method accepts the SDK's run-context wrapper and ignores it (the history
is the same in every context scope).
"""
from __future__ import annotations

import asyncio
import os
import re
import threading
from typing import Any, Awaitable, Callable, TypeVar

import orjson
from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit

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
from eventlog.log.codec import MAX_DEPTH, MAX_EVENT_BYTES
from eventlog.profiles import DEFAULT_PROFILE, validate_profile
from eventlog.sessions.store import SessionStore

__all__ = ["EventlogSession", "session_key", "item_to_message", "message_to_item"]

SOURCE = "openai-agents"
KIND_PREFIX = "openai_agents:"
_PAYLOAD_KEYS = ("content", "output", "arguments", "summary")
_ENVELOPE_ROOM = 1024  # type, session, seq, ts, hashes and the tool fields around the item
_T = TypeVar("_T")


MOVE_ON_TRIES = 5
"""How many incarnations one ``add_items`` follows when each refuses it (each was erased meanwhile)."""


def _erased(store: SessionStore, key: str) -> bool:
    """Whether the session ``key`` was erased, from the log: an erase turns a whole stream into
    stubs, its first event (the creation) included."""
    for env in store.log.read_session(key):
        return bool(env.get("erased"))
    return False


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
    elif isinstance(value, list):
        children = enumerate(value)
    else:
        return out
    for k, v in children:
        if isinstance(v, (dict, list)):
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


async def _settled(work: Awaitable[_T]) -> _T:
    """Await a mutation to its end even when the caller is cancelled meanwhile, then re-raise the
    cancellation: the caller never sees a cancelled call whose outcome is still open."""
    job = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not job.done():
        try:
            await asyncio.wait({job})
        except asyncio.CancelledError as e:
            cancelled = cancelled or e
    if cancelled is not None:
        if not job.cancelled():
            job.exception()  # retrieved, so the loop does not report it as never retrieved
        raise cancelled
    return job.result()


class _History:
    """This object's copy of the session's active messages as of a stream version: (message id,
    the item as JSON bytes or None for a message this adapter did not write)."""

    __slots__ = ("version", "ids", "items", "mark")

    def __init__(self, version: int, ids: list[int], items: list[bytes | None], mark: int | None = None) -> None:
        self.version = version
        self.ids = ids
        self.items = items
        self.mark = mark  # the store's erase mark it was read at (an erase changes no version)


def _encoded(message: dict[str, Any]) -> bytes | None:
    item = message_to_item(message)
    return None if item is None else orjson.dumps(item)


class EventlogSession:
    """An OpenAI Agents SDK session stored in an eventlog profile.

    ``session_id``: any string (see :func:`session_key`). ``home``/``profile``: the store, as
    everywhere in eventlog (``$EVENTLOG_HOME`` or ``~/.eventlog``). ``session_settings``: a
    ``SessionSettings`` or a dict of its fields (``limit``: how many of the latest items
    ``get_items()`` returns when it is given no limit).

    Sessions of one (home, profile) share one store in the process, opened on first use and
    closed with the last session. Every method runs its blocking work in a worker thread.
    """

    session_settings: SessionSettings | None

    def __init__(self, session_id: str, *, home: str | os.PathLike[str] | None = None, profile: str = DEFAULT_PROFILE,
                 session_settings: SessionSettings | dict[str, Any] | None = None) -> None:
        key, hashed = map_id(session_id, field="session_id", domain="openai_agents")
        validate_profile(profile)
        self.session_id = session_id
        self.session_settings = (coerce_session_settings(session_settings) if session_settings is not None
                                 else SessionSettings())
        self.key = key
        """The eventlog session id of this session: of its current incarnation (an erase —
        ``clear_session(erase=True)`` or any other — ends one; the session goes on in a new one)."""
        self._hashed = hashed
        self._incarnation = 0
        self._home = home
        self._profile = profile
        self._store: SessionStore | None = None
        self._created = False
        self._closed = False
        self._lock = threading.Lock()
        self._history: _History | None = None
        self._history_lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def _open(self) -> SessionStore:
        with self._lock:
            if self._closed:
                raise ClosedError(f"EventlogSession {self.key!r} is closed")
            if self._store is None:
                self._store = _shared.acquire(self._home, self._profile)
            return self._store

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

    def _ensure_session(self, store: SessionStore) -> None:
        if self._created:
            return
        if store.get_session(self.key) is None:
            try:
                store.create_session(self.key, **self._creation_fields())
            except ConflictError:
                # Created meanwhile by another task or process (or deleted: the append says so).
                # The other process's create is in the log but maybe not in this process's read
                # model yet: catch up, so the append that follows finds the session.
                store.sync(timeout=30)
        self._created = True

    def _first_write(self, store: SessionStore, key: str, messages: list[dict[str, Any]]) -> list[int] | None:
        """The session's creation and its first items in one atomic batch, appended at stream
        version 0; their ids, or None when the session exists (or another writer created it
        first). Two appends left an empty session when a process was killed between them
        (outside audit)."""
        if self._created or store.version(key):
            return None
        created = {"type": "session.created", "session": key, "data": self._creation_fields()}
        try:
            seqs = store.append_events([created, *_message_events(key, messages)], expected_version=0)
        except (ConcurrencyError, ConflictError):  # created meanwhile: appended as to any existing session
            store.sync(timeout=30)
            return None
        self._created = True
        return seqs[1:]

    def _move_on(self, store: SessionStore) -> bool:
        """Follow the session past every incarnation that is gone (erased or deleted, by this
        object or any other process); True when the key moved. Caller holds ``_history_lock``.

        An erase is judged from the log (the stream's first event is a stub then: one read),
        never from the read model, which may not have applied it yet — a history cached from it
        at the new erase mark would never be read again. A deletion is judged by the read model
        first (cheap) and then the log; a lag there only delays the move to the next write's
        refusal."""
        moved = False
        while _erased(store, self.key) or (store.get_session(self.key) is None and store.gone(self.key)):
            self._incarnation += 1
            self.key = incarnation_id(self.session_id, domain="openai_agents", incarnation=self._incarnation)
            self._created = False
            self._history = None
            moved = True
        return moved

    def _refresh(self, store: SessionStore) -> _History:
        """The session's active messages, as of at least the stream version read on entry.

        Reads are incremental: the stream version (one LMDB lookup) says whether anything
        changed since the last call; if so, only the messages after the last known one are
        read, and the session's active message count proves that none of the known ones was
        rewound meanwhile (else everything is read again). Caller holds ``_history_lock``.
        """
        version = store.version(self.key)
        mark = store.erase_mark()
        h = self._history
        if h is not None and h.version == version and h.mark == mark:
            return h
        # An erase (the mark moved) or a first read may find the session gone: follow it. A plain
        # deletion by another process moves only the version; the next add follows it then.
        if version and (h is None or h.mark != mark) and self._move_on(store):
            version = store.version(self.key)
        if version == 0:
            h = _History(0, [], [], mark)
        else:
            store.sync()  # the projections hold at least what the version counted, other writers' included
            h = None
            if self._history is not None and self._history.mark == mark:
                known = self._history
                fresh = store.get_messages(self.key, after=known.ids[-1]) if known.ids else store.get_messages(self.key)
                info = store.get_session(self.key)
                if info is not None and info.get("message_count") == len(known.ids) + len(fresh):
                    h = _History(version, known.ids + [m["id"] for m in fresh],
                                 known.items + [_encoded(m) for m in fresh], mark)
            if h is None:
                msgs = store.get_messages(self.key)
                h = _History(version, [m["id"] for m in msgs], [_encoded(m) for m in msgs], mark)
        self._history = h
        return h

    def _after_own_write(self, store: SessionStore, before: _History | None, ids: list[int],
                         items: list[bytes | None]) -> None:
        """Bring the history along with this object's own write when nothing else wrote in between:
        the stream then grew by exactly the events this write added."""
        with self._history_lock:
            h = self._history
            if h is None or h is not before:
                return
            if store.version(self.key) == h.version + len(ids):
                self._history = _History(h.version + len(ids), h.ids + ids, h.items + items, h.mark)
            # else someone else wrote too: the next read refreshes from the store

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(fn, *args)

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

    def _get_items(self, limit: int | None) -> list[Any]:
        store = self._open()
        if limit == 0:
            return []
        with self._history_lock:
            items = self._refresh(store).items
        out: list[Any] = []
        for raw in reversed(items):  # the latest `limit` of this adapter's items
            if raw is not None:
                out.append(orjson.loads(raw))
                if limit is not None and len(out) >= limit:
                    break
        out.reverse()
        return out

    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        """Append ``items`` in order, as one atomic batch."""
        if self._closed:
            raise ClosedError(f"EventlogSession {self.key!r} is closed")
        if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
            raise ValidationError("items", f"must be a list of input items, got {type(items).__name__}")
        messages = [item_to_message(item, i) for i, item in enumerate(items)]
        if not messages:
            return
        await _settled(self._call(self._add_items, messages))

    def _add_items(self, messages: list[dict[str, Any]]) -> None:
        store = self._open()
        if not self._created:  # a refused first batch leaves nothing behind, not even the session
            try:
                store.check_events(_message_events(self.key, messages))
            except ValidationError as e:
                raise type(e)(_item_field(e.field, messages), e.problem) from None
        for attempt in range(MOVE_ON_TRIES):
            with self._history_lock:
                if attempt or self._history is None:
                    self._move_on(store)  # the first use, or the session just refused the batch
                before = self._history
                key = self.key
            try:
                written = self._first_write(store, key, messages)
                if written is None:
                    self._ensure_session(store)
                    written = store.append_messages(key, messages)
                ids = written
                break
            except ValidationError as e:
                raise type(e)(_item_field(e.field, messages), e.problem) from None
            except NotFoundError:
                # Erased or deleted (by another process) since this object last looked: the
                # session goes on in its next incarnation, unless it was not gone after all.
                if attempt == MOVE_ON_TRIES - 1 or not store.gone(key):
                    raise
        try:
            encoded = [_encoded(m) for m in messages]
        except (TypeError, orjson.JSONEncodeError):  # text the store cleaned (lone surrogates): read it back
            with self._history_lock:
                self._history = None
            return
        self._after_own_write(store, before, ids, encoded)

    async def pop_item(self, *, wrapper: Any = None) -> Any | None:
        """Remove the latest item from the history (a rewind: the log keeps it) and return it;
        None when the session has none."""
        return await _settled(self._call(self._pop_item))

    def _pop_item(self) -> Any | None:
        store = self._open()
        while True:
            with self._history_lock:
                h = self._refresh(store)
                # The latest of this adapter's items; messages other writers put after it go too.
                at = next((i for i in range(len(h.items) - 1, -1, -1) if h.items[i] is not None), None)
                if at is None:
                    return None
                try:
                    store.rewind(self.key, h.ids[at], expected_version=h.version)
                except ConcurrencyError:
                    continue  # the session moved on (an add or another pop): look again
                except NotFoundError:  # erased or deleted meanwhile: on to where the session is now
                    if not self._move_on(store):
                        raise
                    continue
                self._history = _History(h.version + 1, h.ids[:at], h.items[:at], h.mark)
                return orjson.loads(h.items[at])  # type: ignore[arg-type]

    async def clear_session(self, *, wrapper: Any = None, erase: bool = False) -> None:
        """Remove every item from the history: a rewind from the first one (the log keeps them
        for audit), or with ``erase=True`` an erase (:meth:`SessionStore.erase_session`): the
        items are gone from every file, an audit record stays, and the session goes on, empty,
        in its next incarnation (a new eventlog session: an erased id stays taken; see
        docs/ADAPTERS.md). On a session that was never written it does nothing."""
        await _settled(self._call(self._erase if erase else self._clear))

    def _erase(self) -> None:
        store = self._open()
        with self._history_lock:
            self._move_on(store)  # the incarnation the session is at now (another process may have erased one)
            if store.get_session(self.key) is None and not store.version(self.key):
                return  # never written: nothing to erase, and the id stays free (as a clear of nothing)
            store.erase_session(self.key, "EventlogSession.clear_session(erase=True)")
            self._move_on(store)  # the session goes on, empty, under its next incarnation's id

    def _clear(self) -> None:
        store = self._open()
        while True:
            with self._history_lock:
                h = self._refresh(store)
                if not h.ids:
                    return
                try:
                    store.rewind(self.key, h.ids[0], expected_version=h.version)
                except ConcurrencyError:
                    continue
                except NotFoundError:  # erased or deleted meanwhile: on to where the session is now
                    if not self._move_on(store):
                        raise
                    continue
                self._history = _History(h.version + 1, [], [], h.mark)
                return

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Give back this session's share of the store (idempotent); later calls raise ClosedError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            store, self._store = self._store, None
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



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
import inspect
import os
import threading
from typing import Any, Awaitable, Callable, TypeVar

import orjson
from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit

from eventlog.adapters import _shared
from eventlog.adapters._ids import map_id
from eventlog.errors import ClosedError, ConcurrencyError, ConflictError, EventTooLargeError, ValidationError
from eventlog.log.codec import MAX_EVENT_BYTES
from eventlog.profiles import DEFAULT_PROFILE, validate_profile
from eventlog.sessions.store import SessionStore

__all__ = ["EventlogSession", "session_key", "item_to_message", "message_to_item"]

SOURCE = "openai-agents"
KIND_PREFIX = "openai_agents:"
_PAYLOAD_KEYS = ("content", "output", "arguments", "summary")
_ENVELOPE_ROOM = 1024  # type, session, seq, ts, hashes and the tool fields around the item
_T = TypeVar("_T")


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
    try:
        size = len(orjson.dumps(message))
    except (TypeError, orjson.JSONEncodeError):
        size = 0  # not JSON: the validator names the field
    if size + _ENVELOPE_ROOM > MAX_EVENT_BYTES:
        raise EventTooLargeError(f"items[{index}]", "the item's event would exceed 16 MiB")
    call_id = _short(item.get("call_id"))
    if call_id is not None:
        message["tool_call_id"] = call_id
    if kind_name == "function_call" and _short(item.get("name")) is not None:
        message["tool_name"] = item["name"]
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
    return item


def _latest_n_supported(store: SessionStore) -> bool:
    """True once ``get_messages(limit=N)`` means the latest N (issue 13); until then we slice."""
    try:
        params = inspect.signature(type(store).get_messages).parameters
    except (TypeError, ValueError):
        return False
    return "newest_first" in params or "before" in params


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
        """The eventlog session id of this session."""
        self._hashed = hashed
        self._home = home
        self._profile = profile
        self._store: SessionStore | None = None
        self._created = False
        self._closed = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def _open(self) -> SessionStore:
        with self._lock:
            if self._closed:
                raise ClosedError(f"EventlogSession {self.key!r} is closed")
            if self._store is None:
                self._store = _shared.acquire(self._home, self._profile)
            return self._store

    def _ensure_session(self, store: SessionStore) -> None:
        if self._created:
            return
        if store.get_session(self.key) is None:
            fields: dict[str, Any] = {"source": SOURCE}
            if self._hashed:
                fields["model_config"] = {"openai_agents": {"session_id": self.session_id}}
            try:
                store.create_session(self.key, **fields)
            except ConflictError:
                pass  # created meanwhile by another task or process (or deleted: the append says so)
        self._created = True

    def _active(self, store: SessionStore, limit: int | None) -> list[dict[str, Any]]:
        """The latest ``limit`` active messages (all when None), oldest first."""
        if limit is None:
            return store.get_messages(self.key)
        if limit <= 0:
            return []
        if _latest_n_supported(store):
            return store.get_messages(self.key, limit=limit)
        return store.get_messages(self.key)[-limit:]

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(fn, *args)

    # ------------------------------------------------------------------ Session protocol

    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> list[Any]:
        """The session's items, oldest first: the latest ``limit`` (else ``session_settings.limit``)
        or all. A limit of 0 gives none; a negative limit gives all."""
        effective = resolve_session_limit(limit, self.session_settings)
        if effective is not None and effective < 0:
            effective = None
        return await self._call(self._get_items, effective)

    def _get_items(self, limit: int | None) -> list[Any]:
        store = self._open()
        if limit == 0:
            return []
        items = [message_to_item(m) for m in self._active(store, limit)]
        return [i for i in items if i is not None]

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
        self._ensure_session(store)
        try:
            store.append_messages(self.key, messages)
        except ValidationError as e:
            field = e.field.replace("messages[", "items[", 1)
            raise type(e)(field, e.problem) from None

    async def pop_item(self, *, wrapper: Any = None) -> Any | None:
        """Remove the latest item from the history (a rewind: the log keeps it) and return it;
        None when the session has none."""
        return await _settled(self._call(self._pop_item))

    def _pop_item(self) -> Any | None:
        store = self._open()
        while True:
            version = store.version(self.key)
            if version == 0:
                return None
            store.sync()  # read at least what the version counted, other processes' appends included
            latest = self._active(store, 1)
            if not latest:
                return None
            try:
                store.rewind(self.key, latest[-1]["id"], expected_version=version)
            except ConcurrencyError:
                continue  # the session moved on (an add or another pop): look again
            return message_to_item(latest[-1])

    async def clear_session(self, *, wrapper: Any = None) -> None:
        """Remove every item from the history (a rewind from the first one; the log keeps them)."""
        await _settled(self._call(self._clear))

    def _clear(self) -> None:
        store = self._open()
        while True:
            version = store.version(self.key)
            if version == 0:
                return
            store.sync()
            first = store.get_messages(self.key)[:1]
            if not first:
                return
            try:
                store.rewind(self.key, first[0]["id"], expected_version=version)
            except ConcurrencyError:
                continue
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



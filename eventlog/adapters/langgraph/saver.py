"""EventlogSaver: a LangGraph checkpointer whose checkpoints are events in an eventlog profile."""
from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import random
import sqlite3
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from eventlog.adapters import _shared
from eventlog.adapters.langgraph import combine, latest, model
from eventlog.errors import (
    ClosedError,
    ConcurrencyError,
    ConflictError,
    NotFoundError,
    ProjectionError,
    ValidationError,
)
from eventlog.log import Log
from eventlog.profiles import DEFAULT_PROFILE, validate_profile
from eventlog.sessions.events import make_event, upcast
from eventlog.sessions.store import SessionStore

SOURCE = "langgraph"
_ROLES = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant", "system": "system",
          "developer": "system", "tool": "tool", "function": "tool"}
_COLUMNS = ("thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type, checkpoint, "
            "metadata_type, metadata, channel_versions")
_ROW_TABLES = ("langgraph_checkpoints", "langgraph_blobs", "langgraph_writes")
_APPEND_TRIES = 100
"""Versions a write tries while other writers keep appending to its thread before it gives up
(ConcurrencyError, nothing written): each refusal means another write went in."""
READ_WAIT_S = 1.0
"""How long a read of one thread waits for another process that holds the projector lease to
bring the read model up to the log; then it answers from the thread's own stream, replayed (an
outside audit found every turn waiting 30 s, then failing, behind a stopped process)."""
STUCK_S = 5.0
"""After a read ran out of that wait, the reads of the next seconds do not wait again (one attempt
each): a stopped lease holder costs a saver READ_WAIT_S once, not once per read."""
WAIT_S = 30.0
"""How long a read over every thread (``list`` without a thread, ``prune``, ``delete_for_runs``),
which has no one stream to answer from, waits for the read model before its ProjectionError --
at once when the lease holder is a stopped process."""
_GONE_HINTS = {
    "deleted": "the thread's session {sid!r} was deleted (`eventlog sessions delete`, "
               "SessionStore.delete_session) and a deleted id stays taken: go on under a new thread_id; "
               "nothing was written",
    "no session": "the thread's stream {sid!r} holds no session (an earlier release could leave one after a "
                  "refused first write) and its id stays taken: go on under a new thread_id; nothing was written",
}


def _text(value: Any, field: str = "id") -> str:
    """Ids as the saver keys them: strings (a UUID or int id becomes its text). An id with a
    surrogate code point cannot be stored as it is (neither JSON nor SQLite text holds one), and
    any replacement would make two ids one thread (an outside audit read one thread's checkpoint
    through another id): refused, ValidationError naming ``field``. So is None: stored as its text
    "None" it was one thread with the real id "None" that another caller passes."""
    if value is None:
        raise ValidationError(field, "must be given (None is not an id)")
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, "must not contain surrogate code points (they cannot be stored)") from None
    return str.__str__(text)


PART_BYTES = model.COPY_PART_BYTES
"""About how many encoded bytes of values one ``langgraph.writes_put`` or
``langgraph.checkpoint_put`` event carries: the writes of one ``put_writes``, or the channel values
of one ``put``, that add up to more go as several events in one atomic batch (they were refused
whole once past the log's 16 MiB event limit, where LangGraph's own savers store them)."""


def _namespace(conf: Any, *, writing: bool) -> str:
    """The config's ``checkpoint_ns``: absent is the root namespace ``""``. A None namespace is
    refused on writes (stored as the text "None" it would be one namespace with a real one of
    that name; LangGraph's PostgreSQL saver refuses it too) and read as the root namespace."""
    ns = conf.get("checkpoint_ns", "")
    if ns is None:
        if writing:
            raise ValidationError("checkpoint_ns", 'must be a string (leave it out or pass "" for the root namespace)')
        ns = ""
    return _text(ns, "checkpoint_ns")


def _stored(text: str, field: str, *, empty: bool = True) -> str:
    """An id as a write stores it: at most ``model.MAX_TEXT`` characters, and not empty unless
    ``empty``. Refused here, ValidationError naming ``field`` as the caller passed it (the log's
    check named the event's field instead, ``events[1].data.checkpoint_ns``)."""
    if len(text) > model.MAX_TEXT:
        raise ValidationError(field, f"longer than {model.MAX_TEXT} characters")
    if not empty and not text:
        raise ValidationError(field, "must not be empty")
    return text


def _ids(values: Any, field: str) -> builtins.set[str]:
    """The ids of a ``Sequence[str]`` argument; one string is one id (not its characters)."""
    return {_text(v, field) for v in ([values] if isinstance(values, str) else values)}


def _parts(rows: builtins.list[dict[str, Any]]) -> builtins.list[builtins.list[dict[str, Any]]]:
    """``rows`` (encoded writes or blobs, in order) cut into runs of about PART_BYTES each."""
    parts: builtins.list[builtins.list[dict[str, Any]]] = []
    size = 0
    for row in rows:
        n = 64 + sum(len(v) for v in (row["data"], row["channel"], row["type"]) if isinstance(v, str))  # (a channel
        # that is not a string is the validator's to refuse, naming it)
        if not parts or (size and size + n > PART_BYTES):
            parts.append([])
            size = 0
        parts[-1].append(row)
        size += n
    return parts


def _jsonable(value: Any) -> Any:
    """A JSON copy of a message field (unknown objects as their text)."""
    try:
        return orjson.loads(orjson.dumps(value, default=str))
    except (TypeError, orjson.JSONEncodeError):
        return str(value)


def message_fields(message: Any) -> dict[str, Any] | None:
    """The eventlog message that mirrors one LangGraph message (a LangChain message or a dict
    with an id), or None for what cannot be mirrored (no id, unknown shape)."""
    get = message.get if isinstance(message, dict) else (lambda k, d=None: getattr(message, k, d))
    mid = get("id")
    kind = get("type") or get("role")
    if not isinstance(mid, str) or not mid or not isinstance(kind, str):
        return None
    role = _ROLES.get(kind) or _ROLES.get(str(get("role") or ""), "user")
    content = get("content")
    fields: dict[str, Any] = {
        "role": role,
        "content": content if isinstance(content, str) else (_jsonable(content) if content is not None else None),
        "display_kind": model.MESSAGE_KIND,
        "display_metadata": {"langgraph_id": mid, "type": kind},
    }
    if not isinstance(fields["content"], (str, list, dict)):
        fields["content"] = None if fields["content"] is None else str(fields["content"])
    calls = get("tool_calls")
    if calls:
        fields["tool_calls"] = _jsonable(list(calls))
    call_id, name = get("tool_call_id"), get("name")
    if isinstance(call_id, str) and 0 < len(call_id) <= 1024:
        fields["tool_call_id"] = call_id
    if role == "tool" and isinstance(name, str) and 0 < len(name) <= 1024:
        fields["tool_name"] = name
    return fields


def _mirror_key(message: dict[str, Any]) -> str | None:
    """The LangGraph id of a message the mirror wrote (None for any other message)."""
    meta = message.get("display_metadata")
    key = meta.get("langgraph_id") if isinstance(meta, dict) else None
    return key if message.get("display_kind") == model.MESSAGE_KIND and isinstance(key, str) else None


def _thread_of(batch: builtins.list[combine.Request]) -> str:
    """The thread a batch writes to (for errors): every saver event but a message names it."""
    for r in batch:
        for e in r.events:
            tid = e["data"].get("thread_id")
            if isinstance(tid, str):
                return tid
    return ""


def _gone(thread: str, sid: str, why: str) -> NotFoundError:
    """The NotFoundError of a write to a thread whose session is gone, its hint saying how
    (``why``: see :meth:`EventlogSaver._life`); an erased one keeps NotFoundError's own hint."""
    error = NotFoundError("thread", thread)
    if why in _GONE_HINTS:
        error.hint = _GONE_HINTS[why].format(sid=sid)
    return error


def _to_send(batch: builtins.list[combine.Request], create: bool, mirrored: set[str] | None) -> None:
    """Set each request's ``sent``: its events as this attempt appends them, derived from its own
    ``events``, which stay as the caller made them. A thread's creation goes in once, and only
    when ``create`` (the stream is empty at the version of this attempt); a mirrored message once,
    and not when ``mirrored`` (None: no filter) holds its LangGraph id. Each attempt starts again
    from the requests' own events: a request that a batch's creation served, tried again alone
    after that batch was refused, carries its creation again (an outside audit found such a
    request, whose creation had been removed from its events in place, appended into a stream
    that never got a session: the thread id was then unusable)."""
    created = not create
    taken = set(mirrored) if mirrored is not None else set()
    for r in batch:
        sent = []
        for e in r.events:
            if e["type"] == "session.created":
                if created:
                    continue
                created = True
            elif mirrored is not None and e["type"] == "message.appended":
                key = _mirror_key(e["data"])
                if key is not None:
                    if key in taken:
                        continue
                    taken.add(key)
            sent.append(e)
        r.sent = sent


class _Replay:
    """What a replay of one thread's stream read: ``n`` events (the stream version its tables are
    exact for), the last one's ``seq``, and ``why`` the session is not live (None: it is; see
    :meth:`EventlogSaver._life`)."""

    __slots__ = ("n", "seq", "why")

    def __init__(self, n: int, seq: int, why: str | None) -> None:
        self.n, self.seq, self.why = n, seq, why


def _life_after(env: dict[str, Any], created: bool, why: str | None) -> tuple[bool, str | None]:
    """A thread's session after one more event of its stream: ``(created, why not live)`` --
    an erase wins, a deletion counts unless an erase came first."""
    if env.get("erased"):
        return created, "erased"
    if env.get("type") == "session.created":
        return True, why
    if env.get("type") == "session.deleted":
        return created, why or "deleted"
    return created, why


def _replay(store: SessionStore, sid: str) -> tuple[sqlite3.Connection, _Replay]:
    """An in-memory database holding the ``langgraph`` tables as :func:`model.apply` makes them
    from stream ``sid`` -- with, for a copy of an earlier release (``thread_copied`` v1, which
    takes its source's rows as they stand at that point of the log), the source's events before
    it -- and what the replay read."""
    conn = sqlite3.connect(":memory:", isolation_level=None)  # transactions as the read model's connection
    conn.execute("BEGIN")
    for statement in model.DDL:
        conn.execute(statement)
    at: dict[str, int] = {}
    n = seq = 0
    created, why = False, None

    def fold(stream: str, before: int | None, depth: int) -> None:
        nonlocal n, seq, created, why
        for env in store.log.read_session(stream, after=at.get(stream, 0)):
            if before is not None and env["seq"] >= before:
                return
            at[stream] = env["seq"]
            env = upcast(env)
            data = env.get("data")
            if (env.get("type") == "langgraph.thread_copied" and env.get("v", 1) == 1 and depth < 16
                    and isinstance(data, dict) and isinstance(data.get("source_thread_id"), str)):
                try:
                    source = model.thread_session(data["source_thread_id"])
                except ValidationError:
                    source = stream
                if source != stream:
                    fold(source, env["seq"], depth + 1)
            model.apply(conn, env)
            if stream == sid:
                n, seq = n + 1, env["seq"]
                created, why = _life_after(env, created, why)

    fold(sid, None, 0)
    conn.execute("COMMIT")
    return conn, _Replay(n, seq, why if why is not None or created else "no session")


def _stopped_holder(store: SessionStore) -> int | None:
    """The pid of a stopped process (SIGSTOP, a debugger) holding the profile's projector lease,
    as a store read finds it (at most one short wait), or None."""
    store.list_sessions(limit=1)
    status = store.read_status()
    holder = status.get("lease_holder")
    if status.get("stale") and status.get("lease_holder_state") == "stopped" and isinstance(holder, int):
        return holder
    return None


class _Mirror:
    """The LangGraph ids of the messages mirrored into a thread's session: every one, as of the
    stream's version ``at`` (-1: not known to be complete). An append of mirrored messages at
    exactly that version, which the log checks inside its write transaction, appends each
    message once however many writers mirror the same thread."""

    __slots__ = ("at", "keys")

    def __init__(self, at: int, keys: set[str]) -> None:
        self.at = at
        self.keys = keys


class _Handle:
    """A saver's share of its profile's store and whether it is closed: one object for the saver
    and the shallow copies LangGraph makes of it (``compile()`` with a msgpack allowlist), so that
    closing the saver closes what the graph writes through (an outside audit found a copy still
    writing, and holding the store, after the saver's ``with`` block)."""

    __slots__ = ("store", "closed")

    def __init__(self) -> None:
        self.store: SessionStore | None = None
        self.closed = False


class EventlogSaver(BaseCheckpointSaver[Any]):
    """LangGraph checkpointer on an eventlog profile (sync and async; ``with``/``async with``).

    Every ``put``/``put_writes``/delete/copy/prune is an event in the profile's log, in the
    stream of the thread's session (``lg:<thread_id>``, see :func:`model.thread_session`);
    ``get_tuple`` and ``list`` read the ``langgraph`` read model, never the log. Messages of the
    root graph's ``messages`` channel are mirrored into the thread's session once each (by
    message id), so eventlog's search, transcripts and stats cover LangGraph conversations;
    ``delete_thread`` also rewinds them (the log keeps them) — or, with ``erase_deleted=True``,
    erases the thread's whole stream (:meth:`SessionStore.erase_session`: checkpoints, writes and
    messages gone from every file, an audit record kept; the thread id cannot be used again: a
    later write to it raises NotFoundError and writes nothing).

    Savers of one (home, profile, log) share one store in the process; ``log``: where the
    profile's events live, as for :meth:`SessionStore.open` (a ``postgresql://`` URL, an LMDB
    log directory or a Log object; default ``$EVENTLOG_LOG_URL``, else the LMDB log under ``home``). ``follower``: whether the
    saver's handle asks for the store's background follower. Off by default: a graph's turn is
    several writes in a few milliseconds, and a thread applying them to state.db every 20 ms
    competes with the graph for the GIL (a quarter of the throughput of eight concurrent
    conversations, measured: docs/ADAPTERS.md). Without it the projections are brought up to the
    log, in batches, by the reads that need them (a ``get_tuple`` the saver's copy cannot
    answer, ``list``, any SessionStore read, another process's reader); an application that
    wants them kept current in the background opens a SessionStore of the profile (follower on
    by default), which the saver then shares.
    """

    def __init__(self, *, home: str | os.PathLike[str] | None = None, profile: str = DEFAULT_PROFILE,
                 serde: SerializerProtocol | None = None, mirror_messages: bool = True,
                 erase_deleted: bool = False, follower: bool = False,
                 log: str | os.PathLike[str] | Log | None = None) -> None:
        super().__init__(serde=serde)
        validate_profile(profile)
        self._log = _shared.check_log(log)
        self._home = home
        self._profile = profile
        self._mirror = mirror_messages
        self._erase_deleted = erase_deleted
        self._follower = follower
        self._handle = _Handle()  # shared with the shallow copies LangGraph makes (with_allowlist)
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[int, int]] = {}
        """Streams known to hold a live session: (a seq, the stream's event count up to it) with
        no deletion or erase up to that seq (see :meth:`_life`)."""
        self._stuck_until = 0.0  # see STUCK_S
        self._mirrored: dict[str, _Mirror] = {}
        self._one_batch = True
        self._copies = latest.Copies()
        self._erase_mark: int | None = None
        self._combiner = combine.Combiner(self._append_batch)

    def get_next_version(self, current: Any, channel: Any) -> str:
        """A channel's next version: the counter, zero-padded so versions order as strings, and a
        random tail so two branches of one thread (a fork from an older checkpoint) never share
        a version, which would make them share the channel's stored value."""
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".", 1)[0])
        # 64 bits from the module's generator (seeded from the OS, reseeded in a forked child):
        # a system call per channel and step for secrets.token_hex bought nothing more here.
        return f"{n + 1:032d}.{random.getrandbits(64):016x}"

    # ------------------------------------------------------------------ lifecycle

    def _open(self) -> SessionStore:
        h = self._handle
        with self._lock:
            if h.closed:
                raise ClosedError("EventlogSaver is closed")
            if h.store is None:
                h.store = self._acquire()
            return h.store

    def _acquire(self) -> SessionStore:
        """A store handle with the ``langgraph`` events and read model registered. Opening it
        brings the read model up to the log, waiting for another process that holds the
        projector lease (the store's own wait, 30 s); when that process does not get there (it
        is stopped), the registration stands and the saver goes on without it: its reads of a
        thread answer from the thread's stream meanwhile (:meth:`_thread_reads`)."""
        try:
            return _shared.acquire(self._home, self._profile, [model.EXTENSION], follower=self._follower, log=self._log)
        except ProjectionError as e:
            store = _shared.acquire(self._home, self._profile, (), follower=self._follower, log=self._log)
            try:
                store.check_events([{"type": "langgraph.thread_pruned", "session": model.thread_session("t"),
                                     "data": {"thread_id": "t", "strategy": "delete"}}])
            except ValidationError:  # not registered after all: the open's own error stands
                _shared.release(store)
                raise e from None
            return store

    def _check_open(self) -> None:
        """ClosedError once the saver is closed: for the calls that find nothing to do before
        they need the store (an empty put_writes, prune or delete_for_runs), as the others."""
        if self._handle.closed:
            raise ClosedError("EventlogSaver is closed")

    def _check_erases(self, store: SessionStore) -> None:
        """An erase (this process or another) rewrites streams without changing their versions:
        when the log's erase mark moved, nothing this saver knows of a thread is trusted any
        more -- its copies, the sessions it saw live (a write to an erased thread is then
        refused) and what it mirrored. Asked by the reads (a graph's run starts with one) and the
        operations on whole threads, not by each put/put_writes: those are appended at an
        expected stream version, which the log refuses for an erased stream inside its write
        transaction (:meth:`_append_batch`), so they need no look at the mark."""
        self._note_erase_mark(store.erase_mark())

    def _note_erase_mark(self, mark: int | None) -> None:
        """Forget what this saver knows of every thread when ``mark`` (the log's erase mark,
        read by the caller, with a stream version when it needs one) moved."""
        if mark != self._erase_mark:
            self._copies.clear()
            self._sessions.clear()
            self._mirrored.clear()
            self._erase_mark = mark

    def close(self) -> None:
        """Give back this saver's share of the store (idempotent)."""
        h = self._handle
        with self._lock:
            if h.closed:
                return
            h.closed = True
            store, h.store = h.store, None
        if store is not None:
            _shared.release(store)

    def __enter__(self) -> "EventlogSaver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "EventlogSaver":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # ------------------------------------------------------------------ plumbing

    def _creation(self, store: SessionStore, thread_id: str) -> builtins.list[dict[str, Any]]:
        """``[]`` when the thread's session is live, else its ``session.created``, to go first in
        the same atomic batch as the thread's first write (appended at stream version 0): a
        refused write, or a process killed between two appends, used to leave an empty session
        (outside audits). A session whose id was used and is gone (deleted, or erased with
        ``erase_deleted=True``) takes nothing: NotFoundError, whose hint says which."""
        sid = model.thread_session(thread_id)
        if sid in self._sessions:
            return []
        version = store.version(sid)
        if not version:  # a creation another writer makes meanwhile refuses the batch (version 0)
            return [{"type": "session.created", "session": sid,
                     "data": {"source": SOURCE, "model_config": {"langgraph": {"thread_id": thread_id}}}}]
        why = self._life(store, sid, version)
        if why is not None:
            raise _gone(thread_id, sid, why)
        return []

    def _life(self, store: SessionStore, sid: str, version: int) -> str | None:
        """None when stream ``sid``, counted at ``version`` events, holds a live session; else why
        not: ``"erased"``, ``"deleted"`` or ``"no session"``. From the log, never the projections
        (they may lag, or wait for another process): nothing to read when this saver knows the
        stream live at that very version (its own last append, or a read that proved it), else
        the stream's events past the last seq it knew live (all of them the first time)."""
        known = self._sessions.get(sid)
        if known is not None and known[1] == version:
            return None
        after, count = known if known is not None else (0, 0)
        created, why = known is not None, None
        for env in store.log.read_session(sid, after=after):
            count, after = count + 1, env["seq"]
            created, why = _life_after(env, created, why)
        if why is None and not created:
            why = "no session"
        if why is None:
            self._sessions[sid] = (after, count)
        else:
            self._sessions.pop(sid, None)
        return why

    def _append(self, store: SessionStore, events: list[dict[str, Any]],
                expected_version: int | None = None) -> builtins.list[int]:
        return _shared.append_events(store, events, expected_version)

    def _write(self, store: SessionStore, sid: str, events: list[dict[str, Any]],
               change: latest.Put | latest.Writes | None) -> None:
        """Append ``events`` (all in stream ``sid``), in one batch with the other writes to the
        thread queued meanwhile (:mod:`combine`), and carry this saver's copy of the thread along."""
        self._combiner.write(sid, events, (store, change))

    def _append_batch(self, sid: str, batch: builtins.list[combine.Request]) -> None:
        """One atomic append of ``batch``'s events at an expected stream version: the copy's
        when there is a copy, so that the log refuses them if anything else reached the stream
        since (then the copy is dropped and they are appended at the version read then), else
        the version read just before.

        Never without a version: the log also refuses an append at a version to a stream that
        was erased (an erase changes no count), inside its write transaction. So a write to a
        thread that another process erased is refused even by a saver that has not read the
        thread since (an outside audit found such writes landing in the erased stream): it
        raises NotFoundError and nothing is written."""
        store: SessionStore = batch[0].change[0]
        mirrors = any(_mirror_key(e["data"]) for r in batch for e in r.events if e["type"] == "message.appended")
        thread = _thread_of(batch)
        with self._copies.lock(sid):
            copy = self._copies.get(sid)
            version = copy.version if copy is not None else store.version(sid)
            for _ in range(_APPEND_TRIES):
                known = self._mirrored.get(sid)
                if mirrors and (known is None or known.at != version):
                    # What this saver knows mirrored is not the stream it appends to (another
                    # writer mirrored this thread too): read it again, and append at its version.
                    known = self._mirrored[sid] = self._mirror_known(store, sid)
                    if known.at >= 0 and known.at != version:
                        if copy is not None:
                            self._copies.drop(sid)
                            copy = None
                        version = known.at
                if version:  # at every version another writer moved the stream to: a deletion among them?
                    why = self._life(store, sid, version)
                    if why is not None:
                        raise _gone(thread, sid, why)
                _to_send(batch, version == 0, known.keys if mirrors and known is not None else None)
                events = [e for r in batch for e in r.sent or ()]
                try:
                    try:
                        seqs = self._append(store, events, version)
                    except ConflictError as e:  # the batch's creation: the stream began meanwhile
                        if not any(ev["type"] == "session.created" for ev in events):
                            raise
                        raise ConcurrencyError(sid, version, store.version(sid)) from e
                except ConcurrencyError as e:
                    refused = e
                    if copy is not None:
                        self._copies.drop(sid)
                        copy = None
                    now = store.version(sid)
                    if now == version:  # refused at the stream's own count: the stream was erased
                        break
                    version = now  # another writer's events came first: again after them
                    continue
                except ValidationError:
                    raise  # nothing was appended: the copy still holds
                except BaseException:
                    self._copies.drop(sid)
                    raise
                if copy is not None:
                    for r in batch:
                        copy = copy.after(len(r.sent or ()), r.change[1])
                    self._copies.set(sid, copy)
                self._sessions[sid] = (max(seqs), version + len(events))  # live: at the least, its creation is in
                if known is not None and known.at == version:
                    known.at = version + len(events)
                    known.keys.update(k for e in events if e["type"] == "message.appended"
                                      and (k := _mirror_key(e["data"])) is not None)
                return
            else:
                raise refused  # other writers kept appending to the thread: nothing of this was written
        self._check_erases(store)
        self._sessions.pop(sid, None)
        self._mirrored.pop(sid, None)
        raise NotFoundError("thread", thread)

    def _append_as_read(self, store: SessionStore, sid: str, thread: str,
                        build: Callable[[], builtins.list[dict[str, Any]]]) -> None:
        """Append the events ``build`` derives from stream ``sid`` (read with the projections
        caught up to the version read first) as one batch at that version, the thread's session
        live at it (else NotFoundError, nothing written); again, from a new read, when another
        writer moved the stream meanwhile (a creation that lost the race is a ConflictError: the
        same)."""
        for _ in range(_APPEND_TRIES):
            version = store.version(sid)
            if version:
                why = self._life(store, sid, version)
                if why is not None:
                    raise _gone(thread, sid, why)
                store.sync(timeout=WAIT_S)  # the stream's events as of that version, for build's reads
            events = build()
            try:
                seqs = self._append(store, events, version)
            except ConcurrencyError:
                if store.version(sid) == version:  # refused at the stream's own count: erased
                    raise _gone(thread, sid, "erased") from None
                continue
            except ConflictError:
                if not any(e["type"] == "session.created" for e in events):
                    raise
                continue
            self._sessions[sid] = (max(seqs), version + len(events))
            return
        raise ConcurrencyError(sid, version, store.version(sid))

    def _append_unless_erased(self, store: SessionStore, events: builtins.list[dict[str, Any]]) -> None:
        """Append ``events`` (one per thread, several threads' streams: no stream version can
        check them) as one batch, leaving out the threads whose stream was erased since the read
        model showed them: checked from the log under the profile's rules lock, which every
        erase holds while it commits, so none lands between the check and the append. An
        unchecked batch racing an erase went into the erased stream, and the thread id it names
        outlived the erase (outside audit, helper-56: 3 of 20 threads, prune in a loop)."""
        if not events:
            return
        with _shared.ruled(store):
            keep = [e for e in events if not _shared.erased(store, e["session"])]
            if keep:
                self._append(store, keep)
        self._forget(*(e["session"] for e in events))

    def _forget(self, *sids: str) -> None:
        """Drop the copies of threads an operation on whole threads changed."""
        for sid in sids:
            with self._copies.lock(sid):
                self._copies.drop(sid)

    @contextlib.contextmanager
    def _reads(self, store: SessionStore) -> Iterator[sqlite3.Connection]:
        """The read model, for a read over every thread: it waits for another process's catch-up
        at most WAIT_S, and not at all once that process is seen stopped (ProjectionError naming
        it: there is no one stream to answer from)."""
        deadline = time.monotonic() + WAIT_S
        with contextlib.ExitStack() as stack:
            while True:
                began = time.monotonic()
                wait = min(READ_WAIT_S, max(0.0, deadline - began))
                try:
                    conn = stack.enter_context(store.read_model(model.NAMESPACE, wait=wait))
                    break
                except ProjectionError as e:
                    if time.monotonic() >= deadline or time.monotonic() - began < wait:
                        raise  # out of time, or not a wait that ran out (a broken read model)
                    holder = _stopped_holder(store)
                    if holder is not None:
                        raise ProjectionError(
                            f"read model {model.NAMESPACE!r} cannot reach the log: process {holder}, stopped, "
                            "holds the projector lease",
                            hint="resume or end that process, then retry; reads of one thread answer "
                                 "from its stream meanwhile") from e
            yield conn

    @contextlib.contextmanager
    def _thread_reads(self, store: SessionStore, sid: str,
                      replay: bool = False) -> Iterator[tuple[sqlite3.Connection, _Replay | None]]:
        """A connection with the ``langgraph`` tables as they hold thread stream ``sid``, and how
        it was made: the read model (None) when it reaches the log within READ_WAIT_S (or, with
        ``replay``, never), else the thread's own stream replayed into memory (a
        :class:`_Replay`), exact as of the events it read -- a pure fold (:func:`model.apply`)
        of the events that make the thread's rows, which are all in its stream. So a peer
        process that holds the projector lease and does not catch up (stopped, swapped out,
        busy) costs a read at most READ_WAIT_S, and a read never answers short of the log."""
        with contextlib.ExitStack() as stack:
            conn: sqlite3.Connection | None = None
            found: _Replay | None = None
            if not replay:
                try:
                    wait = 0.0 if time.monotonic() < self._stuck_until else READ_WAIT_S
                    conn = stack.enter_context(store.read_model(model.NAMESPACE, wait=wait))
                except ProjectionError:
                    self._stuck_until = time.monotonic() + STUCK_S
            if conn is None:
                conn, found = _replay(store, sid)
                stack.callback(conn.close)
            yield conn, found

    def _latest(self, conn: sqlite3.Connection, row: tuple[Any, ...]) -> latest.Latest:
        """A checkpoint row of the read model with its blob rows and pending writes."""
        tid, ns, cid, parent, ctype, cdata, mtype, mdata, versions = row
        channel_versions = orjson.loads(versions) if versions else {}
        keys = {str(ch): model.version_key(v) for ch, v in channel_versions.items()}
        blobs: dict[str, latest.Blob] = {}
        if keys:
            sql = ("SELECT b.channel, b.type, b.data FROM langgraph_blobs b JOIN (VALUES "
                   + ", ".join("(?, ?)" for _ in keys)
                   + ") AS w ON b.channel = w.column1 AND b.version = w.column2 "
                     "WHERE b.thread_id = ? AND b.checkpoint_ns = ?")
            for channel, btype, bdata in conn.execute(sql, [x for p in keys.items() for x in p] + [tid, ns]):
                blobs[channel] = (btype, bdata)
        writes = {(t, i): (path, c, wt, wd) for t, i, path, c, wt, wd in conn.execute(
            "SELECT task_id, idx, task_path, channel, type, data FROM langgraph_writes WHERE thread_id = ? "
            "AND checkpoint_ns = ? AND checkpoint_id = ?", (tid, ns, cid))}
        return latest.Latest((tid, ns, cid, parent, ctype, cdata, mtype, mdata), keys, blobs, writes)

    def _tuple(self, found: latest.Latest) -> CheckpointTuple:
        """The CheckpointTuple of a stored checkpoint (values deserialized anew on every call)."""
        tid, ns, cid, parent, ctype, cdata, mtype, mdata = found.row
        loads = self.serde.loads_typed
        values: dict[str, Any] = {}
        for channel in found.versions:
            blob = found.blobs.get(channel)
            if blob is not None and blob[0] != "empty" and blob[1] is not None:
                values[channel] = loads(blob)
        return CheckpointTuple(
            config={"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": cid}},
            checkpoint={**loads((ctype, cdata)), "channel_values": values},  # type: ignore[typeddict-item]
            metadata=loads((mtype, mdata)),
            parent_config=({"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": parent}}
                           if parent else None),
            pending_writes=[(t, c, loads((wt, wd))) for t, c, wt, wd in found.ordered_writes()],
        )

    # ------------------------------------------------------------------ reads

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        tid, ns = _text(conf["thread_id"], "thread_id"), _namespace(conf, writing=False)
        cid = get_checkpoint_id(config)
        cid = _text(cid, "checkpoint_id") if cid else None
        store = self._open()
        try:
            sid = model.thread_session(tid)
        except ValidationError:
            self._check_erases(store)
            return None  # no such thread can exist
        version, mark = store.version_and_erase_mark(sid)  # one look (one round trip on PostgreSQL)
        self._note_erase_mark(mark)
        copy = self._copies.get(sid)
        if copy is not None and ns in copy.spaces:
            found = copy.spaces[ns].latest
            if (cid is None or found is None or found.checkpoint_id == cid) and version == copy.version:
                return None if found is None or (cid is not None and found.checkpoint_id != cid) else self._tuple(found)
        # The read model (or the thread's stream replayed); a read of the latest checkpoint also
        # establishes this saver's copy when it provably holds the stream as of one version (see
        # latest.py), and what it knows of the thread's session and mirrored messages.
        if not version:  # nothing was ever written to the thread: every row of a thread is from its stream
            if cid is None:
                self._copies.establish(sid, 0, ns, None, None)
            return None
        head = store.log.head()[0]
        written = reached = life = None
        keys: set[str] = set()
        with self._thread_reads(store, sid) as (conn, replay):
            conn.execute("BEGIN")  # one snapshot: the rows and the cursor they are current to
            try:
                if cid:
                    row = conn.execute(f"SELECT {_COLUMNS} FROM langgraph_checkpoints WHERE thread_id = ? AND "
                                       "checkpoint_ns = ? AND checkpoint_id = ?", (tid, ns, cid)).fetchone()
                else:
                    row = conn.execute(f"SELECT {_COLUMNS} FROM langgraph_checkpoints WHERE thread_id = ? AND "
                                       "checkpoint_ns = ? ORDER BY checkpoint_id DESC LIMIT 1", (tid, ns)).fetchone()
                found = None if row is None else self._latest(conn, row)
                if cid is None:
                    (written,) = conn.execute("SELECT MAX(checkpoint_id) FROM langgraph_writes WHERE thread_id = ? "
                                              "AND checkpoint_ns = ?", (tid, ns)).fetchone()
                    reached = conn.execute("SELECT value FROM meta WHERE key = ?",
                                           (f"ext:{model.NAMESPACE}:seq",)).fetchone() if replay is None else None
                    life = conn.execute("SELECT gone FROM langgraph_sessions WHERE session_id = ?", (sid,)).fetchone()
                    if replay is not None:
                        keys = {k for (k,) in conn.execute("SELECT message_key FROM langgraph_messages "
                                                           "WHERE session_id = ?", (sid,))}
            finally:
                conn.execute("COMMIT")
        if cid is None and replay is not None:  # exact as of the events the replay read
            self._copies.establish(sid, replay.n, ns, found, written)
            self._mirrored[sid] = _Mirror(replay.n, keys)
            if replay.why is None:
                self._sessions[sid] = (replay.seq, replay.n)
        elif cid is None and reached is not None and int(reached[0]) >= head and store.version(sid) == version:
            self._copies.establish(sid, version, ns, found, written)
            # A copy is (re)established from the read model when this saver's writes are not
            # all the stream holds (first read, or another saver or process wrote since): the
            # messages mirrored meanwhile are read again too, or two savers taking turns on one
            # thread would each mirror the same messages (found by an outside audit).
            self._mirrored.pop(sid, None)
            if life is not None and not life[0]:  # every event of the stream (seq <= head) applied: live
                self._sessions[sid] = (head, version)
        return None if found is None else self._tuple(found)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id) matching every given criterion: the
        config's thread, namespace and checkpoint id, ids before ``before``'s, metadata equal to
        ``filter`` key by key; at most ``limit``."""
        where, params = [], []
        conf = (config or {}).get("configurable") or {}
        if conf.get("thread_id") is not None:
            where.append("thread_id = ?")
            params.append(_text(conf["thread_id"], "thread_id"))
        if conf.get("checkpoint_ns") is not None:
            where.append("checkpoint_ns = ?")
            params.append(_text(conf["checkpoint_ns"], "checkpoint_ns"))
        if config is not None and get_checkpoint_id(config):
            where.append("checkpoint_id = ?")
            params.append(_text(get_checkpoint_id(config), "checkpoint_id"))
        if before is not None and get_checkpoint_id(before):
            where.append("checkpoint_id < ?")
            params.append(_text(get_checkpoint_id(before), "before"))
        sql = f"SELECT {_COLUMNS} FROM langgraph_checkpoints"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY checkpoint_id DESC, thread_id, checkpoint_ns"
        if limit is not None and type(limit) is not int:
            raise ValidationError("limit", f"must be an integer or None, got {type(limit).__name__}")
        if limit is not None and not filter:
            sql += f" LIMIT {max(int(limit), 0)}"
        out: list[CheckpointTuple] = []
        store = self._open()
        sid = None
        if conf.get("thread_id") is not None:
            try:
                sid = model.thread_session(params[0])
            except ValidationError:
                self._check_erases(store)
                return iter(out)  # no such thread can exist
            version, mark = store.version_and_erase_mark(sid)  # one look (one round trip on PostgreSQL)
            self._note_erase_mark(mark)
            if not version:
                return iter(out)  # nothing was ever written to it
        else:
            self._check_erases(store)
        with contextlib.ExitStack() as stack:
            if sid is not None:  # one thread: its stream can answer when the read model is held up
                conn = stack.enter_context(self._thread_reads(store, sid))[0]
            else:
                conn = stack.enter_context(self._reads(store))
            for row in conn.execute(sql, params).fetchall():
                if limit is not None and len(out) >= limit:
                    break
                if filter:
                    metadata = self.serde.loads_typed((row[6], row[7]))
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                out.append(self._tuple(self._latest(conn, row)))
        return iter(out)

    # ------------------------------------------------------------------ writes

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        conf = config["configurable"]
        tid, ns = _text(conf["thread_id"], "thread_id"), _namespace(conf, writing=True)
        parent = conf.get("checkpoint_id")
        dumps = self.serde.dumps_typed
        stripped = dict(checkpoint)
        values: dict[str, Any] = stripped.pop("channel_values", {})  # type: ignore[assignment]
        blobs = []
        raws: builtins.list[tuple[str, str, latest.Blob]] = []
        for channel, version in new_versions.items():
            if channel in values:
                kind, raw = dumps(values[channel])
                blobs.append({"channel": channel, "version": version, **model.encode_blob(kind, raw)})
                raws.append((channel, model.version_key(version), (kind, raw)))
            else:
                blobs.append({"channel": channel, "version": version, "type": "empty", "data": None})
                raws.append((channel, model.version_key(version), ("empty", None)))
        meta = get_checkpoint_metadata(config, metadata)
        ctype, craw = dumps(stripped)
        mtype, mraw = dumps(meta)
        ns = _stored(ns, "checkpoint_ns")
        cid = _stored(_text(checkpoint["id"], "checkpoint.id"), "checkpoint.id", empty=False)
        parent_id = _stored(_text(parent, "checkpoint_id"), "checkpoint_id") if parent else None
        versions = dict(checkpoint.get("channel_versions", {}))
        data: dict[str, Any] = {
            "thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": cid, "parent_checkpoint_id": parent_id,
            "checkpoint": model.encode_blob(ctype, craw), "metadata": model.encode_blob(mtype, mraw),
            "channel_versions": versions, "blobs": blobs,
        }
        for key in ("run_id", "source", "step"):
            value = meta.get(key)
            if isinstance(value, str):
                data[key] = _stored(value, f"metadata.{key}")  # its plain copy: delete_for_runs finds a run by it
            elif key == "step" and isinstance(value, int) and not isinstance(value, bool):
                data[key] = value
        store = self._open()
        sid = model.thread_session(tid)
        # Channel values larger together than one event: the checkpoint's event again with the
        # rest of them, in the same atomic batch (each applies as the one did: rows replaced alike).
        events = [*self._creation(store, tid), *({"type": "langgraph.checkpoint_put", "session": sid,
                                                  "data": {**data, "blobs": part}} for part in _parts(blobs) or [[]])]
        change = latest.Put((tid, ns, cid, parent_id, ctype, craw, mtype, mraw),
                            {str(ch): model.version_key(v) for ch, v in versions.items()}, raws)
        mirror: builtins.list[dict[str, Any]] = []
        if self._mirror and ns == "" and "messages" in new_versions and isinstance(values.get("messages"), builtins.list):
            mirror = self._unmirrored(store, sid, values["messages"])
        if mirror and self._one_batch:
            try:  # the checkpoint and its new messages in one atomic batch: one commit, one sync
                self._write(store, sid, events + [{"type": "message.appended", "session": sid, "data": m}
                                                  for m in mirror], change)
            except ValidationError as e:
                if not e.field.endswith(".type"):
                    raise
                self._one_batch = False  # this store takes session events only through its own methods
        if not mirror or not self._one_batch:
            self._write(store, sid, events, change)
            if mirror:
                store.append_messages(sid, mirror)
                self._forget(sid)
                self._mirrored.pop(sid, None)
        return {"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _unmirrored(self, store: SessionStore, sid: str, messages: builtins.list[Any]) -> builtins.list[dict[str, Any]]:
        """The checkpoint's messages after the newest one already in the thread's session, as valid
        message fields in order (one that does not validate is left out: the checkpoint keeps it)."""
        known = self._mirrored.get(sid)
        if known is None:
            known = self._mirrored[sid] = self._mirror_known(store, sid)
        seen = known.keys
        out: builtins.list[dict[str, Any]] = []
        taken: set[str] = set()
        # From the newest back to the newest one already mirrored: a turn adds at its end.
        for m in reversed(messages):
            fields = message_fields(m)
            if fields is None:
                continue
            key = fields["display_metadata"]["langgraph_id"]
            if key in seen:
                break
            if key in taken:
                continue
            try:
                out.append(make_event("message.appended", sid, fields)["data"])
            except ValidationError:
                continue
            taken.add(key)
        out.reverse()
        return out

    def _mirror_known(self, store: SessionStore, sid: str) -> _Mirror:
        """The messages mirrored into ``sid``, as of the stream's version: from the read model
        once it has applied every event the stream held when its version was read -- brought up
        by a short wait at most -- else from the stream replayed."""
        keys: set[str] = set()
        for attempt in range(3):
            version = store.version(sid)
            if not version:
                return _Mirror(0, set())
            head = store.log.head()[0]  # read after the version: the events it counts are at or below
            with self._thread_reads(store, sid, replay=attempt == 2) as (conn, replay):
                conn.execute("BEGIN")  # one snapshot: the keys and the cursor they are current to
                try:
                    keys = {k for (k,) in conn.execute("SELECT message_key FROM langgraph_messages "
                                                       "WHERE session_id = ?", (sid,))}
                    reached = None if replay is not None else conn.execute(
                        "SELECT value FROM meta WHERE key = ?", (f"ext:{model.NAMESPACE}:seq",)).fetchone()
                finally:
                    conn.execute("COMMIT")
            if replay is not None:
                return _Mirror(replay.n, keys)
            if reached is not None and int(reached[0]) >= head:
                return _Mirror(version, keys)
            if attempt == 0:
                with contextlib.suppress(ProjectionError):
                    store.sync(timeout=READ_WAIT_S)  # a follower of this process short of the head
        return _Mirror(-1, keys)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        self._check_open()
        conf = config["configurable"]
        tid, ns = _text(conf["thread_id"], "thread_id"), _namespace(conf, writing=True)
        rows, raws = [], []
        for idx, (channel, value) in enumerate(writes):
            kind, raw = self.serde.dumps_typed(value)
            i = WRITES_IDX_MAP.get(channel, idx)
            rows.append({"idx": i, "channel": channel, **model.encode_blob(kind, raw)})
            raws.append((i, channel, kind, raw))
        if not rows:
            return
        store = self._open()
        sid = model.thread_session(tid)
        ns = _stored(ns, "checkpoint_ns")
        cid = _stored(_text(conf["checkpoint_id"], "checkpoint_id"), "checkpoint_id", empty=False)
        task = _stored(_text(task_id, "task_id"), "task_id", empty=False)
        path = _stored(_text(task_path, "task_path"), "task_path")
        # Several events in one atomic batch when the writes together outgrow one (each event
        # under the log's limit; a single write too large alone is refused: EventTooLargeError).
        events = [*self._creation(store, tid), *({"type": "langgraph.writes_put", "session": sid, "data": {
            "thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": cid, "task_id": task, "task_path": path,
            "writes": part}} for part in _parts(rows))]
        self._write(store, sid, events, latest.Writes(ns, cid, task, path, raws))

    def _threads_where_in(self, store: SessionStore, column: str, values: builtins.list[str],
                          tables: tuple[str, ...] = ("langgraph_checkpoints",)) -> set[str]:
        """The threads with a row in one of ``tables`` whose ``column`` is one of ``values``. Bound
        one by one (in chunks), not as a JSON array: SQLite's JSON functions cut a text at a NUL,
        and an id with one would silently match nothing."""
        found: set[str] = set()
        with self._reads(store) as conn:
            for i in range(0, len(values), 500):
                chunk = values[i:i + 500]
                marks = ", ".join("?" for _ in chunk)
                for table in tables:
                    found.update(r[0] for r in conn.execute(
                        f"SELECT DISTINCT thread_id FROM {table} WHERE {column} IN ({marks})", chunk))
        return found

    def delete_thread(self, thread_id: str) -> None:
        """Remove the thread's checkpoints and writes from the read model (the log keeps them) and
        rewind its mirrored messages. Never fails for a thread that is gone already: a thread
        whose session was deleted (``eventlog sessions delete``) or erased has nothing left to
        remove; a stream without a session (an earlier release's refused first write) gets the
        deletion of its rows, which needs no session."""
        tid = _text(thread_id, "thread_id")
        store = self._open()
        self._check_erases(store)
        sid = model.thread_session(tid)
        version = store.version(sid)
        if not version:
            return  # never written
        why = self._life(store, sid, version)
        self._forget(sid)
        self._mirrored.pop(sid, None)
        if self._erase_deleted and why != "no session":
            # The erase alone: it takes the checkpoints with the stream (the read model is built
            # again without them), it is one commit, and an erase a process was killed inside
            # is finished by the next one. (A thread_deleted appended first, then the erase,
            # left the thread's words everywhere when a kill fell between the two: outside audit.)
            # A deleted or erased session is erased (again): nothing of it is left after.
            store.erase_session(sid, "EventlogSaver.delete_thread (erase_deleted=True)")
            self._sessions.pop(sid, None)
            return
        deleted = {"type": "langgraph.thread_deleted", "session": sid, "data": {"thread_id": tid}}
        if why == "no session":
            for _ in range(_APPEND_TRIES):
                try:
                    self._append(store, [deleted], version)
                    return
                except ConcurrencyError:
                    now = store.version(sid)
                    if now == version:
                        return  # refused at its own count: erased meanwhile, nothing left
                    version = now
            raise ConcurrencyError(sid, version, store.version(sid))
        if why is not None:
            return  # deleted or erased: the read model holds nothing of it

        def deletion() -> builtins.list[dict[str, Any]]:  # the deletion and the rewind of its transcript
            first = store.get_messages(sid, after=0, limit=1)  # the first active message
            return [deleted, *({"type": "messages.rewound", "session": sid, "data": {"message_id": m["id"]}}
                               for m in first)]

        try:
            self._append_as_read(store, sid, tid, deletion)
        except NotFoundError:
            pass  # deleted or erased meanwhile: nothing left to remove
        self._forget(sid)
        self._mirrored.pop(sid, None)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove every checkpoint (and its writes) whose metadata ``run_id`` is one of ``run_ids``."""
        # LangGraph drops NUL from metadata before a saver sees it (a run "a\x00b" is stored as
        # "ab"), so the ids asked for are matched the same way.
        self._check_open()
        runs = sorted({r.replace("\x00", "") for r in _ids(run_ids, "run_ids")})
        if not runs:
            return
        store = self._open()
        self._check_erases(store)
        # The threads the read model shows (a thread whose session was deleted shows nothing);
        # their own events need no session, so a thread without one is no obstacle either.
        threads = self._threads_where_in(store, "run_id", runs)
        events: builtins.list[dict[str, Any]] = [
            {"type": "langgraph.runs_deleted", "session": model.thread_session(t), "data": {"thread_id": t, "run_ids": runs}}
            for t in sorted(threads)]
        self._append_unless_erased(store, events)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write of one thread to another, and the mirrored
        messages the target does not show yet.

        The rows go into the target's own events (``langgraph.thread_copied`` v2 carries them,
        read from the read model in one snapshot): the copy owes nothing to the source's events,
        so an erase of the source (``erase_deleted``, ``SessionStore.erase_session``,
        ``retention``) or a rebuild of the projections leaves it whole. Messages are matched by
        their LangGraph id against the target's active messages: a target that shows some of the
        source's messages already (an earlier copy) gets only the others, so its transcript holds
        each turn once (both found by an outside audit)."""
        src, dst = _text(source_thread_id, "source_thread_id"), _text(target_thread_id, "target_thread_id")
        store = self._open()
        self._check_erases(store)
        if src == dst:
            return
        src_sid = model.thread_session(src)
        if not store.version(src_sid):
            return  # nothing was ever written to the source
        with self._thread_reads(store, src_sid) as (conn, _):
            conn.execute("BEGIN")  # one snapshot of the source's rows
            try:
                parts = model.copy_parts(conn, src, dst)
            finally:
                conn.execute("COMMIT")
        if not parts:
            return
        dst_sid = model.thread_session(dst)
        copied = [{"type": "langgraph.thread_copied", "session": dst_sid, "data": part} for part in parts]
        keep = ("role", "content", "tool_calls", "tool_name", "tool_call_id", "display_kind", "display_metadata")

        def copy() -> builtins.list[dict[str, Any]]:  # the target's creation, its rows and its transcript
            msgs: builtins.list[dict[str, Any]] = []
            if self._mirror:
                skip: set[str | None] = {None}  # None: not a message the mirror wrote
                skip.update(_mirror_key(m) for m in store.get_messages(dst_sid, limit=None))
                msgs = [{"type": "message.appended", "session": dst_sid,
                         "data": {k: m[k] for k in keep if m.get(k) is not None}}
                        for m in store.get_messages(model.thread_session(src), limit=None) if _mirror_key(m) not in skip]
            return [*self._creation(store, dst), *copied, *msgs]

        self._append_as_read(store, dst_sid, dst, copy)
        self._forget(dst_sid)
        self._mirrored.pop(dst_sid, None)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep only each namespace's newest checkpoint (its writes and the blobs
        it uses); ``delete``: remove every checkpoint. The log keeps everything either way."""
        self._check_open()
        if strategy not in ("keep_latest", "delete"):
            raise ValidationError("strategy", "must be 'keep_latest' or 'delete'")
        tids = sorted(_ids(thread_ids, "thread_ids"))
        if not tids:
            return
        store = self._open()
        self._check_erases(store)
        # "delete" takes every row of the thread, so a thread with pending writes or blobs and no
        # checkpoint left (writes stored before their checkpoint, or after delete_for_runs) is
        # one to prune too: its writes would come back as a later checkpoint's (outside audit).
        tables = ("langgraph_checkpoints",) if strategy == "keep_latest" else _ROW_TABLES
        known = self._threads_where_in(store, "thread_id", tids, tables)
        events: builtins.list[dict[str, Any]] = [
            {"type": "langgraph.thread_pruned", "session": model.thread_session(t),
             "data": {"thread_id": t, "strategy": strategy}} for t in sorted(known)]
        self._append_unless_erased(store, events)

    # ------------------------------------------------------------------ async forms (a worker thread each)
    # A write whose caller is cancelled (a timeout) is awaited to its end before the CancelledError
    # is raised (_shared.settled), as EventlogSession's: the thread is then with it or without it.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await _shared.settled(asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await _shared.settled(asyncio.to_thread(self.put_writes, config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await _shared.settled(asyncio.to_thread(self.delete_thread, thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await _shared.settled(asyncio.to_thread(self.delete_for_runs, run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await _shared.settled(asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await _shared.settled(asyncio.to_thread(self.prune, thread_ids, strategy=strategy))

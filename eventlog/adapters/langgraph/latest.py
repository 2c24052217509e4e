"""The saver's copy of each thread's latest checkpoints, exact as of a stream version.

A LangGraph turn reads the thread's latest checkpoint right after writing it (the next
``invoke`` starts with ``get_tuple``, apps call ``get_state``). The read model answers only after
a catch-up of the writes just made: every event decoded from the log again and applied, about
three times what the write itself cost. So the saver keeps, per thread stream, what the read
model holds for the latest checkpoint of each namespace it has read, tagged with the *stream
version* (the number of events in the thread's stream) for which it is exact:

- **established** by a ``get_tuple`` of the latest checkpoint that went to the read model, when
  the read model's cursor covered the log head read after the version, and the version was
  still the same after the read (so no event of the stream is missing from what was read, and
  none was added);
- **carried forward** by the saver's own ``put``/``put_writes``: they are appended with
  ``expected_version`` = the copy's version, so the log refuses them if anything else reached the
  stream meanwhile (the copy is then dropped and the events appended without it); the copy
  then applies the same rules as :func:`model.apply` to the same data;
- **served** by ``get_tuple`` only while ``store.version(stream)`` (one LMDB lookup) still equals
  its version: a write of another saver or process makes it stale at once.

Operations on a whole thread (delete, prune, copy, runs deleted) and anything uncertain (an
append that failed, a checkpoint whose blobs or writes the copy cannot vouch for) drop the copy:
the next read goes to the read model. The copy holds serialized values, as the read model does;
each read deserializes them anew (callers may mutate what they get).

Events of a thread are always in the thread's stream (the event types refuse any other, see
:mod:`model`), so the stream version covers every event that changes the thread's rows. An
erase rewrites a stream without changing its version: the saver compares the log's erase mark
(:meth:`SessionStore.erase_mark`) on its reads and drops every copy when it moved; its writes
are appended at an expected version, which the log refuses for an erased stream.
"""
from __future__ import annotations

import threading
from typing import Any, Iterable

Blob = tuple[Any, Any]
"""A blob or write value as the read model holds it: (type, raw bytes or None)."""
WriteKey = tuple[str, int]
WriteRow = tuple[Any, Any, Any, Any]
"""(task_path, channel, type, raw bytes) of a pending write, keyed by (task_id, idx)."""


class Latest:
    """The latest checkpoint of one (thread, namespace) as the read model holds it."""

    __slots__ = ("row", "versions", "blobs", "writes")

    def __init__(self, row: tuple[Any, ...], versions: dict[str, str], blobs: dict[str, Blob],
                 writes: dict[WriteKey, WriteRow]) -> None:
        self.row = row
        """(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
        checkpoint, metadata_type, metadata)"""
        self.versions = versions
        """channel -> version key (:func:`model.version_key`), from the checkpoint's channel_versions"""
        self.blobs = blobs
        """channel -> blob row, for each channel of ``versions`` whose row exists"""
        self.writes = writes

    @property
    def checkpoint_id(self) -> str:
        cid: str = self.row[2]
        return cid

    def ordered_writes(self) -> list[tuple[Any, Any, Any, Any]]:
        """(task_id, channel, type, data) in the read model's order: task_path, task_id, idx."""
        def key(item: tuple[WriteKey, WriteRow]) -> tuple[Any, ...]:
            (task_id, idx), (path, _, _, _) = item
            return (path is not None, path or "", task_id, idx)

        return [(task_id, ch, t, d) for (task_id, _), (_, ch, t, d) in sorted(self.writes.items(), key=key)]


class Put:
    """A ``langgraph.checkpoint_put`` as the copy applies it (the saver's own raw values)."""

    __slots__ = ("ns", "row", "versions", "blobs")

    def __init__(self, row: tuple[Any, ...], versions: dict[str, str], blobs: Iterable[tuple[str, str, Blob]]) -> None:
        self.ns: str = row[1]
        self.row = row
        self.versions = versions
        self.blobs = {(ch, vk): b for ch, vk, b in blobs}


class Writes:
    """A ``langgraph.writes_put`` as the copy applies it."""

    __slots__ = ("ns", "checkpoint_id", "task_id", "task_path", "rows")

    def __init__(self, ns: str, checkpoint_id: str, task_id: str, task_path: str,
                 rows: list[tuple[int, str, Any, Any]]) -> None:
        self.ns, self.checkpoint_id, self.task_id, self.task_path, self.rows = ns, checkpoint_id, task_id, task_path, rows


class Space:
    """What the copy knows of one namespace of a thread: its latest checkpoint (None: it has
    none); ``floor``, the greatest checkpoint id that had pending writes when the copy was
    established (None: none), so that every write to a higher id is one the copy saw; and those
    writes of ids above both, kept for when their checkpoint arrives (LangGraph may store a
    task's writes before the checkpoint they belong to is stored)."""

    __slots__ = ("latest", "floor", "ahead")

    def __init__(self, latest: Latest | None, floor: str | None,
                 ahead: dict[str, dict[WriteKey, WriteRow]] | None = None) -> None:
        self.latest = latest
        self.floor = floor
        self.ahead = ahead or {}


class Thread:
    """One thread's copy: a :class:`Space` per namespace known. Immutable: a change makes a new
    object, so a reader never sees half of one."""

    __slots__ = ("version", "spaces")

    def __init__(self, version: int, spaces: dict[str, Space]) -> None:
        self.version = version
        self.spaces = spaces

    def after(self, n: int, change: Put | Writes | None) -> "Thread":
        """The copy after ``n`` more events of the stream, ``change`` the one that touches
        checkpoints (None: messages or a session event only)."""
        spaces = self.spaces
        if change is not None and change.ns in spaces:
            spaces = dict(spaces)
            space = spaces[change.ns]
            fresh = _put(space, change) if isinstance(change, Put) else _writes(space, change)
            if fresh is None:
                del spaces[change.ns]
            else:
                spaces[change.ns] = fresh
        return Thread(self.version + n, spaces)


def _put(space: Space, put: Put) -> Space | None:
    """The namespace after ``put`` (None: the copy cannot tell; forget the namespace)."""
    cid: str = put.row[2]
    latest = space.latest
    if latest is not None and cid < latest.checkpoint_id:
        # Not the newest: only a blob row it replaces can change the latest checkpoint.
        replaced = dict(latest.blobs)
        for (ch, vk), b in put.blobs.items():
            if latest.versions.get(ch) == vk:
                replaced[ch] = b
        return Space(Latest(latest.row, latest.versions, replaced, latest.writes), space.floor, space.ahead)
    if latest is not None and cid == latest.checkpoint_id:
        writes = latest.writes  # the same checkpoint stored again keeps its writes
    elif space.floor is None or cid > space.floor:
        writes = space.ahead.get(cid, {})  # every write to this id is one the copy saw
    else:
        return None  # writes stored before the copy was may belong to it: the read model knows
    blobs: dict[str, Blob] = {}
    for ch, vk in put.versions.items():
        if (ch, vk) in put.blobs:
            blobs[ch] = put.blobs[(ch, vk)]
        elif latest is not None and latest.versions.get(ch) == vk:
            if ch in latest.blobs:
                blobs[ch] = latest.blobs[ch]
        else:
            return None  # a blob row of an older checkpoint the copy never saw
    ahead = {k: v for k, v in space.ahead.items() if k > cid}  # the rest can never be the latest again
    return Space(Latest(put.row, put.versions, blobs, writes), space.floor, ahead)


def _merge(writes: dict[WriteKey, WriteRow], w: Writes) -> dict[WriteKey, WriteRow]:
    out = dict(writes)
    for idx, ch, t, d in w.rows:
        key = (w.task_id, idx)
        if idx >= 0 and key in out:
            continue  # as model._writes: a regular write is stored once, a special one replaced
        out[key] = (w.task_path, ch, t, d)
    return out


def _writes(space: Space, w: Writes) -> Space:
    latest, cid = space.latest, w.checkpoint_id
    if latest is not None and latest.checkpoint_id == cid:
        return Space(Latest(latest.row, latest.versions, latest.blobs, _merge(latest.writes, w)), space.floor,
                     space.ahead)
    if (latest is None or cid > latest.checkpoint_id) and (space.floor is None or cid > space.floor):
        return Space(latest, space.floor, {**space.ahead, cid: _merge(space.ahead.get(cid, {}), w)})
    return space  # writes to a checkpoint that can never be the latest


class Copies:
    """The copies of one saver, by stream, with a lock per stream for the saver's own writes.

    The locks only keep this saver's writes to one thread from refusing each other (two writes
    at the same copy version: the second would fail its expected version); correctness rests on
    the expected version, so the tables may be cleared at any time to bound their size."""

    def __init__(self, limit: int = 1024) -> None:
        self._copies: dict[str, Thread] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._mu = threading.Lock()
        self._limit = limit
        """Threads kept (each holds its latest checkpoints' serialized values): past it, the
        one established or written least recently is dropped."""

    def lock(self, sid: str) -> threading.Lock:
        found = self._locks.get(sid)
        if found is None:
            with self._mu:
                if len(self._locks) >= 4 * self._limit:
                    self._locks.clear()
                found = self._locks.setdefault(sid, threading.Lock())
        return found

    def get(self, sid: str) -> Thread | None:
        return self._copies.get(sid)

    def set(self, sid: str, copy: Thread) -> None:
        """Caller holds ``lock(sid)``."""
        with self._mu:
            self._copies.pop(sid, None)  # to the end: the most recently used
            self._copies[sid] = copy
            if len(self._copies) > self._limit:
                del self._copies[next(iter(self._copies))]

    def clear(self) -> None:
        """Drop every copy (an erase happened: it changes no stream version)."""
        with self._mu:
            self._copies.clear()

    def drop(self, sid: str) -> None:
        with self._mu:
            self._copies.pop(sid, None)

    def establish(self, sid: str, version: int, ns: str, latest: Latest | None, written: str | None) -> None:
        """Record what the read model held for ``(sid, ns)`` at stream ``version``."""
        with self.lock(sid):
            cur = self._copies.get(sid)
            if cur is not None and cur.version == version:
                self.set(sid, Thread(version, {**cur.spaces, ns: Space(latest, written)}))
            elif cur is None or cur.version < version:
                self.set(sid, Thread(version, {ns: Space(latest, written)}))

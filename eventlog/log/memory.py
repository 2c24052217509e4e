"""An in-memory reference log with the same contract as the LMDB log (:class:`eventlog.log.Log`).

It is the executable statement of what a log must do, small enough to read at once; the
contract suite (:mod:`eventlog.log.contract`) runs against it and every other backend. Not
durable, one process only. Handles opened on the same :class:`MemoryStorage` share its events,
as handles of one LMDB environment do.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from eventlog.errors import ConcurrencyError, DuplicateEventError, IntegrityError
from eventlog.log import codec
from eventlog.log.base import (
    LogBase,
    check_erase_seqs,
    check_sealed,
    erasable,
    erase_event,
    named_unerased,
    prepare_batch,
    seq_arg,
    str_arg,
)


class MemoryStorage:
    """The stored events: sealed bytes by seq, ids, streams and the recorded head, under one lock."""

    def __init__(self) -> None:
        self.events: dict[int, bytes] = {}
        self.ids: dict[str, int] = {}
        self.streams: dict[str, list[int]] = {}
        self.head_seq = 0
        self.head = codec.ZERO_HASH
        self.erased_at = 0  # seq of the last log.erased record
        self.lock = threading.Condition()


class MemoryLog(LogBase):
    """A list of sealed events guarded by one lock."""

    def __init__(self, profile: str | None = None, storage: MemoryStorage | None = None) -> None:
        self.path: Path | None = None
        self.profile = profile
        self.durability = "memory"
        self.storage = storage if storage is not None else MemoryStorage()
        self._lock = self.storage.lock
        self._closed = False
        self.commits = 0

    @classmethod
    def open(cls, path: Any = None, **options: Any) -> "MemoryLog":
        return cls(profile=options.get("profile"), storage=options.get("storage"))

    def __enter__(self) -> "MemoryLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def append(self, events: Iterable[Any], expected_version: int | None = None) -> list[int]:
        self._check_open()
        items = prepare_batch(events, expected_version)
        if not items:
            return []
        s = self.storage
        with self._lock:
            self._check_open()
            seqs = [0] * len(items)
            fresh = []
            for i, it in enumerate(items):
                old = s.ids.get(it.id) if it.caller_id else None
                if old is None:
                    fresh.append(i)
                elif not it.same_content(codec.decode(s.events[old])):
                    raise DuplicateEventError(it.id, old)
                else:
                    seqs[i] = old
            if fresh and expected_version is not None:
                session = items[0].session
                stream = s.streams.get(session or "", [])
                actual = len(stream)
                erased = bool(stream) and all(codec.is_stub(codec.decode(s.events[q])) for q in (stream[0], stream[-1]))
                if actual != expected_version or erased:
                    raise ConcurrencyError(session, expected_version, actual)  # an erased stream is not the one counted
            for i in fresh:
                it = items[i]
                seq = s.head_seq = s.head_seq + 1
                raw, s.head = codec.seal(it, seq, time.time_ns(), s.head)
                s.events[seq] = raw
                s.ids[it.id] = seq
                if it.session is not None:
                    s.streams.setdefault(it.session, []).append(seq)
                seqs[i] = seq
            if fresh:
                self.commits += 1
            self._lock.notify_all()
            return seqs

    def append_sealed(self, raws: Sequence[bytes]) -> int:
        self._check_open()
        s = self.storage
        with self._lock:
            seq, prev = s.head_seq, s.head
            staged: list[dict[str, Any]] = []
            for raw in raws:
                env = check_sealed(raw, seq + 1, prev)
                if env["id"] in s.ids or any(e["id"] == env["id"] for e in staged):
                    raise IntegrityError(f"imported event {seq + 1} has an already used id {env['id']!r}")
                staged.append(env)
                seq, prev = seq + 1, env["hash"]
            for raw, env in zip(raws, staged):
                s.events[env["seq"]] = bytes(raw)
                s.ids[env["id"]] = env["seq"]
                if env.get("session") is not None:
                    s.streams.setdefault(env["session"], []).append(env["seq"])
            s.head_seq, s.head = seq, prev
            records = [env for env in staged if env.get("type") == codec.ERASED_TYPE]
            if records:  # as the LMDB log: what they name that the log held whole becomes its stub
                for env in named_unerased(records, lambda q: codec.decode(s.events[q]) if q in s.events else None):
                    s.events[env["seq"]] = codec.canonical(codec.stub(env))
                s.erased_at = max(int(r["seq"]) for r in records)
            self._lock.notify_all()
            return len(staged)

    def erase(self, seqs: Sequence[int], data: dict[str, Any], *, streams: Sequence[str] = ()) -> int:
        """See :meth:`eventlog.log.Log.erase`; nothing is appended (0) when every seq is erased already."""
        self._check_open()
        wanted = check_erase_seqs(seqs)
        s = self.storage
        with self._lock:
            self._check_open()
            wanted = sorted(set(wanted).union(*(s.streams.get(str(name), []) for name in streams)))
            envs = erasable(wanted, lambda q: codec.decode(s.events[q]) if q in s.events else None)
            listed: list[list[Any]] = [[env["seq"], env["hash"]] for env in envs]
            stubs = {env["seq"]: codec.canonical(codec.stub(env)) for env in envs}
            if not listed:
                return 0
            p = codec.prepare(erase_event(listed, data), log_type=True)
            seq = s.head_seq + 1
            raw, digest = codec.seal(p, seq, time.time_ns(), s.head)
            s.events[seq] = raw
            s.ids[p.id] = seq
            s.head_seq, s.head = seq, digest
            s.events.update(stubs)
            s.erased_at = seq
            self._lock.notify_all()
            return seq

    def erase_mark(self) -> int:
        """See :meth:`eventlog.log.lmdb.EventLog.erase_mark`."""
        self._check_open()
        with self._lock:
            return self.storage.erased_at

    def event_seq(self, event_id: str) -> int | None:
        self._check_open()
        str_arg(event_id, "event_id")
        with self._lock:
            return self.storage.ids.get(event_id)

    def head(self) -> tuple[int, str]:
        self._check_open()
        with self._lock:
            return self.storage.head_seq, self.storage.head

    def get(self, seq: int) -> dict[str, Any] | None:
        self._check_open()
        seq_arg(seq, "seq")
        with self._lock:
            raw = self.storage.events.get(seq)
        return None if raw is None else codec.decode(raw)

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        self._check_open()
        seq_arg(from_seq, "from_seq")
        seq_arg(to_seq, "to_seq", optional=True)
        with self._lock:
            stored = self.storage.events
            chunk = sorted((s, v) for s, v in stored.items() if s >= from_seq and (to_seq is None or s <= to_seq))
        for s, v in chunk:
            yield (s, v) if raw else codec.decode(v)

    def stream_version(self, session: str) -> int:
        self._check_open()
        str_arg(session, "session")
        with self._lock:
            return len(self.storage.streams.get(session, []))

    def stream_state(self, session: str) -> tuple[int, int]:
        self._check_open()
        str_arg(session, "session")
        with self._lock:
            return len(self.storage.streams.get(session, [])), self.storage.erased_at

    def read_session(self, session_id: str, *, after: int = 0) -> Iterator[dict[str, Any]]:
        self._check_open()
        session = str_arg(session_id, "session_id")
        after = seq_arg(after, "after")
        with self._lock:
            stored = self.storage.events
            chunk = [stored[s] for s in self.storage.streams.get(session, []) if s > after and s in stored]
        for v in chunk:
            yield codec.decode(v)

    def _wait_appended(self, seconds: float) -> None:
        with self._lock:
            if not self._closed:
                self._lock.wait(seconds)

    def size_bytes(self) -> int:
        with self._lock:
            return sum(len(r) for r in self.storage.events.values())

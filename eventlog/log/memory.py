"""An in-memory reference log with the same contract as the LMDB log (:class:`eventlog.log.Log`).

It is the executable statement of what a log must do, small enough to read at once; the
contract tests run against it and against the LMDB log. Not durable, one process only.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Iterator

from eventlog.errors import ConcurrencyError, DuplicateEventError, IntegrityError
from eventlog.log import codec
from eventlog.log.base import LogBase, prepare_batch


class MemoryLog(LogBase):
    """A list of sealed events guarded by one lock."""

    def __init__(self, profile: str | None = None) -> None:
        self.path = None
        self.profile = profile
        self.durability = "memory"
        self._raw: list[bytes] = []
        self._ids: dict[str, int] = {}
        self._streams: dict[str, list[int]] = {}
        self._head = codec.ZERO_HASH
        self._lock = threading.Condition()
        self._closed = False

    @classmethod
    def open(cls, path: Any = None, **options: Any) -> "MemoryLog":
        return cls(profile=options.get("profile"))

    def __enter__(self) -> "MemoryLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _check(self) -> None:
        self._check_open()

    def append(self, events: Iterable[Any], expected_version: int | None = None) -> list[int]:
        self._check()
        items = prepare_batch(events, expected_version)
        if not items:
            return []
        with self._lock:
            seqs = [0] * len(items)
            fresh = []
            for i, it in enumerate(items):
                old = self._ids.get(it.id) if it.caller_id else None
                if old is None:
                    fresh.append(i)
                elif not it.same_content(codec.decode(self._raw[old - 1])):
                    raise DuplicateEventError(it.id, old)
                else:
                    seqs[i] = old
            if fresh and expected_version is not None:
                session = items[0].session
                actual = len(self._streams.get(session or "", []))
                if actual != expected_version:
                    raise ConcurrencyError(session, expected_version, actual)
            for i in fresh:
                it = items[i]
                seq = len(self._raw) + 1
                raw, self._head = codec.seal(it, seq, time.time_ns(), self._head)
                self._raw.append(raw)
                self._ids[it.id] = seq
                if it.session is not None:
                    self._streams.setdefault(it.session, []).append(seq)
                seqs[i] = seq
            self._lock.notify_all()
            return seqs

    def append_sealed(self, raws: list[bytes]) -> int:
        self._check()
        with self._lock:
            seq, prev = len(self._raw), self._head
            staged: list[dict[str, Any]] = []
            for raw in raws:
                env, reason = codec.check_stored(raw, seq + 1, prev)
                if reason is not None or env is None:
                    raise IntegrityError(f"imported event {seq + 1} does not continue the chain: {reason}")
                if env["id"] in self._ids or any(e["id"] == env["id"] for e in staged):
                    raise IntegrityError(f"imported event {seq + 1} has an already used id {env['id']!r}")
                staged.append(env)
                seq, prev = seq + 1, env["hash"]
            for raw, env in zip(raws, staged):
                self._raw.append(raw)
                self._ids[env["id"]] = env["seq"]
                if env.get("session") is not None:
                    self._streams.setdefault(env["session"], []).append(env["seq"])
            self._head = prev
            self._lock.notify_all()
            return len(staged)

    def event_seq(self, event_id: str) -> int | None:
        with self._lock:
            return self._ids.get(event_id)

    def head(self) -> tuple[int, str]:
        self._check()
        with self._lock:
            return len(self._raw), self._head

    def get(self, seq: int) -> dict[str, Any] | None:
        self._check()
        with self._lock:
            return codec.decode(self._raw[seq - 1]) if 1 <= seq <= len(self._raw) else None

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        self._check()
        with self._lock:
            stop = len(self._raw) if to_seq is None else min(to_seq, len(self._raw))
            chunk = [(s, self._raw[s - 1]) for s in range(max(1, from_seq), stop + 1)]
        for s, v in chunk:
            yield (s, v) if raw else codec.decode(v)

    def stream_version(self, session: str) -> int:
        self._check()
        with self._lock:
            return len(self._streams.get(session, []))

    def read_session(self, session: str) -> Iterator[dict[str, Any]]:
        self._check()
        with self._lock:
            chunk = [self._raw[s - 1] for s in self._streams.get(session, [])]
        for v in chunk:
            yield codec.decode(v)

    def _wait_appended(self, seconds: float) -> None:
        with self._lock:
            if not self._closed:
                self._lock.wait(seconds)

    def size_bytes(self) -> int:
        with self._lock:
            return sum(len(r) for r in self._raw)

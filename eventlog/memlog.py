"""An in-memory reference log with the same contract as :class:`eventlog.log.EventLog`.

It is the executable statement of what a log must do, small enough to read at once; the
contract tests run against it and against the LMDB log. Not durable, one process only.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Iterator

from eventlog import codec
from eventlog.errors import ClosedError, ConcurrencyError, DuplicateEventError, IntegrityError, ValidationError
from eventlog.log import VerifyResult


class MemoryLog:
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
        if self._closed:
            raise ClosedError("the event log is closed")

    def append(self, events: Iterable[Any], expected_version: int | None = None) -> list[int]:
        self._check()
        items = [codec.prepare(e, i) for i, e in enumerate(events)]
        if not items:
            return []
        if len({it.id for it in items}) != len(items):
            raise ValidationError("events.id", "the same event id appears twice in one batch")
        if expected_version is not None:
            if type(expected_version) is not int or expected_version < 0:
                raise ValidationError("expected_version", "must be a non-negative integer")
            streams = {it.session for it in items}
            if len(streams) != 1 or None in streams:
                raise ValidationError("expected_version", "needs a batch whose events all belong to one session")
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

    def follow(self, from_seq: int = 1, timeout: float | None = None, *, poll: float = 0.02) -> Iterator[dict[str, Any]]:
        nxt = max(1, from_seq)
        while True:
            with self._lock:
                if self._closed:
                    return
                if nxt > len(self._raw) and not self._lock.wait_for(
                    lambda: self._closed or nxt <= len(self._raw), timeout
                ):
                    return
                if self._closed:
                    return
                batch = self._raw[nxt - 1:]
            for v in batch:
                env = codec.decode(v)
                nxt = env["seq"] + 1
                yield env

    def verify(self) -> VerifyResult:
        self._check()
        with self._lock:
            raws, head = list(self._raw), self._head
        prev = codec.ZERO_HASH
        for seq, raw in enumerate(raws, 1):
            env, reason = codec.check_stored(raw, seq, prev)
            if reason is not None:
                return VerifyResult(False, seq - 1, len(raws), head, seq, reason)
            assert env is not None
            prev = env["hash"]
        if prev != head:
            return VerifyResult(False, len(raws), len(raws), head, len(raws), "recorded head does not match the last event")
        return VerifyResult(True, len(raws), len(raws), head, None, None)

    def size_bytes(self) -> int:
        with self._lock:
            return sum(len(r) for r in self._raw)

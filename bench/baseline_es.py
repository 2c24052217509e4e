"""Baseline B: the ``eventsourcing`` library (PyPI) with its SQLite persistence.

Configured the documented way, through environment variables read when the
Application is constructed:

    PERSISTENCE_MODULE=eventsourcing.sqlite
    SQLITE_DBNAME=<dir>/es.db       (a file: the library switches it to WAL)
    SQLITE_LOCK_TIMEOUT=30          (seconds; the sqlite3 busy timeout)

One ``Session`` aggregate per session (its id is a UUID derived from the
session id), created on first use and saved together with its first message; a
``MessageAppended`` event per message.  The library's SQLite connections use
SQLite's default ``synchronous`` (FULL, checked and reported), so each save is
one durable transaction.

Modes: one event per call (trigger + ``save``), batches of up to 100 messages of
one session per ``save``, and 8 threads sharing one Application, each thread
owning its own aggregates (the library's connection pool serialises writers with
its own lock).
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from bench.common import drive_single, drive_threads, make_result, perf, scale_record

LOCK_TIMEOUT_S = 30


class Session(Aggregate):
    """The session stream; it keeps counters only, like a runtime's session row."""

    @staticmethod
    def create_id(session_id: str, source: str) -> UUID:  # type: ignore[override]
        return uuid5(NAMESPACE_URL, "eventlog-bench:" + session_id)

    @event("Created")
    def __init__(self, session_id: str, source: str) -> None:
        self.session_id = session_id
        self.source = source
        self.message_count = 0
        self.tool_call_count = 0

    @event("MessageAppended")
    def append_message(
        self,
        role: str,
        content: str,
        tool_calls: list[dict[str, Any]] | None,
        tool_name: str | None,
        tool_call_id: str | None,
        reasoning: str | None,
        token_count: int,
    ) -> None:
        self.message_count += 1
        self.tool_call_count += len(tool_calls) if tool_calls else 0


class SessionApp(Application):
    name = "BenchSessions"


def open_app(dir: str) -> SessionApp:
    db = str(Path(dir) / "es.db")
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "SQLITE_DBNAME": db,
        "SQLITE_LOCK_TIMEOUT": str(LOCK_TIMEOUT_S),
    }
    # The documented interface is the process environment; set it too so the
    # configuration is visible to anything else the library constructs.
    os.environ.update(env)
    return SessionApp(env=env)


def close_app(app: SessionApp, dir: str) -> dict[str, int]:
    """Close the application, then checkpoint any WAL its pool left behind so the
    on-disk size measured is the database's own."""
    app.close()
    db = Path(dir) / "es.db"
    wal = Path(str(db) + "-wal")
    left = wal.stat().st_size if wal.exists() else 0
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return {"wal_left_behind_bytes": left}


def synchronous_setting(app: SessionApp) -> str:
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    try:
        with app.factory.datastore.transaction(commit=False) as c:  # type: ignore[attr-defined]
            c.execute("PRAGMA synchronous")
            v = c.fetchone()[0]
            c.execute("PRAGMA journal_mode")
            jm = c.fetchone()[0]
        return f"{names.get(v, v)} (journal_mode={jm})"
    except Exception as e:  # noqa: BLE001 - informational
        return f"unknown ({e})"


def _trigger(agg: Session, m: dict[str, Any]) -> None:
    agg.append_message(m["role"], m["content"], m["tool_calls"], m["tool_name"], m["tool_call_id"],
                       m["reasoning"], m["token_count"])


class _Store:
    def __init__(self, app: SessionApp) -> None:
        self.app = app
        self.aggs: dict[str, Session] = {}

    def agg(self, sid: str) -> Session:
        a = self.aggs.get(sid)
        if a is None:
            a = Session(session_id=sid, source="bench")  # Created is pending; saved with the first message
            self.aggs[sid] = a
        return a

    def append(self, m: dict[str, Any]) -> None:
        a = self.agg(m["session_id"])
        _trigger(a, m)
        self.app.save(a)

    def append_batch(self, batch: tuple[str, list[dict[str, Any]]]) -> None:
        sid, msgs = batch
        a = self.agg(sid)
        for m in msgs:
            _trigger(a, m)
        self.app.save(a)

    def events(self) -> int:
        # created events + message events
        return len(self.aggs) + sum(a.message_count for a in self.aggs.values())


def _extra(app: SessionApp, store: _Store, **kw: Any) -> dict[str, Any]:
    return {"sessions": len(store.aggs), "synchronous": synchronous_setting(app),
            "lock_timeout_s": LOCK_TIMEOUT_S, **kw}


def single(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    app = open_app(dir)
    store = _Store(app)
    st = drive_single(workload.chunks(opts.get("chunk", 5000)), store.append, budget=opts.get("budget"))
    extra = _extra(app, store)
    events = store.events()
    extra.update(close_app(app, dir))
    return make_result("baseline_es.single", st, dir, events=events, extra=extra)


def batch100(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    app = open_app(dir)
    store = _Store(app)
    st = drive_single(workload.batch_chunks(100, opts.get("chunk", 5000)), store.append_batch,
                      count=lambda b: len(b[1]), budget=opts.get("budget"))
    extra = _extra(app, store, mean_batch=round(st.messages / max(1, st.items), 1))
    events = store.events()
    extra.update(close_app(app, dir))
    return make_result("baseline_es.batch100", st, dir, events=events, extra=extra, unit="batch")


def threads8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    n = opts.get("threads", 8)
    app = open_app(dir)
    store = _Store(app)  # shared; every session belongs to exactly one thread
    st = drive_threads(workload.chunks(opts.get("chunk", 5000)), lambda i: store.append, threads=n,
                       budget=opts.get("budget"))
    extra = _extra(app, store, threads=n)
    events = store.events()
    extra.update(close_app(app, dir))
    return make_result(f"baseline_es.threads{n}", st, dir, events=events, extra=extra)


def scale_point(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """Prefill in batches, then ``probe`` single saves (latency) and a full replay
    of every stored event through the notification log (read + decode: what a
    projection rebuild from this store costs).  No full-text search exists here."""
    probe = opts.get("probe", 2000)
    size = workload.n_messages - probe
    app = open_app(dir)
    store = _Store(app)
    t0 = perf()
    for batch in workload.batches(100, stop=size):
        store.append_batch(batch)
    prefill_s = perf() - t0
    st = drive_single(workload.chunks(probe, size, size + probe), store.append)
    t0 = perf()
    replayed = 0
    start = 1
    while True:
        notes = app.recorder.select_notifications(start=start, limit=1000)
        if not notes:
            break
        for n in notes:
            app.mapper.to_domain_event(n)
        replayed += len(notes)
        start = notes[-1].id + 1
    rebuild_s = perf() - t0
    close_app(app, dir)
    lat = st.rec.summary()
    res = make_result("baseline_es.scale", st, dir, extra={"size": size})
    total = size + st.messages
    res["scale"] = scale_record(size, prefill_s, lat, rebuild_s, replayed,
                                "read + decode every stored event in notification order", None,
                                res["disk_bytes"], total)
    return res

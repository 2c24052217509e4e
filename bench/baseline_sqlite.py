"""Baseline A: the SQLite session store agent runtimes use today, written here.

One ``state.db`` in WAL mode with ``synchronous=FULL``; a ``sessions`` table with
counters and last activity, a ``messages`` table, and an external-content FTS5
index over ``messages.content`` kept in sync by AFTER INSERT/DELETE/UPDATE
triggers.  Every message is its own ``BEGIN IMMEDIATE`` transaction that creates
the session row on first use, inserts the message and bumps the session's
counters and ``last_activity_at``.

Concurrency as such runtimes do it: each thread has its own connection with
``busy_timeout = 0`` and retries "database is locked" at the application level
after a jittered sleep (20-150 ms, as commonly shipped); every retry is counted.
Retries never give up here (so every message lands), but calls that needed more
than ``RUNTIME_MAX_RETRIES`` are counted as the writes a runtime with that cap
would have lost.
"""
from __future__ import annotations

import json
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

from bench.common import Recorder, drive_single, drive_threads, make_result, perf, scale_record

RETRY_MIN_S = 0.020
RETRY_MAX_S = 0.150
RUNTIME_MAX_RETRIES = 15

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    title TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER NOT NULL DEFAULT 0,
    tool_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    last_activity_at REAL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    tool_call_id TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT
);
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);
CREATE INDEX IF NOT EXISTS idx_sessions_activity ON sessions(last_activity_at DESC);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages', content_rowid='id'
);
CREATE TRIGGER IF NOT EXISTS messages_fts_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_au AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""

INSERT_SESSION = "INSERT OR IGNORE INTO sessions (id, source, started_at, last_activity_at) VALUES (?, ?, ?, ?)"
INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, role, content, tool_calls, tool_name, tool_call_id, "
    "timestamp, token_count, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
BUMP_SESSION = (
    "UPDATE sessions SET message_count = message_count + 1, tool_call_count = tool_call_count + ?, "
    "last_activity_at = ? WHERE id = ?"
)
SEARCH = (
    "SELECT m.id, m.session_id, snippet(messages_fts, 0, '[', ']', '...', 12) "
    "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
    "WHERE messages_fts MATCH ? ORDER BY rank LIMIT 20"
)


def connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=True, timeout=busy_timeout_ms / 1000)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def init_db(path: Path) -> None:
    conn = connect(path, 5000)
    conn.executescript(SCHEMA)
    conn.close()


def _is_busy(e: sqlite3.OperationalError) -> bool:
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


class Writer:
    """One connection; ``append(msg)`` is one durable BEGIN IMMEDIATE transaction."""

    def __init__(self, path: Path, busy_timeout_ms: int, seed: int = 0) -> None:
        self.conn = connect(path, busy_timeout_ms)
        self.known: set[str] = set()
        self.retries = 0
        self.calls_over_cap = 0
        self.max_retries_one_call = 0
        self.rng = random.Random(seed)

    def _txn(self, msg: dict[str, Any]) -> None:
        c = self.conn
        now = time.time()
        sid = msg["session_id"]
        c.execute("BEGIN IMMEDIATE")
        try:
            if sid not in self.known:
                c.execute(INSERT_SESSION, (sid, "bench", now, now))
            tool_calls = msg["tool_calls"]
            c.execute(INSERT_MESSAGE, (
                sid, msg["role"], msg["content"],
                json.dumps(tool_calls) if tool_calls else None,
                msg["tool_name"], msg["tool_call_id"], now, msg["token_count"], msg["reasoning"],
            ))
            c.execute(BUMP_SESSION, (len(tool_calls) if tool_calls else 0, now, sid))
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        self.known.add(sid)

    def append(self, msg: dict[str, Any]) -> None:
        tries = 0
        while True:
            try:
                self._txn(msg)
                break
            except sqlite3.OperationalError as e:
                if not _is_busy(e):
                    raise
                tries += 1
                time.sleep(self.rng.uniform(RETRY_MIN_S, RETRY_MAX_S))
        if tries:
            self.retries += tries
            self.max_retries_one_call = max(self.max_retries_one_call, tries)
            if tries > RUNTIME_MAX_RETRIES:
                self.calls_over_cap += 1

    def close(self) -> None:
        self.conn.close()


def settle(path: Path) -> dict[str, int]:
    """After every writer has closed: how much WAL was left behind (a close that
    races another connection's lock skips its checkpoint), then checkpoint it so
    the on-disk size measured is the database's own."""
    wal = Path(str(path) + "-wal")
    left = wal.stat().st_size if wal.exists() else 0
    conn = connect(path, 5000)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return {"wal_left_behind_bytes": left}


def _db(dir: str) -> Path:
    p = Path(dir) / "state.db"
    init_db(p)
    return p


def single(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    path = _db(dir)
    w = Writer(path, busy_timeout_ms=0)
    st = drive_single(workload.chunks(opts.get("chunk", 5000)), w.append, budget=opts.get("budget"))
    extra = {"busy_retries": w.retries, "journal_mode": "wal", "synchronous": "FULL"}
    w.close()
    extra.update(settle(path))
    return make_result("baseline_sqlite.single", st, dir, extra=extra)


def threads8(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    path = _db(dir)
    n = opts.get("threads", 8)
    writers: list[Writer | None] = [None] * n

    def make_worker(i: int) -> Any:
        writers[i] = Writer(path, busy_timeout_ms=0, seed=1000 + i)
        return writers[i].append

    def finish(i: int) -> None:
        if writers[i] is not None:
            writers[i].close()

    st = drive_threads(workload.chunks(opts.get("chunk", 5000)), make_worker, threads=n,
                       finish_worker=finish, budget=opts.get("budget"))
    ws = [w for w in writers if w is not None]
    extra = {
        "threads": n,
        "busy_retries": sum(w.retries for w in ws),
        "max_retries_one_call": max((w.max_retries_one_call for w in ws), default=0),
        f"calls_over_{RUNTIME_MAX_RETRIES}_retries": sum(w.calls_over_cap for w in ws),
        "retry_sleep_s": [RETRY_MIN_S, RETRY_MAX_S],
        "busy_timeout_ms": 0,
        **settle(path),
    }
    return make_result(f"baseline_sqlite.threads{n}", st, dir, extra=extra)


def scale_point(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """Prefill ``workload.n_messages - probe`` messages in large transactions
    (untimed for the curve), then: ``probe`` single durable appends (latency), a
    full FTS reindex (``'rebuild'``, the only rebuild this store has), and FTS
    searches."""
    probe = opts.get("probe", 2000)
    size = workload.n_messages - probe
    path = _db(dir)
    w = Writer(path, busy_timeout_ms=0)
    c = w.conn
    t0 = perf()
    now = time.time()
    for chunk in workload.chunks(10000, 0, size):
        c.execute("BEGIN IMMEDIATE")
        for msg in chunk:
            sid = msg["session_id"]
            if sid not in w.known:
                c.execute(INSERT_SESSION, (sid, "bench", now, now))
                w.known.add(sid)
            tc = msg["tool_calls"]
            c.execute(INSERT_MESSAGE, (sid, msg["role"], msg["content"], json.dumps(tc) if tc else None,
                                       msg["tool_name"], msg["tool_call_id"], now, msg["token_count"],
                                       msg["reasoning"]))
            c.execute(BUMP_SESSION, (len(tc) if tc else 0, now, sid))
        c.execute("COMMIT")
    prefill_s = perf() - t0
    st = drive_single(workload.chunks(probe, size, size + probe), w.append)
    t0 = perf()
    c.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
    rebuild_s = perf() - t0
    srec = Recorder()
    for term in workload.search_terms(opts.get("searches", 100)):
        t0 = perf()
        c.execute(SEARCH, (term,)).fetchall()
        srec.add(perf() - t0)
    w.close()
    settle(path)
    lat = st.rec.summary()
    s = srec.summary()
    total = size + st.messages
    res = make_result("baseline_sqlite.scale", st, dir, extra={"size": size})
    res["scale"] = scale_record(size, prefill_s, lat, rebuild_s, total, "FTS5 'rebuild' of messages_fts", s,
                                res["disk_bytes"], total)
    return res


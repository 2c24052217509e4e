"""The bare rebuild: the floor under eventlog's full rebuild (issue 4 figure).

``baseline_bare_rebuild.scale`` takes eventlog's own projection schema
(``projections.schema.STATE_DDL`` + ``FTS_TABLES``: sessions, messages with their indexes,
and the search index: a contentless word index over the message rows plus a trigram index over
its vocabulary), inserts the *same rows* a rebuild of the same workload produces -- one
``sessions`` row per session with its final counters, one ``messages`` row per message -- with
``executemany``, then builds the index from those rows with the index's own bulk statements
(one ``INSERT … SELECT`` into the word index, then the vocabulary and its trigram index:
``projections.fts.Bulk``) and fsyncs the file.  Same bulk pragmas as eventlog's builder (no journal, synchronous off,
64 MiB cache).

Everything that is not SQLite is done *outside* the clock: the rows (including the JSON of
``tool_calls`` and the search text) are materialised 5,000 messages at a time before they are
timed, so this is the most favourable case for the baseline.  The clock covers the
``executemany`` calls, the FTS ``'rebuild'``, the commit and the fsync.  Events counted as for
eventlog's rebuild: one ``session.created`` per session plus one ``message.appended`` per
message.
"""
from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

import orjson

from bench.common import Recorder, RunStats, make_result, peak_rss_mb, perf

PROFILE = "bench"


class ContenderUnavailable(RuntimeError):
    pass


_MESSAGE_COLS = ("id", "session_id", "role", "content", "content_json", "tool_calls", "tool_name",
                 "tool_call_id", "timestamp", "token_count", "finish_reason", "reasoning",
                 "reasoning_details", "display_kind", "display_metadata", "active", "n_tool_calls")
_INSERT_MESSAGE = (f"INSERT INTO messages ({', '.join(_MESSAGE_COLS)}) "
                   f"VALUES ({', '.join('?' * len(_MESSAGE_COLS))})")
_SESSION_COLS = ("id", "source", "started_at", "last_activity_at", "message_count", "tool_call_count",
                 "archived", "pinned", "hidden", "profile_name", "created_seq")
_INSERT_SESSION = (f"INSERT INTO sessions ({', '.join(_SESSION_COLS)}) "
                   f"VALUES ({', '.join('?' * len(_SESSION_COLS))})")


def _schema() -> list[str]:
    try:
        from projections.schema import FTS_TABLES, STATE_DDL
    except ImportError as e:
        raise ContenderUnavailable(f"`from projections.schema import STATE_DDL, FTS_TABLES` failed: {e}") from e
    return [*STATE_DDL, *FTS_TABLES]


def _rows(chunk: list[dict[str, Any]], seq: int, sessions: dict[str, list[Any]], now: float
          ) -> tuple[list[tuple[Any, ...]], int]:
    """Message rows of one chunk, as eventlog's Applier writes them; sessions (first seen
    here) get a seq for their ``session.created`` and their counters are bumped."""
    msgs: list[tuple[Any, ...]] = []
    for m in chunk:
        sid = m["session_id"]
        c = sessions.get(sid)
        if c is None:
            seq += 1
            c = sessions[sid] = [now, now, 0, 0, seq]  # started_at, last_activity_at, count, tool calls, seq
        seq += 1
        calls = m["tool_calls"]
        calls_text = orjson.dumps(calls).decode() if calls is not None else None
        n_calls = len(calls) if calls else 0
        content = m["content"]
        msgs.append((seq, sid, m["role"], content, 0, calls_text, m["tool_name"], m["tool_call_id"], now,
                     m["token_count"], None, m["reasoning"], None, None, None, 1, n_calls))
        c[1] = now
        c[2] += 1
        c[3] += n_calls
    return msgs, seq


def scale_point(workload: Any, dir: str, **opts: Any) -> dict[str, Any]:
    """All ``n_messages`` of the workload (= eventlog.scale's prefill + probe at this size)."""
    probe = opts.get("probe", 2000)
    size = workload.n_messages - probe
    ddl = _schema()
    path = os.path.join(dir, "state.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -65536")
    conn.execute("PRAGMA temp_store = MEMORY")
    for stmt in ddl:
        conn.execute(stmt)
    sessions: dict[str, list[Any]] = {}
    seq = 0
    now = time.time()
    rec = Recorder()  # timed SQLite work per chunk
    insert_s = 0.0
    messages = 0
    conn.execute("BEGIN")
    for chunk in workload.chunks(opts.get("chunk", 5000)):
        msgs, seq = _rows(chunk, seq, sessions, now)  # untimed
        t0 = perf()
        conn.executemany(_INSERT_MESSAGE, msgs)
        dt = perf() - t0
        rec.add(dt)
        insert_s += dt
        messages += len(chunk)
    srows = [(sid, "bench", c[0], c[1], c[2], c[3], 0, 0, 0, PROFILE, c[4]) for sid, c in sessions.items()]
    t0 = perf()
    conn.executemany(_INSERT_SESSION, srows)
    t1 = perf()
    from projections import fts

    fts.register(conn)
    bulk = fts.Bulk(conn)
    bulk.add_from(f"SELECT id, {fts.INDEXED_VALUES} FROM messages")
    bulk.finish()
    t2 = perf()
    conn.execute("COMMIT")
    conn.close()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    t3 = perf()
    insert_s += t1 - t0
    fts_s = t2 - t1
    total_s = insert_s + (t3 - t1)
    events = messages + len(sessions)
    st = RunStats()
    st.rec = rec
    st.messages = messages
    st.items = messages
    st.seconds = total_s
    res = make_result("baseline_bare_rebuild.scale", st, dir, events=events, extra={
        "size": size, "insert_s": round(insert_s, 4), "fts_rebuild_s": round(fts_s, 4),
        "commit_fsync_s": round(t3 - t2, 4), "sessions": len(sessions)})
    res["scale"] = {
        "size": size,
        "prefill_s": None,
        "append_p50_ms": None,
        "append_p99_ms": None,
        "rebuild_s": round(total_s, 4),
        "rebuild_events": events,
        "rebuild_events_per_s": round(events / total_s, 1) if total_s else None,
        "rebuild_peak_rss_mb": peak_rss_mb(),
        "rebuild_what": "executemany of the same rows into eventlog's schema + the index's bulk build + fsync",
        "insert_s": round(insert_s, 4),
        "fts_rebuild_s": round(fts_s, 4),
        "search_p50_ms": None,
        "search_p99_ms": None,
        "disk_bytes_per_message": round(res["disk_bytes"] / messages, 1) if messages else None,
    }
    return res

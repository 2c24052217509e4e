"""Builders of Hermes-Agent-like ``state.db`` files for the migration tests.

Two shapes: the current column set (with the external-content FTS5 index and its triggers, as
Hermes keeps it) and an older one (fewer columns, the legacy inline FTS5 table). Both carry
damaged rows of the kinds found in real installations.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

CURRENT_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, session_key TEXT, chat_id TEXT,
    chat_type TEXT, thread_id TEXT, model TEXT, model_config TEXT, system_prompt TEXT,
    parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL, end_reason TEXT,
    message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0, cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0, cwd TEXT, git_branch TEXT, git_repo_root TEXT,
    billing_provider TEXT, estimated_cost_usd REAL, actual_cost_usd REAL, title TEXT,
    title_source TEXT, last_activity_at REAL, archived INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0, hidden INTEGER NOT NULL DEFAULT 0, tool_names TEXT,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
    timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT, reasoning TEXT,
    reasoning_content TEXT, reasoning_details TEXT, codex_reasoning_items TEXT,
    active INTEGER NOT NULL DEFAULT 1, compacted INTEGER NOT NULL DEFAULT 0, api_content TEXT,
    display_kind TEXT, display_metadata TEXT
);
CREATE INDEX idx_messages_session_id ON messages(session_id, id);
CREATE VIEW messages_fts_src AS
    SELECT id, CASE WHEN role = 'tool' THEN substr(COALESCE(content, ''), 1, 8192) ELSE content END
           AS content, tool_name, tool_calls
    FROM messages;
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, tool_name, tool_calls, content='messages_fts_src', content_rowid='id');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END;
CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, tokenize='trigram');
CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id, COALESCE(new.content, ''));
END;
"""

LEGACY_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT, model TEXT, started_at REAL, ended_at REAL,
    end_reason TEXT, parent_session_id TEXT, title TEXT, input_tokens INTEGER,
    output_tokens INTEGER
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT, content TEXT,
    tool_calls TEXT, tool_name TEXT, tool_call_id TEXT, timestamp REAL, token_count INTEGER
);
CREATE VIRTUAL TABLE messages_fts USING fts5(content);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id, COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
        || COALESCE(new.tool_calls, ''));
END;
"""

T0 = 1_735_725_600.0  # 2025-01-01T10:00:00Z
S1, S2, S3, S4 = "20250101_100000_aaaa", "20250101_110000_bbbb", "tg-chat:42", "cron_job.daily"
S5 = "weird id/with spaces"
S6, S7 = "parent-late", "child-early"
SENTINEL = "\x00json:"


def _insert(conn: sqlite3.Connection, table: str, **values: object) -> int:
    cols = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    cur = conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(values.values()))
    return int(cur.lastrowid or 0)


def call(name: str, args: dict[str, object], call_id: str = "call_1") -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def make_current(path: Path, *, wal: bool = False) -> dict[str, object]:
    """A current-schema state.db; returns facts the tests check against."""
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(CURRENT_SCHEMA)
    conn.execute("INSERT INTO schema_version VALUES (30)")
    rows: dict[str, int] = {}
    with conn:
        _insert(conn, "sessions", id=S1, source="cli", model="claude-x",
                model_config=json.dumps({"temperature": 0.2}), title="Fix the parser",
                title_source="user", started_at=T0, ended_at=T0 + 3600, end_reason="compression",
                cwd="/home/u/proj", git_repo_root="/home/u/proj", git_branch="main",
                input_tokens=1000, output_tokens=500, cache_read_tokens=100, cache_write_tokens=50,
                reasoning_tokens=20, estimated_cost_usd=0.12, actual_cost_usd=None,
                billing_provider="anthropic", tool_names=json.dumps(["terminal", "web_search"]))
        # Child (compression continuation): double-encoded model_config, inherits cwd.
        _insert(conn, "sessions", id=S2, source="cli", model="claude-x",
                model_config=json.dumps(json.dumps({"temperature": 0.3})), title="Fix the parser #2",
                title_source="branch", parent_session_id=S1, started_at=T0 + 3600)
        # Archived; TEXT started_at (ISO); invalid model_config.
        _insert(conn, "sessions", id=S3, source="telegram", user_id="42", chat_id="-1001",
                chat_type="group", title="Groceries", started_at="2025-01-02 08:00:00",
                model_config="not json {", archived=1, input_tokens="lots")
        # Pinned; duplicate title; 1e30 started_at; model_config not an object.
        _insert(conn, "sessions", id=S4, source="cron", title="Groceries", started_at=1e30,
                model_config="[1, 2]", pinned=1, ended_at="whenever", end_reason=None)
        # An id that does not fit the id pattern.
        _insert(conn, "sessions", id=S5, source="cli", title="Odd one", started_at=T0 + 100)
        # A child that started before its parent: the parent must still come first.
        _insert(conn, "sessions", id=S6, source="cli", started_at=T0 + 9000, hidden=1)
        _insert(conn, "sessions", id=S7, source="cli", parent_session_id=S6, started_at=T0 + 50)

        m = lambda key, **kw: rows.__setitem__(key, _insert(conn, "messages", **kw))  # noqa: E731
        m("m1", session_id=S1, role="user", content="Please fix the tokenizer bug", timestamp=T0 + 1)
        m("m2", session_id=S1, role="assistant", content=None, reasoning="Let me run the tests",
          tool_calls=json.dumps([call("terminal", {"cmd": "pytest -q"})]), timestamp=T0 + 2,
          token_count=42, finish_reason="tool_calls")
        m("m3", session_id=S1, role="tool", tool_name="terminal", tool_call_id="call_1",
          content="3 passed", timestamp=T0 + 3)
        m("m4", session_id=S1, role="assistant", content="Fixed the zebra tokenizer", timestamp=T0 + 4,
          display_metadata=json.dumps({"reactions": {"user": "+1"}}))
        # /undo: two rewound rows, then the conversation continues.
        m("m15", session_id=S1, role="user", content="undo me please", timestamp=T0 + 5, active=0)
        m("m16", session_id=S1, role="assistant", content="an undone reply", timestamp=T0 + 6, active=0)
        m("m17", session_id=S1, role="user", content="after the undo", timestamp=T0 + 7)

        parts = [{"type": "text", "text": "what is in this picture of a giraffe"},
                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
        m("m5", session_id=S2, role="user", content=SENTINEL + json.dumps(parts), timestamp=T0 + 3601)
        m("m6", session_id=S2, role="assistant", timestamp=T0 + 3602,
          tool_calls=json.dumps(json.dumps([call("web_search", {"q": "giraffe"}, "call_2")])))
        m("m7", session_id=S2, role="assistant", content="broken calls", timestamp=T0 + 3603,
          tool_calls='{"broken')
        m("m8", session_id=S2, role="assistant", content="meta twice", timestamp=T0 + 3604,
          display_metadata=json.dumps(json.dumps({"kind": "note"})))
        m("m9", session_id=S2, role="assistant", content="meta invalid", timestamp=T0 + 3605,
          display_metadata="{nope")
        m("m18", session_id=S2, role="user", content="compacted but visible", timestamp=T0 + 3606,
          active=0, compacted=1)

        m("m10", session_id=S3, role="user", content="buy milk", timestamp="yesterday")
        m("m11", session_id=S3, role="user", content="buy eggs", timestamp=1e30)
        m("m12", session_id=S3, role="assistant", content="noted", timestamp=-5)
        m("m13", session_id=S3, role="robot", content="beep", timestamp=T0 + 10)
        m("m14", session_id=S3, role="user", timestamp=T0 + 11,
          content=json.dumps([{"type": "text", "text": "double encoded parts"}]))
        m("m21", session_id=S3, role="assistant", content="count me", timestamp=T0 + 12,
          token_count="abc")

        m("m19", session_id="ghost-session", role="user", content="orphan row", timestamp=T0 + 20)
        m("m20", session_id=S5, role="user", content="hello from the weird id", timestamp=T0 + 101)
        m("m22", session_id=S7, role="user", content="early child speaks", timestamp=T0 + 51)
    conn.close()
    return {"rows": rows, "sessions": 7, "messages_ok": 20, "orphans": 1, "bad_roles": 1}


def make_legacy(path: Path) -> dict[str, object]:
    """An older state.db: fewer columns, no NOT NULL on role, the inline FTS5 table."""
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    rows: dict[str, int] = {}
    with conn:
        _insert(conn, "sessions", id="old-1", source="cli", model="gpt-4", started_at=T0,
                title="Legacy chat", ended_at=T0 + 60, input_tokens=10, output_tokens=20)
        _insert(conn, "sessions", id="old-2", source=None, started_at=T0 + 10, parent_session_id="gone",
                end_reason="user_exit")
        m = lambda key, **kw: rows.__setitem__(key, _insert(conn, "messages", **kw))  # noqa: E731
        m("a", session_id="old-1", role="user", content="an ancient walrus question", timestamp=T0 + 1)
        m("b", session_id="old-1", role=None, content="who said this", timestamp=T0 + 2)
        m("c", session_id="old-1", role="assistant", content="an ancient answer", timestamp=T0 + 3,
          tool_calls=json.dumps({"id": "x", "type": "function",
                                 "function": {"name": "lookup", "arguments": "{}"}}))
        m("d", session_id="old-2", role="user", content="second legacy session", timestamp=None)
        m("e", session_id="nobody", role="user", content="lost", timestamp=T0)
    conn.close()
    return {"rows": rows}

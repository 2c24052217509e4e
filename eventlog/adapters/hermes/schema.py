"""The Hermes projection's schema: Hermes Agent's ``state.db`` at schema version 22, plus one row
of eventlog bookkeeping.

The file at ``db_path`` must be readable by Hermes code that opens it directly (the dashboard's
raw ``SELECT``s, insights, ``mcp_serve``), so its tables, columns (in the same order, with the
same types, defaults and constraints), indexes and both FTS5 indexes with their triggers are
those of Hermes 0.19.0. The DDL is generated here from column tables rather than kept as text.

``PROJECTION_VERSION`` changes whenever this module or the fold in :mod:`.apply` changes what
a log prefix projects to; a projection of another version is rebuilt on open.
"""
from __future__ import annotations

import sqlite3

HERMES_SCHEMA_VERSION = 22
PROJECTION_VERSION = 6
"""3: the cursor row keeps ``erase_due`` (sessions deleted whose erase has not run yet).
4: each ``erase_due`` entry carries the seq of its deletion (the erase takes no event after it).
5: ``hermes.routing_restated`` / ``hermes.routing_upserted`` are applied (a version 4 program
ignores them as a newer program's, so its files lack what they wrote).
6: an imported session or message whose rowid, id or title another row holds takes a free one
(version 5 dropped the row: a later copy of Hermes' file imported into a switched home)."""
APPLICATION_ID = 0x48654C67  # "HeLg": marks a file as an eventlog Hermes projection

# (name, declaration) in Hermes' column order: ``SELECT *`` dicts keep this key order.
SESSION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "TEXT PRIMARY KEY"),
    ("source", "TEXT NOT NULL"),
    ("user_id", "TEXT"),
    ("session_key", "TEXT"),
    ("chat_id", "TEXT"),
    ("chat_type", "TEXT"),
    ("thread_id", "TEXT"),
    ("display_name", "TEXT"),
    ("origin_json", "TEXT"),
    ("expiry_finalized", "INTEGER DEFAULT 0"),
    ("model", "TEXT"),
    ("model_config", "TEXT"),
    ("system_prompt", "TEXT"),
    ("parent_session_id", "TEXT"),
    ("started_at", "REAL NOT NULL"),
    ("ended_at", "REAL"),
    ("end_reason", "TEXT"),
    ("message_count", "INTEGER DEFAULT 0"),
    ("tool_call_count", "INTEGER DEFAULT 0"),
    ("input_tokens", "INTEGER DEFAULT 0"),
    ("output_tokens", "INTEGER DEFAULT 0"),
    ("cache_read_tokens", "INTEGER DEFAULT 0"),
    ("cache_write_tokens", "INTEGER DEFAULT 0"),
    ("reasoning_tokens", "INTEGER DEFAULT 0"),
    ("cwd", "TEXT"),
    ("git_branch", "TEXT"),
    ("git_repo_root", "TEXT"),
    ("billing_provider", "TEXT"),
    ("billing_base_url", "TEXT"),
    ("billing_mode", "TEXT"),
    ("estimated_cost_usd", "REAL"),
    ("actual_cost_usd", "REAL"),
    ("cost_status", "TEXT"),
    ("cost_source", "TEXT"),
    ("pricing_version", "TEXT"),
    ("title", "TEXT"),
    ("api_call_count", "INTEGER DEFAULT 0"),
    ("handoff_state", "TEXT"),
    ("handoff_platform", "TEXT"),
    ("handoff_error", "TEXT"),
    ("compression_failure_cooldown_until", "REAL"),
    ("compression_failure_error", "TEXT"),
    ("compression_fallback_streak", "INTEGER NOT NULL DEFAULT 0"),
    ("profile_name", "TEXT"),
    ("rewind_count", "INTEGER NOT NULL DEFAULT 0"),
    ("archived", "INTEGER NOT NULL DEFAULT 0"),
)
SESSION_NAMES = tuple(name for name, _ in SESSION_COLUMNS)

MESSAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "INTEGER PRIMARY KEY AUTOINCREMENT"),
    ("session_id", "TEXT NOT NULL REFERENCES sessions(id)"),
    ("role", "TEXT NOT NULL"),
    ("content", "TEXT"),
    ("tool_call_id", "TEXT"),
    ("tool_calls", "TEXT"),
    ("tool_name", "TEXT"),
    ("effect_disposition", "TEXT"),
    ("timestamp", "REAL NOT NULL"),
    ("token_count", "INTEGER"),
    ("finish_reason", "TEXT"),
    ("reasoning", "TEXT"),
    ("reasoning_content", "TEXT"),
    ("reasoning_details", "TEXT"),
    ("codex_reasoning_items", "TEXT"),
    ("codex_message_items", "TEXT"),
    ("platform_message_id", "TEXT"),
    ("observed", "INTEGER DEFAULT 0"),
    ("active", "INTEGER NOT NULL DEFAULT 1"),
    ("compacted", "INTEGER NOT NULL DEFAULT 0"),
    ("api_content", "TEXT"),
)
MESSAGE_NAMES = tuple(name for name, _ in MESSAGE_COLUMNS)

USAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("session_id", "TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE"),
    ("model", "TEXT NOT NULL"),
    ("billing_provider", "TEXT NOT NULL DEFAULT ''"),
    ("billing_base_url", "TEXT NOT NULL DEFAULT ''"),
    ("billing_mode", "TEXT NOT NULL DEFAULT ''"),
    ("task", "TEXT NOT NULL DEFAULT ''"),
    ("api_call_count", "INTEGER NOT NULL DEFAULT 0"),
    ("input_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("output_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("cache_read_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("cache_write_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("reasoning_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("estimated_cost_usd", "REAL NOT NULL DEFAULT 0"),
    ("actual_cost_usd", "REAL NOT NULL DEFAULT 0"),
    ("cost_status", "TEXT"),
    ("cost_source", "TEXT"),
    ("first_seen", "REAL"),
    ("last_seen", "REAL"),
)
USAGE_KEY = ("session_id", "model", "billing_provider", "billing_base_url", "billing_mode", "task")

DELEGATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("delegation_id", "TEXT PRIMARY KEY"),
    ("origin_session", "TEXT NOT NULL"),
    ("origin_ui_session_id", "TEXT NOT NULL DEFAULT ''"),
    ("parent_session_id", "TEXT"),
    ("state", "TEXT NOT NULL"),
    ("dispatched_at", "REAL NOT NULL"),
    ("completed_at", "REAL"),
    ("updated_at", "REAL NOT NULL"),
    ("event_json", "TEXT"),
    ("result_json", "TEXT"),
    ("delivery_state", "TEXT NOT NULL DEFAULT 'pending'"),
    ("delivery_attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("delivered_at", "REAL"),
    ("owner_pid", "INTEGER"),
    ("owner_started_at", "INTEGER"),
    ("task_json", "TEXT"),
    ("delivery_claim", "TEXT"),
    ("delivery_claimed_at", "REAL"),
)

TOPIC_MODE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("chat_id", "TEXT PRIMARY KEY"),
    ("user_id", "TEXT NOT NULL"),
    ("enabled", "INTEGER NOT NULL DEFAULT 1"),
    ("activated_at", "REAL NOT NULL"),
    ("updated_at", "REAL NOT NULL"),
    ("has_topics_enabled", "INTEGER"),
    ("allows_users_to_create_topics", "INTEGER"),
    ("capability_checked_at", "REAL"),
    ("intro_message_id", "TEXT"),
    ("pinned_message_id", "TEXT"),
)
TOPIC_BINDING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("chat_id", "TEXT NOT NULL"),
    ("thread_id", "TEXT NOT NULL"),
    ("user_id", "TEXT NOT NULL"),
    ("session_key", "TEXT NOT NULL"),
    ("session_id", "TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE"),
    ("managed_mode", "TEXT NOT NULL DEFAULT 'auto'"),
    ("linked_at", "REAL NOT NULL"),
    ("updated_at", "REAL NOT NULL"),
)


def _table(name: str, columns: tuple[tuple[str, str], ...], *extra: str) -> str:
    body = ",\n    ".join([f"{col} {decl}" for col, decl in columns] + list(extra))
    return f"CREATE TABLE IF NOT EXISTS {name} (\n    {body}\n);\n"


# What the FTS indexes hold for a message: its text, tool name and tool-call JSON, space-joined.
FTS_TEXT = "COALESCE({p}.content, '') || ' ' || COALESCE({p}.tool_name, '') || ' ' || COALESCE({p}.tool_calls, '')"
FTS_TABLES = ("messages_fts", "messages_fts_trigram")


def _fts_table(table: str, tokenizer: str | None) -> str:
    options = f",\n    tokenize='{tokenizer}'" if tokenizer else ""
    return f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5(\n    content{options}\n);\n"


def _fts_triggers(table: str, short: str) -> str:
    new, old = FTS_TEXT.format(p="new"), "old.id"
    return (
        f"CREATE TRIGGER IF NOT EXISTS {short}_insert AFTER INSERT ON messages BEGIN\n"
        f"    INSERT INTO {table}(rowid, content) VALUES (new.id, {new});\nEND;\n"
        f"CREATE TRIGGER IF NOT EXISTS {short}_delete AFTER DELETE ON messages BEGIN\n"
        f"    DELETE FROM {table} WHERE rowid = {old};\nEND;\n"
        f"CREATE TRIGGER IF NOT EXISTS {short}_update AFTER UPDATE ON messages BEGIN\n"
        f"    DELETE FROM {table} WHERE rowid = {old};\n"
        f"    INSERT INTO {table}(rowid, content) VALUES (new.id, {new});\nEND;\n"
    )


TABLES_SQL = (
    "CREATE TABLE IF NOT EXISTS schema_version (\n    version INTEGER NOT NULL\n);\n"
    + _table("sessions", SESSION_COLUMNS, "FOREIGN KEY (parent_session_id) REFERENCES sessions(id)")
    + _table("messages", MESSAGE_COLUMNS)
    + _table("session_model_usage", USAGE_COLUMNS, f"PRIMARY KEY ({', '.join(USAGE_KEY)})")
    + _table("state_meta", (("key", "TEXT PRIMARY KEY"), ("value", "TEXT")))
    + _table("gateway_routing", (("scope", "TEXT NOT NULL DEFAULT ''"), ("session_key", "TEXT NOT NULL"),
                                 ("entry_json", "TEXT NOT NULL"), ("updated_at", "REAL NOT NULL")),
             "PRIMARY KEY (scope, session_key)")
    + _table("compression_locks", (("session_id", "TEXT PRIMARY KEY"), ("holder", "TEXT NOT NULL"),
                                   ("acquired_at", "REAL NOT NULL"), ("expires_at", "REAL NOT NULL")))
    + _table("async_delegations", DELEGATION_COLUMNS)
)

INDEXES = (
    ("idx_sessions_source", "sessions(source)"),
    ("idx_sessions_source_id", "sessions(source, id)"),
    ("idx_sessions_parent", "sessions(parent_session_id)"),
    ("idx_sessions_started", "sessions(started_at DESC)"),
    ("idx_messages_session", "messages(session_id, timestamp)"),
    ("idx_compression_locks_expires", "compression_locks(expires_at)"),
    ("idx_session_model_usage_session", "session_model_usage(session_id)"),
    ("idx_session_model_usage_model", "session_model_usage(model)"),
    ("idx_async_delegations_delivery", "async_delegations(delivery_state, completed_at)"),
    ("idx_messages_platform_msg_id", "messages(session_id, platform_message_id) WHERE platform_message_id IS NOT NULL"),
    ("idx_messages_session_active", "messages(session_id, active, timestamp)"),
    ("idx_messages_active_null", "messages(active) WHERE active IS NULL"),
    ("idx_sessions_session_key", "sessions(session_key, started_at DESC)"),
    ("idx_sessions_gateway_peer", "sessions(source, user_id, chat_id, chat_type, thread_id, started_at DESC)"),
    ("idx_sessions_handoff_state", "sessions(handoff_state, started_at)"),
)
INDEXES_SQL = "".join(f"CREATE INDEX IF NOT EXISTS {name} ON {target};\n" for name, target in INDEXES) + (
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL;\n")

FTS_TABLES_SQL = _fts_table("messages_fts", None) + _fts_table("messages_fts_trigram", "trigram")
FTS_TRIGGERS_SQL = _fts_triggers("messages_fts", "messages_fts") + _fts_triggers("messages_fts_trigram", "messages_fts_trigram")
FTS_SQL = FTS_TABLES_SQL + FTS_TRIGGERS_SQL

TOPIC_SQL = (
    _table("telegram_dm_topic_mode", TOPIC_MODE_COLUMNS)
    + _table("telegram_dm_topic_bindings", TOPIC_BINDING_COLUMNS, "PRIMARY KEY (chat_id, thread_id)")
    + "CREATE UNIQUE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_session "
      "ON telegram_dm_topic_bindings(session_id);\n"
    + "CREATE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_user "
      "ON telegram_dm_topic_bindings(user_id, chat_id);\n"
)
"""Created only when a ``hermes.topic_tables_created`` event is applied (Hermes creates them on
the first explicit ``/topic`` opt-in, never at startup)."""

# The projection's own bookkeeping, one row: how far it is (``seq``, the last event applied) and
# which log it derives from (``hash`` of the event at ``hash_seq``, one it applied; the writer
# refreshes it every so often rather than on every write, which would cost a log read each), and
# ``erase_due``: ``[Hermes id, seq of its deletion]`` (a JSON list) for each session deleted whose
# events no ``log.erased`` record has erased yet. Deleting a session and erasing it are two
# commits; a process killed between them leaves the ids here, and the next writer finishes the
# erase. The erase takes the session's events up to its deletion only: a session of the same id
# that another process made again in between keeps what it was acknowledged.
CURSOR_TABLE = "eventlog_projection"
CURSOR_SQL = (
    f"CREATE TABLE IF NOT EXISTS {CURSOR_TABLE} (\n"
    "    id INTEGER PRIMARY KEY CHECK (id = 1),\n"
    "    projection_version INTEGER NOT NULL,\n"
    "    seq INTEGER NOT NULL,\n"
    "    hash_seq INTEGER NOT NULL,\n"
    "    hash TEXT NOT NULL,\n"
    "    erase_due TEXT NOT NULL DEFAULT '[]'\n"
    ");\n"
)


def create(conn: sqlite3.Connection, *, fts_triggers: bool = True) -> None:
    """Create every table, index and trigger of an empty projection (no transaction of its own).
    Without ``fts_triggers`` the FTS indexes are left for :func:`fill_fts` (a rebuild fills them
    in one pass at the end, several times faster than row by row)."""
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    for script in (TABLES_SQL, INDEXES_SQL, FTS_SQL if fts_triggers else FTS_TABLES_SQL, CURSOR_SQL):
        for statement in _statements(script):
            conn.execute(statement)
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (HERMES_SCHEMA_VERSION,))
    conn.execute(f"INSERT INTO {CURSOR_TABLE} (id, projection_version, seq, hash_seq, hash) VALUES (1, ?, 0, 0, ?)",
                 (PROJECTION_VERSION, "0" * 64))


def fill_fts(conn: sqlite3.Connection) -> None:
    """Index every message in both FTS tables, then create the triggers that keep them current."""
    for table in FTS_TABLES:
        conn.execute(f"INSERT INTO {table}(rowid, content) SELECT id, {FTS_TEXT.format(p='messages')} FROM messages")
    for statement in _statements(FTS_TRIGGERS_SQL):
        conn.execute(statement)


def create_topic_tables(conn: sqlite3.Connection) -> None:
    for statement in _statements(TOPIC_SQL):
        conn.execute(statement)


def _statements(script: str) -> list[str]:
    """Split a script of this module into statements (trigger bodies end with ``END;``)."""
    out: list[str] = []
    current: list[str] = []
    for line in script.splitlines():
        current.append(line)
        text = "\n".join(current).strip()
        if text.endswith(";") and sqlite3.complete_statement(text):
            out.append(text)
            current = []
    assert not "".join(current).strip(), "unterminated statement"
    return out

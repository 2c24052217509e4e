"""The SQL schema of the projections and their identity marks.

``state`` holds the read models of docs/EVENTS.md in tables close to what agent runtimes read
(sessions, messages), plus usage, reactions, tombstones and the cursor (meta).
``fts`` holds the search index: ``docs`` (message id, session, the lower-cased search text of
:func:`eventlog.sessions.fold.search_text`) and ``fts``, an FTS5 trigram index over it (case-sensitive
on lower-cased text; ``detail=none``: which documents hold a trigram, not where, so a query
takes the documents holding all trigrams of its terms as candidates and checks each term
with ``instr``, see :mod:`projections.fts`).

Bump ``STATE_SCHEMA``/``FTS_SCHEMA`` on any change to the tables or to what is derived: files
of an older version are rebuilt into a new generation, see :mod:`projections.files`.
"""
from __future__ import annotations

from eventlog.sessions.rules import COSTS as COSTS  # the token and cost columns (re-exported)
from eventlog.sessions.rules import TOKENS as TOKENS

STATE_SCHEMA = 1
FTS_SCHEMA = 2  # 2: detail=none (1: positional trigram index)
STATE_APP_ID = 0x45564C53  # "EVLS"
FTS_APP_ID = 0x45564C46  # "EVLF"
REPLAY_APP_ID = 0x45564C52  # "EVLR": a standalone state + FTS file written for an audit


META_DDL = "CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID"

# Token totals have no declared type: a sum past 2**63-1 is stored as its decimal text
# rather than rounded to a REAL by column affinity.
STATE_DDL = [
    META_DDL,
    """CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        source TEXT, model TEXT, model_config TEXT,
        title TEXT, title_source TEXT,
        started_at REAL, ended_at REAL, end_reason TEXT, ended INTEGER NOT NULL DEFAULT 0,
        message_count INTEGER NOT NULL DEFAULT 0, tool_call_count INTEGER NOT NULL DEFAULT 0,
        input_tokens NOT NULL DEFAULT 0, output_tokens NOT NULL DEFAULT 0,
        cache_read_tokens NOT NULL DEFAULT 0, cache_write_tokens NOT NULL DEFAULT 0,
        reasoning_tokens NOT NULL DEFAULT 0,
        estimated_cost_usd REAL, actual_cost_usd REAL,
        cwd TEXT, git_repo_root TEXT, git_branch TEXT, parent_session_id TEXT,
        user_id TEXT, chat_id TEXT, chat_type TEXT, thread_id TEXT, tool_names TEXT,
        archived INTEGER NOT NULL DEFAULT 0, pinned INTEGER NOT NULL DEFAULT 0,
        hidden INTEGER NOT NULL DEFAULT 0,
        last_activity_at REAL, profile_name TEXT, created_seq INTEGER
    )""",
    "CREATE INDEX sessions_activity ON sessions (last_activity_at DESC, id DESC)",
    "CREATE INDEX sessions_parent ON sessions (parent_session_id) WHERE parent_session_id IS NOT NULL",
    "CREATE INDEX sessions_title ON sessions (title) WHERE title IS NOT NULL",
    "CREATE INDEX sessions_pinned ON sessions (last_activity_at DESC, id DESC) WHERE pinned = 1",
    "CREATE INDEX sessions_source ON sessions (source, last_activity_at DESC)",
    "CREATE INDEX sessions_cwd ON sessions (cwd) WHERE cwd IS NOT NULL",
    "CREATE INDEX sessions_repo ON sessions (git_repo_root) WHERE git_repo_root IS NOT NULL",
    "CREATE TABLE tombstones (id TEXT PRIMARY KEY, deleted_seq INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX tombstones_seq ON tombstones (deleted_seq)",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        role TEXT, content TEXT, content_json INTEGER NOT NULL DEFAULT 0,
        tool_calls TEXT, tool_name TEXT, tool_call_id TEXT,
        timestamp REAL, token_count INTEGER, finish_reason TEXT,
        reasoning TEXT, reasoning_details TEXT, display_kind TEXT, display_metadata TEXT,
        active INTEGER NOT NULL DEFAULT 1, n_tool_calls INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX messages_session ON messages (session_id, id)",
    """CREATE TABLE usage (
        session_id TEXT NOT NULL, ukey TEXT NOT NULL,
        model TEXT, provider TEXT, task TEXT,
        input_tokens NOT NULL DEFAULT 0, output_tokens NOT NULL DEFAULT 0,
        cache_read_tokens NOT NULL DEFAULT 0, cache_write_tokens NOT NULL DEFAULT 0,
        reasoning_tokens NOT NULL DEFAULT 0,
        estimated_cost_usd REAL, actual_cost_usd REAL, records INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (session_id, ukey)
    ) WITHOUT ROWID""",
    """CREATE TABLE reactions (
        message_id INTEGER NOT NULL, author TEXT NOT NULL, emoji TEXT NOT NULL,
        set_seq INTEGER NOT NULL, seen INTEGER NOT NULL DEFAULT 0, session_id TEXT NOT NULL,
        PRIMARY KEY (message_id, author)
    ) WITHOUT ROWID""",
    "CREATE INDEX reactions_session ON reactions (session_id, seen, message_id, author)",
]

FTS_TABLES = [
    "CREATE TABLE docs (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, text TEXT NOT NULL)",
    "CREATE INDEX docs_session ON docs (session_id)",
    """CREATE VIRTUAL TABLE fts USING fts5(
        text, content='docs', content_rowid='id', tokenize='trigram case_sensitive 1',
        detail=none)""",
]
FTS_DDL = [META_DDL, *FTS_TABLES]
FTS_SHADOW = ("fts_data", "fts_idx", "fts_docsize", "fts_config")

"""The SQL schema of the projections and their identity marks.

``state`` holds the read models of docs/EVENTS.md in tables close to what agent runtimes read
(sessions, messages), plus usage, reactions, tombstones, the cursor (meta) and ``fts_pending``:
the indexed columns of messages that a ``session.deleted`` removed, kept only until the search
index has dropped them (a contentless index needs what it indexed to delete a document).

``fts`` holds the search index and no copy of the content (see :mod:`projections.fts`):
``fts``, a contentless FTS5 word index over a message's content, tool name and tool calls
(``ascii`` tokenizer, ``detail=none``: which documents hold a word), ``vocab`` (every word of the
index, kept in step with it), ``vocab_tri`` (a contentless trigram index over the lower-cased
words: which words contain a substring) and ``fts_terms`` (FTS5's own view of the index's words).

Bump ``STATE_SCHEMA``/``FTS_SCHEMA`` on any change to the tables or to what is derived: files
of an older version are rebuilt into a new generation, see :mod:`projections.files`.
"""
from __future__ import annotations

from eventlog.sessions.rules import COSTS as COSTS  # the token and cost columns (re-exported)
from eventlog.sessions.rules import TOKENS as TOKENS

STATE_SCHEMA = 2  # 2: fts_pending (1: the index kept its own copy of the text)
FTS_SCHEMA = 3  # 3: contentless word index + vocabulary trigrams (2: trigram index over a copy, detail=none)
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
    # seq: the session.deleted that removed the message; then the indexed columns of its row.
    "CREATE TABLE fts_pending (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, content, tool_name, tool_calls)",
]

FTS_TABLES = [
    """CREATE VIRTUAL TABLE fts USING fts5(content, tool_name, tool_calls, content='', tokenize='ascii',
        detail=none, columnsize=0)""",
    "CREATE VIRTUAL TABLE fts_terms USING fts5vocab(fts, row)",
    # folded: the word lower-cased by Python (ς as σ) where that differs from the word itself
    "CREATE TABLE vocab (id INTEGER PRIMARY KEY, word TEXT NOT NULL UNIQUE, folded TEXT)",
    """CREATE VIRTUAL TABLE vocab_tri USING fts5(word, content='', tokenize='trigram case_sensitive 1',
        detail=none, columnsize=0)""",
]
# Created once a bulk build has filled the vocabulary: from then on every word added to or
# removed from ``vocab`` is added to or removed from its trigram index in the same statement.
FTS_TRIGGERS = [
    """CREATE TRIGGER vocab_added AFTER INSERT ON vocab BEGIN
        INSERT INTO vocab_tri (rowid, word) VALUES (new.id, coalesce(new.folded, new.word)); END""",
    """CREATE TRIGGER vocab_removed AFTER DELETE ON vocab BEGIN
        INSERT INTO vocab_tri (vocab_tri, rowid, word) VALUES ('delete', old.id, coalesce(old.folded, old.word));
        END""",
]
FTS_DDL = [META_DDL, *FTS_TABLES]

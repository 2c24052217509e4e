"""The search index: derived from state.db's messages, queried with state.db attached.

The FTS file holds ``docs`` (message id, session id, the lower-cased search text of
:func:`eventlog.sessions.fold.search_text`) and ``fts``, a trigram FTS5 index over it with
``detail=none`` (it records which documents hold a trigram, not where: half the indexing
work of a positional index, which is what a rebuild spends its time on). A message matches a
query when its search text contains every term of :func:`eventlog.sessions.fold.search_terms` as a
case-insensitive substring — the reference fold's rule. The index gives the candidates: the
documents holding every distinct trigram of every term of three or more characters (both
sides are lower-cased by Python and the index is case-sensitive, so no match is missed, CJK
included); ``instr`` on the candidates' text then checks every term exactly. A query with no
term of three or more characters is a scan of ``docs`` with ``instr``.

The index is kept in step with state.db by :func:`sync`, which reads the state rows newer than
the FTS cursor; it is therefore a function of the same log prefix and can be rebuilt alone.
"""
from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from eventlog.sessions.fold import content_text, search_terms

TRIGRAM = 3
SNIPPET_CHARS = 64
MARK_OPEN, MARK_CLOSE = "«", "»"


def search_doc(content: Any, content_json: Any, tool_name: Any, tool_calls: Any) -> str:
    """The lower-cased search text of a stored message row (SQL function ``search_doc``)."""
    return raw_search_text(content, content_json, tool_name, tool_calls).lower()


def raw_search_text(content: Any, content_json: Any, tool_name: Any, tool_calls: Any) -> str:
    if content_json and isinstance(content, str):
        try:
            text = content_text(orjson.loads(content))
        except orjson.JSONDecodeError:
            text = ""
    else:
        text = content if isinstance(content, str) else ""
    calls = tool_calls if isinstance(tool_calls, str) and tool_calls not in ("[]", "null") else ""
    return "\n".join((text, tool_name if isinstance(tool_name, str) else "", calls))


def register(db: sqlite3.Connection) -> None:
    db.create_function("search_doc", 4, search_doc, deterministic=True)


def sync(db: sqlite3.Connection, fts_seq: int, state_seq: int, *, fts_schema: str = "f",
         state_schema: str = "main", bulk: bool = False) -> None:
    """Bring the FTS tables (schema ``fts_schema``) from cursor ``fts_seq`` to the state
    tables' cursor ``state_seq`` (schema ``state_schema``). Runs in the caller's transaction
    and does not write either cursor.

    ``bulk``: the FTS5 index is left empty, for one ``rebuild`` command afterwards.
    """
    f, s = fts_schema, state_schema
    # Messages of sessions deleted since fts_seq are gone from state: drop their documents.
    gone = db.execute(f"SELECT id FROM {s}.tombstones WHERE deleted_seq > ?", (fts_seq,)).fetchall()
    for (sid,) in gone:
        if not bulk:
            db.execute(f"INSERT INTO {f}.fts (fts, rowid, text) SELECT 'delete', id, text FROM {f}.docs "
                       "WHERE session_id = ?", (sid,))
        db.execute(f"DELETE FROM {f}.docs WHERE session_id = ?", (sid,))
    db.execute(f"INSERT INTO {f}.docs (id, session_id, text) SELECT id, session_id, "
               f"search_doc(content, content_json, tool_name, tool_calls) FROM {s}.messages "
               "WHERE id > ? AND id <= ?", (fts_seq, state_seq))
    if not bulk:
        db.execute(f"INSERT INTO {f}.fts (rowid, text) SELECT id, text FROM {f}.docs WHERE id > ?", (fts_seq,))


BULK_HASH_BYTES = 32 << 20  # FTS5's in-memory term hash while rebuilding (default 1 MiB)
HASH_BYTES = 1 << 20


def rebuild_index(db: sqlite3.Connection, fts_schema: str = "f") -> None:
    """Index every document of ``docs`` from scratch (FTS5 'rebuild'), merging the segments
    once at the end instead of as it goes, with a larger term hash so that fewer, larger
    segments are written (about 15% faster on 1 KB messages), then back to the defaults
    for incremental updates."""
    f = fts_schema
    db.execute(f"INSERT INTO {f}.fts (fts, rank) VALUES ('automerge', 0)")
    db.execute(f"INSERT INTO {f}.fts (fts, rank) VALUES ('hashsize', ?)", (BULK_HASH_BYTES,))
    db.execute(f"INSERT INTO {f}.fts (fts) VALUES ('rebuild')")
    db.execute(f"INSERT INTO {f}.fts (fts) VALUES ('optimize')")
    db.execute(f"INSERT INTO {f}.fts (fts, rank) VALUES ('hashsize', ?)", (HASH_BYTES,))
    db.execute(f"INSERT INTO {f}.fts (fts, rank) VALUES ('automerge', 4)")


def trigrams(terms: list[str]) -> list[str]:
    """The distinct trigrams of the terms of three or more characters, in first-seen order."""
    seen: dict[str, None] = {}
    for t in terms:
        for i in range(len(t) - TRIGRAM + 1):
            seen.setdefault(t[i:i + TRIGRAM], None)
    return list(seen)


MAX_MATCH_TRIGRAMS = 48
"""The candidates of a long query come from this many of its trigrams (any subset selects a
superset of the matches; every term is then checked exactly): a 10 KB query stays one small
FTS5 expression."""
MAX_INLINE_TERMS = 32
"""Up to this many terms are checked with one ``instr`` each; more with one function call."""


def match_expression(terms: list[str]) -> str:
    """An FTS5 query for the candidates of ``terms`` (each of three or more characters): the
    documents holding every distinct trigram of every term (at most MAX_MATCH_TRIGRAMS of them,
    taken from the longest terms first). Each trigram is a quoted string (quotes doubled), a
    single token, so no user text can be read as an operator and no phrase query (which
    ``detail=none`` cannot answer) is asked. Candidates still need the exact check of every term."""
    grams = trigrams(sorted(terms, key=len, reverse=True))[:MAX_MATCH_TRIGRAMS]
    return " AND ".join('"' + g.replace('"', '""') + '"' for g in grams)


def query_too_large(e: BaseException) -> bool:
    """True when SQLite refused a search statement for its size (not a fault of the index)."""
    text = str(e).lower()
    return any(t in text for t in ("expression tree is too large", "too many sql variables",
                                   "parser stack overflow", "string or blob too big", "too many terms"))


def snippet(text: str, terms: list[str], width: int = SNIPPET_CHARS) -> str:
    """A window of ``text`` around the first match, each match of a term wrapped in «»."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters lower-case to several: compare char by char
        lowered = "".join(ch.lower()[:1] or ch for ch in text)
    spans: list[tuple[int, int]] = []
    for t in terms:
        start = lowered.find(t)
        while start >= 0:
            spans.append((start, start + len(t)))
            start = lowered.find(t, start + len(t))
    if not spans:
        head = " ".join(text[:width].split())
        return head + ("…" if len(text) > width else "")
    spans.sort()
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    first = merged[0][0]
    lo = max(0, first - width // 3)
    hi = min(len(text), max(lo + width, merged[0][1]))
    out = ["…" if lo > 0 else ""]
    pos = lo
    for a, b in merged:
        if a >= hi:
            break
        out.append(text[pos:a])
        out.append(MARK_OPEN + text[a:b] + MARK_CLOSE)
        pos = b
    if pos < hi:
        out.append(text[pos:hi])
    if hi < len(text):
        out.append("…")
    return " ".join("".join(out).split())


def plan(query: Any) -> tuple[list[str], list[str], list[str]]:
    """(all terms, terms whose trigrams select candidates from the index, terms of one or two
    characters). Every term is checked with instr on the candidates."""
    terms = search_terms(query)
    longer = [t for t in terms if len(t) >= TRIGRAM]
    shorter = [t for t in terms if len(t) < TRIGRAM]
    return terms, longer, shorter

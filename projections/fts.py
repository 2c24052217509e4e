"""The search index: a word index over state.db's messages, with no copy of their content.

What a query must find is the reference fold's rule (:func:`eventlog.sessions.fold.search_terms`):
every whitespace-separated term, punctuation included, is a substring of the message's
lower-cased search text (:func:`search_doc`). The index only narrows the candidates; every
term is then checked exactly on the candidates' rows in state.db (:func:`search_match`), so
content is stored once — in state.db.

**The index** (tables in :mod:`projections.schema`). ``fts`` is a contentless FTS5 table with
the ``ascii`` tokenizer, given a message's stored columns as they are (content — the JSON text
for structured content —, tool name, tool-calls JSON): no Python runs per message to build it.
Its words are the maximal runs of :data:`RAW_TOKEN_RE` — ASCII letters and digits and *every*
non-ASCII character — with A-Z folded to a-z and nothing else changed. No Unicode tables are
involved, so Python knows exactly which words FTS5 made (CJK text and emoji are words too).
FTS5 cuts a word at 32,768 bytes, so a run longer than :data:`LONG_RUN` characters is given as
overlapping pieces (:func:`index_part`). ``vocab`` lists every word of the index with its
:func:`fold` (lower-cased by Python) where that differs, and ``vocab_tri`` indexes the folded
words by trigram.

**Why the index finds every match.** Lower-casing maps every separator to itself and every word
character to word characters (checked for every code point in the tests), so the words of the
lower-cased search text are the lower-cased words of the stored columns; JSON escaping only
puts characters in front of a word, and keys or numbers only add words. ``str.lower`` depends
on context for one letter only (a capital sigma becomes ς or σ), so both sides compare with ς
read as σ. Hence: if a message holds a term, the longest run of word characters of the term
(at most :data:`MAX_RUN` of them; a substring of the term is as good as the term for finding
candidates) lies inside the fold of one of the message's words.

**A query**, per term: find the words whose fold contains the term's run (through ``vocab_tri``,
or for a run of one or two characters by a scan of ``vocab``); the candidates are the documents
holding one word of each term's list (``(a OR b) AND (c)``). A run no word contains means no
message matches. A term with no word character, or whose run is in more than :data:`WORD_CAP`
words, gives no list; when no term gives one, the query is a scan of state.db (newest first,
so a common term ends it early).

**Deletes.** A contentless FTS5 table forgets what it indexed, and deleting a document needs
those values again. Messages leave state.db only when their session is deleted; the applier then
copies their indexed columns to ``fts_pending`` (same transaction), :func:`sync` deletes them
from the index, and the rows are purged once the index's cursor has passed them. Words that no
document holds any more leave ``vocab`` too, so nothing of a deleted session stays searchable.
"""
from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import orjson

from eventlog.sessions.fold import content_text, search_terms
from projections.schema import FTS_TRIGGERS

_RAW_TOKEN = "[0-9A-Za-z\x80-\U0010ffff]+"
"""The runs FTS5's ``ascii`` tokenizer makes words of (its separators: every ASCII character
that is not a letter or digit): ``RAW_TOKEN_RE``."""
_TOKEN = "[0-9a-z\x80-\U0010ffff]+"
"""The same runs in lower-cased text: ``TOKEN_RE``."""


@functools.cache
def _re(pattern: str) -> "re.Pattern[str]":
    """``pattern`` compiled on first use: a class over every code point takes ~2.5 ms to
    compile, paid by every one-shot command that imports this module and never searches."""
    return re.compile(pattern)


def __getattr__(name: str) -> Any:
    if name == "RAW_TOKEN_RE":
        return _re(_RAW_TOKEN)
    if name == "TOKEN_RE":
        return _re(_TOKEN)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
LONG_RUN = 8000
"""Characters per indexed piece of a long run: 8,000 characters are at most 32,000 UTF-8 bytes,
under FTS5's 32,768-byte cut."""
MAX_RUN = 64
"""A query uses at most this many characters of a run; pieces of long runs overlap by as much."""
WORD_CAP = 64
"""A run found in more words of the vocabulary than this does not select candidates."""
MAX_GROUPS = 8
"""At most this many terms (those with the fewest words) select candidates; all are checked."""
TRIGRAM = 3
_LONG = "[0-9A-Za-z\x80-\U0010ffff]{%d,}" % (LONG_RUN + 1)
_STEP = LONG_RUN - MAX_RUN
_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
SNIPPET_CHARS = 64
MARK_OPEN, MARK_CLOSE = "«", "»"
BULK_HASH_BYTES = 32 << 20  # FTS5's in-memory term hash while building (default 1 MiB)
HASH_BYTES = 1 << 20

INDEXED = ("content", "tool_name", "tool_calls")
"""The columns of a message row the index is given (and ``fts_pending`` keeps)."""


def indexed_value(column: str) -> str:
    """SQL for what the index is given for ``column``: the value, or for one longer than
    :data:`LONG_RUN` bytes (rare: only those reach Python, where :func:`index_part` leaves
    a value of at most that many characters as it is) its :func:`index_part`. Bytes, not
    characters: SQLite counts a text's characters by reading all of it, which cost a fifth of
    an index build; a blob's length is its header's."""
    return f"CASE WHEN length(CAST({column} AS BLOB)) > {LONG_RUN} THEN index_part({column}) ELSE {column} END"


INDEXED_VALUES = ", ".join(indexed_value(c) for c in INDEXED)
_INSERT = "INSERT INTO {f}.fts (rowid, content, tool_name, tool_calls) "
_DELETE = "INSERT INTO {f}.fts (fts, rowid, content, tool_name, tool_calls) "


# ---- the text of a message ----------------------------------------------------------------------

def raw_search_text(content: Any, content_json: Any, tool_name: Any, tool_calls: Any) -> str:
    """:func:`eventlog.sessions.fold.search_text` of a stored message row (not lower-cased)."""
    if content_json and isinstance(content, str):
        try:
            text = content_text(orjson.loads(content))
        except orjson.JSONDecodeError:
            text = ""
    else:
        text = content if isinstance(content, str) else ""
    calls = tool_calls if isinstance(tool_calls, str) and tool_calls not in ("[]", "null") else ""
    return "\n".join((text, tool_name if isinstance(tool_name, str) else "", calls))


def search_doc(content: Any, content_json: Any, tool_name: Any, tool_calls: Any) -> str:
    """The lower-cased search text of a stored message row: what every term must be in."""
    return raw_search_text(content, content_json, tool_name, tool_calls).lower()


def _pieces(m: re.Match[str]) -> str:
    run = m.group()
    out = []
    for start in range(0, len(run), _STEP):
        out.append(run[start:start + LONG_RUN])
        if start + LONG_RUN >= len(run):
            break
    return " ".join(out)


def index_part(value: Any) -> Any:
    """A stored column as the index is given it: every run of word characters longer than
    :data:`LONG_RUN` replaced by pieces of that length overlapping by :data:`MAX_RUN`, so every
    substring of up to ``MAX_RUN`` characters of the run lies whole in one piece and no piece
    is cut by FTS5. Anything but a long string is returned as it is."""
    if not isinstance(value, str) or len(value) <= LONG_RUN:
        return value
    return _re(_LONG).sub(_pieces, value)


def index_row(content: Any, tool_name: Any, tool_calls: Any) -> tuple[Any, Any, Any]:
    """The values the index is given for a message (the Python twin of :data:`INDEXED_VALUES`)."""
    return index_part(content), index_part(tool_name), index_part(tool_calls)


def words(values: Iterable[Any]) -> set[str]:
    """The distinct words FTS5 makes of the indexed values ``values``."""
    out: set[str] = set()
    for v in values:
        if isinstance(v, str):
            out.update(t if t.islower() and t.isascii() else t.translate(_ASCII_FOLD)
                       for t in _re(_RAW_TOKEN).findall(v))
    return out


def fold(word: str) -> str:
    """What a word of the index is compared in: lower-cased, ς read as σ."""
    return word.lower().replace("ς", "σ")


def folded(word: str) -> str | None:
    """:func:`fold` of ``word`` when it differs from ``word`` (stored in ``vocab.folded``)."""
    if word.isascii():
        return None  # the index already folded A-Z
    f = fold(word)
    return None if f == word else f


def join_terms(terms: list[str]) -> str:
    """Terms as one SQL argument of :func:`search_match` (a term never holds whitespace)."""
    return " ".join(terms)


_split: dict[str, list[str]] = {}


def search_match(content: Any, content_json: Any, tool_name: Any, tool_calls: Any, joined: str) -> bool:
    """True when every term of ``joined`` (:func:`join_terms`) is a substring of the row's
    search text (SQL ``search_match``)."""
    terms = _split.get(joined)
    if terms is None:
        if len(_split) > 64:
            _split.clear()
        terms = _split[joined] = joined.split(" ")
    text = search_doc(content, content_json, tool_name, tool_calls)
    return all(t in text for t in terms)


def register(db: sqlite3.Connection) -> None:
    """The SQL functions the index and its queries use, on connection ``db``."""
    db.create_function("search_doc", 4, search_doc, deterministic=True)
    db.create_function("index_part", 1, index_part, deterministic=True)
    db.create_function("folded", 1, folded, deterministic=True)
    db.create_function("search_match", 5, search_match, deterministic=True)


# ---- keeping the index in step with state.db ------------------------------------------------------

def _add_words(db: sqlite3.Connection, f: str, found: set[str]) -> None:
    if found:
        db.executemany(f"INSERT OR IGNORE INTO {f}.vocab (word, folded) VALUES (?, ?)",
                       ((w, folded(w)) for w in found))


def _drop_words(db: sqlite3.Connection, f: str, maybe_gone: set[str]) -> None:
    """Remove from ``vocab`` the words of ``maybe_gone`` no document holds any more."""
    gone = [(w,) for w in maybe_gone
            if db.execute(f"SELECT 1 FROM {f}.fts_terms WHERE term = ?", (w,)).fetchone() is None]
    if gone:
        db.executemany(f"DELETE FROM {f}.vocab WHERE word = ?", gone)


def _bump_documents(db: sqlite3.Connection, f: str, delta: int) -> None:
    if delta:
        db.execute(f"UPDATE {f}.meta SET value = value + ? WHERE key = 'documents'", (delta,))


def sync(db: sqlite3.Connection, fts_seq: int, state_seq: int, *, fts_schema: str = "f",
         state_schema: str = "main") -> None:
    """Bring the index (schema ``fts_schema``) from cursor ``fts_seq`` to the state tables'
    cursor ``state_seq`` (schema ``state_schema``), in the caller's transaction, and purge the
    pending rows the index no longer needs. Writes neither cursor. Raises ``LookupError`` when
    state.db has already purged rows this index still needs (rebuild the index).

    The index at ``fts_seq`` holds every message with ``id <= fts_seq`` that was live at
    ``fts_seq``; so a pending row is deleted from it when ``id <= fts_seq < seq``, and the
    messages ``fts_seq < id <= state_seq`` still in state.db are added.
    """
    f, s = fts_schema, state_schema
    purged = db.execute(f"SELECT value FROM {s}.meta WHERE key = 'fts_purged_to'").fetchone()
    if purged is not None and isinstance(purged[0], int) and purged[0] > fts_seq:
        raise LookupError(f"state.db no longer holds what the index needs from seq {fts_seq} "
                          f"(purged to {purged[0]})")
    gone = db.execute(f"SELECT id, {INDEXED_VALUES} FROM {s}.fts_pending WHERE seq > ? AND id <= ?",
                      (fts_seq, fts_seq)).fetchall()
    if gone:
        db.executemany(_DELETE.format(f=f) + "VALUES ('delete', ?, ?, ?, ?)", gone)
        _drop_words(db, f, words(v for row in gone for v in row[1:]))
    added = db.execute(f"SELECT id, {INDEXED_VALUES} FROM {s}.messages WHERE id > ? AND id <= ?",
                       (fts_seq, state_seq)).fetchall()
    if added:
        db.executemany(_INSERT.format(f=f) + "VALUES (?, ?, ?, ?)", added)
        _add_words(db, f, words(v for row in added for v in row[1:]))
    _bump_documents(db, f, len(added) - len(gone))
    purge(db, state_seq, state_schema=s)


def pending(db: sqlite3.Connection, upto: int, *, state_schema: str = "main") -> bool:
    """True when state.db holds pending rows of deletions up to seq ``upto`` (to purge)."""
    return db.execute(f"SELECT 1 FROM {state_schema}.fts_pending WHERE seq <= ? LIMIT 1",
                      (upto,)).fetchone() is not None


def purge(db: sqlite3.Connection, upto: int, *, state_schema: str = "main") -> None:
    """Drop the pending rows of deletions up to seq ``upto`` (the index has passed them) and
    record how far state.db has purged (an index behind that must be rebuilt)."""
    s = state_schema
    if not pending(db, upto, state_schema=s):
        return
    db.execute(f"DELETE FROM {s}.fts_pending WHERE seq <= ?", (upto,))
    db.execute(f"INSERT OR REPLACE INTO {s}.meta (key, value) VALUES ('fts_purged_to', "
               f"max(coalesce((SELECT value FROM {s}.meta WHERE key = 'fts_purged_to'), 0), ?))", (upto,))


class Bulk:
    """Fills an empty index (schema ``fts_schema`` of ``db``, inside the caller's transaction)
    from scratch: :meth:`add` documents, :meth:`delete` documents added before, then
    :meth:`finish` derives the vocabulary from the index. A larger term hash while building
    (fewer, larger segments); segments are merged as they come (``automerge``): measured at
    1M messages, a final 'optimize' (one segment) cost 3.3 s of a 20 s index build for
    queries 0.1-1 ms faster."""

    def __init__(self, db: sqlite3.Connection, fts_schema: str = "main") -> None:
        self.db = db
        self.f = fts_schema
        self.documents = 0
        f = self.f
        db.execute(f"INSERT INTO {f}.fts (fts, rank) VALUES ('automerge', 4)")
        db.execute(f"INSERT INTO {f}.fts (fts, rank) VALUES ('hashsize', ?)", (BULK_HASH_BYTES,))
        self._add = _INSERT.format(f=f) + "VALUES (?, ?, ?, ?)"
        self._delete = _DELETE.format(f=f) + "VALUES ('delete', ?, ?, ?, ?)"

    def add(self, docs: Sequence[tuple[int, Any, Any, Any]]) -> None:
        """Index ``(message id, content, tool_name, tool_calls)`` rows, values as
        :func:`index_row` gives them."""
        self.db.executemany(self._add, docs)
        self.documents += len(docs)

    def add_from(self, select: str, params: Sequence[Any] = ()) -> None:
        """Index the rows of a query giving ``id`` and :data:`INDEXED_VALUES` (one statement)."""
        self.db.execute(_INSERT.format(f=self.f) + select, params)
        self.documents += self.db.execute("SELECT changes()").fetchone()[0]

    def delete(self, docs: Sequence[tuple[int, Any, Any, Any]]) -> None:
        """Drop documents added before (with the values they were added with)."""
        self.db.executemany(self._delete, docs)
        self.documents -= len(docs)

    def finish(self) -> int:
        """Fill the vocabulary, record the document count, restore the incremental settings and
        create the vocabulary triggers. Returns the number of documents."""
        db, f = self.db, self.f
        db.execute(f"INSERT INTO {f}.vocab (word, folded) SELECT term, folded(term) FROM {f}.fts_terms")
        db.execute(f"INSERT INTO {f}.vocab_tri (vocab_tri, rank) VALUES ('automerge', 0)")
        db.execute(f"INSERT INTO {f}.vocab_tri (rowid, word) SELECT id, coalesce(folded, word) FROM {f}.vocab")
        db.execute(f"INSERT INTO {f}.vocab_tri (vocab_tri) VALUES ('optimize')")
        db.execute(f"INSERT INTO {f}.vocab_tri (vocab_tri, rank) VALUES ('automerge', 4)")
        db.execute(f"INSERT INTO {f}.fts (fts, rank) VALUES ('hashsize', ?)", (HASH_BYTES,))
        for statement in FTS_TRIGGERS:
            db.execute(statement.replace("CREATE TRIGGER ", f"CREATE TRIGGER {f}.", 1))
        db.execute(f"INSERT OR REPLACE INTO {f}.meta (key, value) VALUES ('documents', ?)", (self.documents,))
        return self.documents


def build_from_state(db: sqlite3.Connection, *, fts_schema: str, state_schema: str) -> int:
    """Fill an empty index from the messages of the state tables (in the caller's transaction;
    one statement, no Python per message). Returns the number of documents."""
    bulk = Bulk(db, fts_schema)
    bulk.add_from(f"SELECT id, {INDEXED_VALUES} FROM {state_schema}.messages ORDER BY id")
    return bulk.finish()


# ---- queries ------------------------------------------------------------------------------------

@dataclass
class Plan:
    """How a query is answered: ``terms`` (all checked exactly), ``groups`` (per selecting
    term, the words of the index whose fold contains its run; empty: scan), ``none`` (a run no
    word contains: nothing can match)."""

    terms: list[str]
    groups: list[list[str]] = field(default_factory=list)
    none: bool = False

    def match_expression(self) -> str:
        """The FTS5 query for the candidates: each word quoted (one token, never an operator)."""
        return " AND ".join("(" + " OR ".join(_quote(w) for w in g) + ")" for g in self.groups)


def _quote(word: str) -> str:
    return '"' + word.replace('"', '""') + '"'


def query_terms(query: Any) -> list[str]:
    """The fold's terms, each once, dropping a term contained in another (it adds nothing)."""
    terms = list(dict.fromkeys(search_terms(query)))
    return [t for t in terms if not any(t != u and t in u for u in terms)]


def run_of(term: str) -> str:
    """The longest run of word characters of ``term`` (at most :data:`MAX_RUN` of them, ς read
    as σ), or ""."""
    runs = _re(_TOKEN).findall(term)
    return max(runs, key=len)[:MAX_RUN].replace("ς", "σ") if runs else ""


def trigram_expression(run: str) -> str:
    """FTS5 query over ``vocab_tri`` for the words holding every distinct trigram of ``run``."""
    grams = dict.fromkeys(run[i:i + TRIGRAM] for i in range(len(run) - TRIGRAM + 1))
    return " AND ".join(_quote(g) for g in grams)


def words_containing(db: sqlite3.Connection, f: str, run: str, cap: int = WORD_CAP) -> list[str] | None:
    """The words of the index whose fold contains ``run``; None when there are more than ``cap``."""
    if len(run) >= TRIGRAM:
        rows = db.execute(f"SELECT v.word FROM {f}.vocab_tri JOIN {f}.vocab v ON v.id = vocab_tri.rowid "
                          "WHERE vocab_tri MATCH ? AND instr(coalesce(v.folded, v.word), ?) > 0 LIMIT ?",
                          (trigram_expression(run), run, cap + 1)).fetchall()
    else:
        rows = db.execute(f"SELECT word FROM {f}.vocab WHERE instr(coalesce(folded, word), ?) > 0 LIMIT ?",
                          (run, cap + 1)).fetchall()
    return None if len(rows) > cap else [r[0] for r in rows]


def plan(db: sqlite3.Connection, f: str, terms: list[str]) -> Plan:
    """Look the terms' runs up in the vocabulary of the index in schema ``f``."""
    out = Plan(terms)
    found: list[list[str]] = []
    for run in dict.fromkeys(run_of(t) for t in terms):
        if not run:
            continue
        ws = words_containing(db, f, run)
        if ws is None:
            continue
        if not ws:
            out.none = True
            return out
        found.append(ws)
    out.groups = sorted(found, key=len)[:MAX_GROUPS]
    return out


# ---- presenting a hit ---------------------------------------------------------------------------

def snippet(text: str, terms: list[str], width: int = SNIPPET_CHARS) -> str:
    """A window of ``text`` around the first match, each match of a term wrapped in «»."""
    lowered = text.lower()
    if len(lowered) != len(text):  # İ is the one character that lower-cases to two: keep offsets
        lowered = text.replace("İ", "i").lower()
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
    # A third of the window before the first match, less when the text ends sooner: a text that
    # fits the window is shown whole ("…hy does test_refunds «flake»?" cut a 28-character one).
    lo = max(0, min(first - width // 3, len(text) - width))
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

"""Raw SQL on ``SessionDB._conn`` and ``SessionDB._execute_write``, kept in the log.

Hermes code (and Hermes' tests) sometimes bypasses the ``SessionDB`` methods: the dashboard
runs ``SELECT``s on ``db._conn``, the API server creates sessions inside ``db._execute_write``,
maintenance code backdates rows with ``UPDATE``. A write that went straight into the
projection would vanish at its next rebuild, so none does:

* ``db._conn`` is a :class:`RawConnection`: reads run on the handle's read-only connection;
  each ``INSERT``/``UPDATE``/``DELETE`` runs as one write of its own — through the engine, on the
  projection writer, with temporary triggers noting which rows of which Hermes table it touched —
  and the final state of those rows becomes one ``hermes.rows_written`` event (row images by
  rowid), appended before the projection commits. Replaying the event gives the same rows.
* ``db._execute_write(fn)`` runs ``fn(conn)`` the same way (its statements form one write).

Refused with :class:`UnsupportedRawWrite`: schema changes (``CREATE``/``DROP``/``ALTER`` of
anything that does not exist already, ``ATTACH``, a ``journal_mode`` other than WAL), and writes
to tables that are not Hermes' (eventlog's cursor, ``sqlite_sequence``). ``BEGIN``/``COMMIT``/``ROLLBACK`` on ``_conn`` are
accepted and do nothing: each statement is atomic on its own (a multi-statement raw transaction
is not atomic as a whole; ``_execute_write`` is).
"""
from __future__ import annotations

import json
import re
import sqlite3
from typing import Any, Callable, Iterable, Iterator, Literal

from eventlog.adapters.hermes import schema
from eventlog.adapters.hermes.events import from_json, sql_value

CAPTURED = ("sessions", "messages", "session_model_usage", "state_meta", "gateway_routing", "compression_locks",
            "async_delegations", "telegram_dm_topic_mode", "telegram_dm_topic_bindings")
"""Hermes' tables, parents first (row images are replayed in this order, deletions in reverse)."""

KEYS: dict[str, tuple[str, ...]] = {
    "sessions": ("id",), "messages": ("id",), "session_model_usage": schema.USAGE_KEY, "state_meta": ("key",),
    "gateway_routing": ("scope", "session_key"), "compression_locks": ("session_id",),
    "async_delegations": ("delegation_id",), "telegram_dm_topic_mode": ("chat_id",),
    "telegram_dm_topic_bindings": ("chat_id", "thread_id"),
}
"""Each table's primary key. Row images are replayed by it, not by rowid: a rebuild after an erase
renumbers the rowids of tables without an integer key (an image of session s2 at rowid 3 then met
another session there and was skipped, so a raw write was lost; found by an outside audit)."""


class UnsupportedRawWrite(sqlite3.OperationalError):
    """A raw SQL statement the log cannot record (a schema change, a write to a table that is
    not Hermes')."""


_COMMENT = re.compile(r"^\s*(--[^\n]*\n|/\*.*?\*/)", re.S)
_STRING = re.compile(r"'(?:[^']|'')*'")
_DDL_TARGET = re.compile(r"^\s*(?:CREATE|DROP)\s+(?:TEMP\w*\s+|UNIQUE\s+|VIRTUAL\s+)*(TABLE|INDEX|TRIGGER|VIEW)\s+"
                         r"(IF\s+(?:NOT\s+)?EXISTS\s+)?[\"`\[]?(?:main\.)?([\w]+)", re.I)


_JOURNAL_MODE = re.compile(r"PRAGMA\s+(?:[\"`\[]?\w+[\"`\]]?\s*\.\s*)?[\"`\[]?journal_mode[\"`\]]?\s*(?:=|\()\s*"
                           r"[\"'`\[]?(\w+)", re.I)


def classify(sql: str) -> str:
    """'read', 'write', 'noop' (transaction control), 'ddl' or 'maintenance'."""
    text = sql
    while True:
        m = _COMMENT.match(text)
        if not m:
            break
        text = text[m.end():]
    word = (text.split(None, 1) or [""])[0].upper().rstrip(";")
    if word in ("SELECT", "VALUES", "EXPLAIN"):
        return "read"
    if word == "WITH":
        # A write is a statement (INSERT/REPLACE INTO, UPDATE, DELETE FROM), not the word: a read
        # whose text held one (replace(), LIKE '%delete%') was run as a write, waiting for the
        # writer lease (behind a stopped writer: for good) where reads never wait.
        return "write" if _DML_TARGET.search(_STRING.sub("''", without_comments(text))) else "read"
    if word == "PRAGMA":
        # Leaving WAL is a change of the file's format: on the read connection it failed as a
        # disk I/O error, taken for damage, and the projection was rebuilt at every such call.
        mode = _JOURNAL_MODE.match(without_comments(text).lstrip())
        return "ddl" if mode and mode.group(1).lower() != "wal" else "read"
    if word in ("BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"):
        return "noop"
    if word in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
        return "write"
    if word in ("VACUUM", "ANALYZE", "REINDEX"):
        return "maintenance"
    return "ddl"


_DML_TARGET = re.compile(r"\b(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|REPLACE\s+INTO|UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM)"
                         r"\s+[\"`\[]?(?:main\.)?(\w+)[\"`\]]?\s*(\([^)]*\))?", re.I)


_UPSERT_TAIL = re.compile(r"\bDO\s*$", re.I)


def without_comments(sql: str) -> str:
    """``sql`` with every ``-- ...`` and ``/* ... */`` comment outside quotes replaced by one
    space (quoted text, identifiers included, is kept as it is)."""
    return _COMMENT_OR_QUOTED.sub(lambda m: m.group(1) or " ", sql)


_COMMENT_OR_QUOTED = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\])|--[^\n]*|/\*.*?(?:\*/|$)""",
                                re.S)


def check_target(sql: str) -> None:
    """Refuse a write to a table that is not Hermes' (its schema version, eventlog's cursor,
    ``sqlite_sequence``, FTS internals); an FTS command (``INSERT INTO messages_fts(messages_fts)
    VALUES('optimize')``) only reorganises the index and is let through. Comments are read as
    the blanks they are (a comment ending in DO made a write to any table pass as an upsert's
    tail, and a comment between DO and UPDATE refused an upsert: outside audit, helper-42)."""
    sql = without_comments(sql)
    for m in _DML_TARGET.finditer(sql):
        if _UPSERT_TAIL.search(sql, 0, m.start()):
            continue  # the DO UPDATE SET of an upsert: its table is the INSERT's, checked already
        table, cols = m.group(1), (m.group(2) or "").strip("() ").strip("\"`[]")
        if table in CAPTURED or (table in schema.FTS_TABLES and cols == table):
            continue
        raise UnsupportedRawWrite(f"raw writes to {table} are not supported by eventlog's SessionDB "
                                  "(only Hermes' data tables are recorded in the log); see docs/HERMES.md")


_MARK = "eventlog_raw"
"""The savepoint a raw-SQL callback's ``commit()``/``rollback()`` move and roll back to."""


class _Checked:
    """The projection writer as a raw-SQL callback sees it: every statement's target is checked,
    and transaction control behaves as on Hermes' own connection (autocommit mode, inside the
    ``BEGIN IMMEDIATE`` its ``_execute_write`` opened): ``rollback()`` undoes the callback's
    writes since that ``BEGIN`` (or its last ``commit()``), and a write made after either is kept
    at once, as an autocommitted statement is. It all goes into the log as one write when the
    callback returns. (A ``rollback()`` rolled back the facade's whole transaction and the call
    failed with "no such table: temp.eventlog_touched"; a ``commit()`` committed the projection
    before the log held its rows.) One difference is left: when the callback raises, nothing of
    it is written, where Hermes keeps what it had committed before the raise."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._open = True  # inside the transaction _execute_write began (or one the callback began)

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        kind = classify(sql)
        if kind == "noop":
            return self._control(sql)
        if kind != "read":
            check_target(sql)
        cursor = self._conn.execute(sql, parameters)
        if kind != "read" and not self._open:
            self._keep()  # autocommitted: a later rollback() does not undo it
        return cursor

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any]) -> Any:
        check_target(sql)
        cursor = self._conn.executemany(sql, seq_of_parameters)
        if not self._open:
            self._keep()
        return cursor

    def executescript(self, script: str) -> Any:
        """As ``sqlite3``'s: what is open is committed first, then each statement runs as
        :meth:`execute` runs it (checked; its ``BEGIN``/``COMMIT``/``ROLLBACK`` as above).
        ``sqlite3``'s own committed the facade's transaction and ran the statements unchecked: the
        projection kept rows the log never got, and the call failed ("no such savepoint")."""
        self.commit()
        cursor = None
        for statement in _split(script):
            cursor = self.execute(statement)
        return cursor if cursor is not None else self._conn.execute("SELECT NULL WHERE 0")

    def cursor(self, factory: Any = None) -> "_CheckedCursor":
        """A cursor whose statements :meth:`execute` runs (a plain one's ``COMMIT`` or ``ROLLBACK``
        ended the facade's transaction, as :meth:`executescript` did)."""
        return _CheckedCursor(self)

    def __enter__(self) -> "_Checked":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> Literal[False]:
        """``with conn:`` commits or, on an exception, rolls back, as on ``sqlite3``'s connection
        (it was a TypeError: ``_Checked`` is not a context manager)."""
        if exc_type is None:
            self.commit()
        else:
            self.rollback()
        return False

    def rollback(self) -> None:
        if self._open:
            self._conn.execute(f"ROLLBACK TO {_MARK}")
            self._open = False

    def commit(self) -> None:
        if self._open:
            self._keep()
            self._open = False

    def _keep(self) -> None:
        self._conn.execute(f"RELEASE {_MARK}")
        self._conn.execute(f"SAVEPOINT {_MARK}")

    def _control(self, sql: str) -> Any:
        words = without_comments(sql).upper().replace(";", " ").split()
        word = words[0] if words else ""
        if word == "BEGIN":
            if self._open:
                raise sqlite3.OperationalError("cannot start a transaction within a transaction")
            self._open = True
        elif word in ("COMMIT", "END") or (word == "ROLLBACK" and "TO" not in words):
            if not self._open:
                action = "commit" if word != "ROLLBACK" else "rollback"
                raise sqlite3.OperationalError(f"cannot {action} - no transaction is active")
            self.rollback() if word == "ROLLBACK" else self.commit()
        else:  # SAVEPOINT, RELEASE, ROLLBACK TO: nested inside the callback's own mark
            return self._conn.execute(sql)
        return self._conn.execute("SELECT NULL WHERE 0")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _CheckedCursor:
    """:meth:`_Checked.cursor`: each statement runs through the :class:`_Checked` it came from;
    results, ``lastrowid``, ``rowcount`` and ``description`` are its last statement's."""

    def __init__(self, checked: _Checked) -> None:
        self._checked = checked
        self._cursor: Any = checked._conn.cursor()

    def execute(self, sql: str, parameters: Any = ()) -> "_CheckedCursor":
        self._cursor = self._checked.execute(sql, parameters)
        return self

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any]) -> "_CheckedCursor":
        self._cursor = self._checked.executemany(sql, seq_of_parameters)
        return self

    def executescript(self, script: str) -> "_CheckedCursor":
        self._cursor = self._checked.executescript(script)
        return self

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def ddl_is_noop(conn: sqlite3.Connection, sql: str) -> bool:
    """``CREATE ... IF NOT EXISTS`` of something that exists (Hermes code re-declares tables)."""
    m = _DDL_TARGET.match(sql)
    if not m or not m.group(2) or not sql.lstrip().upper().startswith("CREATE"):
        return False
    kind, name = m.group(1).lower(), m.group(3)
    if kind == "view":
        kind = "view"
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = ? AND name = ?", (kind, name)).fetchone() is not None


def capture(tx: Any, run: Callable[[sqlite3.Connection], Any]) -> Any:
    """Run ``run(conn)`` on the projection writer inside ``tx``, then record the final state of
    every Hermes row it touched as one ``hermes.rows_written`` event of ``tx``."""
    conn: sqlite3.Connection = tx.conn
    factory, conn.row_factory = conn.row_factory, sqlite3.Row  # what Hermes' own write callbacks get
    try:
        return _capture(tx, conn, run)
    finally:
        conn.row_factory = factory


def _capture(tx: Any, conn: sqlite3.Connection, run: Callable[[sqlite3.Connection], Any]) -> Any:
    tables = [t for t in CAPTURED if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                                  (t,)).fetchone()]
    before = conn.execute("SELECT group_concat(name || ':' || COALESCE(sql, ''), ';') FROM sqlite_master").fetchone()
    conn.execute("DROP TABLE IF EXISTS temp.eventlog_touched")  # an earlier release's had no key column
    conn.execute("CREATE TEMP TABLE eventlog_touched (n INTEGER PRIMARY KEY, tbl TEXT, rid INTEGER, k TEXT)")
    triggers = []
    for t in tables:
        for op, refs in (("INSERT", ("NEW",)), ("UPDATE", ("OLD", "NEW")), ("DELETE", ("OLD",))):
            name = f"eventlog_touch_{t}_{op.lower()}"
            key = "json_array(" + ", ".join(f"{{r}}.{c}" for c in KEYS[t]) + ")"
            body = " ".join(f"INSERT INTO eventlog_touched (tbl, rid, k) VALUES ('{t}', {r}.rowid, "
                            f"{key.format(r=r)});" for r in refs)
            conn.execute(f"CREATE TEMP TRIGGER {name} AFTER {op} ON main.{t} BEGIN {body} END")
            triggers.append(name)
    conn.execute(f"SAVEPOINT {_MARK}")
    try:
        result = run(_Checked(conn))  # type: ignore[arg-type]
        conn.execute(f"RELEASE {_MARK}")
    finally:
        for name in triggers:
            conn.execute(f"DROP TRIGGER IF EXISTS temp.{name}")
    after = conn.execute("SELECT group_concat(name || ':' || COALESCE(sql, ''), ';') FROM sqlite_master").fetchone()
    touched = conn.execute("SELECT tbl, rid, k FROM temp.eventlog_touched ORDER BY n").fetchall()
    conn.execute("DELETE FROM temp.eventlog_touched")
    if before != after:
        raise UnsupportedRawWrite("raw schema changes are not supported by eventlog's SessionDB (the schema is "
                                  "Hermes' own, derived from the log); see docs/HERMES.md")
    seen: dict[tuple[str, int], str] = {}
    for t, rid, k in touched:
        seen.setdefault((t, rid), k)  # the key the row had first (a deleted row's, for its image)
    if seen:
        columns = {t: [r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')] for t in {t for t, _ in seen}}
        images = []
        for (t, rid), k in seen.items():
            row = conn.execute(f"SELECT {', '.join(columns[t])} FROM {t} WHERE rowid = ?", (rid,)).fetchone()
            first_key = [sql_value(v) for v in json.loads(k)]
            if row is None:  # gone: its key says which row to delete on replay
                images.append([t, rid, None, first_key])
                continue
            values = [sql_value(v) for v in row]
            images.append([t, rid, values])
            if [values[columns[t].index(c)] for c in KEYS[t]] != first_key:
                images.append([t, rid, None, first_key])  # its key changed: the old one goes
        tx.record("hermes.rows_written", None, {"columns": columns, "rows": images})
    return result


def apply_rows_written(conn: sqlite3.Connection, d: dict[str, Any]) -> int:
    """Replay row images: rows that exist (parents' tables first) by their key (:data:`KEYS`; by
    rowid for an image without it), updated in place or inserted; rows that are gone, deleted
    by their key (children's tables first). A row that no longer fits (its session was erased
    since) is left out, not the whole image."""
    columns: dict[str, list[str]] = d.get("columns") or {}
    rows = d.get("rows") or []
    allowed = {t: {c for c, _ in spec} | {"rowid"} for t, spec in _SPECS.items()}
    n = 0
    for table in CAPTURED:
        cols = [c for c in columns.get(table, []) if c in allowed[table]]
        if not cols:
            continue
        key = KEYS[table] if set(KEYS[table]) <= set(cols) else ()
        for t, rid, values, *_ in rows:
            if t != table or values is None:
                continue
            vals = [from_json(v) for c, v in zip(columns[table], values) if c in allowed[table]]
            sets = ", ".join(f"{c} = ?" for c in cols)
            try:
                if key:  # by its key: the rowid it had may be another row's after an erase's rebuild
                    at = [vals[cols.index(c)] for c in key]
                    where = " AND ".join(f"{c} IS ?" for c in key)
                    if conn.execute(f"UPDATE {table} SET {sets} WHERE {where}", (*vals, *at)).rowcount:
                        n += 1
                        continue
                    free = conn.execute(f"SELECT 1 FROM {table} WHERE rowid = ?", (rid,)).fetchone() is None
                    if free:
                        conn.execute(f"INSERT INTO {table} (rowid, {', '.join(cols)}) VALUES "
                                     f"(?, {', '.join('?' * len(cols))})", (rid, *vals))
                    else:
                        conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                     vals)
                elif conn.execute(f"UPDATE {table} SET {sets} WHERE rowid = ?", (*vals, rid)).rowcount == 0:
                    conn.execute(f"INSERT INTO {table} (rowid, {', '.join(cols)}) VALUES "
                                 f"(?, {', '.join('?' * len(cols))})", (rid, *vals))
            except sqlite3.IntegrityError:
                continue  # a row of a session erased since (a rebuild meets it): left out, the others kept
            n += 1
    for table in reversed(CAPTURED):
        for t, rid, values, *rest in rows:
            if t != table or values is not None:
                continue
            gone = rest[0] if rest and isinstance(rest[0], list) and len(rest[0]) == len(KEYS[table]) else None
            if gone is not None:
                where = " AND ".join(f"{c} IS ?" for c in KEYS[table])
                n += conn.execute(f"DELETE FROM {table} WHERE {where}", [from_json(v) for v in gone]).rowcount
            else:  # an image from before keys were recorded
                n += conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (rid,)).rowcount
    return n


_SPECS = {
    "sessions": schema.SESSION_COLUMNS, "messages": schema.MESSAGE_COLUMNS, "session_model_usage": schema.USAGE_COLUMNS,
    "state_meta": (("key", ""), ("value", "")),
    "gateway_routing": (("scope", ""), ("session_key", ""), ("entry_json", ""), ("updated_at", "")),
    "compression_locks": (("session_id", ""), ("holder", ""), ("acquired_at", ""), ("expires_at", "")),
    "async_delegations": schema.DELEGATION_COLUMNS, "telegram_dm_topic_mode": schema.TOPIC_MODE_COLUMNS,
    "telegram_dm_topic_bindings": schema.TOPIC_BINDING_COLUMNS,
}


class Result:
    """What a raw write returns in place of a cursor: its rows (``RETURNING``), rowcount,
    lastrowid and description, readable after the write committed."""

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: Any, description: Any) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid
        self.description = description
        self.arraysize = 1

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows

    def fetchmany(self, size: int | None = None) -> list[Any]:
        size = self.arraysize if size is None else size
        rows, self._rows = self._rows[:size], self._rows[size:]
        return rows

    def __iter__(self) -> Iterator[Any]:
        while self._rows:
            yield self._rows.pop(0)

    def close(self) -> None:
        self._rows = []


class RawConnection:
    """``SessionDB._conn``: a ``sqlite3.Connection`` look-alike over the projection (see the
    module docstring). Reads see the handle's current projection; writes go through the log."""

    def __init__(self, db: Any) -> None:
        self._db = db

    @property
    def row_factory(self) -> Any:
        return self._db._reader.row_factory

    @row_factory.setter
    def row_factory(self, factory: Any) -> None:
        self._db._reader.row_factory = factory

    @property
    def total_changes(self) -> int:
        return int(self._db._reader.total_changes)

    in_transaction = False
    isolation_level = None

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        kind = classify(sql)
        if kind == "read":
            with self._db._reading() as conn:
                return self._db._lend(conn.execute(sql, parameters))
        if kind == "noop":
            return Result([], -1, None, None)
        if kind == "maintenance":  # layout only (VACUUM cannot run inside a transaction)
            self._db._on_writer(lambda conn: conn.execute(sql))
            return Result([], -1, None, None)
        return self._db._raw(lambda conn: _run(conn, sql, parameters, kind))

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any]) -> Any:
        params = list(seq_of_parameters)
        kind = classify(sql)
        if kind == "read":
            with self._db._reading() as conn:
                return self._db._lend(conn.executemany(sql, params))
        return self._db._raw(lambda conn: _run_many(conn, sql, params))

    def executescript(self, script: str) -> Any:
        statements = _split(script)
        if all(classify(s) in ("read", "noop") for s in statements):
            for s in statements:
                self.execute(s)
            return Result([], -1, None, None)
        return self._db._raw(lambda conn: [_run(conn, s, (), classify(s)) for s in statements][-1:] or None)

    def cursor(self) -> "RawConnection":
        return self

    def commit(self) -> None:
        """Each raw write committed when it ran; nothing is pending."""

    def rollback(self) -> None:
        """Nothing is pending (each raw write committed when it ran)."""

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "RawConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db._reader, name)


def _run(conn: sqlite3.Connection, sql: str, parameters: Any, kind: str) -> Result:
    if kind == "ddl" and not ddl_is_noop(conn, sql):
        # Compiled, not run: what SQLite cannot compile (a typo, a missing table) fails with its
        # own error, as on Hermes' connection, rather than as a schema change.
        conn.execute("EXPLAIN " + sql, parameters)
        raise UnsupportedRawWrite(f"raw schema changes are not supported by eventlog's SessionDB: {sql.strip()[:80]}")
    if kind in ("ddl", "noop", "maintenance"):
        return Result([], -1, None, None)
    check_target(sql)
    cur = conn.execute(sql, parameters)
    rows = cur.fetchall() if cur.description else []
    return Result(rows, cur.rowcount, cur.lastrowid, cur.description)


def _run_many(conn: sqlite3.Connection, sql: str, params: list[Any]) -> Result:
    check_target(sql)
    cur = conn.executemany(sql, params)
    return Result([], cur.rowcount, cur.lastrowid, cur.description)


def _split(script: str) -> list[str]:
    """The statements of ``script``, cut at each ``;`` that ends one (not one in a string, a
    comment or a trigger's body); a part that is only comments is none. (Cut at line ends, two
    statements on one line were one: "You can only execute one statement at a time".)"""
    out, current = [], ""
    for piece in re.split(r"(?<=;)", script):
        current += piece
        if sqlite3.complete_statement(current):
            if without_comments(current).strip(" \t\r\n;"):
                out.append(current.strip())
            current = ""
    if without_comments(current).strip(" \t\r\n;"):
        out.append(current.strip())
    return out

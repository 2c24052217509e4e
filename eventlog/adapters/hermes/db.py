"""``SessionDB``: Hermes Agent's session store, kept in an eventlog log.

Same constructor, methods, return shapes and exceptions as ``hermes_state.SessionDB`` of
hermes-agent 0.19.0. Writes become events in the log beside ``db_path`` (see :mod:`.engine`);
reads answer from the Hermes-schema projection at ``db_path`` (see :mod:`.reads`).

``self._conn`` looks like Hermes' connection (``sqlite3.Row`` rows): raw ``SELECT``s on it read
the projection; raw ``INSERT``/``UPDATE``/``DELETE`` on it, and ``_execute_write(fn)``, are
recorded in the log as row images (:mod:`.raw`), so they survive a rebuild like every other
write; raw schema changes raise :class:`UnsupportedRawWrite`.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import orjson

from eventlog.adapters.hermes import text
from eventlog.adapters.hermes.apply import compression_ancestors, compression_lineage, next_message_id, numbered
from eventlog.adapters.hermes.engine import Engine, Tx, closed_error, finalizer, is_corrupt
from eventlog.adapters.hermes.events import from_json, sql_value
from eventlog.adapters.hermes.imports import ImportSessions
from eventlog.adapters.hermes.raw import RawConnection, UnsupportedRawWrite, capture
from eventlog.adapters.hermes.reads import Reads, prune_filter
from eventlog.adapters.hermes.reads_runtime import RuntimeReads

log = logging.getLogger("eventlog.adapters.hermes")

CHECK_EVERY_S = 0.1


__all__ = ["SessionDB", "UnsupportedRawWrite"]
def default_db_path() -> Path:
    """Hermes' default: ``hermes_state.DEFAULT_DB_PATH`` when Hermes is importable (tests and
    profiles re-point it), else ``$HERMES_HOME/state.db`` (``~/.hermes``)."""
    try:
        import hermes_state

        return Path(hermes_state.DEFAULT_DB_PATH)
    except Exception:
        home = os.environ.get("HERMES_HOME") or str(Path.home() / ".hermes")
        return Path(home) / "state.db"


def _record_init_error(exc: BaseException) -> None:
    try:
        import hermes_state

        hermes_state._set_last_init_error(f"{type(exc).__name__}: {exc}")
    except Exception:
        pass


def _put(data: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        data[key] = sql_value(value, key)


def _put_content(data: dict[str, Any], stored: Any) -> None:
    if isinstance(stored, str) and stored.startswith(text.CONTENT_JSON_PREFIX):
        data["content_json"] = sql_value(stored[len(text.CONTENT_JSON_PREFIX):], "content")
    else:
        _put(data, "content", stored)


def _when(value: Any, default: float) -> float:
    """An explicit message time (a datetime or a number) or ``default``; unusable ones are ignored."""
    if value is None:
        return default
    try:
        return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)
    except (TypeError, ValueError):
        log.debug("Ignoring invalid explicit message timestamp: %r", value)
        return default


def _tool_call_count(tool_calls: Any) -> int:
    if tool_calls is None:
        return 0
    return len(tool_calls) if isinstance(tool_calls, list) else 1



_USAGE_COLUMNS = ("session_id", "model", "billing_provider", "billing_base_url", "billing_mode", "task", "api_call_count",
                  "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                  "estimated_cost_usd", "actual_cost_usd")
"""``session_model_usage``'s NOT NULL columns in table order (the order SQLite checks them)."""
_TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")


def _nan_usage_column(**values: Any) -> Optional[str]:
    """The column a NaN would fail in Hermes' ``session_model_usage`` upsert, if any.

    Hermes binds each key (``model or "unknown"``, ``billing_provider or ""``, ...: NaN is truthy,
    so it stays) and each counter as given; a NaN is bound as NULL and the NOT NULL constraint of
    the first such column in table order fails the call's transaction with IntegrityError. The
    session row Hermes inserts before that transaction stays. ``values``: the call's value per
    column name (columns it does not bind may be left out). The session id is bound as given:
    None is NULL there too (Hermes' session row, inserted first, then has a NULL id: SQLite lets
    a TEXT primary key be NULL)."""
    for column in _USAGE_COLUMNS:
        value = values.get(column)
        if (isinstance(value, float) and math.isnan(value)) or (column == "session_id" and value is None
                                                                and "session_id" in values):
            return column
    return None


def _read_only_error() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("attempt to write a readonly database")


class SessionDB(Reads, RuntimeReads, ImportSessions):
    """Hermes' ``SessionDB`` on an eventlog log. Thread-safe; any number of instances per path
    and per process share one log environment."""

    MAX_TITLE_LENGTH = text.MAX_TITLE_LENGTH
    _CONTENT_JSON_PREFIX = text.CONTENT_JSON_PREFIX
    _FTS_TABLES = ("messages_fts", "messages_fts_trigram")
    _OPTIMIZE_EVERY_N_WRITES = 1000
    """Writes of this handle between two FTS segment merges (each message write adds a segment;
    unmerged, they slow every search and every insert). The write path calls
    :meth:`optimize_fts` on this cadence, as Hermes does; that call merges incrementally (at most
    :data:`_CADENCE_MERGE_PAGES` pages an index) where an explicit call rewrites each index."""
    _CADENCE_MERGE_PAGES = 500
    """FTS5 ``merge`` budget of the write path's periodic call. A full ``optimize`` rewrites the
    whole index: 95-355 ms at 5,000-20,000 messages, under the projection's write lock, inside
    whichever caller's write hit the cadence; this merge takes 0.1-2.5 ms there."""

    @staticmethod
    def _is_fts5_unavailable_error(exc: BaseException) -> bool:
        """The SQLite build lacks FTS5, or only its trigram tokenizer (never another tokenizer)."""
        err = str(exc).lower()
        return ("no such module" in err and "fts5" in err) or "no such tokenizer: trigram" in err

    @staticmethod
    def _is_trigram_unavailable_error(exc: BaseException) -> bool:
        return "no such tokenizer: trigram" in str(exc).lower()

    def _fts_table_exists(self, name: str) -> bool:
        try:
            self._row(f"SELECT 1 FROM {name} LIMIT 0")
            return True
        except sqlite3.OperationalError:
            return False

    def __init__(self, db_path: Optional[Path] = None, read_only: bool = False) -> None:
        self.db_path = db_path or default_db_path()
        # Hermes' connection keeps its file across a chdir(); reads here reopen the projection by
        # path (after a swap), so a relative path is pinned now.
        self._path = Path(os.path.abspath(self.db_path))
        self.read_only = read_only
        self._lock = threading.RLock()
        self._cadence = threading.local()  # set while the write path makes its periodic FTS merge
        self._engine: Engine | None = None
        self._finalizer: Any = None
        self._reader: Optional[sqlite3.Connection] = None
        self._lent: list[weakref.ref[sqlite3.Cursor]] = []
        self._retired: list[tuple[sqlite3.Connection, list[weakref.ref[sqlite3.Cursor]]]] = []
        self._conn: Optional[RawConnection] = None
        self._target: str | None = None
        self._generation = 0
        self._next_check = 0.0
        self._fts_enabled = True
        self._trigram_available = True
        self._busy_timeout = 30.0
        self._write_count = 0
        try:
            if not read_only:
                Path(self.db_path).parent.mkdir(parents=True, exist_ok=True)
                self._engine = Engine.acquire(self._path)
                self._finalizer = finalizer(self, self._engine)
            self._connect_reader()
            # The open just looked (the link's target; the engine's first open took a dead
            # writer's tail): the first reads need not look again before the usual interval.
            self._next_check = time.monotonic() + CHECK_EVERY_S
        except Exception as exc:
            _record_init_error(exc)
            self._give_back()
            raise

    def _give_back(self) -> None:
        """This handle's share of the engine, released now by its owner (the finalizer, left for
        a handle the collector takes, never waits for the registry: Engine.release_collected)."""
        if self._finalizer is not None and self._finalizer.detach() is not None and self._engine is not None:
            self._engine.release()
        self._finalizer = None

    # ---- connections ----------------------------------------------------------------------

    def _connect_reader(self) -> None:
        path = self._path
        if self._engine is not None:
            self._generation = self._engine.generation
        try:
            self._target = os.readlink(path)
        except OSError:
            self._target = None
        # Reads never wait on the writer (WAL); the timeout only bounds a checkpoint's brief lock.
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=self._busy_timeout,
                               isolation_level=None)
        conn.row_factory = sqlite3.Row if self._reader is None else self._reader.row_factory
        conn.execute("PRAGMA foreign_keys=ON")  # what Hermes' connection reports
        try:
            # Load the schema now, as Hermes' constructor does (its DDL), not in the first read:
            # a one-shot process's one call would otherwise pay it (0.5-0.9 ms here). A file
            # that cannot be read raises from that read, as before.
            conn.execute("SELECT 1 FROM sessions LIMIT 0").fetchall()
        except sqlite3.Error:
            pass
        old, self._reader = self._reader, conn
        if old is not None:
            self._retire(old)
        if self._conn is None:
            self._conn = RawConnection(self)

    def _lend(self, cursor: sqlite3.Cursor) -> sqlite3.Cursor:
        """A cursor of a raw read (``_conn.execute``), handed to the caller unread: kept track of,
        so that following a swap does not close the connection under it (under ``_lock``)."""
        if len(self._lent) >= 64:
            self._lent = [ref for ref in self._lent if ref() is not None]
        self._lent.append(weakref.ref(cursor))
        return cursor

    def _retire(self, old: sqlite3.Connection) -> None:
        """The read connection left for a new generation: closed, or, while a raw cursor on it
        is still held, kept open until that cursor is gone. On Hermes' one connection such a
        cursor reads on whatever the handle does meanwhile; here a read that followed another
        process's rebuild (each delete makes one) closed it, and the caller's next fetch raised
        ProgrammingError (outside audit, helper-53)."""
        lent = [ref for ref in self._lent if ref() is not None]
        self._lent = []
        if lent:
            self._retired.append((old, lent))
        else:
            old.close()
        still = []
        for conn, refs in self._retired:
            if any(ref() is not None for ref in refs):
                still.append((conn, refs))
            else:
                conn.close()
        self._retired = still

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The read connection, current: it follows a swap this process's writer made at once,
        and a swap another process made at the next read; every :data:`CHECK_EVERY_S` it lets the
        engine catch up a tail a crashed writer left (writes of live processes are applied
        before they return, so they are always visible)."""
        with self._lock:
            conn = self._reader
            if conn is None:
                raise closed_error()
            engine = self._engine
            if engine is not None and engine.generation != self._generation:
                self._connect_reader()
            # Every read follows a swap another process made (one readlink): the writes acknowledged
            # since went into the new file, and the old one is only what it was at the swap.
            try:
                target: str | None = os.readlink(self._path)
            except OSError:
                target = None
            if target != self._target and (target is not None or os.path.lexists(self._path)):
                # (db_path removed: the file this handle reads stays, as under Hermes' open
                # connection, until a writer links a new one; reconnecting raised 'unable to open
                # database file' once — outside audit, helper-53)
                self._connect_reader()
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + CHECK_EVERY_S
                if engine is not None:
                    engine.refresh(self._reader)  # type: ignore[arg-type]
                    if engine.generation != self._generation:  # the catch-up rebuilt the projection
                        self._connect_reader()
            try:
                yield self._reader  # type: ignore[misc]
            except sqlite3.DatabaseError as e:
                # A damaged projection page: the query fails as it would on Hermes' own file, but
                # the projection is rebuilt from the log at once, so the next call is served.
                if engine is not None and not self.read_only and is_corrupt(e):
                    engine.heal(e, self._generation)
                raise

    def close(self) -> None:
        """Close this handle (others on the same path keep working); idempotent."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            for conn, _ in self._retired:
                conn.close()
            self._retired = []
            self._conn = None
            self._give_back()
            self._engine = None

    def __enter__(self) -> "SessionDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, fn: Callable[[Tx], Any], *, statement: bool = False) -> Any:
        """Run ``fn`` as one write. ``statement``: Hermes runs a write statement for this call
        whatever the rows hold (an ``INSERT OR IGNORE``, an ``UPDATE`` that may match nothing), so
        on a read_only handle it fails even when nothing would change."""
        if self.read_only:
            return self._read_only_write(fn, statement)
        engine = self._engine
        if engine is None or self._reader is None:
            raise closed_error()
        result = engine.write(fn)
        self._write_count += 1
        if self._write_count % self._OPTIMIZE_EVERY_N_WRITES == 0:
            self._cadence.on = True
            try:
                self.optimize_fts()
            except Exception:  # layout only: never fails the write that triggered it
                pass
            finally:
                self._cadence.on = False
        return result

    def _read_only_write(self, fn: Callable[[Tx], Any], statement: bool = False) -> Any:
        """A write call on a read_only handle: run on its read-only connection, as Hermes' own
        read-only connection would run it -- a call with nothing to do (a prune that matches no
        session) returns its empty answer, one that would change a row, or that Hermes answers
        with a write statement (``statement``), raises OperationalError ('attempt to write a
        readonly database'). Nothing reaches the log either way."""
        with self._reading() as conn:
            conn.execute("SAVEPOINT read_only_write")
            try:
                tx = Tx(conn)
                try:
                    result = fn(tx)
                except sqlite3.IntegrityError:
                    # A constraint fails only in a write statement, which Hermes' read-only
                    # connection refuses before it checks any constraint.
                    raise _read_only_error() from None
                if tx.events or statement:
                    raise _read_only_error()
                return result
            finally:
                conn.execute("ROLLBACK TO read_only_write")
                conn.execute("RELEASE read_only_write")

    def _raw(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return self._write(lambda tx: capture(tx, fn))

    def _execute_write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run Hermes-style raw SQL ``fn(conn)`` as one write, recorded in the log (:mod:`.raw`)."""
        return self._raw(fn)

    def _try_wal_checkpoint(self) -> Any:
        """A PASSIVE WAL checkpoint of the projection (layout only); never raises."""
        try:
            return self._on_writer(lambda conn: conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone())
        except Exception as exc:
            log.warning("WAL checkpoint (PASSIVE) failed: %s", exc)
            return None

    @staticmethod
    def _parse_schema_columns(schema_sql: str) -> dict[str, dict[str, str]]:
        """{table: {column: declaration}} of a schema script, as SQLite itself parses it."""
        ref = sqlite3.connect(":memory:")
        try:
            ref.executescript(schema_sql)
            out: dict[str, dict[str, str]] = {}
            for (table,) in ref.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                        " AND name NOT LIKE 'sqlite_%'").fetchall():
                cols: dict[str, str] = {}
                for _, name, kind, notnull, default, pk in ref.execute(f'PRAGMA table_info("{table}")'):
                    parts = [kind] if kind else []
                    if notnull and not pk:
                        parts.append("NOT NULL")
                    if default is not None:
                        parts.append(f"DEFAULT {default}")
                    cols[name] = " ".join(parts)
                out[table] = cols
            return out
        finally:
            ref.close()

    # ---- sessions ----------------------------------------------------------------------

    def _upsert_session(self, tx: Tx, session_id: str, source: str, model: Optional[str] = None,
                        model_config: Optional[dict[str, Any]] = None, system_prompt: Optional[str] = None,
                        user_id: Optional[str] = None, session_key: Optional[str] = None,
                        chat_id: Optional[str] = None, chat_type: Optional[str] = None,
                        thread_id: Optional[str] = None, parent_session_id: Optional[str] = None,
                        cwd: Optional[str] = None, profile_name: Optional[str] = None) -> None:
        """Insert the row, or fill the NULL columns of an existing one (Hermes' insert-or-enrich:
        a bare gateway row gains the agent's model and prompt; a later bare call never
        overwrites). Writes nothing when nothing would change."""
        given = {"model": model, "model_config": json.dumps(model_config) if model_config else None,
                 "system_prompt": system_prompt, "session_key": session_key, "chat_id": chat_id,
                 "chat_type": chat_type, "thread_id": thread_id, "parent_session_id": parent_session_id,
                 "cwd": cwd, "profile_name": profile_name}
        # Hermes binds every value of its upsert, so one it cannot store fails the call even when
        # the row exists and that column is kept: check them all, in its bind order (the id is
        # parameter 1), named by position as sqlite3 names them.
        for position, value in enumerate((source, user_id, session_key, chat_id, chat_type, thread_id, model,
                                          given["model_config"], system_prompt, parent_session_id, cwd,
                                          profile_name), start=2):
            sql_value(value, str(position))
        if sql_value(source) is None:  # SQLite checks NOT NULL before the upsert's ON CONFLICT
            raise sqlite3.IntegrityError("NOT NULL constraint failed: sessions.source")
        row = tx.conn.execute("SELECT model, model_config, system_prompt, session_key, chat_id, chat_type, thread_id,"
                              " parent_session_id, cwd, profile_name FROM sessions WHERE id = ?",
                              (session_id,)).fetchone()
        if row is None:
            data: dict[str, Any] = {"source": sql_value(source, "source"), "started_at": time.time()}
            _put(data, "user_id", user_id)
            for key, value in given.items():
                _put(data, "model_config_json" if key == "model_config" else key, value)
            tx.emit("session.created", session_id, data)
            return
        fill = {k: sql_value(v, k) for (k, v), now in zip(given.items(), row) if now is None and v is not None}
        fill = {k: v for k, v in fill.items() if v is not None}  # NaN binds as NULL: it fills nothing
        if fill:
            tx.emit("hermes.session_enriched", session_id, fill)

    def create_session(self, session_id: str, source: str, **kwargs: Any) -> str:
        self._write(lambda tx: self._upsert_session(tx, session_id, source, **kwargs), statement=True)
        return session_id

    def ensure_session(self, session_id: str, source: str = "unknown", model: Optional[str] = None,
                       **kwargs: Any) -> str:
        self._write(lambda tx: self._upsert_session(tx, session_id, source, model=model, **kwargs), statement=True)
        return session_id

    def record_gateway_session_peer(self, session_id: str, *, source: str, user_id: Optional[str] = None,
                                    session_key: Optional[str] = None, chat_id: Optional[str] = None,
                                    chat_type: Optional[str] = None, thread_id: Optional[str] = None,
                                    display_name: Optional[str] = None, origin_json: Optional[str] = None) -> None:
        """The gateway's routing peer on the session row (written only when it changes)."""
        if not session_id or not session_key:
            return
        values = {"session_key": session_key, "source": source, "user_id": user_id, "chat_id": chat_id,
                  "chat_type": chat_type, "thread_id": thread_id}
        optional = {"display_name": display_name, "origin_json": origin_json}
        peer_sql = ("SELECT session_key, source, user_id, chat_id, chat_type, thread_id, display_name, origin_json"
                    " FROM sessions WHERE id = ?")

        def unchanged(row: Any) -> bool:
            return row is not None and all(_same(row[i], v) for i, v in enumerate(values.values())) and all(
                v is None or _same(row[6 + i], v) for i, v in enumerate(optional.values()))

        if self.read_only:  # Hermes binds (the id last), then runs its UPDATE whatever the row holds
            self._refuse_read_only(*values.values(), *optional.values(), session_id)
        if unchanged(self._row(peer_sql, (session_id,))):  # the gateway re-records it every turn
            return

        def fn(tx: Tx) -> None:
            if unchanged(tx.conn.execute(peer_sql, (session_id,)).fetchone()):
                return
            data = {k: sql_value(v, k) for k, v in values.items()}
            for k, v in optional.items():
                _put(data, k, v)
            tx.emit("hermes.peer_recorded", session_id, data)

        self._write(fn)

    def set_expiry_finalized(self, session_id: str, finalized: bool = True) -> None:
        if not session_id:
            return
        self._write(lambda tx: tx.emit("hermes.expiry_flag_set", session_id, {"value": 1 if finalized else 0}))

    def end_session(self, session_id: str, end_reason: str) -> None:
        """End a session; an ended session keeps its first reason (reopen it to re-end)."""
        self._write(lambda tx: tx.emit("session.ended", session_id,
                                       {"reason": sql_value(end_reason, "end_reason"), "ended_at": time.time()}))

    def reopen_session(self, session_id: str) -> None:
        self._write(lambda tx: tx.emit("session.reopened", session_id, {}))

    def promote_to_session_reset(self, session_id: str, reason: str = "session_reset") -> bool:
        """End a live session, or re-end one closed by a recoverable accident, as a reset
        boundary. False when skipped (another explicit end) or on any error."""
        if not session_id:
            return False
        data = {"reason": reason, "ended_at": time.time()}
        try:
            return bool(self._write(lambda tx: tx.emit("hermes.session_reset", session_id,
                                                       {k: sql_value(v, k) for k, v in data.items()})))
        except Exception:
            return False

    def update_session_cwd(self, session_id: str, cwd: str, git_branch: Optional[str] = None,
                           git_repo_root: Optional[str] = None) -> None:
        """The frontend's cwd; branch and repo root only when non-empty (a failed probe never
        clears a known value)."""
        if not session_id or not cwd:
            return
        branch, root = (git_branch or "").strip(), (git_repo_root or "").strip()
        self._open()
        data: dict[str, Any] = {"cwd": sql_value(cwd, "cwd")}
        if branch:
            data["git_branch"] = sql_value(branch)
        if root:
            data["git_repo_root"] = sql_value(root)
        self._write(lambda tx: tx.emit("session.meta_updated", session_id, data))

    def backfill_repo_roots(self, cwd_to_root: dict[str, str]) -> None:
        pairs = [[sql_value(root), sql_value(cwd)] for cwd, root in cwd_to_root.items() if root and cwd]
        if pairs:
            self._write(lambda tx: tx.emit("hermes.repo_roots_backfilled", None, {"pairs": pairs}))

    def _open(self) -> None:
        """Raise what every call on a closed handle raises (:func:`closed_error`), before what a
        read_only handle or a best-effort guard would answer: Hermes' closed handle fails at the
        first statement, whatever the handle's mode, and its guards catch only sqlite3.Error."""
        if self._reader is None:
            raise closed_error()

    def _refuse_read_only(self, *bound: Any) -> None:
        """On a read_only handle, fail as the call's first write statement fails there: after
        binding ``bound`` (what that statement binds, in order: a value sqlite3 cannot bind
        raises its binding error), with OperationalError -- before anything the call does after
        that statement (iterating messages or entries that are not iterable). No-op otherwise."""
        self._open()
        if self.read_only:
            for value in bound:
                sql_value(value)
            raise _read_only_error()

    def _best_effort(self, what: str, session_id: str, fn: Callable[[Tx], Any], default: Any = None) -> Any:
        self._open()
        try:
            return self._write(fn)
        except (sqlite3.Error, OSError) as exc:
            log.warning("%s(%s) failed: %s", what, session_id, exc)
            return default
        except Exception as exc:
            from eventlog.errors import EventLogError

            if not isinstance(exc, EventLogError):
                raise
            log.warning("%s(%s) failed: %s", what, session_id, exc)
            return default

    def record_compression_failure_cooldown(self, session_id: str, cooldown_until: float,
                                            error: Optional[str] = None) -> None:
        if not session_id:
            return
        # Values are converted inside the write: one SQLite cannot bind fails it as Hermes' UPDATE
        # does, logged and swallowed when sqlite3 raises it (ProgrammingError), raised otherwise.
        self._best_effort("record_compression_failure_cooldown", session_id,
                          lambda tx: tx.emit("hermes.compression_cooldown_set", session_id,
                                             {"until": sql_value(cooldown_until), "error": sql_value(error)}))

    def clear_compression_failure_cooldown(self, session_id: str) -> None:
        if not session_id:
            return
        self._best_effort("clear_compression_failure_cooldown", session_id,
                          lambda tx: tx.emit("hermes.compression_cooldown_cleared", session_id, {}))

    def set_compression_fallback_streak(self, session_id: str, streak: int) -> None:
        if not session_id:
            return
        normalized = max(0, int(streak))
        self._write(lambda tx: tx.emit("hermes.fallback_streak_set", session_id, {"streak": normalized}))

    # ---- compression locks -------------------------------------------------------------

    def refresh_compression_lock(self, session_id: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        """Extend the lease of a lock ``holder`` still owns (False if it expired or moved on)."""
        if not session_id or not holder:
            return False
        now = time.time()
        expires_at = now + ttl_seconds
        return bool(self._best_effort("refresh_compression_lock", session_id,
                                      lambda tx: tx.emit("hermes.compression_lock_refreshed", session_id, {
                                          "holder": sql_value(holder), "now": now,
                                          "expires_at": sql_value(expires_at)}),
                                      False))

    def try_acquire_compression_lock(self, session_id: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        """Take the session's compression lock unless another holder has a live one; an expired
        lock is reclaimed. True when ``holder`` owns it afterwards."""
        if not session_id:
            return False
        now = time.time()
        expires_at = now + ttl_seconds
        self._open()
        if self.read_only:  # Hermes' first statement (the expired lock's DELETE) fails: it answers False
            try:
                sql_value(session_id)  # bound before the statement steps: OverflowError is raised,
                error: Exception = _read_only_error()
            except sqlite3.Error as exc:  # what sqlite3 refuses (a list) is caught as the refusal is
                error = exc
            log.warning("try_acquire_compression_lock(%s) failed: %s", session_id, error)
            return False
        held = bool(self._best_effort("try_acquire_compression_lock", session_id,
                                      lambda tx: tx.emit("hermes.compression_lock_acquired", session_id, {
                                          "holder": sql_value(holder), "now": now,
                                          "expires_at": sql_value(expires_at)}),
                                      False))
        # Hermes compares the stored holder with the one given: a value sqlite3 adapted to store
        # it (a datetime, stored as text) is never equal to it, so Hermes answers False.
        return held and from_json(sql_value(holder)) == holder

    def release_compression_lock(self, session_id: str, holder: str) -> None:
        if not session_id:
            return
        self._best_effort("release_compression_lock", session_id,
                          lambda tx: tx.emit("hermes.compression_lock_released", session_id,
                                             {"holder": sql_value(holder)}))

    # ---- session metadata ----------------------------------------------------------------

    def update_session_meta(self, session_id: str, model_config_json: str, model: Optional[str] = None) -> None:
        self._open()
        data = {"model_config_json": sql_value(model_config_json), "model": sql_value(model)}
        self._write(lambda tx: tx.emit("hermes.model_config_set", session_id, data))

    def update_system_prompt(self, session_id: str, system_prompt: str) -> None:
        """The assembled system prompt snapshot (nothing is written when it is unchanged)."""
        self._open()
        value = sql_value(system_prompt, "system_prompt")
        if self.read_only:  # Hermes binds and runs its UPDATE even when it would change nothing
            sql_value(session_id)
            raise _read_only_error()
        # The common case (every agent init re-stores the same prompt) answers from a read: the
        # call takes effect at that read, no writer is waited for.
        current = self._row("SELECT system_prompt FROM sessions WHERE id = ?", (session_id,))
        if current is None or _same(current[0], system_prompt):
            return

        def fn(tx: Tx) -> None:
            row = tx.conn.execute("SELECT system_prompt FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None or _same(row[0], system_prompt):
                return
            tx.emit("hermes.system_prompt_set", session_id, {"system_prompt": value})

        self._write(fn)

    def update_session_model(self, session_id: str, model: str) -> None:
        self._write(lambda tx: tx.emit("session.meta_updated", session_id, {"model": sql_value(model, "model")}))

    def update_session_billing_route(self, session_id: str, *, provider: str, base_url: str,
                                     billing_mode: Optional[str] = None) -> None:
        self._open()
        data = {"provider": sql_value(provider), "base_url": sql_value(base_url), "billing_mode": sql_value(billing_mode)}
        self._write(lambda tx: tx.emit("hermes.billing_route_set", session_id, data))

    def update_token_counts(self, session_id: str, input_tokens: int = 0, output_tokens: int = 0,
                            model: Optional[str] = None, cache_read_tokens: int = 0, cache_write_tokens: int = 0,
                            reasoning_tokens: int = 0, estimated_cost_usd: Optional[float] = None,
                            actual_cost_usd: Optional[float] = None, cost_status: Optional[str] = None,
                            cost_source: Optional[str] = None, pricing_version: Optional[str] = None,
                            billing_provider: Optional[str] = None, billing_base_url: Optional[str] = None,
                            billing_mode: Optional[str] = None, api_call_count: int = 0,
                            absolute: bool = False) -> None:
        """One API call's usage: added to the session's totals (``absolute``: the caller's
        cumulative totals replace them), and per model/route in ``session_model_usage``. The
        session row is created first if it is missing."""
        tokens = (input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens)
        accounted = bool(any(tokens) or api_call_count or estimated_cost_usd or actual_cost_usd)
        per_model = (not absolute) and bool(any(tokens) or api_call_count or estimated_cost_usd)
        if per_model:
            self._refuse_nan_usage(session_id, model, _nan_usage_column(
                session_id=session_id, model=model, billing_provider=billing_provider, billing_base_url=billing_base_url,
                billing_mode=billing_mode, api_call_count=api_call_count, estimated_cost_usd=estimated_cost_usd,
                actual_cost_usd=actual_cost_usd, **dict(zip(_TOKENS, tokens))))
        data: dict[str, Any] = {}
        # Hermes binds the route only for a call that accounts usage (else NULL): an unusable
        # provider of a call without usage is never seen; other values it cannot bind fail the
        # call after the session row, inserted by a write of its own, is there.
        route = (("provider", billing_provider), ("base_url", billing_base_url),
                 ("billing_mode", billing_mode)) if accounted else ()
        extra: tuple[tuple[str, Any], ...] = (("estimated_cost_usd", estimated_cost_usd), ("actual_cost_usd", actual_cost_usd),
                            ("cost_status", cost_status), ("cost_source", cost_source),
                            ("pricing_version", pricing_version), ("model", model), *route)
        with self._session_row_first(session_id, model):
            for name, value in zip(_TOKENS, tokens):
                if not (type(value) is int and value == 0):
                    data[name] = sql_value(value, name)
            for name, value in extra:
                _put(data, name, value)
            if not (type(api_call_count) is int and api_call_count == 0):
                data["api_call_count"] = sql_value(api_call_count, "api_call_count")
            if per_model:  # Hermes' per-model row binds float(cost or 0.0): 'abc' or bytes raise there
                float(estimated_cost_usd or 0.0)
                float(actual_cost_usd or 0.0)
        if accounted:
            data["accounted"] = True
        if per_model:
            data["per_model"] = True
            data["now"] = time.time()
        if absolute:
            data["absolute"] = True

        def fn(tx: Tx) -> None:
            self._upsert_session(tx, session_id, "unknown", model=model)
            tx.emit("hermes.usage_totals_set" if absolute else "usage.recorded", session_id, data)

        self._write(fn)

    @contextmanager
    def _session_row_first(self, session_id: str, model: Any) -> Iterator[None]:
        """Hermes' usage calls insert the session row in a write of their own and then bind the
        usage: a usage value it cannot bind (or convert) fails the call with that row written.
        The block converts the values; what it raises is raised after the row is written (or
        with the error of that write, as in Hermes, when the row itself cannot be)."""
        try:
            yield
        except (sqlite3.Error, OverflowError, TypeError, ValueError):
            self._write(lambda tx: self._upsert_session(tx, session_id, "unknown", model=model), statement=True)
            raise

    def _refuse_nan_usage(self, session_id: str, model: Any, column: Optional[str]) -> None:
        """Fail a usage call Hermes' upsert would fail (:func:`_nan_usage_column`) as Hermes does:
        the session row it inserts first is written, no usage is, IntegrityError names the column.
        (Storing it instead kept a NULL key or counter that lost every later increment; found by
        outside audits.)"""
        if column is None:
            return
        self._write(lambda tx: self._upsert_session(tx, session_id, "unknown", model=model), statement=True)
        raise sqlite3.IntegrityError(f"NOT NULL constraint failed: session_model_usage.{column}")

    def record_auxiliary_usage(self, session_id: str, task: str, *, model: Optional[str] = None,
                               billing_provider: Optional[str] = None, billing_base_url: Optional[str] = None,
                               input_tokens: int = 0, output_tokens: int = 0, cache_read_tokens: int = 0,
                               cache_write_tokens: int = 0, reasoning_tokens: int = 0,
                               estimated_cost_usd: Optional[float] = None) -> None:
        """An auxiliary call's usage (titles, compression, vision...) per model/route/task only;
        the session's totals, which the gateway overwrites with main-loop totals, stay apart."""
        if not session_id or not task:
            return
        self._refuse_nan_usage(session_id, None, _nan_usage_column(
            session_id=session_id, model=model, billing_provider=billing_provider, billing_base_url=billing_base_url, task=task,
            input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens, reasoning_tokens=reasoning_tokens,
            estimated_cost_usd=estimated_cost_usd))
        data: dict[str, Any] = {"now": time.time()}
        with self._session_row_first(session_id, None):
            # Hermes binds float(cost or 0.0) (2**63 is a REAL, a Decimal a float, a list a
            # TypeError) and each route key as ``value or default``: a falsy one is the default.
            cost = float(estimated_cost_usd or 0.0)
            for key, text_value in (("model", model), ("provider", billing_provider), ("base_url", billing_base_url)):
                if text_value:
                    _put(data, key, text_value)
            data.update({"task": sql_value(task, "task"), "api_call_count": 1})
            for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens),
                                ("cache_read_tokens", cache_read_tokens), ("cache_write_tokens", cache_write_tokens),
                                ("reasoning_tokens", reasoning_tokens)):
                if value:
                    data[name] = sql_value(value, name)
            if cost:
                data["estimated_cost_usd"] = sql_value(cost, "estimated_cost_usd")

        def fn(tx: Tx) -> None:
            self._upsert_session(tx, session_id, "unknown")
            tx.emit("usage.recorded", session_id, data)

        self._write(fn)

    # ---- cleanup sweeps ------------------------------------------------------------------

    def prune_empty_ghost_sessions(self, sessions_dir: Optional[Path] = None) -> int:
        """TUI sessions ended more than a day ago with neither messages nor title."""
        cutoff = time.time() - 86400

        def fn(tx: Tx) -> list[Any]:
            ids = [r[0] for r in tx.conn.execute(
                "SELECT id FROM sessions WHERE source = 'tui' AND title IS NULL AND ended_at IS NOT NULL"
                " AND started_at < ? AND NOT EXISTS (SELECT 1 FROM messages WHERE messages.session_id = sessions.id)",
                (cutoff,))]
            if ids:
                tx.emit("hermes.sessions_deleted", None, {"ids": [sql_value(i) for i in ids]})
            return ids

        engine = self._engine
        removed = self._write(fn) or []
        if removed:
            _erase_deleted(engine)
        if sessions_dir and removed:
            for sid in removed:
                self._remove_session_files(sessions_dir, sid)
        return len(removed)

    def finalize_orphaned_compression_sessions(self) -> int:
        now = time.time()
        data = {"now": now, "cutoff": now - 604800}
        return int(self._write(lambda tx: tx.emit("hermes.sessions_finalized", None, data)) or 0)

    # ---- titles ---------------------------------------------------------------------------

    sanitize_title = staticmethod(text.sanitize_title)

    def _set_title(self, session_id: str, title: str, only_if_empty: bool) -> bool:
        clean = text.sanitize_title(title)
        data: dict[str, Any] = {"only_if_empty": True} if only_if_empty else {}

        def fn(tx: Tx) -> int:
            if only_if_empty:  # Hermes reads first and returns without a write statement
                row = tx.conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
                if row is None or row[0] is not None:
                    return 0
            if clean:
                # A compression ancestor holding the title hands it over: that is recorded in the
                # ancestor's own stream, so it stays when this session is deleted and its events
                # erased (found by the differential test).
                row = tx.conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
                if row is not None and not (only_if_empty and row[0] is not None):
                    holder = tx.conn.execute("SELECT id FROM sessions WHERE title = ? AND id != ?",
                                             (clean, session_id)).fetchone()
                    if holder is not None and holder[0] in compression_ancestors(tx.conn, session_id):
                        tx.emit("hermes.title_cleared", holder[0], {})
                return int(tx.emit("session.titled", session_id,
                                   {"title": clean, "source": "llm" if only_if_empty else "user", **data}))
            return int(tx.emit("hermes.title_cleared", session_id, data))

        return int(self._write(fn)) > 0

    def set_session_title(self, session_id: str, title: str) -> bool:
        """Set or clear (empty title) a session's title. ValueError when another session holds
        it (unless that is a compression ancestor, which hands it over) or it is invalid."""
        return self._set_title(session_id, title, only_if_empty=False)

    def set_auto_title_if_empty(self, session_id: str, title: str) -> bool:
        return self._set_title(session_id, title, only_if_empty=True)

    def set_session_archived(self, session_id: str, archived: bool) -> bool:
        """Archive or unarchive the session's whole compression chain: one event per member, in
        that member's own stream (``alone``), so a member's flag survives the erase of another
        member's stream when that one is deleted or pruned (a chain-wide event in the deleted
        session's stream went with it; found by the differential test). True when the chain has
        a row."""
        kind = "session.archived" if archived else "session.unarchived"

        def fn(tx: Tx) -> int:
            return sum(int(tx.emit(kind, member, {"alone": 1}) or 0)
                       for member in compression_lineage(tx.conn, session_id))

        return int(self._write(fn) or 0) > 0

    # ---- messages ------------------------------------------------------------------------

    def append_message(self, session_id: str, role: str, content: Any = None, tool_name: Optional[str] = None,
                       tool_calls: Any = None, tool_call_id: Optional[str] = None, token_count: Optional[int] = None,
                       finish_reason: Optional[str] = None, reasoning: Optional[str] = None,
                       reasoning_content: Optional[str] = None, reasoning_details: Any = None,
                       codex_reasoning_items: Any = None, codex_message_items: Any = None,
                       platform_message_id: Optional[str] = None, observed: bool = False,
                       effect_disposition: Optional[str] = None, timestamp: Any = None,
                       api_content: Optional[str] = None) -> int:
        """Append a message; returns its id. The session's message count grows by one and its
        tool-call count by the number of tool calls."""
        # Hermes encodes (JSON, content) before its first statement, and binds in that statement:
        # on a closed handle only the encoding can fail otherwise than a closed handle does.
        encoded = {"reasoning_details_json": text.json_text(reasoning_details),
                   "codex_reasoning_items_json": text.json_text(codex_reasoning_items),
                   "codex_message_items_json": text.json_text(codex_message_items),
                   "tool_calls_json": text.json_text(tool_calls)}
        stored = text.encode_content(content)
        stamp = _when(timestamp, time.time())
        self._open()
        data: dict[str, Any] = {"role": sql_value(role, "role"), "timestamp": sql_value(stamp)}
        _put_content(data, stored)
        _put(data, "tool_call_id", tool_call_id)
        _put(data, "tool_calls_json", encoded["tool_calls_json"])
        _put(data, "tool_name", text.scrub_if_text(tool_name))
        _put(data, "effect_disposition", effect_disposition)
        _put(data, "token_count", token_count)
        _put(data, "finish_reason", finish_reason)
        _put(data, "reasoning", text.scrub_if_text(reasoning))
        _put(data, "reasoning_content", text.scrub_if_text(reasoning_content))
        for key in ("reasoning_details_json", "codex_reasoning_items_json", "codex_message_items_json"):
            _put(data, key, encoded[key])
        _put(data, "platform_message_id", platform_message_id)
        if observed:
            data["observed"] = 1
        if isinstance(api_content, str):
            data["api_content"] = sql_value(text.scrub(api_content), "api_content")
        calls = _tool_call_count(tool_calls)
        if calls:
            data["n_tool_calls"] = calls

        def fn(tx: Tx) -> int:
            data["id"] = next_message_id(tx.conn)
            return int(tx.emit("message.appended", session_id, data))

        return int(self._write(fn))

    def _message_rows(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Event data of messages inserted together (replace, compaction, import): Hermes'
        per-message encoding, each without an explicit time stamped just after the previous."""
        now = time.time()
        out = []
        for msg in messages:
            role = msg.get("role", "unknown")
            assistant = role == "assistant"
            stamp = _when(msg.get("timestamp"), now)
            tool_calls = msg.get("tool_calls")
            data: dict[str, Any] = {"role": sql_value(role, "role"), "timestamp": sql_value(stamp)}
            _put_content(data, text.encode_content(msg.get("content")))
            _put(data, "tool_call_id", msg.get("tool_call_id"))
            _put(data, "tool_calls_json", text.json_text(tool_calls))
            _put(data, "tool_name", text.scrub_if_text(msg.get("tool_name")))
            _put(data, "effect_disposition", msg.get("effect_disposition"))
            _put(data, "token_count", msg.get("token_count"))
            _put(data, "finish_reason", msg.get("finish_reason"))
            if assistant:
                _put(data, "reasoning", text.scrub_if_text(msg.get("reasoning")))
                _put(data, "reasoning_content", text.scrub_if_text(msg.get("reasoning_content")))
                _put(data, "reasoning_details_json", text.json_text(msg.get("reasoning_details")))
                _put(data, "codex_reasoning_items_json", text.json_text(msg.get("codex_reasoning_items")))
                _put(data, "codex_message_items_json", text.json_text(msg.get("codex_message_items")))
            _put(data, "platform_message_id", msg.get("platform_message_id") or msg.get("message_id"))
            if msg.get("observed"):
                data["observed"] = 1
            api_content = msg.get("api_content")
            if isinstance(api_content, str):
                data["api_content"] = sql_value(text.scrub(api_content), "api_content")
            calls = _tool_call_count(tool_calls)
            if calls:
                data["n_tool_calls"] = calls
            out.append(data)
            now = max(now + 1e-6, stamp + 1e-6)
        return out

    def replace_messages(self, session_id: str, messages: list[dict[str, Any]], active_only: bool = False) -> None:
        """Replace the session's stored messages (only the active ones with ``active_only``) atomically."""
        self._refuse_read_only(session_id)
        rows = self._message_rows(messages)
        flags: dict[str, Any] = {"active_only": True} if active_only else {}
        self._write(lambda tx: tx.emit("hermes.messages_replaced", session_id,
                                       {"messages": numbered(tx.conn, rows), **flags}))

    def archive_and_compact(self, session_id: str, compacted_messages: list[dict[str, Any]]) -> int:
        """Compaction that keeps history: active messages become archived (compacted, still
        searchable), the compacted transcript becomes the active set. Returns its size."""
        self._refuse_read_only(session_id)
        rows = self._message_rows(compacted_messages)
        return int(self._write(lambda tx: tx.emit("hermes.messages_compacted", session_id,
                                                  {"messages": numbered(tx.conn, rows)})) or 0)

    def set_latest_user_api_content(self, session_id: str, content: Any, api_content: str) -> int:
        """The API-content sidecar on the newest active user message, if it holds ``content``."""
        stored = text.encode_content(content)
        self._open()
        data: dict[str, Any] = {"api_content": sql_value(text.scrub_if_text(api_content), "api_content")}
        _put_content(data, stored)
        return int(self._write(lambda tx: tx.emit("hermes.api_content_set", session_id, data)) or 0)

    def clear_messages(self, session_id: str) -> None:
        self._write(lambda tx: tx.emit("hermes.messages_cleared", session_id, {}))

    def rewind_to_message(self, session_id: str, target_message_id: int) -> dict[str, Any]:
        """Hide the target user message and everything after it (kept, inactive); the session's
        rewind count grows even when nothing was active. ValueError for a missing target or
        one that is not a user message."""
        with self._reading() as conn:
            row = conn.execute("SELECT * FROM messages WHERE id = ? AND session_id = ?",
                               (target_message_id, session_id)).fetchone()
        if row is None:
            raise ValueError(f"message {target_message_id} not found in session {session_id}")
        target = dict(row)
        if target.get("role") != "user":
            raise ValueError(f"rewind target must be a 'user' message (got role={target.get('role')!r}, "
                             f"id={target_message_id})")
        target["content"] = text.decode_content(target.get("content"))
        rewound = self._write(lambda tx: tx.emit("hermes.messages_rewound", session_id,
                                                 {"message_id": sql_value(target_message_id)})) or []
        head = self._row("SELECT MAX(id) FROM messages WHERE session_id = ? AND active = 1", (session_id,))
        return {"rewound_count": len(rewound), "target_message": target,
                "new_head_id": head[0] if head and head[0] is not None else None}

    def restore_rewound(self, session_id: str, since_message_id: int) -> int:
        return int(self._write(lambda tx: tx.emit("hermes.messages_restored", session_id,
                                                  {"since": sql_value(since_message_id)})) or 0)

    # ---- deletion ------------------------------------------------------------------------

    @staticmethod
    def _remove_session_files(sessions_dir: Optional[Path], session_id: str) -> None:
        """Remove a session's transcript files (``<id>.json``, ``<id>.jsonl``, request dumps);
        filesystem errors are ignored."""
        if sessions_dir is None:
            return
        for suffix in (".json", ".jsonl"):
            try:
                (Path(sessions_dir) / f"{session_id}{suffix}").unlink(missing_ok=True)
            except OSError:
                pass
        try:
            for dump in Path(sessions_dir).glob(f"request_dump_{session_id}_*.json"):
                try:
                    dump.unlink(missing_ok=True)
                except OSError:
                    pass
        except OSError:
            pass

    def _delete(self, ids_sql: Callable[[sqlite3.Connection], list[Any]], flags: dict[str, Any],
                statement: bool = False) -> list[Any]:
        def fn(tx: Tx) -> list[Any]:
            ids = ids_sql(tx.conn)
            if not ids:
                return []
            return list(tx.emit("hermes.sessions_deleted", None, {"ids": [sql_value(i) for i in ids], **flags}) or [])

        engine = self._engine
        gone = list(self._write(fn, statement=statement))
        if gone:
            _erase_deleted(engine)
        return gone

    def delete_session(self, session_id: str, sessions_dir: Optional[Path] = None) -> bool:
        """Delete a session and its messages; its delegate subagents go with it, other children
        are kept as roots. False when it does not exist."""
        gone = self._delete(lambda conn: [r[0] for r in conn.execute("SELECT id FROM sessions WHERE id = ?",
                                                                      (session_id,))],
                            {"delegates": True, "orphan": True})
        if not gone:
            return False
        for sid in gone[1:]:
            self._remove_session_files(sessions_dir, sid)
        self._remove_session_files(sessions_dir, session_id)
        return True

    def delete_session_if_empty(self, session_id: str, sessions_dir: Optional[Path] = None) -> bool:
        """Delete a session that never got content: no title, no messages, no children."""
        gone = self._delete(lambda conn: [session_id], {"if_empty": True}, statement=True)
        if gone:
            self._remove_session_files(sessions_dir, session_id)
        return bool(gone)

    def delete_sessions(self, session_ids: list[str], sessions_dir: Optional[Path] = None) -> int:
        """Delete the given sessions at once (unknown ids skipped); returns how many existed."""
        if not session_ids:
            return 0
        unique = list({sid for sid in session_ids if isinstance(sid, str) and sid})
        if not unique:
            return 0
        found: list[Any] = []

        def existing(conn: sqlite3.Connection) -> list[Any]:
            found[:] = [r[0] for r in conn.execute(f"SELECT id FROM sessions WHERE id IN ({','.join('?' * len(unique))})",
                                                   unique)]
            return found

        gone = self._delete(existing, {"delegates": True, "orphan": True})
        for sid in gone[len(found):]:
            self._remove_session_files(sessions_dir, sid)
        for sid in found:
            self._remove_session_files(sessions_dir, sid)
        return len(found)

    def delete_empty_sessions(self, sessions_dir: Optional[Path] = None) -> int:
        """Delete every ended, unarchived session without messages (children kept as roots)."""
        gone = self._delete(lambda conn: [r[0] for r in conn.execute(
            "SELECT id FROM sessions WHERE message_count = 0 AND ended_at IS NOT NULL AND archived = 0")],
            {"orphan": True})
        for sid in gone:
            self._remove_session_files(sessions_dir, sid)
        return len(gone)

    _prune_filter_where = staticmethod(prune_filter)

    def archive_sessions(self, older_than_days: Optional[float] = None, source: Optional[str] = None,
                         **filters: Any) -> int:
        filters.setdefault("archived", False)
        rows = self.list_prune_candidates(older_than_days=older_than_days, source=source, **filters)
        for row in rows:
            self.set_session_archived(row["id"], True)
        return len(rows)

    def prune_sessions(self, older_than_days: Optional[float] = 90, source: Optional[str] = None,
                       sessions_dir: Optional[Path] = None, **filters: Any) -> int:
        """Delete ended sessions matching the filters (default: older than 90 days); children
        outside the selection are kept as roots. Returns how many were deleted."""
        if filters.get("started_before") is None and older_than_days is not None:
            filters["started_before"] = time.time() - older_than_days * 86400
        where, params = prune_filter(source=source, **filters)
        gone = self._delete(lambda conn: [r[0] for r in conn.execute(f"SELECT s.id FROM sessions s WHERE {where}",
                                                                      params)], {"orphan": True})
        for sid in gone:
            self._remove_session_files(sessions_dir, sid)
        return len(gone)

    # ---- key/value -----------------------------------------------------------------------

    def set_meta(self, key: str, value: str) -> None:
        self._open()
        data = {"key": sql_value(key, "key"), "value": sql_value(value, "value")}
        self._write(lambda tx: tx.emit("hermes.meta_set", None, data))

    # ---- gateway routing index -----------------------------------------------------------

    def save_gateway_routing_entry(self, session_key: str, entry_json: str, *, scope: str = "") -> None:
        if not session_key or not entry_json:
            return
        self._open()
        data = {"scope": sql_value(scope), "session_key": sql_value(session_key), "entry_json": sql_value(entry_json),
                "updated_at": time.time()}
        self._write(lambda tx: tx.emit("hermes.routing_saved", None, data))

    _ROUTING_EVENT_BYTES = 4 * 1024 * 1024
    """Room for changed routing entries in one event (an event holds 16 MiB encoded)."""

    def replace_gateway_routing_entries(self, entries: dict[str, str], *, scope: str = "") -> None:
        """Replace the scope's routing index (keys not given disappear), every row stamped with
        the time of this call — also when the entries are the ones already there: Hermes rewrites
        them, and their ``updated_at`` is part of the rows (an earlier version skipped that write
        and kept the old stamps; the differential test found it)."""
        now = time.time()
        self._refuse_read_only(scope)  # Hermes' first statement (a DELETE of the scope) refuses it
        pairs = [(k, v) for k, v in entries.items() if k and v] if entries else []
        encoded = [[sql_value(k), sql_value(v)] for k, v in pairs]
        scope_value = sql_value(scope)

        def fn(tx: Tx) -> None:
            # The gateway restates its whole index after every interaction: the event carries the
            # keys and only the entries that differ from the stored rows (logging the whole index
            # cost the log its size per message, and an index over one event's room could not be
            # stored at all). Changed entries beyond one event's room go first, upserted by
            # hermes.routing_upserted events of the same write.
            stored = dict(tx.conn.execute("SELECT session_key, entry_json FROM gateway_routing WHERE scope = ?",
                                          (scope,)).fetchall())
            changed = [pair for (k, v), pair in zip(pairs, encoded) if not (k in stored and _same(stored[k], v))]
            part: list[list[Any]] = []
            size = 0
            for pair in changed:
                n = len(orjson.dumps(pair))
                if part and size + n > self._ROUTING_EVENT_BYTES:
                    tx.emit("hermes.routing_upserted", None, {"scope": scope_value, "entries": part, "updated_at": now})
                    part, size = [], 0
                part.append(pair)
                size += n
            tx.emit("hermes.routing_restated", None, {"scope": scope_value, "order": [k for k, _ in encoded],
                                                      "entries": part, "updated_at": now})

        self._write(fn)

    def delete_gateway_routing_entries(self, session_keys: list[str], *, scope: str = "") -> None:
        if not session_keys:
            return
        self._open()
        keys = list(session_keys)
        if self.read_only:  # Hermes' DELETEs bind one key at a time: the first one's is refused
            self._refuse_read_only(scope, *keys[:1])
        data = {"scope": sql_value(scope), "keys": [sql_value(k) for k in keys]}
        self._write(lambda tx: tx.emit("hermes.routing_deleted", None, data))

    # ---- Telegram topic mode ---------------------------------------------------------------

    def _topic_tables(self, tx: Tx) -> None:
        from eventlog.adapters.hermes.apply import topic_tables_exist

        if topic_tables_exist(tx.conn):
            row = tx.conn.execute("SELECT value FROM state_meta WHERE key = 'telegram_dm_topic_schema_version'").fetchone()
            if row is not None and row[0] == "2":
                return
        tx.emit("hermes.topic_tables_created", None, {})

    def apply_telegram_topic_migration(self) -> None:
        """Create the topic-mode tables (Hermes does so only on an explicit /topic opt-in). Its
        script and its state_meta row are written whatever is there: a read_only handle raises."""
        self._write(self._topic_tables, statement=True)

    def enable_telegram_topic_mode(self, *, chat_id: str, user_id: str, has_topics_enabled: Optional[bool] = None,
                                   allows_users_to_create_topics: Optional[bool] = None) -> None:
        def flag(value: Optional[bool]) -> Optional[int]:
            return None if value is None else (1 if value else 0)

        data = {"chat_id": str(chat_id), "user_id": str(user_id), "now": time.time(),
                "has_topics_enabled": flag(has_topics_enabled),
                "allows_users_to_create_topics": flag(allows_users_to_create_topics)}

        self.apply_telegram_topic_migration()  # its own write, as in Hermes: it stays if the next fails
        self._write(lambda tx: tx.emit("hermes.topic_mode_enabled", None, data))

    def disable_telegram_topic_mode(self, *, chat_id: str, clear_bindings: bool = True) -> None:
        data = {"chat_id": str(chat_id), "now": time.time(), "clear_bindings": bool(clear_bindings)}
        try:
            self._write(lambda tx: tx.emit("hermes.topic_mode_disabled", None, data))
        except sqlite3.OperationalError:
            if not self.read_only:
                raise
            # Hermes takes its statements' OperationalError for 'no topic tables yet': on a
            # read_only handle (where every write statement raises one) the call does nothing

    def delete_telegram_topic_binding(self, *, chat_id: str, thread_id: str) -> int:
        """Unbind one topic thread; 0 when there was none. Never raises on a read_only handle,
        where Hermes' cleanup takes the refused statement for missing tables and answers 0."""
        data = {"chat_id": str(chat_id), "thread_id": str(thread_id), "now": time.time()}
        try:
            return int(self._write(lambda tx: tx.emit("hermes.topic_unbound", None, data)) or 0)
        except sqlite3.OperationalError:
            if not self.read_only:
                raise
            return 0

    def bind_telegram_topic(self, *, chat_id: str, thread_id: str, user_id: str, session_key: str, session_id: str,
                            managed_mode: str = "auto") -> None:
        """Bind a topic thread to a session; a session bound to another topic raises ValueError."""
        self.apply_telegram_topic_migration()  # its own write, first, as in Hermes: it stays if the bind fails
        data = {"chat_id": str(chat_id), "thread_id": str(thread_id), "user_id": str(user_id),
                "session_key": str(session_key), "managed_mode": sql_value(managed_mode), "now": time.time()}
        sid = str(session_id)

        def fn(tx: Tx) -> None:
            # A thread bound to another session moves here (the row keeps its linked_at): the
            # move is also recorded in that session's stream, so erasing this one's events (a
            # delete) does not bring the old binding back (found by the differential test).
            row = tx.conn.execute("SELECT session_id, linked_at FROM telegram_dm_topic_bindings"
                                  " WHERE chat_id = ? AND thread_id = ?", (data["chat_id"], data["thread_id"])).fetchone()
            moved = row is not None and row[0] != sid
            if moved:
                tx.emit("hermes.topic_unbound", row[0], {"chat_id": data["chat_id"], "thread_id": data["thread_id"],
                                                        "now": data["now"], "moved": 1})
            tx.emit("hermes.topic_bound", sid, {**data, "linked_at": row[1]} if moved else data)

        self._write(fn)

    # ---- handoff -----------------------------------------------------------------------------

    def request_handoff(self, session_id: str, platform: str) -> bool:
        self._open()
        data = {"platform": sql_value(platform)}
        return int(self._write(lambda tx: tx.emit("hermes.handoff_requested", session_id, data)) or 0) > 0

    def claim_handoff(self, session_id: str) -> bool:
        return int(self._write(lambda tx: tx.emit("hermes.handoff_claimed", session_id, {})) or 0) > 0

    def complete_handoff(self, session_id: str) -> None:
        self._write(lambda tx: tx.emit("hermes.handoff_completed", session_id, {}))

    def fail_handoff(self, session_id: str, error: str) -> None:
        self._open()
        data = {"error": sql_value(error[:500])}
        self._write(lambda tx: tx.emit("hermes.handoff_failed", session_id, data))

    # ---- maintenance of the projection file ----------------------------------------------

    def _on_writer(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn`` on the projection writer under the lease (layout-only work, no events); on a
        read_only handle, on its read-only connection, where what would write fails as in Hermes."""
        if self.read_only:
            with self._reading() as conn:
                return fn(conn)
        engine = self._engine
        if engine is None:
            raise closed_error()
        with engine._held(), engine.lease:
            return fn(engine._connection())

    def _fts_command(self, command: str, rank: int | None = None) -> int:
        def run(conn: sqlite3.Connection) -> int:
            done = 0
            for table in self._FTS_TABLES:
                try:
                    if rank is None:
                        conn.execute(f"INSERT INTO {table}({table}) VALUES('{command}')")
                    else:
                        conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('{command}', ?)", (rank,))
                    done += 1
                except sqlite3.OperationalError as exc:
                    log.warning("FTS %s failed for %s: %s", command, table, exc)
            return done

        return int(self._on_writer(run))

    def optimize_fts(self) -> int:
        """Merge each FTS index into one segment (layout only: results do not change). Called by
        the write path on its cadence, an incremental merge instead (see
        :data:`_OPTIMIZE_EVERY_N_WRITES`)."""
        if getattr(self._cadence, "on", False):
            return self._fts_command("merge", self._CADENCE_MERGE_PAGES)
        return self._fts_command("optimize")

    def rebuild_fts(self) -> int:
        """Rebuild both FTS indexes from the messages (the projection can also be rebuilt whole
        from the log)."""
        return self._fts_command("rebuild")

    def vacuum(self) -> int:
        """Merge FTS segments, then VACUUM the projection file; returns the indexes optimized."""
        try:
            optimized = self.optimize_fts()
        except Exception as exc:
            log.warning("FTS optimize before VACUUM failed: %s", exc)
            optimized = 0

        def run(conn: sqlite3.Connection) -> None:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            conn.execute("VACUUM")

        self._on_writer(run)
        return optimized

    def maybe_auto_prune_and_vacuum(self, retention_days: int = 90, min_interval_hours: int = 24, vacuum: bool = True,
                                    sessions_dir: Optional[Path] = None) -> dict[str, Any]:
        """Prune old sessions (and VACUUM when some went) at most once per interval; never raises."""
        result: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
        try:
            last = self.get_meta("last_auto_prune")
            now = time.time()
            if last:
                try:
                    if now - float(last) < min_interval_hours * 3600:
                        result["skipped"] = True
                        return result
                except (TypeError, ValueError):
                    pass
            pruned = self.prune_sessions(older_than_days=retention_days, sessions_dir=sessions_dir)
            result["pruned"] = pruned
            if vacuum and pruned > 0:
                try:
                    self.vacuum()
                    result["vacuumed"] = True
                except Exception as exc:
                    log.warning("state.db VACUUM failed: %s", exc)
            self.set_meta("last_auto_prune", str(now))
        except Exception as exc:
            log.warning("state.db auto-maintenance failed: %s", exc)
            result["error"] = str(exc)
        return result


def _erase_deleted(engine: Optional[Engine]) -> None:
    """What Hermes deletes is gone from the disk, not only from the views (an erase). A handle
    closed by another thread since the delete committed leaves it to the next process's first
    write (the delete recorded the ids as due), as a kill there would: the delete stands."""
    assert engine is not None
    if not engine.closing:
        try:
            engine.erase("deleted through Hermes' SessionDB")
        except AttributeError:  # closed_error()
            if not engine.closing:
                raise


def _same(stored: Any, value: Any) -> bool:
    return type(stored) is type(value) and stored == value

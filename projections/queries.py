"""Read-only queries on a profile's projections: the read models of docs/EVENTS.md.

A :class:`Reader` opens state.db ``mode=ro`` (never a write lock) with the FTS file attached
read-only as ``f``. Before each query it checks the pointers (two ``readlink`` calls) and
reopens when a rebuild swapped in a new generation; a connection to the old file keeps
working until then. A query that meets a damaged file asks the projector to repair it and
runs once more. A search whose index fails falls back to a scan of state.db and says so
(``degraded: True``); transcripts stay readable throughout.

Odd stored values never break a read: they come back as None, and ``reader.warnings.lines``
(and the ``eventlog.projections`` logger) names the session and column.
"""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from eventlog.errors import DiskFullError, EventLogError, ProjectionError, ValidationError
from eventlog.sessions.fold import search_terms
from eventlog.sessions.reads import typed_read
from eventlog.sessions.rules import (
    COSTS,
    DEFAULT_SOURCE,
    FLAGS,
    INT64_MAX,
    INT64_MIN,
    TOKENS,
    as_int,
    normalize_title,
    workspace_scope,
)
from projections import db as sql
from projections import files, fts, space
from projections.apply import lineage_of, load_int
from projections.files import Generation
from projections.health import HEALTHY, LogView, fts_counts, judge_meta, read_meta
from projections.rows import (
    MESSAGE_COLS,
    REACTION_COLS,
    SESSION_COLS,
    USAGE_COLS,
    Warnings,
    message_dict,
    reaction_dict,
    session_dict,
    usage_dict,
)
from projections.schema import FTS_APP_ID, REPLAY_APP_ID, STATE_APP_ID

T = TypeVar("T")
_S = ", ".join(f"s.{c}" for c in SESSION_COLS)
_M = ", ".join(f"m.{c}" for c in MESSAGE_COLS)
_U = ", ".join(USAGE_COLS)
_R = ", ".join(REACTION_COLS)
_SOURCE = f"coalesce(s.source, '{DEFAULT_SOURCE}')"


def _encodable(*values: Any) -> bool:
    """False when a text argument holds lone surrogates: nothing stored can equal or contain it
    (stored text had them replaced), and SQLite cannot bind it."""
    for v in values:
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


def _clamp(v: int) -> int:
    """An int argument brought into SQLite's 64-bit range (same answers: no stored id is
    outside it)."""
    return max(INT64_MIN, min(int(v), INT64_MAX))


def _int64(v: Any) -> bool:
    return as_int(v) is not None


class Reader:
    """Queries over one profile's projections (``Reader(projector)``) or over a standalone
    replay file (:meth:`open_file`). Thread-safe; one connection guarded by a lock."""

    def __init__(self, projector: Any = None, *, path: str | Path | None = None) -> None:
        if (projector is None) == (path is None):
            raise ValidationError("path", "give a projector or a path (not both)")
        self._projector = projector
        self._path = Path(path).absolute() if path is not None else None
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._state_gen: Generation | None = None
        self._fts_gen: Generation | None = None
        self._fts: str | None = None  # schema name of the FTS tables, None when unusable
        self._holds: dict[str, tuple[int | None, Generation]] = {}  # kind -> hold (files.hold)
        self.warnings = Warnings()
        self.last_search_degraded = False
        self._counted = False

    @classmethod
    def open_file(cls, path: str | Path) -> "Reader":
        """A reader over a standalone file written by ``rebuild(out_path=...)``."""
        return cls(path=path)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db = None
            self._state_gen = self._fts_gen = None
            self._fts = None
            for kind in list(self._holds):
                self._let_go(kind)

    def _hold(self, kind: str, g: Generation) -> None:
        """Hold generation ``g`` while a connection has it open: no process deletes it meanwhile."""
        self._let_go(kind)
        self._holds[kind] = (files.hold(g), g)

    def _hold_pointed(self, kind: str, g: Generation, pointer: Path) -> Generation | None:
        """Hold ``g``, which ``pointer`` named a moment ago; if it was collected meanwhile (a
        rebuild swapped and nobody held it), hold the generation the pointer names now."""
        for _ in range(20):
            self._hold(kind, g)
            if self._holds[kind][0] is not None:
                return g
            now = files.read_pointer(pointer)
            if now is None or now == g:
                return g  # the file itself is missing: opening it reports that
            g = now
        return g

    def _let_go(self, kind: str) -> None:
        held = self._holds.pop(kind, None)
        if held is not None:
            files.release(*held)  # the last process to let go of a replaced generation deletes it

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- connection ------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._path is not None:
            if self._db is None:
                if not self._path.exists():
                    raise ProjectionError(f"{self._path} does not exist")
                db = sql.connect_ro(self._path)
                try:
                    app = db.execute("PRAGMA application_id").fetchone()[0]
                    if app not in (REPLAY_APP_ID, STATE_APP_ID):
                        raise ProjectionError(f"{self._path} is not an eventlog projection file")
                    has_fts = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'fts'").fetchone()
                except BaseException:
                    db.close()
                    raise
                fts.register(db)
                self._db, self._fts = db, ("main" if has_fts else None)
            return self._db
        p = self._projector
        g = files.read_pointer(p.state_pointer())
        if isinstance(self._db, sql.ImmutableConnection) and space.cannot_write(p.dir) is None:
            self.close()  # there is room again: read through the WAL as usual
        if self._db is None or g != self._state_gen:
            self._open_state(g)
        assert self._db is not None
        fg = files.read_pointer(p.fts_pointer())
        if fg != self._fts_gen:
            self._attach_fts(fg)
        return self._db

    def _open_state(self, g: Generation | None) -> None:
        self.close()
        p = self._projector
        for attempt in (1, 2):
            problem = None
            db = None
            if g is not None:
                g = self._hold_pointed("state", g, p.state_pointer())
            if g is None:
                problem = "missing"
            else:
                try:
                    db = sql.connect_ro(g.path)
                    if db.execute("PRAGMA application_id").fetchone()[0] != STATE_APP_ID:
                        problem = "foreign"
                    else:
                        status, detail = judge_meta(read_meta(db), "state", p.profile, LogView.of(p.log))
                        if status not in HEALTHY:
                            problem = f"{status} ({detail})"
                except sqlite3.DatabaseError as e:
                    problem = f"{sql.status_of(e)} ({e})"
            if problem is None and db is not None:
                fts.register(db)
                self._db, self._state_gen = db, g
                return
            if db is not None:
                db.close()
            self._let_go("state")
            if attempt == 2:
                if p.site.halt is not None:
                    # the heal could not build it: no room (a full disk, a read-only file system),
                    # which doctor --fix or rebuild cannot mend either
                    raise ProjectionError(f"state.db is {problem} and cannot be built now: {p.site.halt}",
                                          hint=f"{space.remedy(p.site.halt)}, then retry: the log keeps every event")
                raise ProjectionError(f"state.db is unusable: {problem}",
                                      hint="run `eventlog doctor --fix` or `eventlog rebuild`")
            p.heal()
            g = files.read_pointer(p.state_pointer())

    def _attach_fts(self, fg: Generation | None) -> None:
        assert self._db is not None
        if self._fts is not None:
            try:
                self._db.execute("DETACH DATABASE f")
            except sqlite3.Error:
                pass
        self._fts, self._fts_gen = None, fg
        self._let_go("fts")
        if fg is not None:
            fg = self._hold_pointed("fts", fg, self._projector.fts_pointer())
            self._fts_gen = fg
        if fg is None or not fg.path.exists():
            return
        try:
            sql.attach_ro(self._db, fg.path, "f", immutable=isinstance(self._db, sql.ImmutableConnection))
        except sqlite3.DatabaseError:
            return
        try:
            if self._db.execute("PRAGMA f.application_id").fetchone()[0] == FTS_APP_ID:
                self._fts = "f"
                self._counted = False
                # Cheap counts on every open: an emptied index is found by reads, not only by doctor.
                problem = fts_counts(self._db, "f")
                if problem and self._projector is not None:
                    self._projector.report_fts_fault(problem)
                return
        except sqlite3.DatabaseError:
            pass
        try:
            self._db.execute("DETACH DATABASE f")
        except sqlite3.Error:
            pass

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one read transaction: the reader's one error boundary. A damaged file
        is repaired once (by the projector) and ``fn`` runs again; every other driver, OS or
        value error leaves as an EventLogError (:func:`projections.db.converted`), cause chained."""
        action = "reading the projection" if self._path is None else f"reading {self._path}"
        with self._lock:
            heal = False
            for attempt in (1, 2):
                try:
                    if heal:
                        self.close()
                        self._projector.heal(full=True)
                    db = self._connection()
                    db.execute("BEGIN")
                    try:
                        return fn(db)
                    finally:
                        if db.in_transaction:
                            db.execute("COMMIT")
                except EventLogError:
                    raise
                except sqlite3.DatabaseError as e:
                    directory = self._projector.dir if self._projector is not None else None
                    if attempt == 1 and sql.is_fault(e, directory) and self._projector is not None:
                        heal = True
                        continue
                    why = space.out_of_room(e, directory) if directory is not None else None
                    if why is not None:
                        raise DiskFullError(f"{action} failed: {why} ({e})",
                                            hint="free some disk space; the log is not affected") from e
                    raise sql.converted(e, action) from e
                except (sqlite3.Error, OSError, ValueError) as e:
                    raise sql.converted(e, action) from e
            raise AssertionError("unreachable")

    @property
    def fts_schema(self) -> str | None:
        """The schema name the FTS tables are attached as (None while the index is unusable);
        meaningful inside :meth:`run_read`."""
        return self._fts

    def run_read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` in one read transaction, under this reader's error boundary
        (for checks that read tables directly: ``doctor --deep``)."""
        return self._run(fn)

    def cursors(self) -> tuple[int, int | None]:
        """(state.db cursor, FTS cursor or None when the index is unusable)."""
        def read(db: sqlite3.Connection) -> tuple[int, int | None]:
            s = db.execute("SELECT value FROM meta WHERE key = 'last_seq'").fetchone()
            f = None
            if self._fts is not None:
                try:
                    row = db.execute(f"SELECT value FROM {self._fts}.meta WHERE key = 'last_seq'").fetchone()
                    f = row[0] if row else None
                except sqlite3.DatabaseError:
                    f = None
            return (s[0] if s else 0), f
        return self._run(read)

    # ---- sessions ---------------------------------------------------------------------------

    # Every read checks its call against its signature (eventlog.sessions.reads.typed_read).

    @typed_read
    def get_session(self, session_id: str) -> dict[str, Any] | None:
        if not _encodable(session_id):
            return None
        row = self._run(lambda db: db.execute(f"SELECT {_S} FROM sessions s WHERE s.id = ?", (session_id,)).fetchone())
        return session_dict(row, self.warnings) if row else None

    @typed_read
    def list_sessions(self, *, source: str | None = None, archived: bool | None = False,
                      pinned: bool | None = None, hidden: bool | None = False, children: bool = True,
                      workspace: str | None = None, limit: int | None = 50, offset: int = 0) -> list[dict[str, Any]]:
        """Most recent activity first (null last), then id descending; the page
        ``[offset:offset+limit]``, then every matching pinned session outside the page."""
        if not _encodable(source, workspace):
            return []
        where: list[str] = []
        params: list[Any] = []
        for flag, wanted in zip(FLAGS, (archived, pinned, hidden)):
            if wanted is not None:
                where.append(f"s.{flag} = ?")
                params.append(1 if wanted else 0)
        if source is not None:
            where.append(f"{_SOURCE} = ?")
            params.append(source)
        if not children:
            where.append("s.parent_session_id IS NULL")
        if workspace is not None:
            path, under = workspace_scope(workspace)
            where.append("(s.git_repo_root = ? OR substr(s.git_repo_root, 1, ?) = ?"
                         " OR s.cwd = ? OR substr(s.cwd, 1, ?) = ?)")
            params += [path, len(under), under] * 2
        cond = " AND ".join(where) or "1"
        start = _clamp(offset)
        count = -1 if limit is None else _clamp(limit)
        order = "ORDER BY s.last_activity_at DESC, s.id DESC"

        def query(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            page = db.execute(f"SELECT {_S} FROM sessions s WHERE {cond} {order} LIMIT ? OFFSET ?",
                              (*params, count, start)).fetchall()
            if pinned is False:
                return page
            shown = {r[0] for r in page}
            extra = db.execute(f"SELECT {_S} FROM sessions s WHERE {cond} AND s.pinned = 1 {order}",
                               params).fetchall()
            return page + [r for r in extra if r[0] not in shown]

        return [session_dict(r, self.warnings) for r in self._run(query)]

    # ---- checks writers make before appending (same answers as the fold's helpers) --------

    def is_live(self, session_id: str) -> bool:
        if not isinstance(session_id, str) or not _encodable(session_id):
            return False
        row = self._run(lambda db: db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone())
        return row is not None

    def title_holder(self, title: str) -> str | None:
        """The live session holding ``title`` (compared after normalize_title), if any."""
        if not isinstance(title, str):
            return None
        t = normalize_title(title)
        if not _encodable(t):
            return None
        row = self._run(lambda db: db.execute("SELECT id FROM sessions WHERE title = ? LIMIT 1", (t,)).fetchone())
        return row[0] if row else None

    def titles(self) -> set[str]:
        rows = self._run(lambda db: db.execute("SELECT title FROM sessions WHERE title IS NOT NULL").fetchall())
        return {r[0] for r in rows if isinstance(r[0], str)}

    def message_session(self, message_id: int) -> str | None:
        """The live session a message belongs to (active or not), or None."""
        if not _int64(message_id):
            return None
        row = self._run(lambda db: db.execute("SELECT session_id FROM messages WHERE id = ?", (message_id,)).fetchone())
        return row[0] if row else None

    def current_reaction(self, message_id: int, author: str) -> str | None:
        if not _int64(message_id) or not isinstance(author, str) \
                or not _encodable(author):
            return None
        row = self._run(lambda db: db.execute(
            "SELECT emoji FROM reactions WHERE message_id = ? AND author = ?", (message_id, author)).fetchone())
        return row[0] if row else None

    def lineage(self, session_id: str) -> list[str]:
        """Live members of the session's lineage: the root first, then its descendants by id."""
        if not isinstance(session_id, str) or not _encodable(session_id):
            return []
        return self._run(lambda db: lineage_of(db, session_id))

    # ---- messages ------------------------------------------------------------------------------

    @typed_read
    def get_messages(self, session_id: str, *, include_inactive: bool = False, limit: int | None = None,
                     before: int | None = None, after: int | None = None,
                     newest_first: bool = False) -> list[dict[str, Any]]:
        if not _encodable(session_id):
            return []
        cond = "m.session_id = ?"
        params: list[Any] = [session_id]
        if not include_inactive:
            cond += " AND m.active = 1"
        if after is not None:
            cond += " AND m.id > ?"
            params.append(_clamp(after))
        if before is not None:
            cond += " AND m.id < ?"
            params.append(_clamp(before))
        count = -1 if limit is None else _clamp(limit)
        # Paging forward takes the first `limit`; otherwise the latest `limit`, read from the
        # end of the (session_id, id) index: O(limit), not O(session).
        forward = limit is None or (after is not None and before is None)
        order = "ASC" if forward else "DESC"

        def query(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                return []
            return db.execute(f"SELECT {_M} FROM messages m WHERE {cond} ORDER BY m.id {order} LIMIT ?",
                              (*params, count)).fetchall()

        rows = self._run(query)
        if forward == newest_first:
            rows.reverse()
        return [message_dict(r, self.warnings) for r in rows]

    @typed_read
    def get_usage(self, session_id: str) -> list[dict[str, Any]]:
        if not _encodable(session_id):
            return []
        rows = self._run(lambda db: db.execute(
            f"SELECT {_U} FROM usage WHERE session_id = ? ORDER BY model, provider, task",
            (session_id,)).fetchall())
        return [usage_dict(r, self.warnings) for r in rows]

    @typed_read
    def get_reactions(self, message_id: int) -> list[dict[str, Any]]:
        if not _int64(message_id):
            return []

        def query(db: sqlite3.Connection) -> tuple[Any, list[tuple[Any, ...]]]:
            owner = db.execute("SELECT session_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if owner is None:
                return None, []
            return owner[0], db.execute(f"SELECT {_R} FROM reactions WHERE message_id = ? ORDER BY author",
                                        (message_id,)).fetchall()

        session, rows = self._run(query)
        return [reaction_dict(r, session, self.warnings) for r in rows]

    def unseen_reactions(self, session_id: str) -> list[dict[str, Any]]:
        if not isinstance(session_id, str) or not _encodable(session_id):
            return []
        rows = self._run(lambda db: db.execute(
            f"SELECT {_R} FROM reactions WHERE session_id = ? AND seen = 0 ORDER BY message_id, author",
            (session_id,)).fetchall())
        return [reaction_dict(r, session_id, self.warnings) for r in rows]

    # ---- search ----------------------------------------------------------------------------------

    @typed_read
    def search(self, query: str, *, role: str | None = None, source: str | None = None,
               session_id: str | None = None, limit: int | None = 20) -> dict[str, Any]:
        """Active messages of live, non-hidden sessions whose search text contains every term
        of ``query`` (case-insensitive substrings), newest first. Any text is accepted.

        Returns ``{"degraded": bool, "results": [{"session_id", "message_id", "role",
        "snippet", "timestamp"}]}``; ``degraded`` means the index was unusable and a scan of
        state.db answered (same results, slower)."""
        shown = list(dict.fromkeys(search_terms(query)))
        terms = fts.query_terms(query)
        if not terms or not _encodable(*terms, role, source, session_id):
            return {"degraded": bool(self._projector is not None and self._projector.search_degraded),
                    "results": []}
        filters, params = ["m.active = 1", "s.hidden = 0"], []
        if role is not None:
            filters.append("m.role = ?")
            params.append(role)
        if source is not None:
            filters.append(f"{_SOURCE} = ?")
            params.append(source)
        if session_id is not None:
            filters.append("m.session_id = ?")
            params.append(session_id)
        count = -1 if limit is None else _clamp(limit)
        cols = "m.id, m.session_id, m.role, m.timestamp, m.content, m.content_json, m.tool_name, m.tool_calls"
        where = " AND ".join([*filters, "search_match(m.content, m.content_json, m.tool_name, m.tool_calls, ?)"])
        joined = fts.join_terms(terms)

        def scan(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            # Newest first, so a term found in many messages ends the scan early; one session's
            # messages are read through their index.
            return db.execute(
                f"SELECT {cols} FROM messages m JOIN sessions s ON s.id = m.session_id "
                f"WHERE {where} ORDER BY m.id DESC LIMIT ?", (*params, joined, count)).fetchall()

        def indexed(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            f = self._fts
            assert f is not None
            plan = fts.plan(db, f, terms)
            if plan.none:
                return []
            if not plan.groups or session_id is not None:
                return scan(db)
            return db.execute(
                f"SELECT {cols} FROM {f}.fts JOIN messages m ON m.id = fts.rowid "
                f"JOIN sessions s ON s.id = m.session_id WHERE fts MATCH ? AND {where} "
                "ORDER BY fts.rowid DESC LIMIT ?", (plan.match_expression(), *params, joined, count)).fetchall()

        def run(db: sqlite3.Connection) -> tuple[bool, list[tuple[Any, ...]]]:
            if self._fts is None and self._projector is not None:
                self._projector.report_fts_fault("the FTS index is missing or unreadable")
            if self._fts is not None and not self._counted and self._projector is not None:
                # Once per index generation: the documents counted against the index.
                self._counted = True
                try:
                    problem = fts_counts(db, self._fts, exact=True)
                except sqlite3.DatabaseError as e:
                    problem = str(e)
                if problem:
                    self._projector.report_fts_fault(problem)
            if self._fts is not None and not self._degraded():
                try:
                    return False, indexed(db)
                except sqlite3.DatabaseError as e:
                    # Whatever the index did wrong (a damaged or dropped shadow table reads as
                    # anything from "malformed" to "SQL logic error"), the scan answers instead.
                    if self._projector is not None:
                        self._projector.report_fts_fault(e)
            return True, scan(db)

        degraded, rows = self._run(run)
        self.last_search_degraded = degraded
        results = []
        for mid, sid, role_, stamp, content, content_json, tool_name, tool_calls in rows:
            text = fts.raw_search_text(content, content_json, tool_name, tool_calls)
            msg = message_dict((mid, sid, role_, None, 0, None, None, None, stamp, None, None, None, None,
                                None, None, 1), self.warnings)
            results.append({"session_id": sid, "message_id": mid, "role": msg["role"],
                            "snippet": fts.snippet(text, shown), "timestamp": msg["timestamp"]})
        return {"degraded": degraded, "results": results}

    def _degraded(self) -> bool:
        return self._fts is None or (self._projector is not None and self._projector.search_degraded)

    # ---- stats -------------------------------------------------------------------------------------

    @typed_read
    def stats(self) -> dict[str, Any]:
        """Totals over live root sessions (no parent, or a parent that is not live)."""
        rows = self._run(lambda db: db.execute(
            f"SELECT s.id, s.source, s.message_count, {', '.join('s.' + c for c in TOKENS + COSTS)} "
            "FROM sessions s LEFT JOIN sessions p ON p.id = s.parent_session_id "
            "WHERE s.parent_session_id IS NULL OR s.parent_session_id = s.id OR p.id IS NULL "
            "ORDER BY s.id").fetchall())
        out: dict[str, Any] = {"sessions": len(rows), "messages": 0, "by_source": {}}
        out.update(dict.fromkeys(TOKENS, 0), **dict.fromkeys(COSTS))
        for sid, source, messages, *rest in rows:
            if not isinstance(messages, int):
                self.warnings.add(sid, "message_count", messages)
                messages = 0
            key = source if isinstance(source, str) else DEFAULT_SOURCE
            bucket = out["by_source"].setdefault(key, {"sessions": 0, "messages": 0})
            bucket["sessions"] += 1
            bucket["messages"] += messages
            out["messages"] += messages
            for name, v in zip(TOKENS, rest[:5]):
                out[name] += load_int(v)
            for name, v in zip(COSTS, rest[5:]):
                if isinstance(v, (int, float)) and v == v:
                    out[name] = (out[name] or 0.0) + v
        return out

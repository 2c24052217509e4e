"""The read half of the Hermes ``SessionDB``: Hermes' queries over the projection.

Every method answers from the projection file through the handle's read-only connection
(``self._conn``), with the results, shapes and orderings of Hermes 0.19.0. Where Hermes leaves
an order to SQLite (ties), the same schema and indexes give the same plans.
"""
from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from typing import Any, Callable, Optional

from eventlog.adapters.hermes import schema, text

log = logging.getLogger("eventlog.adapters.hermes")

DELEGATE = "json_extract(COALESCE({a}model_config, '{{}}'), '$._delegate_from')"
BRANCHED = "json_extract(COALESCE({a}model_config, '{{}}'), '$._branched_from')"


def _branch_child(a: str) -> str:
    """A /branch child: marked at creation, or (older rows) started after its parent ended 'branched'."""
    return (f"{BRANCHED.format(a=a + '.')} IS NOT NULL OR EXISTS (SELECT 1 FROM sessions p WHERE"
            f" p.id = {a}.parent_session_id AND p.end_reason = 'branched' AND {a}.started_at >= p.ended_at)")


LISTABLE = f"(s.parent_session_id IS NULL OR {_branch_child('s')})"
"""Rows pickers show: roots and branch children (subagents and continuations stay hidden)."""
NOT_DELEGATE = f"{DELEGATE.format(a='s.')} IS NULL"
CONTINUATION = (f"parent.end_reason = 'compression' AND {BRANCHED.format(a='child.')} IS NULL"
                f" AND {DELEGATE.format(a='child.')} IS NULL AND COALESCE(child.source, '') != 'tool'")
"""A compression continuation edge parent -> child (branches, delegates and tool runs excluded)."""
PREVIEW = ("COALESCE((SELECT SUBSTR(REPLACE(REPLACE(m.content, X'0A', ' '), X'0D', ' '), 1, 63) FROM messages m"
           " WHERE m.session_id = s.id AND m.role = 'user' AND m.content IS NOT NULL"
           " ORDER BY m.timestamp, m.id LIMIT 1), '') AS _preview_raw")
LAST_ACTIVE = "COALESCE((SELECT MAX(m2.timestamp) FROM messages m2 WHERE m2.session_id = s.id), s.started_at)"
COMPACT_COLUMNS = ", ".join(f"s.{c}" for c in schema.SESSION_NAMES if c != "system_prompt")
CONVERSATION_COLUMNS = ("role, content, tool_call_id, tool_calls, tool_name, effect_disposition, finish_reason,"
                        " reasoning, reasoning_content, reasoning_details, codex_reasoning_items, codex_message_items,"
                        " platform_message_id, observed, timestamp, api_content")


def cwd_prefix_clause(cwd_prefix: str) -> tuple[str, list[str]]:
    """The cwd itself or anything below it (either separator)."""
    prefix = cwd_prefix.rstrip("/\\") or cwd_prefix
    return "(s.cwd = ? OR s.cwd LIKE ? OR s.cwd LIKE ?)", [prefix, f"{prefix}/%", f"{prefix}\\%"]


def with_preview(row: Any) -> dict[str, Any]:
    """A row dict whose raw preview column became ``preview`` (60 characters, "..." when cut)."""
    s = dict(row)
    raw = str(s.pop("_preview_raw", "") or "").strip()
    s["preview"] = (raw[:60] + ("..." if len(raw) > 60 else "")) if raw else ""
    s.pop("_effective_last_active", None)
    return s


def decoded_message(row: Any, where: str) -> dict[str, Any]:
    msg = dict(row)
    if "content" in msg:
        msg["content"] = text.decode_content(msg["content"])
    if msg.get("tool_calls"):
        try:
            msg["tool_calls"] = json.loads(msg["tool_calls"])
        except (json.JSONDecodeError, TypeError):
            log.warning("Failed to deserialize tool_calls in %s, falling back to []", where)
            msg["tool_calls"] = []
    return msg


def _like_any(needle: str) -> str:
    return f"%{text.like_escape(needle)}%"


class Reads:
    """Mixin: needs ``self._reading()`` (a context manager yielding the read connection)."""

    _lock: Any

    _reading: Callable[[], Any]
    """Provided by SessionDB (this is one of its mixins): a context manager giving the read connection."""

    def _rows(self, sql: str, params: Any = ()) -> list[Any]:
        with self._reading() as conn:
            rows: list[Any] = conn.execute(sql, params).fetchall()
            return rows

    def _row(self, sql: str, params: Any = ()) -> Any:
        with self._reading() as conn:
            return conn.execute(sql, params).fetchone()

    # ---- sessions ------------------------------------------------------------------------

    def get_session(self, session_id: str) -> Optional[dict[str, Any]]:
        row = self._row("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return dict(row) if row else None

    def resolve_session_id(self, session_id_or_prefix: str) -> Optional[str]:
        """The exact id, or the only id starting with it (None when none or several)."""
        exact = self.get_session(session_id_or_prefix)
        if exact:
            return exact["id"]  # type: ignore[no-any-return]
        rows = self._rows("SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' ORDER BY started_at DESC LIMIT 2",
                          (f"{text.like_escape(session_id_or_prefix)}%",))
        return rows[0]["id"] if len(rows) == 1 else None

    def get_session_title(self, session_id: str) -> Optional[str]:
        row = self._row("SELECT title FROM sessions WHERE id = ?", (session_id,))
        return row["title"] if row else None

    def get_session_by_title(self, title: str) -> Optional[dict[str, Any]]:
        row = self._row("SELECT * FROM sessions WHERE title = ?", (title,))
        return dict(row) if row else None

    def resolve_session_by_title(self, title: str) -> Optional[str]:
        """The newest "title #N" continuation if any, else the exact title's session."""
        exact = self.get_session_by_title(title)
        numbered = self._rows("SELECT id, title, started_at FROM sessions WHERE title LIKE ? ESCAPE '\\'"
                              " ORDER BY started_at DESC", (f"{text.like_escape(title)} #%",))
        if numbered:
            return numbered[0]["id"]  # type: ignore[no-any-return]
        return exact["id"] if exact else None

    def get_next_title_in_lineage(self, base_title: str) -> str:
        """``base`` when free, else ``base #N`` with N one past the highest taken (the bare base
        counting as #1); a " #N" suffix of the argument is dropped first."""
        m = re.match(r"^(.*?) #(\d+)$", base_title)
        base = m.group(1) if m else base_title
        taken = [r["title"] for r in self._rows(
            "SELECT title FROM sessions WHERE title = ? OR title LIKE ? ESCAPE '\\'",
            (base, f"{text.like_escape(base)} #%"))]
        if not taken:
            return base
        numbers = [int(m2.group(1)) for t in taken if (m2 := re.match(r"^.* #(\d+)$", t))]
        return f"{base} #{max([1, *numbers]) + 1}"

    def get_compression_tip(self, session_id: str) -> Optional[str]:
        """Follow compression continuations forward (at most 100 steps, never in a circle),
        preferring a child that itself continues, then a live one, then the most recently
        active; returns the last session reached."""
        current = session_id
        seen = {current} if current else set()
        for _ in range(100):
            row = self._row(
                "SELECT child.id FROM sessions parent JOIN sessions child ON child.parent_session_id = parent.id"
                f" WHERE parent.id = ? AND {CONTINUATION}"
                " ORDER BY CASE WHEN child.end_reason = 'compression' THEN 0 WHEN child.ended_at IS NULL THEN 1"
                " ELSE 2 END, COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = child.id),"
                " child.started_at) DESC, child.started_at DESC, child.id DESC LIMIT 1", (current,))
            if row is None or not row["id"] or row["id"] in seen:
                return current
            current = row["id"]
            seen.add(current)
        return current

    def distinct_session_cwds(self, include_archived: bool = False) -> list[dict[str, Any]]:
        where = "cwd IS NOT NULL AND TRIM(cwd) != ''" + ("" if include_archived else " AND archived = 0")
        rows = self._rows("SELECT cwd AS cwd, COUNT(*) AS sessions, MAX(COALESCE(ended_at, started_at, 0))"
                          f" AS last_active FROM sessions WHERE {where} GROUP BY cwd")
        return [{"cwd": r["cwd"], "sessions": int(r["sessions"] or 0), "last_active": float(r["last_active"] or 0)}
                for r in rows]

    def list_sessions_rich(
        self,
        source: Optional[str] = None,
        exclude_sources: Optional[list[str]] = None,
        cwd_prefix: Optional[str] = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        min_message_count: int = 0,
        project_compression_tips: bool = True,
        order_by_last_active: bool = False,
        include_archived: bool = False,
        archived_only: bool = False,
        id_query: Optional[str] = None,
        search_query: Optional[str] = None,
        compact_rows: bool = False,
    ) -> list[dict[str, Any]]:
        """Sessions with ``preview`` and ``last_active``; see Hermes' documentation of the same
        method for the filters. Compression roots are shown as their live tip unless
        ``project_compression_tips`` is off or children are included."""
        clauses: list[str] = []
        params: list[Any] = []
        if not include_children:
            clauses += [LISTABLE, NOT_DELEGATE]
        if source:
            clauses.append("s.source = ?")
            params.append(source)
        if exclude_sources:
            clauses.append(f"s.source NOT IN ({','.join('?' * len(exclude_sources))})")
            params.extend(exclude_sources)
        if cwd_prefix:
            clause, extra = cwd_prefix_clause(cwd_prefix)
            clauses.append(clause)
            params.extend(extra)
        if min_message_count > 0:
            clauses.append("s.message_count >= ?")
            params.append(min_message_count)
        if archived_only:
            clauses.append("s.archived = 1")
        elif not include_archived:
            clauses.append("s.archived = 0")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        columns = COMPACT_COLUMNS if compact_rows else "s.*"
        # Hermes strips both queries whatever the order (one without .strip() fails with
        # AttributeError); only the order by last activity filters on them.
        (id_query or "").strip().lower(), (search_query or "").strip().lower()
        if order_by_last_active:
            filters, filter_params = self._chain_filters(id_query, search_query)
            outer = where
            if filters:
                outer = f"{where} AND {filters}" if where else f"WHERE {filters}"
            sql = (
                "WITH RECURSIVE chain(root_id, cur_id) AS ("
                f" SELECT s.id, s.id FROM sessions s {where}"
                " UNION ALL SELECT c.root_id, child.id FROM chain c JOIN sessions parent ON parent.id = c.cur_id"
                f" JOIN sessions child ON child.parent_session_id = c.cur_id WHERE {CONTINUATION}),"
                " chain_max AS (SELECT root_id, MAX(COALESCE((SELECT MAX(m.timestamp) FROM messages m"
                " WHERE m.session_id = cur_id), (SELECT started_at FROM sessions ss WHERE ss.id = cur_id)))"
                " AS effective_last_active FROM chain GROUP BY root_id)"
                f" SELECT {columns}, {PREVIEW}, {LAST_ACTIVE} AS last_active,"
                " COALESCE(cm.effective_last_active, s.started_at) AS _effective_last_active"
                f" FROM sessions s LEFT JOIN chain_max cm ON cm.root_id = s.id {outer}"
                " ORDER BY _effective_last_active DESC, s.started_at DESC, s.id DESC LIMIT ? OFFSET ?")
            args = params + params + filter_params + [limit, offset]
        else:
            sql = (f"SELECT {columns}, {PREVIEW}, {LAST_ACTIVE} AS last_active FROM sessions s {where}"
                   " ORDER BY s.started_at DESC LIMIT ? OFFSET ?")
            args = params + [limit, offset]
        sessions = [with_preview(r) for r in self._rows(sql, args)]
        if not project_compression_tips or include_children:
            return sessions
        return [self._projected(s, compact_rows) for s in sessions]

    @staticmethod
    def _chain_filters(id_query: Optional[str], search_query: Optional[str]) -> tuple[str, list[Any]]:
        """Filters matching a row when any session of its compression chain matches (id substring;
        or title/id substring, also with punctuation removed)."""
        parts: list[str] = []
        params: list[Any] = []
        id_needle = (id_query or "").strip().lower()
        needle = (search_query or "").strip().lower()
        if id_needle:
            parts.append("EXISTS (SELECT 1 FROM chain cq WHERE cq.root_id = s.id AND LOWER(cq.cur_id) LIKE ? ESCAPE '\\')")
            params.append(_like_any(id_needle))
        if needle:
            compact = re.sub(r"[\W_]+", "", needle)
            clause = ("EXISTS (SELECT 1 FROM chain cq JOIN sessions cs ON cs.id = cq.cur_id WHERE cq.root_id = s.id"
                      " AND (LOWER(COALESCE(cs.title, '')) LIKE ? ESCAPE '\\' OR LOWER(cq.cur_id) LIKE ? ESCAPE '\\'")
            params += [_like_any(needle)] * 2
            if compact:
                clause += (" OR REPLACE(REPLACE(REPLACE(REPLACE(LOWER(COALESCE(cs.title, '')), '-', ''), '_', ''),"
                           " '.', ''), ' ', '') LIKE ? ESCAPE '\\'")
                params.append(_like_any(compact))
            parts.append(clause + "))")
        return " AND ".join(parts), params

    _TIP_FIELDS = ("id", "ended_at", "end_reason", "message_count", "tool_call_count", "title", "last_active",
                   "preview", "model", "system_prompt", "cwd", "git_branch", "git_repo_root")

    def _projected(self, s: dict[str, Any], compact_rows: bool) -> dict[str, Any]:
        """A compression root shown as its tip (the root's start time and order kept)."""
        if s.get("end_reason") != "compression":
            return s
        tip_id = self.get_compression_tip(s["id"])
        if tip_id == s["id"]:
            return s
        tip = self._rich_row(tip_id, compact_rows)
        if not tip:
            return s
        merged = dict(s)
        for key in self._TIP_FIELDS:
            if key in tip:
                merged[key] = tip[key]
        merged["_lineage_root_id"] = s["id"]
        return merged

    def _rich_row(self, session_id: Any, compact_rows: bool = False) -> Optional[dict[str, Any]]:
        columns = COMPACT_COLUMNS if compact_rows else "s.*"
        row = self._row(f"SELECT {columns}, {PREVIEW}, {LAST_ACTIVE} AS last_active FROM sessions s WHERE s.id = ?",
                        (session_id,))
        return with_preview(row) if row else None

    _get_session_rich_row = _rich_row

    def list_cron_job_runs(self, job_id: str, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        """Run sessions of one cron job (ids ``cron_<job>_...``), newest first."""
        prefix = f"cron_{job_id}_"
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self._rows(f"SELECT s.*, {PREVIEW}, {LAST_ACTIVE} AS last_active FROM sessions s"
                          " WHERE s.source = 'cron' AND s.id >= ? AND s.id < ?"
                          " ORDER BY s.started_at DESC, s.id DESC LIMIT ? OFFSET ?", (prefix, upper, limit, offset))
        return [with_preview(r) for r in rows]

    # ---- messages ------------------------------------------------------------------------

    def get_messages(self, session_id: str, include_inactive: bool = False, limit: Optional[int] = None,
                     offset: int = 0) -> list[dict[str, Any]]:
        """Messages in insertion (id) order; active ones only unless asked; paged when asked."""
        sql = "SELECT * FROM messages WHERE session_id = ?" + ("" if include_inactive else " AND active = 1")
        sql += " ORDER BY id"
        params: list[Any] = [session_id]
        if limit is not None or offset:
            sql += " LIMIT ? OFFSET ?"
            params += [-1 if limit is None else limit, offset]
        return [decoded_message(r, "get_messages") for r in self._rows(sql, params)]

    def has_archived_messages(self, session_id: str) -> bool:
        return self._row("SELECT 1 FROM messages WHERE session_id = ? AND active = 0 LIMIT 1",
                         (session_id,)) is not None

    def get_messages_around(self, session_id: str, around_message_id: int, window: int = 5) -> dict[str, Any]:
        window = max(window, 0)
        with self._reading() as conn:
            if conn.execute("SELECT 1 FROM messages WHERE id = ? AND session_id = ? LIMIT 1",
                            (around_message_id, session_id)).fetchone() is None:
                return {"window": [], "messages_before": 0, "messages_after": 0}
            before = conn.execute("SELECT * FROM messages WHERE session_id = ? AND id <= ? ORDER BY id DESC LIMIT ?",
                                  (session_id, around_message_id, window + 1)).fetchall()
            after = conn.execute("SELECT * FROM messages WHERE session_id = ? AND id > ? ORDER BY id ASC LIMIT ?",
                                 (session_id, around_message_id, window)).fetchall()
        rows = list(reversed(before)) + list(after)
        return {"window": [decoded_message(r, "get_messages_around") for r in rows],
                "messages_before": max(0, len(before) - 1), "messages_after": len(after)}

    def get_anchored_view(self, session_id: str, around_message_id: int, window: int = 5, bookend: int = 3,
                          keep_roles: Optional[tuple[str, ...]] = ("user", "assistant")) -> dict[str, Any]:
        """The window around an anchor (filtered to ``keep_roles``, the anchor always kept) plus
        the first and last ``bookend`` non-empty messages of those roles outside it."""
        bookend = max(bookend, 0)
        around = self.get_messages_around(session_id, around_message_id, window=window)
        rows = around["window"]
        if not rows:
            return {"window": [], "messages_before": 0, "messages_after": 0, "bookend_start": [], "bookend_end": []}
        if keep_roles is not None:
            keep = set(keep_roles)
            shown = [m for m in rows if m.get("id") == around_message_id or m.get("role") in keep]
        else:
            shown = rows
        start: list[Any] = []
        end: list[Any] = []
        if bookend > 0:
            roles = list(keep_roles) if keep_roles is not None else []
            role_sql = f" AND role IN ({','.join('?' * len(roles))})" if keep_roles is not None else ""
            with self._reading() as conn:
                start = conn.execute(f"SELECT * FROM messages WHERE session_id = ? AND id < ?{role_sql}"
                                     " AND length(content) > 0 ORDER BY id ASC LIMIT ?",
                                     (session_id, rows[0]["id"], *roles, bookend)).fetchall()
                end = conn.execute(f"SELECT * FROM messages WHERE session_id = ? AND id > ?{role_sql}"
                                   " AND length(content) > 0 ORDER BY id DESC LIMIT ?",
                                   (session_id, rows[-1]["id"], *roles, bookend)).fetchall()[::-1]
        return {"window": shown, "messages_before": around["messages_before"],
                "messages_after": around["messages_after"],
                "bookend_start": [decoded_message(r, "get_anchored_view") for r in start],
                "bookend_end": [decoded_message(r, "get_anchored_view") for r in end]}

    def resolve_resume_session_id(self, session_id: str) -> str:
        """The session a resume should load: first the compression tip, then down the chain of
        latest-started children (branches, delegates and tool runs excluded, at most 32 steps)
        the deepest one holding messages; ``session_id`` when none does."""
        if not session_id:
            return session_id
        try:
            tip = self.get_compression_tip(session_id)
        except Exception:
            tip = session_id
        if tip and tip != session_id:
            session_id = tip
        current, seen, best = session_id, {session_id}, None
        try:
            with self._reading() as conn:
                for _ in range(32):
                    if conn.execute("SELECT 1 FROM messages WHERE session_id = ? LIMIT 1", (current,)).fetchone():
                        best = current
                    child = conn.execute(
                        f"SELECT id FROM sessions WHERE parent_session_id = ? AND {BRANCHED.format(a='')} IS NULL"
                        f" AND {DELEGATE.format(a='')} IS NULL AND COALESCE(source, '') != 'tool'"
                        " ORDER BY started_at DESC, id DESC LIMIT 1", (current,)).fetchone()
                    if child is None or not child[0] or child[0] in seen:
                        break
                    current = child[0]
                    seen.add(current)
        except Exception:
            return session_id
        return best if best is not None else session_id

    def _lineage_root_to_tip(self, session_id: str) -> list[Any]:
        """``session_id`` and its parents, root first (at most 100, never in a circle)."""
        if not session_id:
            return [session_id]
        chain: list[Any] = []
        current: Any = session_id
        seen: set[Any] = set()
        hash(session_id)  # Hermes looks it up in its set before reading: a list fails so, closed or not
        with self._reading() as conn:
            for _ in range(100):
                if not current or current in seen:
                    break
                seen.add(current)
                chain.append(current)
                row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (current,)).fetchone()
                if row is None:
                    break
                current = row[0]
        return list(reversed(chain)) or [session_id]

    _session_lineage_root_to_tip = _lineage_root_to_tip

    def get_conversation_root(self, session_id: str) -> str:
        """The root of the lineage, as Hermes gives it: the id read from the rows, or the
        argument itself (not made a string) when it has no parent."""
        chain = self._lineage_root_to_tip(session_id)
        root: str = chain[0] if chain and chain[0] else session_id
        return root

    def _conversation_rows(self, session_ids: list[Any], active_only: bool, with_session: bool = False) -> list[Any]:
        cols = ("session_id, " if with_session else "") + CONVERSATION_COLUMNS
        active = " AND active = 1" if active_only else ""
        return self._rows(f"SELECT {cols} FROM messages WHERE session_id IN ({','.join('?' * len(session_ids))})"
                          f"{active} ORDER BY id", tuple(session_ids))

    def get_messages_as_conversation(self, session_id: str, include_ancestors: bool = False,
                                     include_inactive: bool = False,
                                     repair_alternation: bool = False) -> list[dict[str, Any]]:
        """Messages in the OpenAI conversation shape, in insertion order (with the ancestors of a
        compression lineage when asked)."""
        ids = self._lineage_root_to_tip(session_id) if include_ancestors else [session_id]
        rows = self._conversation_rows(ids, active_only=not include_inactive)
        return self._to_conversation(rows, session_id, include_ancestors, repair_alternation)

    def get_resume_conversations(self, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(the tip's active messages, alternation-repaired; the whole lineage verbatim) from one read."""
        rows = self._conversation_rows(self._lineage_root_to_tip(session_id), active_only=True, with_session=True)
        tip_rows = [r for r in rows if r["session_id"] == session_id]
        return (self._to_conversation(tip_rows, session_id, False, True),
                self._to_conversation(rows, session_id, True, False))

    def get_ancestor_display_prefix(self, session_id: str) -> list[dict[str, Any]]:
        ids = self._lineage_root_to_tip(session_id)
        if len(ids) <= 1:
            return []
        rows = [r for r in self._conversation_rows(ids, active_only=True, with_session=True)
                if r["session_id"] != session_id]
        return self._to_conversation(rows, session_id, True, False) if rows else []

    def _to_conversation(self, rows: list[Any], session_id: Any, include_ancestors: bool,
                         repair_alternation: bool) -> list[dict[str, Any]]:
        scrub_context = text.context_scrubber()
        messages: list[dict[str, Any]] = []
        for row in rows:
            role = row["role"]
            content = text.decode_content(row["content"])
            if role in ("user", "assistant") and isinstance(content, str):
                content = scrub_context(content).strip()
            msg: dict[str, Any] = {"role": role, "content": content}
            for column, key in (("api_content", "api_content"), ("timestamp", "timestamp"),
                                ("tool_call_id", "tool_call_id"), ("tool_name", "tool_name"),
                                ("effect_disposition", "effect_disposition")):
                if row[column]:
                    msg[key] = row[column]
            if row["tool_calls"]:
                msg["tool_calls"] = _loads_or(row["tool_calls"], [], "tool_calls in conversation replay")
            if row["platform_message_id"]:
                msg["message_id"] = row["platform_message_id"]
            if row["observed"]:
                msg["observed"] = True
            if role == "assistant":
                if row["finish_reason"]:
                    msg["finish_reason"] = row["finish_reason"]
                if row["reasoning"]:
                    msg["reasoning"] = row["reasoning"]
                if row["reasoning_content"] is not None:
                    msg["reasoning_content"] = row["reasoning_content"]
                for column in ("reasoning_details", "codex_reasoning_items", "codex_message_items"):
                    if row[column]:
                        msg[column] = _loads_or(row[column], None, column)
            if include_ancestors and _replayed_user(messages, msg):
                continue
            messages.append(msg)
        messages = text.drop_review_harness(messages)
        if repair_alternation and messages:
            repair = text.alternation_repairer()
            if repair is not None:
                repaired = repair(None, messages)
                if repaired:
                    log.info("Repaired %d message-alternation violation(s) while restoring session %s",
                             repaired, session_id)
        return messages

    def list_recent_user_messages(self, session_id: str, limit: int = 20,
                                  include_inactive: bool = False) -> list[dict[str, Any]]:
        """The newest user messages first: id, timestamp and an 80-character one-line preview."""
        active = "" if include_inactive else " AND active = 1"
        rows = self._rows("SELECT id, timestamp, content FROM messages WHERE session_id = ? AND role = 'user'"
                          f"{active} ORDER BY id DESC LIMIT ?", (session_id, int(limit)))
        out = []
        for r in rows:
            decoded = text.decode_content(r["content"])
            preview = " ".join(text.content_preview(decoded).split()) if isinstance(decoded, (list, str)) else ""
            if len(preview) > 80:
                preview = preview[:77] + "..."
            out.append({"id": r["id"], "timestamp": r["timestamp"], "preview": preview})
        return out

    # ---- search --------------------------------------------------------------------------

    _sanitize_fts5_query = staticmethod(text.sanitize_fts5_query)
    _contains_cjk = staticmethod(text.contains_cjk)
    _count_cjk = staticmethod(text.count_cjk)

    def search_messages(self, query: str, source_filter: Optional[list[str]] = None,
                        exclude_sources: Optional[list[str]] = None, role_filter: Optional[list[str]] = None,
                        limit: int = 20, offset: int = 0, sort: Optional[str] = None,
                        include_inactive: bool = False) -> list[dict[str, Any]]:
        """Full-text search (FTS5; the trigram index for CJK queries of 3+ characters per term; a
        substring scan for shorter CJK terms) with each hit's neighbours as context. Rewound
        messages are left out unless ``include_inactive``; compacted ones stay searchable."""
        if not query or not query.strip():
            return []
        query = text.sanitize_fts5_query(query)
        if not query:
            return []
        order = {"newest": "ORDER BY m.timestamp DESC, rank", "oldest": "ORDER BY m.timestamp ASC, rank"}.get(
            sort.strip().lower() if isinstance(sort, str) else "", "ORDER BY rank")
        filters, filter_params = _search_filters(include_inactive, source_filter, exclude_sources, role_filter)
        if text.contains_cjk(query):
            matches = self._search_cjk(query, order, filters, filter_params, source_filter, exclude_sources,
                                       role_filter, limit, offset)
        else:
            try:
                matches = [dict(r) for r in self._rows(_fts_sql("messages_fts", filters, order),
                                                       [query, *filter_params, limit, offset])]
            except sqlite3.OperationalError:
                return []
        for match in matches:
            match["context"] = self._search_context(match["id"])
        for match in matches:
            match.pop("content", None)
        return matches

    def _search_cjk(self, query: str, order: str, filters: list[str], filter_params: list[Any],
                    source_filter: Optional[list[str]], exclude_sources: Optional[list[str]],
                    role_filter: Optional[list[str]], limit: int, offset: int) -> list[dict[str, Any]]:
        raw = query.strip('"').strip()
        operators = {"AND", "OR", "NOT"}
        cjk_terms = [t for t in raw.split() if t.upper() not in operators and text.contains_cjk(t)]
        if text.count_cjk(raw) >= 3 and not any(text.count_cjk(t) < 3 for t in cjk_terms):
            trigram_query = " ".join(t if t.upper() in operators else '"' + t.replace('"', '""') + '"'
                                     for t in raw.split())
            try:
                return [dict(r) for r in self._rows(_fts_sql("messages_fts_trigram", filters, order),
                                                    [trigram_query, *filter_params, limit, offset])]
            except sqlite3.OperationalError:
                pass
        terms = [t for t in raw.split() if t.upper() not in operators] or [raw]
        likes = " OR ".join(["(m.content LIKE ? ESCAPE '\\' OR m.tool_name LIKE ? ESCAPE '\\'"
                             " OR m.tool_calls LIKE ? ESCAPE '\\')"] * len(terms))
        where = [f"({likes})"]
        params: list[Any] = [terms[0]]
        for t in terms:
            params += [_like_any(t)] * 3
        # The substring scan keeps rewound messages (as Hermes' does) but honours the filters.
        _, extra = _search_filters(True, source_filter, exclude_sources, role_filter, into=where)
        params += extra
        sql = ("SELECT m.id, m.session_id, m.role, substr(m.content, max(1, instr(m.content, ?) - 40), 120) AS snippet,"
               " m.content, m.timestamp, m.tool_name, s.source, s.model, s.started_at AS session_started"
               f" FROM messages m JOIN sessions s ON s.id = m.session_id WHERE {' AND '.join(where)}"
               " ORDER BY m.timestamp DESC LIMIT ? OFFSET ?")
        return [dict(r) for r in self._rows(sql, [*params, limit, offset])]

    def _search_context(self, message_id: Any) -> list[dict[str, Any]]:
        """The hit's previous and next message of its session (by time, then id) and the hit,
        200 characters of text each."""
        try:
            rows = self._rows(
                "WITH t AS (SELECT session_id, timestamp, id FROM messages WHERE id = ?)"
                " SELECT role, content FROM (SELECT m.role, m.content FROM messages m JOIN t ON t.session_id = m.session_id"
                " WHERE m.timestamp < t.timestamp OR (m.timestamp = t.timestamp AND m.id < t.id)"
                " ORDER BY m.timestamp DESC, m.id DESC LIMIT 1)"
                " UNION ALL SELECT role, content FROM messages WHERE id = ?"
                " UNION ALL SELECT role, content FROM (SELECT m.role, m.content FROM messages m JOIN t"
                " ON t.session_id = m.session_id WHERE m.timestamp > t.timestamp OR (m.timestamp = t.timestamp"
                " AND m.id > t.id) ORDER BY m.timestamp ASC, m.id ASC LIMIT 1)", (message_id, message_id))
            return [{"role": r["role"], "content": text.content_preview(text.decode_content(r["content"]))[:200]}
                    for r in rows]
        except Exception:
            return []

    def search_sessions_by_id(self, query: str, limit: int = 20, include_archived: bool = True) -> list[dict[str, Any]]:
        """Listed sessions whose id (or compression root id) equals, starts with or contains the
        needle, in that order of preference."""
        needle = (query or "").strip().lower()
        if not needle or limit <= 0:
            return []
        candidates = self.list_sessions_rich(limit=max(limit * 4, limit), offset=0, include_archived=include_archived,
                                             order_by_last_active=True, id_query=needle)

        def rank(row: dict[str, Any]) -> int:
            ids = [v.lower() for v in (str(row.get("id") or ""), str(row.get("_lineage_root_id") or "")) if v]
            if needle in ids:
                return 0
            return 1 if any(v.startswith(needle) for v in ids) else 2

        ranked = sorted(enumerate(candidates), key=lambda item: (rank(item[1]), item[0]))
        return [row for _, row in ranked[:limit]]

    def search_sessions(self, source: Optional[str] = None, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        """Sessions by most recent activity (``last_active``)."""
        base = ("SELECT s.*, COALESCE(m.last_active, s.started_at) AS last_active FROM sessions s"
                " LEFT JOIN (SELECT session_id, MAX(timestamp) AS last_active FROM messages GROUP BY session_id) m"
                " ON m.session_id = s.id ")
        order = "ORDER BY last_active DESC, s.started_at DESC, s.id DESC LIMIT ? OFFSET ?"
        if source:
            rows = self._rows(base + "WHERE s.source = ? " + order, (source, limit, offset))
        else:
            rows = self._rows(base + order, (limit, offset))
        return [dict(r) for r in rows]

    # ---- counts --------------------------------------------------------------------------

    def session_count(self, source: Optional[str] = None, cwd_prefix: Optional[str] = None,
                      min_message_count: int = 0, include_archived: bool = False, archived_only: bool = False,
                      exclude_children: bool = False, exclude_sources: Optional[list[str]] = None) -> int:
        clauses: list[str] = []
        params: list[Any] = []
        if exclude_children:
            clauses += [LISTABLE, NOT_DELEGATE]
        if source:
            clauses.append("s.source = ?")
            params.append(source)
        if exclude_sources:
            clauses.append(f"s.source NOT IN ({','.join('?' * len(exclude_sources))})")
            params.extend(exclude_sources)
        if cwd_prefix:
            clause, extra = cwd_prefix_clause(cwd_prefix)
            clauses.append(clause)
            params.extend(extra)
        if min_message_count > 0:
            clauses.append("s.message_count >= ?")
            params.append(min_message_count)
        if archived_only:
            clauses.append("s.archived = 1")
        elif not include_archived:
            clauses.append("s.archived = 0")
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return int(self._row(f"SELECT COUNT(*) FROM sessions s{where}", params)[0])

    def message_count(self, session_id: Optional[str] = None) -> int:
        if session_id:
            return int(self._row("SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,))[0])
        return int(self._row("SELECT COUNT(*) FROM messages")[0])

    def has_platform_message_id(self, session_id: str, platform_message_id: str) -> bool:
        return self._row("SELECT 1 FROM messages WHERE session_id = ? AND platform_message_id = ? LIMIT 1",
                         (session_id, platform_message_id)) is not None

    def count_empty_sessions(self) -> int:
        return int(self._row("SELECT COUNT(*) FROM sessions WHERE message_count = 0 AND ended_at IS NOT NULL"
                             " AND archived = 0")[0])

    # ---- lineage and export ------------------------------------------------------------------

    @staticmethod
    def _is_branch_child_row(session: dict[str, Any]) -> bool:
        raw = session.get("model_config")
        if not raw:
            return False
        try:
            cfg = json.loads(raw) if isinstance(raw, str) else raw
        except (TypeError, json.JSONDecodeError):
            return False
        return isinstance(cfg, dict) and cfg.get("_branched_from") is not None

    def _is_compression_child_row(self, child: dict[str, Any]) -> bool:
        parent_id = child.get("parent_session_id")
        if not parent_id or self._is_branch_child_row(child):
            return False
        parent = self.get_session(parent_id)
        return bool(parent and parent.get("end_reason") == "compression")

    def get_compression_lineage(self, session_id: str) -> list[str]:
        """Compression ancestors through the tip, oldest first (branch children stand alone)."""
        session = self.get_session(session_id)
        if not session or self._is_branch_child_row(session):
            return [session_id] if session else []
        root = session
        ancestors = {root["id"]}
        while self._is_compression_child_row(root):
            parent = self.get_session(root["parent_session_id"])
            if not parent or parent["id"] in ancestors:
                break
            root = parent
            ancestors.add(root["id"])
        lineage = [root["id"]]
        seen = {root["id"]}
        current = root
        while current.get("end_reason") == "compression":
            children = [dict(r) for r in self._rows(
                "SELECT * FROM sessions WHERE parent_session_id = ? ORDER BY started_at ASC", (current["id"],))]
            nxt = next((c for c in children if not self._is_branch_child_row(c)), None)
            if not nxt or nxt["id"] in seen:
                break
            lineage.append(nxt["id"])
            seen.add(nxt["id"])
            current = nxt
        return lineage if session_id in lineage else [session_id]

    def export_session(self, session_id: str) -> Optional[dict[str, Any]]:
        session = self.get_session(session_id)
        if not session:
            return None
        return {**session, "messages": self.get_messages(session_id)}

    def export_session_lineage(self, session_id: str) -> Optional[dict[str, Any]]:
        segments = [seg for seg in (self.export_session(s) for s in self.get_compression_lineage(session_id)) if seg]
        if not segments:
            return None
        base = dict(segments[-1])
        base["segments"] = segments
        base["lineage_session_ids"] = [seg["id"] for seg in segments]
        base["message_count"] = sum(len(seg.get("messages") or []) for seg in segments)
        base["messages"] = [m for seg in segments for m in (seg.get("messages") or [])]
        return base

    def export_all(self, source: Optional[str] = None) -> list[dict[str, Any]]:
        return [{**s, "messages": self.get_messages(s["id"])} for s in self.search_sessions(source=source, limit=100000)]

    # ---- maintenance queries -------------------------------------------------------------

    def list_prune_candidates(self, older_than_days: Optional[float] = None, source: Optional[str] = None,
                              **filters: Any) -> list[dict[str, Any]]:
        """Ended sessions a prune or bulk archive with these filters would touch, oldest first."""
        if filters.get("started_before") is None and older_than_days is not None:
            filters["started_before"] = time.time() - older_than_days * 86400
        where, params = prune_filter(source=source, **filters)
        rows = self._rows("SELECT s.id, s.source, s.title, s.model, s.started_at, s.ended_at, s.message_count,"
                          f" s.archived FROM sessions s WHERE {where} ORDER BY s.started_at ASC", params)
        return [dict(r) for r in rows]

    def get_meta(self, key: str) -> Optional[str]:
        row = self._row("SELECT value FROM state_meta WHERE key = ?", (key,))
        return row[0] if row is not None else None


def _loads_or(raw: Any, fallback: Any, what: str) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, TypeError):
        log.warning("Failed to deserialize %s, falling back to %r", what, fallback)
        return fallback


def _replayed_user(messages: list[dict[str, Any]], msg: dict[str, Any]) -> bool:
    """A user message repeating the last user message with no assistant turn in between (a
    resume prompt replayed into a continuation)."""
    if msg.get("role") != "user":
        return False
    content = msg.get("content")
    if not isinstance(content, str) or not content:
        return False
    for prev in reversed(messages):
        if prev.get("role") == "user" and prev.get("content") == content:
            return True
        if prev.get("role") == "assistant" and (prev.get("content") or prev.get("tool_calls")):
            return False
    return False


def _search_filters(include_inactive: bool, source_filter: Optional[list[str]], exclude_sources: Optional[list[str]],
                    role_filter: Optional[list[str]], into: Optional[list[str]] = None) -> tuple[list[str], list[Any]]:
    clauses = into if into is not None else []
    params: list[Any] = []
    if not include_inactive:
        clauses.append("(m.active = 1 OR m.compacted = 1)")
    if source_filter is not None:
        clauses.append(f"s.source IN ({','.join('?' * len(source_filter))})")
        params.extend(source_filter)
    if exclude_sources is not None:
        clauses.append(f"s.source NOT IN ({','.join('?' * len(exclude_sources))})")
        params.extend(exclude_sources)
    if role_filter:
        clauses.append(f"m.role IN ({','.join('?' * len(role_filter))})")
        params.extend(role_filter)
    return clauses, params


def _fts_sql(table: str, filters: list[str], order: str) -> str:
    where = " AND ".join([f"{table} MATCH ?", *filters])
    return (f"SELECT m.id, m.session_id, m.role, snippet({table}, 0, '>>>', '<<<', '...', 40) AS snippet,"
            " m.content, m.timestamp, m.tool_name, s.source, s.model, s.started_at AS session_started"
            f" FROM {table} JOIN messages m ON m.id = {table}.rowid JOIN sessions s ON s.id = m.session_id"
            f" WHERE {where} {order} LIMIT ? OFFSET ?")


_PRUNE_FILTERS = ("started_before", "started_after", "source", "title_like", "end_reason", "cwd_prefix",
                  "min_messages", "max_messages", "archived", "model_like", "provider", "user_id", "chat_id",
                  "chat_type", "branch_like", "min_tokens", "max_tokens", "min_cost", "max_cost", "min_tool_calls",
                  "max_tool_calls")


def prune_filter(**filters: Any) -> tuple[str, list[Any]]:
    """The WHERE clause (alias ``s``) shared by prune, bulk archive and their dry run: only ended
    sessions, and every given filter. An unknown filter raises TypeError."""
    unknown = set(filters) - set(_PRUNE_FILTERS)
    if unknown:
        raise TypeError(f"_prune_filter_where() got an unexpected keyword argument '{sorted(unknown)[0]}'")
    def f(key: str) -> Any:
        return filters.get(key)

    clauses = ["s.ended_at IS NOT NULL"]
    params: list[Any] = []

    def add(clause: str, value: Any) -> None:
        clauses.append(clause)
        params.append(value)

    if f("started_before") is not None:
        add("s.started_at < ?", f("started_before"))
    if f("started_after") is not None:
        add("s.started_at >= ?", f("started_after"))
    if f("source"):
        add("s.source = ?", f("source"))
    if f("title_like"):
        add("LOWER(COALESCE(s.title, '')) LIKE ?", f"%{str(f('title_like')).lower()}%")
    if f("end_reason"):
        add("s.end_reason = ?", f("end_reason"))
    if f("cwd_prefix"):
        clause, extra = cwd_prefix_clause(str(f("cwd_prefix")))
        clauses.append(clause)
        params.extend(extra)
    if f("min_messages") is not None:
        add("s.message_count >= ?", f("min_messages"))
    if f("max_messages") is not None:
        add("s.message_count <= ?", f("max_messages"))
    if f("model_like"):
        add("LOWER(COALESCE(s.model, '')) LIKE ?", f"%{str(f('model_like')).lower()}%")
    if f("provider"):
        add("LOWER(COALESCE(s.billing_provider, '')) = ?", str(f("provider")).lower())
    for key in ("user_id", "chat_id", "chat_type"):
        if f(key):
            add(f"s.{key} = ?", f(key))
    if f("branch_like"):
        add("LOWER(COALESCE(s.git_branch, '')) LIKE ?", f"%{str(f('branch_like')).lower()}%")
    tokens = "(COALESCE(s.input_tokens, 0) + COALESCE(s.output_tokens, 0))"
    cost = "COALESCE(s.actual_cost_usd, s.estimated_cost_usd, 0)"
    calls = "COALESCE(s.tool_call_count, 0)"
    for key, clause in (("min_tokens", f"{tokens} >= ?"), ("max_tokens", f"{tokens} <= ?"),
                        ("min_cost", f"{cost} >= ?"), ("max_cost", f"{cost} <= ?"),
                        ("min_tool_calls", f"{calls} >= ?"), ("max_tool_calls", f"{calls} <= ?")):
        if f(key) is not None:
            add(clause, f(key))
    if f("archived") is True:
        clauses.append("s.archived = 1")
    elif f("archived") is False:
        clauses.append("s.archived = 0")
    return " AND ".join(clauses), params

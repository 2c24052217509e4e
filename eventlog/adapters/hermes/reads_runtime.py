"""The reads of Hermes' runtime state: the gateway's routing and peers, compression locks and
cooldowns, Telegram topic mode, handoffs (a mixin of :class:`.db.SessionDB`, like :mod:`.reads`)."""
from __future__ import annotations

import sqlite3
import time
from typing import Any, Callable, Optional

from eventlog.adapters.hermes.reads import LAST_ACTIVE, PREVIEW, with_preview


class RuntimeReads:
    """Mixin: needs ``_row``/``_rows`` (see :class:`.reads.Reads`) and ``_reader``."""

    _reader: Any

    # Provided by Reads (SessionDB has both mixins).
    _row: Callable[..., Any]
    _rows: Callable[..., list[Any]]

    # ---- gateway ---------------------------------------------------------------------------

    def load_gateway_routing_entries(self, *, scope: str = "") -> dict[str, str]:
        return {r["session_key"]: r["entry_json"] for r in self._rows(
            "SELECT session_key, entry_json FROM gateway_routing WHERE scope = ?", (scope,))}

    def list_gateway_sessions(self, *, platform: Optional[str] = None, active_only: bool = True) -> list[dict[str, Any]]:
        """The newest session per routing key (optionally of one platform, not ended), by activity."""
        sql = ("SELECT sessions.*, COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = sessions.id),"
               " sessions.started_at) AS last_active FROM sessions WHERE session_key IS NOT NULL AND started_at ="
               " (SELECT MAX(s2.started_at) FROM sessions s2 WHERE s2.session_key = sessions.session_key)")
        params: list[Any] = []
        if platform:
            sql += " AND LOWER(source) = LOWER(?)"
            params.append(platform)
        if active_only:
            sql += " AND ended_at IS NULL"
        return [dict(r) for r in self._rows(sql + " ORDER BY last_active DESC", params)]

    def find_session_by_origin(self, *, platform: str, chat_id: str, thread_id: Optional[str] = None,
                               user_id: Optional[str] = None) -> Optional[str]:
        """The newest live gateway session of a chat (and thread); with several senders in the
        chat, only an exact sender match (or, without a sender, a single-sender chat) answers."""
        if not platform or chat_id in (None, ""):
            return None
        sql = ("SELECT id, user_id, started_at FROM sessions WHERE LOWER(source) = LOWER(?) AND session_key IS NOT NULL"
               " AND chat_id = ? AND ended_at IS NULL")
        params: list[Any] = [platform, str(chat_id)]
        if thread_id is not None:
            sql += " AND COALESCE(thread_id, '') = ?"
            params.append(str(thread_id))
        rows = [dict(r) for r in self._rows(sql + " ORDER BY started_at DESC", params)]
        if not rows:
            return None
        if user_id:
            exact = [r for r in rows if str(r.get("user_id") or "") == str(user_id)]
            if exact:
                return str(exact[0]["id"])
            if len(rows) > 1:
                return None
        elif len(rows) > 1:
            users = {str(r.get("user_id") or "").strip() for r in rows} - {""}
            if len(users) > 1:
                return None
        return str(rows[0]["id"])

    def find_latest_gateway_session_for_peer(self, *, source: str, user_id: Optional[str] = None,
                                             session_key: Optional[str] = None, chat_id: Optional[str] = None,
                                             chat_type: Optional[str] = None,
                                             thread_id: Optional[str] = None) -> Optional[dict[str, Any]]:
        """The newest recoverable session (live, or ended only by a recoverable accident) with
        messages, by routing key; failing that by the complete peer tuple."""
        if not session_key:
            return None
        recoverable = ("(ended_at IS NULL OR end_reason IN ('agent_close', 'ws_orphan_reap')) AND"
                       " (COALESCE(message_count, 0) > 0 OR EXISTS (SELECT 1 FROM messages WHERE"
                       " messages.session_id = sessions.id LIMIT 1))")
        row = self._row(f"SELECT * FROM sessions WHERE session_key = ? AND source = ? AND {recoverable}"
                        " ORDER BY started_at DESC LIMIT 1", (session_key, source))
        if row is not None:
            return dict(row)
        if chat_id is None or chat_type is None:
            return None
        row = self._row(
            "SELECT * FROM sessions WHERE source = ? AND COALESCE(user_id, '') = COALESCE(?, '')"
            " AND COALESCE(chat_id, '') = COALESCE(?, '') AND COALESCE(chat_type, '') = COALESCE(?, '')"
            f" AND COALESCE(thread_id, '') = COALESCE(?, '') AND {recoverable} ORDER BY started_at DESC LIMIT 1",
            (source, user_id, chat_id, chat_type, thread_id))
        return dict(row) if row else None

    # ---- compression bookkeeping -----------------------------------------------------------

    def get_compression_failure_cooldown(self, session_id: str) -> Optional[dict[str, Any]]:
        if not session_id:
            return None
        now = time.time()
        row = self._row("SELECT compression_failure_cooldown_until, compression_failure_error FROM sessions"
                        " WHERE id = ?", (session_id,))
        if row is None or row[0] is None:
            return None
        until = float(row[0])
        if until <= now:
            return None
        return {"cooldown_until": until, "remaining_seconds": until - now, "error": row[1]}

    def get_compression_fallback_streak(self, session_id: str) -> int:
        if not session_id or getattr(self, "_reader", None) is None:
            return 0
        row = self._row("SELECT compression_fallback_streak FROM sessions WHERE id = ?", (session_id,))
        if row is None:
            return 0
        try:
            return max(0, int(row[0] or 0))
        except (TypeError, ValueError):
            return 0

    def get_compression_lock_holder(self, session_id: str) -> Optional[str]:
        if not session_id:
            return None
        row = self._row("SELECT holder FROM compression_locks WHERE session_id = ? AND expires_at >= ?",
                        (session_id, time.time()))
        return row[0] if row is not None else None

    # ---- Telegram topics (tables exist only after the first /topic) -------------------------

    def _topic_row(self, sql: str, params: Any) -> Any:
        try:
            return self._row(sql, params)
        except sqlite3.OperationalError:
            return None

    def is_telegram_topic_mode_enabled(self, *, chat_id: str, user_id: str) -> bool:
        row = self._topic_row("SELECT enabled FROM telegram_dm_topic_mode WHERE chat_id = ? AND user_id = ?",
                              (str(chat_id), str(user_id)))
        return bool(row[0]) if row is not None else False

    def get_telegram_topic_binding(self, *, chat_id: str, thread_id: str) -> Optional[dict[str, Any]]:
        row = self._topic_row("SELECT * FROM telegram_dm_topic_bindings WHERE chat_id = ? AND thread_id = ?",
                              (str(chat_id), str(thread_id)))
        return dict(row) if row else None

    def list_telegram_topic_bindings_for_chat(self, *, chat_id: str) -> list[dict[str, Any]]:
        try:
            rows = self._rows("SELECT * FROM telegram_dm_topic_bindings WHERE chat_id = ? ORDER BY updated_at DESC",
                              (str(chat_id),))
        except sqlite3.OperationalError:
            return []
        return [dict(r) for r in rows]

    def get_telegram_topic_binding_by_session(self, *, session_id: str) -> Optional[dict[str, Any]]:
        row = self._topic_row("SELECT * FROM telegram_dm_topic_bindings WHERE session_id = ?", (str(session_id),))
        return dict(row) if row else None

    def is_telegram_session_linked_to_topic(self, *, session_id: str) -> bool:
        return self._topic_row("SELECT 1 FROM telegram_dm_topic_bindings WHERE session_id = ? LIMIT 1",
                               (str(session_id),)) is not None

    def list_unlinked_telegram_sessions_for_user(self, *, chat_id: str, user_id: str,
                                                 limit: int = 10) -> list[dict[str, Any]]:
        """This user's Telegram sessions not bound to a topic, most recently active first."""
        base = f"SELECT s.*, {PREVIEW}, {LAST_ACTIVE} AS last_active FROM sessions s WHERE s.source = 'telegram'" \
               " AND s.user_id = ?"
        tail = " ORDER BY last_active DESC, s.started_at DESC LIMIT ?"
        unbound = " AND NOT EXISTS (SELECT 1 FROM telegram_dm_topic_bindings b WHERE b.session_id = s.id)"
        try:
            rows = self._rows(base + unbound + tail, (str(user_id), int(limit)))
        except sqlite3.OperationalError:
            rows = self._rows(base + tail, (str(user_id), int(limit)))
        return [with_preview(r) for r in rows]

    # ---- handoff ---------------------------------------------------------------------------

    def get_handoff_state(self, session_id: str) -> Optional[dict[str, Any]]:
        try:
            row = self._row("SELECT handoff_state, handoff_platform, handoff_error FROM sessions WHERE id = ?",
                            (session_id,))
        except Exception:
            return None
        if not row:
            return None
        return {"state": row[0], "platform": row[1], "error": row[2]}

    def list_pending_handoffs(self) -> list[dict[str, Any]]:
        try:
            return [dict(r) for r in self._rows("SELECT * FROM sessions WHERE handoff_state = 'pending'"
                                                " ORDER BY started_at ASC")]
        except Exception:
            return []

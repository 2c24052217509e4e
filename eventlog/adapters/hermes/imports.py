"""Hermes' ``import_sessions``: exported sessions restored, with Hermes' validation (a mixin of
:class:`.db.SessionDB`)."""
from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Callable, Optional

from eventlog.adapters.hermes.apply import numbered
from eventlog.adapters.hermes.engine import Tx
from eventlog.adapters.hermes.events import sql_value


class ImportSessions:
    """Mixin: needs ``_write`` and ``_message_rows`` of :class:`.db.SessionDB`."""

    _IMPORT_MAX_SESSIONS = 500
    _IMPORT_MAX_MESSAGES_PER_SESSION = 10_000
    _IMPORT_MAX_TOTAL_MESSAGES = 50_000
    _IMPORT_MAX_SESSION_BYTES = 5 * 1024 * 1024
    _IMPORT_MAX_TOTAL_BYTES = 25 * 1024 * 1024

    # Provided by SessionDB (this is one of its mixins).
    _write: Callable[[Callable[[Tx], Any]], Any]
    _message_rows: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]

    @staticmethod
    def _import_text_or_none(value: Any, field: str) -> Optional[str]:
        if value is None or isinstance(value, str):
            return value
        raise ValueError(f"{field} must be a string")

    @staticmethod
    def _import_json_object_or_none(value: Any, field: str) -> Optional[str]:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{field} must be valid JSON") from exc
            if not isinstance(parsed, dict):
                raise ValueError(f"{field} must be a JSON object")
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{field} must be a JSON object")
        try:
            return json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{field} must be JSON serializable") from exc

    @staticmethod
    def _float_or_none(value: Any) -> Optional[float]:
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            return None

    @staticmethod
    def _import_int_or_none(value: Any, field: str) -> Optional[int]:
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{field} must be an integer") from exc

    @staticmethod
    def _int_or_default(value: Any, default: int = 0) -> int:
        if value is None:
            return default
        try:
            return int(value)
        except (TypeError, ValueError):
            return default

    @staticmethod
    def _reasoning_json_value(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except (json.JSONDecodeError, TypeError):
            return value

    _SESSION_TEXT = ("source", "user_id", "model", "system_prompt", "end_reason", "cwd", "git_branch", "git_repo_root",
                     "billing_provider", "billing_base_url", "billing_mode", "cost_status", "cost_source",
                     "pricing_version", "title")
    _MESSAGE_TEXT = ("tool_call_id", "tool_name", "effect_disposition", "finish_reason", "reasoning",
                     "reasoning_content", "platform_message_id", "message_id")

    def _check_import(self, sessions: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Hermes' import validation: (normalized items, errors). Any error refuses the batch."""
        if not isinstance(sessions, list):
            raise ValueError("sessions must be a list")
        if len(sessions) > self._IMPORT_MAX_SESSIONS:
            raise ValueError(f"sessions must contain at most {self._IMPORT_MAX_SESSIONS} entries")
        items: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        total_messages = total_bytes = 0

        def error(index: int, sid: str, problem: str) -> None:
            errors.append({"index": index, "error": problem, **({"session_id": sid} if sid else {})})

        for index, raw in enumerate(sessions):
            if not isinstance(raw, dict):
                error(index, "", "session must be an object")
                continue
            sid = str(raw.get("id") or "").strip()
            if not sid:
                error(index, "", "session id is required")
                continue
            if sid in seen:
                error(index, sid, "duplicate session id")
                continue
            messages = raw.get("messages") or []
            if not isinstance(messages, list):
                error(index, sid, "messages must be a list")
                continue
            if len(messages) > self._IMPORT_MAX_MESSAGES_PER_SESSION:
                error(index, sid, "messages exceeds the per-session import limit")
                continue
            if any(not isinstance(m, dict) for m in messages):
                error(index, sid, "messages must contain only objects")
                continue
            try:
                size = len(json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
            except (TypeError, ValueError):
                error(index, sid, "session must be JSON serializable")
                continue
            if size > self._IMPORT_MAX_SESSION_BYTES:
                error(index, sid, "session exceeds the import size limit")
                continue
            total_bytes += size
            if total_bytes > self._IMPORT_MAX_TOTAL_BYTES:
                error(index, sid, "import exceeds the total size limit")
                continue
            try:
                session = dict(raw)
                session["id"] = sid
                session["model_config"] = self._import_json_object_or_none(session.get("model_config"), "model_config")
                session["parent_session_id"] = self._import_text_or_none(session.get("parent_session_id"),
                                                                         "parent_session_id")
                for field in self._SESSION_TEXT:
                    session[field] = self._import_text_or_none(session.get(field), field)
                clean_messages = []
                for i, message in enumerate(messages):
                    clean = dict(message)
                    role = clean.get("role")
                    if not isinstance(role, str) or not role:
                        raise ValueError(f"messages[{i}].role must be a non-empty string")
                    for field in self._MESSAGE_TEXT:
                        clean[field] = self._import_text_or_none(clean.get(field), field)
                    clean["token_count"] = self._import_int_or_none(clean.get("token_count"), "token_count")
                    clean_messages.append(clean)
            except ValueError as exc:
                error(index, sid, str(exc))
                continue
            total_messages += len(clean_messages)
            if total_messages > self._IMPORT_MAX_TOTAL_MESSAGES:
                error(index, sid, "messages exceeds the total import limit")
                continue
            seen.add(sid)
            items.append({"session": session, "messages": clean_messages})
        return items, errors

    def import_sessions(self, sessions: list[dict[str, Any]]) -> dict[str, Any]:
        """Restore exported sessions (Hermes' ``import_sessions``): existing ids are skipped,
        parents kept only when present (and not making a cycle), live runtime state reset."""
        items, errors = self._check_import(sessions)
        if errors:
            return {"ok": False, "imported": 0, "skipped": 0, "detached": 0, "errors": errors}
        prepared = []
        for item in items:
            raw, sid = item["session"], item["session"]["id"]
            started = self._float_or_none(raw.get("started_at"))
            row = {
                "source": str(raw.get("source") or "import"), "user_id": raw.get("user_id"), "model": raw.get("model"),
                "model_config": raw.get("model_config"), "system_prompt": raw.get("system_prompt"),
                "started_at": time.time() if started is None else started,
                "ended_at": self._float_or_none(raw.get("ended_at")), "end_reason": raw.get("end_reason"),
                **{k: self._int_or_default(raw.get(k)) for k in ("input_tokens", "output_tokens", "cache_read_tokens",
                                                                  "cache_write_tokens", "reasoning_tokens")},
                "cwd": raw.get("cwd"), "git_branch": raw.get("git_branch"), "git_repo_root": raw.get("git_repo_root"),
                "billing_provider": raw.get("billing_provider"), "billing_base_url": raw.get("billing_base_url"),
                "billing_mode": raw.get("billing_mode"),
                "estimated_cost_usd": self._float_or_none(raw.get("estimated_cost_usd")),
                "actual_cost_usd": self._float_or_none(raw.get("actual_cost_usd")),
                "cost_status": raw.get("cost_status"), "cost_source": raw.get("cost_source"),
                "pricing_version": raw.get("pricing_version"), "title": raw.get("title"),
                "api_call_count": self._int_or_default(raw.get("api_call_count")),
                "archived": 1 if raw.get("archived") else 0,
            }
            msgs = []
            for m in item["messages"]:
                clean = dict(m)
                for key in ("reasoning_details", "codex_reasoning_items", "codex_message_items"):
                    clean[key] = self._reasoning_json_value(clean.get(key))
                msgs.append(clean)
            prepared.append((sid, {k: sql_value(v, k) for k, v in row.items() if v is not None}, msgs,
                             str(raw.get("parent_session_id") or "").strip()))

        def fn(tx: Tx) -> dict[str, Any]:
            imported: list[str] = []
            skipped: list[str] = []
            links: list[tuple[str, str]] = []
            for sid, row, msgs, parent in prepared:
                if tx.conn.execute("SELECT 1 FROM sessions WHERE id = ? LIMIT 1", (sid,)).fetchone():
                    skipped.append(sid)
                    continue
                tx.emit("hermes.sessions_imported", sid,
                        {"session": row, "messages": numbered(tx.conn, self._message_rows(msgs))})
                if parent:
                    links.append((sid, parent))
                imported.append(sid)
            accepted, detached = self._acceptable_links(tx.conn, links)
            if accepted:
                tx.emit("hermes.parents_attached", None, {"links": [[c, p] for c, p in accepted]})
            return {"ok": True, "imported": len(imported), "skipped": len(skipped), "detached": detached,
                    "imported_ids": imported, "skipped_ids": skipped, "errors": []}

        return dict(self._write(fn))

    @staticmethod
    def _acceptable_links(conn: sqlite3.Connection, links: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
        """The (child, parent) links whose parent exists and that close no cycle, in order; a
        refused link is dropped and later links no longer walk through it."""
        pending = dict(links)
        accepted: list[tuple[str, str]] = []
        detached = 0

        def cycle(child: str, parent: str) -> bool:
            seen = {child}
            current: Any = parent
            while current:
                if current in seen:
                    return True
                seen.add(current)
                if current in pending:
                    current = pending[current]
                    continue
                row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = ? LIMIT 1", (current,)).fetchone()
                if row is None:
                    return False
                current = row[0]
            return False

        for child, parent in links:
            exists = conn.execute("SELECT 1 FROM sessions WHERE id = ? LIMIT 1", (parent,)).fetchone()
            if exists and not cycle(child, parent):
                accepted.append((child, parent))
            else:
                pending.pop(child, None)
                detached += 1
        return accepted, detached

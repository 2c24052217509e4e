"""Stored rows to read-model dicts (docs/EVENTS.md shapes), never crashing on an odd value.

A value that is not what the projector writes (a text timestamp, an epoch of 1e30, a JSON
column that does not decode...) reads as None; a :class:`Warnings` collector records one line
naming the session and the column, and logs it.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import orjson

from eventlog.sessions.rules import COSTS, FLAGS, MAX_TIME, TOKENS, as_number

log = logging.getLogger("eventlog.projections")

SESSION_COLS = (
    "id", "source", "model", "model_config", "title", "title_source", "started_at", "ended_at",
    "end_reason", "message_count", "tool_call_count", *TOKENS, *COSTS, "cwd", "git_repo_root",
    "git_branch", "parent_session_id", "user_id", "chat_id", "chat_type", "thread_id", "tool_names",
    *FLAGS, "last_activity_at",
)
MESSAGE_COLS = (
    "id", "session_id", "role", "content", "content_json", "tool_calls", "tool_name", "tool_call_id",
    "timestamp", "token_count", "finish_reason", "reasoning", "reasoning_details", "display_kind",
    "display_metadata", "active",
)
USAGE_COLS = ("session_id", "model", "provider", "task", *TOKENS, *COSTS, "records")
REACTION_COLS = ("message_id", "author", "emoji", "set_seq", "seen")

_TIMES = {"started_at", "ended_at", "last_activity_at", "timestamp"}
_COUNTS = {"message_count", "tool_call_count", "records", "set_seq", "token_count"}
_BIG = set(TOKENS)
_FLOATS = set(COSTS)
_FLAGS = {*FLAGS, "active", "seen"}
_IDS = {"id", "message_id"}
_JSON = {"model_config": (dict,), "tool_names": (list,), "tool_calls": (list,),
         "reasoning_details": (list, dict), "display_metadata": (dict,)}


class Warnings:
    """Collects (and logs) one line per odd stored value met while reading. Bounded."""

    LIMIT = 1000

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, session: Any, column: str, value: Any) -> None:
        line = f"session {session!r}: stored {column} {str(value)[:80]!r} is not valid; shown as unknown"
        log.warning(line)
        if len(self.lines) < self.LIMIT:
            self.lines.append(line)


def _time(v: Any) -> Any:
    if v is None:
        return None
    t = as_number(v, 0.0, MAX_TIME)  # the fold's reading of a time
    return _BAD if t is None else t


_BAD = object()


def _id(v: Any) -> Any:
    return v if isinstance(v, (int, str)) else _BAD


def _count(v: Any) -> Any:
    return v if isinstance(v, int) and v >= 0 else _BAD


def _big(v: Any) -> Any:
    if isinstance(v, int) and v >= 0:
        return v
    if isinstance(v, str) and v.isdigit() and len(v) < 40:
        return int(v)
    return _BAD


def _float(v: Any) -> Any:
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return _BAD


def _flag(v: Any) -> Any:
    return bool(v) if isinstance(v, int) else _BAD


def _json_of(types: tuple[type, ...]) -> Any:
    def convert(v: Any) -> Any:
        if not isinstance(v, str):
            return _BAD
        try:
            out = orjson.loads(v)
        except orjson.JSONDecodeError:
            return _BAD
        return out if isinstance(out, types) else _BAD
    return convert


def _text(v: Any) -> Any:
    return v if isinstance(v, str) else _BAD


def _converter(col: str) -> Any:
    if col in _TIMES:
        return _time
    if col in _IDS:
        return _id
    if col in _COUNTS:
        return _count
    if col in _BIG:
        return _big
    if col in _FLOATS:
        return _float
    if col in _FLAGS:
        return _flag
    if col in _JSON:
        return _json_of(_JSON[col])
    return _text


def _plan(cols: tuple[str, ...]) -> tuple[tuple[str, Any, Any], ...]:
    """Per column: its name, its converter, and what an invalid value reads as."""
    return tuple((c, _converter(c), False if c in _FLAGS else None) for c in cols)


def _fill(plan: tuple[tuple[str, Any, Any], ...], row: tuple[Any, ...], session: Any,
          warnings: Warnings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (col, conv, invalid), v in zip(plan, row):
        if v is None:
            out[col] = None
            continue
        value = conv(v)
        if value is _BAD:
            warnings.add(session, col, v)
            value = invalid
        out[col] = value
    return out


_SESSION_PLAN = _plan(SESSION_COLS)
_MESSAGE_PLAN = _plan(MESSAGE_COLS[:3] + MESSAGE_COLS[5:])  # content, content_json: in message_dict
_USAGE_PLAN = _plan(USAGE_COLS)
_REACTION_PLAN = _plan(REACTION_COLS)


def session_dict(row: tuple[Any, ...], warnings: Warnings) -> dict[str, Any]:
    return _fill(_SESSION_PLAN, row, row[0], warnings)


def message_dict(row: tuple[Any, ...], warnings: Warnings) -> dict[str, Any]:
    content, content_json = row[3], row[4]
    out = _fill(_MESSAGE_PLAN, row[:3] + row[5:], row[1], warnings)
    if content_json:
        try:
            value = orjson.loads(content) if isinstance(content, str) else _BAD
        except orjson.JSONDecodeError:
            value = _BAD
        if not isinstance(value, (list, dict)):
            warnings.add(row[1], "content", content)
            value = None
    elif content is None or isinstance(content, str):
        value = content
    else:
        warnings.add(row[1], "content", content)
        value = None
    out["content"] = value
    return out


def usage_dict(row: tuple[Any, ...], warnings: Warnings) -> dict[str, Any]:
    return _fill(_USAGE_PLAN, row, row[0], warnings)


def reaction_dict(row: tuple[Any, ...], session: Any, warnings: Warnings) -> dict[str, Any]:
    return _fill(_REACTION_PLAN, row, session, warnings)

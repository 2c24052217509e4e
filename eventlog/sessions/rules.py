"""The session rules, declared once: limits, the fields of accounting and flags, how stored
values are read, titles, and lineage.

Everything that writes, folds or queries sessions takes these from here: the catalogue
(:mod:`eventlog.sessions.events`), the reference fold (:mod:`eventlog.sessions.fold`), the
SQL applier and the queries of the projections, the exports and imports. Pure, no I/O.

The envelope's own limits (ids, 64-bit integers, event size, nesting) belong to the generic log
(:mod:`eventlog.log.codec`) and are re-exported here, so the session layer names one module.
"""
from __future__ import annotations

import logging
import posixpath
import re
from typing import Any, Callable, Iterable

import orjson

from eventlog.log.codec import ID_RE, INT64_MAX, INT64_MIN, MAX_DEPTH, MAX_EVENT_BYTES

__all__ = [
    "ID_RE", "INT64_MAX", "INT64_MIN", "MAX_DEPTH", "MAX_EVENT_BYTES",
    "MAX_ID", "MAX_SHORT", "MAX_TITLE", "MAX_PATH", "MAX_LIST_ITEMS", "MAX_TEXT_BYTES", "MAX_TIME", "MAX_COST",
    "TOKENS", "COSTS", "DEFAULT_SOURCE", "TITLE_RANK", "DEFAULT_TITLE_SOURCE",
    "FLAGS", "FLAG_EVENTS", "CREATED_TEXT", "INHERITED", "META_TEXT",
    "as_str", "as_int", "as_number", "as_time", "event_time", "json_text",
    "clean_text", "normalize_title", "title_claim", "outranked",
    "lineage_root", "descendants", "lineage",
]

# ---- limits ------------------------------------------------------------------------------

MAX_ID = 128
"""Session and event ids: 1-128 characters of ``[A-Za-z0-9_.:@-]`` (:data:`ID_RE`)."""
MAX_SHORT = 1024
MAX_TITLE = 200
MAX_PATH = 4096
MAX_LIST_ITEMS = 4096
MAX_TEXT_BYTES = 8 * 1024 * 1024
MAX_TIME = 4.2e9
"""Times are float epoch seconds in [0, MAX_TIME]; a stored time outside reads as unknown."""
MAX_COST = 1e15

# ---- accounting ------------------------------------------------------------------------------

TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
"""Token counters of ``usage.recorded``, summed per session and per (session, model, provider, task)."""
COSTS = ("estimated_cost_usd", "actual_cost_usd")
"""Costs of ``usage.recorded``: a missing cost stays missing (None) rather than becoming 0."""

DEFAULT_SOURCE = "cli"
"""The source a session created without one is listed, searched and counted under."""

# ---- titles ----------------------------------------------------------------------------------

TITLE_RANK: dict[str, int] = {"derived": 0, "llm": 1, "user": 2}
"""Title provenance: a lower one never replaces a higher one."""
DEFAULT_TITLE_SOURCE = "user"

# ---- session events --------------------------------------------------------------------------

FLAGS = ("archived", "pinned", "hidden")
"""The lineage flags: each event below sets one on every live member of the lineage."""
FLAG_EVENTS: dict[str, tuple[str, bool]] = {
    "session.archived": ("archived", True), "session.unarchived": ("archived", False),
    "session.pinned": ("pinned", True), "session.unpinned": ("pinned", False),
    "session.hidden": ("hidden", True), "session.unhidden": ("hidden", False),
}
CREATED_TEXT = ("source", "model", "cwd", "git_repo_root", "git_branch", "parent_session_id",
                "user_id", "chat_id", "chat_type", "thread_id")
"""Text fields ``session.created`` sets as given (a value of another type reads as unknown)."""
INHERITED = ("cwd", "git_repo_root", "git_branch")
"""What a child session takes from its live parent when it does not say (flags come from the root)."""
META_TEXT = ("model", "cwd", "git_repo_root", "git_branch", "source")
"""Text fields ``session.meta_updated`` replaces when present (null clears)."""


# ---- reading stored values: anything of the wrong type reads as unknown (None) -------------

def as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def as_int(v: Any, low: int = INT64_MIN) -> int | None:
    """An int (not a bool) in [low, 2**63-1], else None."""
    if isinstance(v, int) and not isinstance(v, bool) and low <= v <= INT64_MAX:
        return v
    return None


def as_number(v: Any, low: float, high: float) -> float | None:
    """An int or float (not a bool) in [low, high] as a float, else None (NaN included)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high:
        return float(v)  # the range test is also false for NaN
    return None


def as_time(v: Any, default: float | None) -> float | None:
    """A stored time: absent/null -> ``default`` (the event time), a valid time -> float, else None."""
    return default if v is None else as_number(v, 0.0, MAX_TIME)


class OddValues:
    """Warnings for stored values a read model shows as unknown (invariant 8), naming the
    session, field and seq — one wording and one bound for the fold and the SQL applier: the
    first :attr:`LIMIT` of a pass are named, the rest only counted (:attr:`count`)."""

    LIMIT = 100

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.count = 0

    def add(self, sid: str, seq: int, field: str, value: Any) -> None:
        self.count += 1
        if self.count <= self.LIMIT:
            self.log.warning(f"session {sid!r}: {field} {repr(value)[:80]} of the event at seq {seq} is not valid; "
                             "shown as unknown")
        elif self.count == self.LIMIT + 1:
            self.log.warning("more values shown as unknown; only the first %d are named", self.LIMIT)

    def texts(self, sid: str, seq: int, data: dict[str, Any], keys: Any) -> None:
        """One warning for each of ``keys`` present in ``data`` with a value that is not text."""
        for key in keys:
            v = data.get(key)
            if v is not None and type(v) is not str:
                self.add(sid, seq, key, v)

    def unread(self, sid: str, seq: int, data: dict[str, Any], read: dict[str, Any]) -> None:
        """One warning for each field of ``read`` (field -> what it read as) that ``data`` holds
        but that read as unknown."""
        for key, value in read.items():
            if value is None and data.get(key) is not None:
                self.add(sid, seq, key, data[key])


def event_time(ts: Any) -> float | None:
    """An envelope's ``ts`` (int nanoseconds) as epoch seconds, or None when it is not valid."""
    ns = as_int(ts, 0)
    return None if ns is None else as_number(ns / 1e9, 0.0, MAX_TIME)


def json_text(v: Any, *kinds: type) -> str | None:
    """The orjson text of a stored JSON value of one of ``kinds`` (list, dict), or None."""
    if not isinstance(v, kinds):
        return None
    try:
        return orjson.dumps(v).decode()
    except TypeError:  # orjson.JSONEncodeError: not plain JSON after all
        return None


# ---- text and titles -------------------------------------------------------------------------

_WS_RE = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Return ``text`` as an exact ``str`` with each lone surrogate replaced by U+FFFD.

    A high+low surrogate pair is combined into the character it encodes.
    """
    if type(text) is not str:
        text = str.__str__(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def normalize_title(title: str) -> str:
    """Return ``title`` with surrogates replaced, whitespace runs collapsed to one space, trimmed.

    Writers, the fold and the projections compare titles only in this form.
    """
    return _WS_RE.sub(" ", clean_text(title)).strip()


def title_claim(title: Any, source: Any) -> tuple[str, str] | None:
    """What a stored title event asks for: (normalized title, provenance), or None when it cannot
    apply (no text, an empty title, an unknown provenance). A missing provenance is ``user``."""
    source = DEFAULT_TITLE_SOURCE if source is None else source
    if not isinstance(title, str) or not isinstance(source, str) or source not in TITLE_RANK:
        return None
    title = normalize_title(title)
    return (title, source) if title else None


def outranked(current: Any, source: str) -> bool:
    """True when a title of provenance ``current`` must be kept against one of ``source``."""
    return current in TITLE_RANK and TITLE_RANK[current] > TITLE_RANK[source]


# ---- lineage ---------------------------------------------------------------------------------
# A lineage is a root session and every live session reachable from it through child links.
# Read models differ only in how they look a link up; the walk (and its guard against cycles
# an odd log can contain) is this one.

def lineage_root(session_id: str, parent_of: Callable[[str], str | None]) -> str:
    """The root of a live session: follow ``parent_of`` (the live parent, or None) until there is
    none or it would revisit a session."""
    sid, seen = session_id, {session_id}
    while True:
        parent = parent_of(sid)
        if parent is None or parent in seen:
            return sid
        seen.add(parent)
        sid = parent


def descendants(session_id: str, children_of: Callable[[str], Iterable[str]]) -> list[str]:
    """Every session reachable from ``session_id`` through ``children_of`` (live children other
    than the session itself), ``session_id`` excluded, sorted by id."""
    found, todo = {session_id}, [session_id]
    while todo:
        for child in children_of(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(session_id)
    return sorted(found)


def lineage(session_id: str, parent_of: Callable[[str], str | None],
            children_of: Callable[[str], Iterable[str]]) -> list[str]:
    """The lineage of a live session: its root first, then the root's descendants by id."""
    root = lineage_root(session_id, parent_of)
    return [root, *descendants(root, children_of)]


def workspace_scope(path: str) -> tuple[str, str]:
    """A ``workspace`` filter as ``(the path, the prefix of every path under it)``, normalised
    (``/a/b/``, ``/a/./b`` and ``/a/c/../b`` are ``/a/b``; the root's prefix is ``/``): a session is
    in it when its git root or cwd is the path or starts with the prefix."""
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return norm, norm if norm.endswith("/") else norm + "/"

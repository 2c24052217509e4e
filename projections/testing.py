"""Helpers for tests and reliability campaigns: every query answer of a read model, in one
comparable dict, and faults a test can do to a projection file.

``answers(model, ...)`` works on :class:`eventlog.sessions.fold.Fold` and on :class:`Reader` alike, so
``answers(fold) == answers(reader)`` is the whole "the projection equals the reference fold"
check. :class:`Prefix` shows a projector the log as it stood at a seq (catch up to a prefix).
The fault helpers write files with plain I/O: use them only while no connection of the calling
process has the file open.
"""
from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Iterator

from eventlog.log import Log
from projections import files

LIST_VARIANTS: list[dict[str, Any]] = [
    {}, {"limit": None}, {"limit": 2}, {"limit": 1, "offset": 1}, {"limit": 0},
    {"archived": None, "hidden": None, "limit": None}, {"archived": True, "limit": None},
    {"pinned": True, "limit": None}, {"pinned": False, "limit": 3}, {"hidden": True, "limit": None},
    {"children": False, "limit": None}, {"source": "cli", "limit": None}, {"source": "tg", "limit": None},
    {"workspace": "/w", "limit": None}, {"workspace": "/w/x", "hidden": None, "limit": None},
    {"workspace": "/", "limit": None}, {"workspace": "/w/", "limit": None}, {"workspace": "/w/x/..", "limit": None},
]
SEARCH_WORDS = ["alpha", "Beta", "gamma delta", "中文", "文测试", "a", "ph", "grep", '"alpha', "alpha)", "*",
                "beta OR", "NEAR(alpha", "al*", "'", "", "zzz"]


def search_ids(model: Any, query: str, **kw: Any) -> list[int]:
    """Message ids a search returns, for the fold (list of messages) or a reader (dict)."""
    found = model.search(query, **kw)
    if isinstance(found, dict):
        return [r["message_id"] for r in found["results"]]
    return [m["id"] for m in found]


def answers(model: Any, session_ids: Iterable[str], message_ids: Iterable[int],
            words: Iterable[str] = SEARCH_WORDS) -> dict[Any, Any]:
    """Every query of docs/EVENTS.md (and the writers' helper queries) on ``model``."""
    out: dict[Any, Any] = {}
    session_ids, message_ids = list(session_ids), list(message_ids)
    for sid in session_ids:
        out["get_session", sid] = model.get_session(sid)
        out["get_messages", sid] = model.get_messages(sid)
        out["get_messages.all", sid] = model.get_messages(sid, include_inactive=True)
        out["get_messages.page", sid] = model.get_messages(sid, include_inactive=True, limit=2,
                                                           after=min(message_ids, default=0))
        mid = sorted(message_ids)[len(message_ids) // 2] if message_ids else 1
        out["get_messages.latest", sid] = model.get_messages(sid, limit=3)
        out["get_messages.latest0", sid] = model.get_messages(sid, limit=0)
        out["get_messages.before", sid] = model.get_messages(sid, include_inactive=True, limit=2, before=mid)
        out["get_messages.window", sid] = model.get_messages(sid, before=mid, after=min(message_ids, default=0),
                                                             newest_first=True)
        out["get_messages.newest", sid] = model.get_messages(sid, limit=4, newest_first=True)
        out["get_usage", sid] = model.get_usage(sid)
        out["unseen_reactions", sid] = model.unseen_reactions(sid)
        out["lineage", sid] = model.lineage(sid)
        out["is_live", sid] = model.is_live(sid)
        out["search.session", sid] = search_ids(model, "a", session_id=sid, limit=None)
    for i, variant in enumerate(LIST_VARIANTS):
        out["list_sessions", i] = model.list_sessions(**variant)
    for mid in message_ids:
        out["get_reactions", mid] = model.get_reactions(mid)
        out["message_session", mid] = model.message_session(mid)
    for w in words:
        out["search", w] = search_ids(model, w, limit=None)
    out["search.limit"] = search_ids(model, "a", limit=3)
    out["search.role"] = search_ids(model, "a", role="assistant", limit=None)
    out["search.source"] = search_ids(model, "a", source="cli", limit=None)
    out["titles"] = sorted(model.titles())
    out["stats"] = model.stats()
    return out


class Prefix:
    """The read side of ``log`` as it stood when its head was ``until`` (settable): a projector
    given this view catches up to that seq and no further. For tests of batching and resuming."""

    def __init__(self, log: Log, until: int) -> None:
        self.log = log
        self.until = until

    @property
    def profile(self) -> str | None:
        return self.log.profile

    def head(self) -> tuple[int, str]:
        seq = min(self.until, self.log.head()[0])
        env = self.log.get(seq) if seq > 0 else None
        return (seq, str(env["hash"])) if env else (0, "0" * 64)

    def get(self, seq: int) -> dict[str, Any] | None:
        return self.log.get(seq) if seq <= self.until else None

    def read(self, from_seq: int = 1, to_seq: int | None = None, *, raw: bool = False) -> Iterator[Any]:
        yield from self.log.read(from_seq, self.until if to_seq is None else min(to_seq, self.until), raw=raw)


def diff(a: dict[Any, Any], b: dict[Any, Any]) -> list[str]:
    """Keys whose answers differ, with both answers (for assertion messages)."""
    lines = []
    for key in sorted(set(a) | set(b), key=repr):
        if a.get(key) != b.get(key):
            lines.append(f"{key!r}:\n  expected {a.get(key)!r}\n  got      {b.get(key)!r}")
    return lines


# ---- faults ----------------------------------------------------------------------------------

def current_file(profile_dir: Path, kind: str = "state") -> Path:
    g = files.read_pointer(files.canonical_pointer(Path(profile_dir), kind))
    if g is None:
        raise FileNotFoundError(f"no {kind} pointer in {profile_dir}")
    return g.path


def zero_file(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(b"\0" * size)


def truncate_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def garbage_pages(path: Path, pages: int = 3, seed: int = 0, page_size: int = 4096) -> list[int]:
    """Overwrite ``pages`` whole pages (never page 1) with random bytes; returns their numbers."""
    rng = random.Random(seed)
    count = path.stat().st_size // page_size
    chosen = sorted(rng.sample(range(1, count), min(pages, count - 1))) if count > 1 else []
    with open(path, "r+b") as f:
        for p in chosen:
            f.seek(p * page_size)
            f.write(rng.randbytes(page_size))
    return chosen


def checkpoint(path: Path) -> None:
    """Move a file's WAL content into it, so byte-level damage hits the real pages."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()

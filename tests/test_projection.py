"""state.db and the FTS index: schema, queries, batching, read-your-writes, health, rebuilds."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.log import EventLog
from eventlog.log.memory import MemoryLog
from eventlog.sessions.events import make_event
from eventlog.sessions.fold import Fold
from projections import Projector, Reader, files
from projections.schema import STATE_SCHEMA
from projections.testing import Prefix, answers, current_file


def ev(type_: str, session: str, **data: Any) -> dict[str, Any]:
    return make_event(type_, session, data)


def history(log: Any) -> dict[str, int]:
    """A small history whose answers are written out in the tests below."""
    seqs: dict[str, int] = {}
    log.append([
        ev("session.created", "root", source="cli", cwd="/w/app", git_repo_root="/w", title="Root", started_at=100.0),
        ev("session.created", "child", parent_session_id="root", started_at=200.0),
        ev("session.created", "tg1", source="tg", cwd="/elsewhere", started_at=300.0),
        ev("session.created", "nosrc", started_at=50.0),
        ev("session.created", "old", source="cli", started_at=10.0),
    ])
    seqs["m1"], seqs["m2"], seqs["m3"] = log.append([
        ev("message.appended", "root", role="user", content="Find the needle", timestamp=400.0),
        ev("message.appended", "root", role="assistant", content=[{"type": "text", "text": "needle found"}],
           tool_calls=[{"id": "c1", "function": {"name": "grep"}}], timestamp=410.0),
        ev("message.appended", "root", role="user", content="and again", timestamp=420.0),
    ])
    log.append([
        ev("messages.rewound", "root", message_id=seqs["m3"]),
        ev("usage.recorded", "root", model="m1", provider="p", input_tokens=10, output_tokens=5),
        ev("usage.recorded", "root", input_tokens=1, estimated_cost_usd=0.5),
        ev("usage.recorded", "root", model="m1", provider="p", input_tokens=2, actual_cost_usd=0.25),
        ev("message.reaction_set", "root", message_id=seqs["m1"], author="bob", emoji="+1"),
        ev("message.reaction_set", "root", message_id=seqs["m1"], author="ann", emoji="heart"),
        ev("message.reaction_set", "root", message_id=seqs["m1"], author="ann", emoji="heart"),  # retracts
        ev("message.reaction_set", "root", message_id=seqs["m2"], author="ann", emoji="eyes"),
        ev("session.pinned", "old", {}) if False else ev("session.pinned", "old"),
        ev("session.archived", "child"),
        ev("session.hidden", "tg1"),
    ])
    seqs["seen"] = log.append([ev("reactions.seen", "root", up_to=seqs["m1"] + 1000)])[0]
    seqs["m4"] = log.append([ev("message.appended", "nosrc", role="user", content="中文测试 needle",
                                timestamp=500.0)])[0]
    return seqs


@pytest.fixture
def proj(tmp_path: Path) -> Any:
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    seqs = history(log)
    p = Projector(tmp_path / "p", log, "p")
    p.advance()
    reader = p.reader()
    yield log, p, reader, seqs
    reader.close()
    p.close()
    log.close()


def test_schema_is_what_agent_runtimes_read(proj: Any) -> None:
    log, p, reader, seqs = proj
    db = sqlite3.connect(f"file:{p.dir / 'state.db'}?mode=ro", uri=True)
    cols = {r[1] for r in db.execute("PRAGMA table_info(sessions)")}
    assert {"id", "source", "model", "model_config", "title", "title_source", "started_at", "ended_at", "end_reason",
            "message_count", "tool_call_count", "input_tokens", "output_tokens", "cache_read_tokens",
            "cache_write_tokens", "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd", "cwd",
            "git_repo_root", "git_branch", "parent_session_id", "archived", "pinned", "hidden", "last_activity_at",
            "profile_name", "user_id", "chat_id", "chat_type", "thread_id", "tool_names"} <= cols
    cols = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
    assert {"id", "session_id", "role", "content", "tool_calls", "tool_name", "tool_call_id", "timestamp",
            "token_count", "finish_reason", "reasoning", "display_kind", "display_metadata", "active"} <= cols
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"usage", "reactions", "meta", "tombstones"} <= tables
    meta = dict(db.execute("SELECT key, value FROM meta"))
    assert meta["last_seq"] == log.head()[0] and meta["last_hash"] == log.head()[1]
    assert meta["log_id"] == log.get(1)["hash"] and meta["profile"] == "p" and meta["schema_version"] == STATE_SCHEMA
    assert db.execute("SELECT profile_name FROM sessions LIMIT 1").fetchone() == ("p",)
    # Every query is served by an index, never a full scan of a big table.
    plans = {
        "list": "SELECT id FROM sessions WHERE archived = 0 AND hidden = 0 "
                "ORDER BY last_activity_at DESC, id DESC LIMIT 50",
        "messages": "SELECT * FROM messages WHERE session_id = 'root' AND active = 1 ORDER BY id",
        "unseen": "SELECT * FROM reactions WHERE session_id = 'root' AND seen = 0 ORDER BY message_id, author",
        "usage": "SELECT * FROM usage WHERE session_id = 'root' ORDER BY model, provider, task",
        "title": "SELECT id FROM sessions WHERE title = 'Root'",
        "children": "SELECT id FROM sessions WHERE parent_session_id = 'root'",
        "pinned": "SELECT id FROM sessions WHERE pinned = 1 ORDER BY last_activity_at DESC, id DESC",
    }
    for name, sql in plans.items():
        plan = " ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql))
        assert "INDEX" in plan or "PRIMARY KEY" in plan, (name, plan)
    db.close()


def test_queries_answer_as_documented(proj: Any) -> None:
    log, p, r, seqs = proj
    root = r.get_session("root")
    assert root is not None
    assert (root["message_count"], root["tool_call_count"], root["last_activity_at"]) == (2, 1, 420.0)
    assert (root["input_tokens"], root["output_tokens"]) == (13, 5)
    assert (root["estimated_cost_usd"], root["actual_cost_usd"]) == (0.5, 0.25)
    assert r.get_session("child")["cwd"] == "/w/app"  # type: ignore[index]  # inherited
    assert r.get_session("nope") is None
    # Most recent activity first; archived (the whole lineage of "child") and hidden left out by
    # default; pinned always included.
    assert [s["id"] for s in r.list_sessions()] == ["nosrc", "old"]
    assert [s["id"] for s in r.list_sessions(limit=1)] == ["nosrc", "old"]
    assert [s["id"] for s in r.list_sessions(limit=1, offset=1)] == ["old"]
    assert [s["id"] for s in r.list_sessions(archived=None, hidden=None, limit=None)] == \
        ["nosrc", "root", "tg1", "child", "old"]
    assert [s["id"] for s in r.list_sessions(source="cli")] == ["nosrc", "old"]  # null source is cli
    assert [s["id"] for s in r.list_sessions(workspace="/w", archived=None)] == ["root", "child"]
    assert [s["id"] for s in r.list_sessions(archived=None, children=False)] == ["nosrc", "root", "old"]
    # Messages: rewound ones only on request.
    assert [m["id"] for m in r.get_messages("root")] == [seqs["m1"], seqs["m2"]]
    assert [m["id"] for m in r.get_messages("root", include_inactive=True)] == [seqs["m1"], seqs["m2"], seqs["m3"]]
    assert [m["id"] for m in r.get_messages("root", include_inactive=True, after=seqs["m1"], limit=1)] == [seqs["m2"]]
    assert r.get_messages("root")[1]["content"] == [{"type": "text", "text": "needle found"}]
    # Usage per (model, provider, task), nulls first; a missing cost stays missing.
    usage = r.get_usage("root")
    assert [(u["model"], u["records"], u["estimated_cost_usd"], u["actual_cost_usd"]) for u in usage] == \
        [(None, 1, 0.5, None), ("m1", 2, None, 0.25)]
    # Reactions: one per author; the same emoji again retracts.
    assert [(x["author"], x["emoji"]) for x in r.get_reactions(seqs["m1"])] == [("bob", "+1")]
    assert [(x["message_id"], x["author"], x["seen"]) for x in r.unseen_reactions("root")] == []
    stats = r.stats()
    assert stats["sessions"] == 4 and stats["by_source"] == {
        "cli": {"sessions": 3, "messages": 3}, "tg": {"sessions": 1, "messages": 0}}
    fold = Fold()
    fold.apply_all(log.read())
    mids = list(range(1, log.head()[0] + 2))
    sids = ["root", "child", "tg1", "nosrc", "old", "x"]
    assert answers(r, sids, mids) == answers(fold, sids, mids)


def test_search(proj: Any) -> None:
    log, p, r, seqs = proj
    found = r.search("needle")
    assert found["degraded"] is False
    assert [x["message_id"] for x in found["results"]] == [seqs["m4"], seqs["m2"], seqs["m1"]]
    first = found["results"][-1]
    assert first == {"session_id": "root", "message_id": seqs["m1"], "role": "user",
                     "snippet": "Find the «needle»", "timestamp": 400.0}
    assert [x["message_id"] for x in r.search("NEEDLE", role="assistant")["results"]] == [seqs["m2"]]
    in_cli = [x["message_id"] for x in r.search("needle", source="cli")["results"]]
    assert in_cli == [seqs["m4"], seqs["m2"], seqs["m1"]]
    assert [x["message_id"] for x in r.search("needle", session_id="nosrc")["results"]] == [seqs["m4"]]
    assert [x["message_id"] for x in r.search("eedl")["results"]][:1] == [seqs["m4"]]  # substrings
    assert [x["message_id"] for x in r.search("文测")["results"]] == [seqs["m4"]]  # CJK, two characters
    assert [x["message_id"] for x in r.search("grep")["results"]] == [seqs["m2"]]  # tool calls
    assert r.search("again")["results"] == []  # rewound
    assert r.search("needle", limit=1)["results"][0]["message_id"] == seqs["m4"]


def test_search_never_crosses_profiles(tmp_path: Path) -> None:
    a, b = MemoryLog(profile="a"), MemoryLog(profile="b")
    a.append([ev("session.created", "s1"), ev("message.appended", "s1", role="user", content="secret alpha")])
    b.append([ev("session.created", "s1"), ev("message.appended", "s1", role="user", content="other beta")])
    with Projector(tmp_path / "profiles" / "a", a, "a") as pa, Projector(tmp_path / "profiles" / "b", b, "b") as pb:
        pa.advance()
        pb.advance()
        assert pb.reader().search("secret")["results"] == []
        assert pb.reader().search("s1", session_id="s1")["results"] == []
        assert [x["message_id"] for x in pa.reader().search("secret")["results"]] == [2]


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
           for t in ("sessions", "messages", "usage", "reactions", "tombstones")}
    out["meta"] = sorted(r for r in db.execute("SELECT * FROM meta") if r[0] not in ("built_at_ns", "rebuilt_at"))
    db.close()
    return out


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8), seed=st.integers(0, 1000))
def test_any_batch_sizes_give_identical_rows(sizes: list[int], seed: int, tmp_path_factory: Any) -> None:
    tmp = tmp_path_factory.mktemp("b")
    log = MemoryLog(profile="p")
    history(log)
    import random
    rng = random.Random(seed)
    for i in range(60):
        sid = rng.choice(["root", "child", "tg1", "nosrc"])
        log.append([ev("message.appended", sid, role="user", content=f"m{i}"),
                    ev("usage.recorded", sid, input_tokens=i, estimated_cost_usd=rng.random() / 7)])
    with Projector(tmp / "one", log, "p", batch_size=10**6) as p:
        p.advance()
    prefix = Prefix(log, 1)  # the first cursor read builds state.db as of seq 1; catch-ups do the rest
    with Projector(tmp / "many", prefix, "p") as p:  # type: ignore[arg-type]
        for n in sizes:
            prefix.until = p.cursor() + n
            p.batch_size = rng.randint(1, 9)
            p.advance()
        prefix.until = log.head()[0]
        p.batch_size = 3
        p.advance()
    with Projector(tmp / "rebuilt", log, "p") as p:
        p.rebuild()
    one = dump(tmp / "one" / "state.db")
    assert dump(tmp / "many" / "state.db") == one
    assert dump(tmp / "rebuilt" / "state.db") == one


def test_read_your_writes_and_sync(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "log", durability="nosync", profile="p")
    with Projector(tmp_path / "p", log, "p") as p:
        reader = p.reader()
        for i in range(20):
            seq = log.append([ev("session.created", f"s{i}")])[0]
            assert p.advance(seq, wait=5).done
            assert reader.get_session(f"s{i}") is not None
        log.append([ev("message.appended", "s0", role="user", content="x")])
        assert p.advance(wait=5).done
        assert reader.get_messages("s0")[0]["content"] == "x"
        reader.close()
    log.close()


def test_rebuild_stats_progress_and_points_in_time(proj: Any, tmp_path: Path) -> None:
    log, p, r, seqs = proj
    calls: list[tuple[int, int]] = []
    stats = p.rebuild(progress=lambda done, total: calls.append((done, total)))
    assert {"events", "seconds", "events_per_s", "last_seq", "files", "which"} <= set(stats)
    assert stats["events"] == stats["last_seq"] == log.head()[0] and calls[-1] == (log.head()[0], log.head()[0])
    cut_ts = log.get(seqs["m2"])["ts"]
    p.rebuild(out_path=tmp_path / "as-of.db", as_of_ns=cut_ts)
    with Reader.open_file(tmp_path / "as-of.db") as audit:
        assert [m["id"] for m in audit.get_messages("root", include_inactive=True)] == [seqs["m1"], seqs["m2"]]
        assert [x["message_id"] for x in audit.search("needle")["results"]] == [seqs["m2"], seqs["m1"]]
    db = sqlite3.connect(tmp_path / "as-of.db")
    assert dict(db.execute("SELECT key, value FROM meta"))["last_seq"] == seqs["m2"]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one self-contained file
    db.close()
    stats = p.rebuild("fts")
    assert stats["files"] and stats["files"][0].startswith("fts.")
    assert r.search("needle")["degraded"] is False


def test_health_reports_and_changes_nothing(tmp_path: Path) -> None:
    log = MemoryLog(profile="p")
    with Projector(tmp_path / "p", log, "p") as p:
        listing = sorted(os.listdir(p.dir))
        h = p.health()
        assert h["state"]["status"] == "missing" and h["fts"]["status"] == "missing" and not h["ok"]
        assert sorted(os.listdir(p.dir)) == listing
        p.heal()
        assert p.health()["ok"]
        log.append([ev("session.created", "s1")])
        h = p.health(full=True)
        assert h["state"]["status"] == "stale" and h["ok"]  # behind the log is healthy: catch-up fixes it
        # (-shm is SQLite's shared-memory index: every reader updates it.)
        mtimes = {n: os.stat(p.dir / n).st_mtime_ns for n in os.listdir(p.dir) if not n.endswith("-shm")}
        p.health(full=True)
        assert {n: os.stat(p.dir / n).st_mtime_ns for n in os.listdir(p.dir) if not n.endswith("-shm")} == mtimes


def test_lease_is_a_flock_and_readers_are_read_only(proj: Any) -> None:
    log, p, r, seqs = proj
    assert p.lease.acquire(0)
    try:
        inode = os.stat(p.dir).st_ino  # the lease locks the profile directory (a file could be deleted)
        locks = Path("/proc/locks").read_text().splitlines()
        mine = [line for line in locks if f":{inode} " in line]
        assert mine and all("FLOCK" in line for line in mine), mine
    finally:
        p.lease.release()
    r.get_session("root")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        r._db.execute("UPDATE sessions SET title = 'x'")  # type: ignore[union-attr]
    state = current_file(p.dir)
    assert files.parse(state) is not None


def test_the_lease_says_when_it_is_let_go(tmp_path: Path) -> None:
    """on_release runs when the outermost hold ends (still held) and at close, never in between:
    the projector closes its read-write connection there, so none outlives the lease."""
    from projections.lease import Lease

    calls: list[bool] = []
    lease = Lease(tmp_path, on_release=lambda: calls.append(lease.held))
    with lease.hold(0):
        with lease.hold(0):
            pass
        assert calls == []
    assert calls == [True]  # called while still held, just before the flock goes
    lease.close()
    assert calls == [True, False]


def test_a_snippet_shows_a_text_that_fits_its_window_whole() -> None:
    """A short message is shown whole around its match; a long one keeps a third of the window
    before the first match, and a match near its end still gets a full window (outside audit,
    helper-58: the README's own example showed '…hy does test_refunds «flake»?')."""
    from projections.fts import SNIPPET_CHARS, snippet

    assert snippet("Why does test_refunds flake?", ["flake"]) == "Why does test_refunds «flake»?"
    long = "a" * 200 + " needle " + "b" * 200
    shown = snippet(long, ["needle"])
    assert shown.startswith("…") and shown.endswith("…") and "«needle»" in shown
    assert shown.index("«") == 1 + SNIPPET_CHARS // 3  # the "…", then a third of the window (its space last)
    tail = "c" * 300 + " the end"
    shown = snippet(tail, ["end"])
    assert shown.startswith("…") and shown.endswith("«end»") and len(shown) == SNIPPET_CHARS + 3

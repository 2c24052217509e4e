"""Migration from a Hermes Agent state.db (sqlite_export.hermes)."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import StorageError, ValidationError
from eventlog.sessions.store import SessionStore
from sqlite_export.hermes import import_hermes, map_session_id

sys.path.insert(0, str(Path(__file__).parent))
import fixtures_hermes as fx  # noqa: E402

READ_MODELS = ["fold", "projection"]


def fingerprint(path: Path) -> dict[str, Any]:
    """Bytes (hashed in a subprocess: no plain file I/O on a database in this process), mtime,
    and the files beside it."""
    out: dict[str, Any] = {"listing": sorted(os.listdir(path.parent))}
    for f in sorted(path.parent.iterdir()):
        if f.name.startswith(path.name):
            digest = subprocess.run(
                [sys.executable, "-c", "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
                 str(f)], capture_output=True, text=True, check=True).stdout.strip()
            out[f.name] = (digest, f.stat().st_mtime_ns, f.stat().st_size)
    return out


def hit_ids(result: Any) -> set[int]:
    rows = result.get("results", []) if isinstance(result, dict) else result
    return {r.get("message_id", r.get("id")) for r in rows}


def seq_of(store: SessionStore, sid: str, row: int) -> int:
    seq = store.log.event_seq(f"hermes:{sid}:msg:{row}")
    assert seq is not None, (sid, row)
    return seq


def has_warning(report: Any, *parts: str) -> bool:
    return any(all(p in w for p in parts) for w in report.warnings)


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    d = tmp_path / "hermes"
    d.mkdir()
    facts = fx.make_current(d / "state.db")
    return d / "state.db", facts


def open_store(home: Path, read_model: str = "fold", profile: str = "imported") -> SessionStore:
    return SessionStore.open(home, profile, read_model=read_model, durability="nosync")


@pytest.mark.parametrize("read_model", READ_MODELS)
def test_current_schema(home: Path, source: tuple[Path, dict[str, Any]], read_model: str) -> None:
    path, facts = source
    rows = facts["rows"]
    before = fingerprint(path)
    calls: list[tuple[int, int]] = []
    with open_store(home, read_model) as store:
        report = import_hermes(store, path, progress=lambda done, total: calls.append((done, total)))
        assert (report.sessions, report.messages, report.usage) == (7, 20, 1)
        assert report.skipped == 2  # the 'robot' row and the orphan
        assert report.already_present == 0
        assert report.warning_count == len(report.warnings)

        # Every damaged value is named by session and row.
        w = lambda *p: has_warning(report, *p)  # noqa: E731
        assert w(f"session '{fx.S3}' message row {rows['m13']}", "role 'robot'", "skipped")
        assert w(f"session '{fx.S3}' message row {rows['m10']}", "timestamp", "TEXT 'yesterday'")
        assert w(f"session '{fx.S3}' message row {rows['m11']}", "timestamp 1e+30", "out of range")
        assert w(f"session '{fx.S3}' message row {rows['m12']}", "timestamp -5", "out of range")
        assert w(f"session '{fx.S3}' message row {rows['m21']}", "token_count 'abc'")
        assert w(f"session '{fx.S3}' message row {rows['m14']}", "multimodal parts")
        assert w(f"session '{fx.S2}' message row {rows['m6']}", "tool_calls", "JSON-encoded 2 times")
        assert w(f"session '{fx.S2}' message row {rows['m7']}", "tool_calls", "not valid JSON", "dropped")
        assert w(f"session '{fx.S2}' message row {rows['m8']}", "display_metadata", "JSON-encoded 2 times")
        assert w(f"session '{fx.S2}' message row {rows['m9']}", "display_metadata", "not valid JSON")
        assert w(f"session '{fx.S2}'", "model_config", "JSON-encoded 2 times")
        assert w(f"session '{fx.S3}'", "model_config", "not valid JSON")
        assert w(f"session '{fx.S4}'", "model_config", "list")
        assert w(f"session '{fx.S4}'", "started_at 1e+30")
        assert w(f"session '{fx.S3}'", "started_at stored as TEXT")
        assert w(f"session '{fx.S4}'", "title 'Groceries'", "'Groceries #2'")
        assert w("session 'ghost-session'", f"rows {rows['m19']}", "orphans")
        assert w(f"session '{fx.S5}'", f"imported as '{map_session_id(fx.S5)}'")
        assert w(f"session '{fx.S6}'", "partly hidden")

        assert calls and calls[-1][0] == calls[-1][1] == 7 + 22
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)

        store.sync()
        listed = {s["id"]: s for s in store.list_sessions(archived=None, hidden=None, limit=None)}
        assert set(listed) == {fx.S1, fx.S2, fx.S3, fx.S4, map_session_id(fx.S5), fx.S6, fx.S7}
        s1, s2, s3, s4 = (listed[k] for k in (fx.S1, fx.S2, fx.S3, fx.S4))
        assert (s1["title"], s1["source"], s1["model"], s1["model_config"]) == (
            "Fix the parser", "cli", "claude-x", {"temperature": 0.2})
        assert (s1["started_at"], s1["ended_at"], s1["end_reason"]) == (fx.T0, fx.T0 + 3600, "compression")
        assert s1["tool_names"] == ["terminal", "web_search"]
        assert (s2["parent_session_id"], s2["cwd"], s2["git_branch"]) == (fx.S1, "/home/u/proj", "main")
        assert (s2["model_config"], s2["title"], s2["title_source"]) == ({"temperature": 0.3}, "Fix the parser #2", "derived")
        assert s3["archived"] and not s3["pinned"] and s3["started_at"] == 1735804800.0
        assert (s3["user_id"], s3["chat_id"], s3["model_config"]) == ("42", "-1001", None)
        assert s4["pinned"] and s4["title"] == "Groceries #2" and s4["end_reason"] == "unknown"
        assert listed[fx.S6]["hidden"] and listed[fx.S7]["hidden"] and listed[fx.S7]["parent_session_id"] == fx.S6
        assert listed[map_session_id(fx.S5)]["title"] == "Odd one"

        # Parents before children, whatever their start times.
        created = [e["session"] for e in store.log.read() if e["type"] == "session.created"]
        assert created.index(fx.S6) < created.index(fx.S7) and created.index(fx.S1) < created.index(fx.S2)

        msgs = store.get_messages(fx.S1, include_inactive=True)
        assert [m["content"] for m in msgs] == [
            "Please fix the tokenizer bug", None, "3 passed", "Fixed the zebra tokenizer",
            "undo me please", "an undone reply", "after the undo"]
        assert [m["active"] for m in msgs] == [True] * 4 + [False, False, True]
        assert store.get_session(fx.S1)["message_count"] == 5
        assert msgs[1]["tool_calls"][0]["function"]["name"] == "terminal"
        assert (msgs[1]["reasoning"], msgs[1]["token_count"], msgs[1]["finish_reason"]) == (
            "Let me run the tests", 42, "tool_calls")
        assert (msgs[2]["tool_name"], msgs[2]["tool_call_id"]) == ("terminal", "call_1")
        assert msgs[3]["display_metadata"] == {"reactions": {"user": "+1"}}
        assert [m["timestamp"] for m in msgs] == [fx.T0 + i for i in range(1, 8)]

        m2 = {m["id"]: m for m in store.get_messages(fx.S2)}
        image = m2[seq_of(store, fx.S2, rows["m5"])]["content"]
        assert isinstance(image, list) and image[1]["type"] == "image_url"
        assert m2[seq_of(store, fx.S2, rows["m6"])]["tool_calls"][0]["function"]["name"] == "web_search"
        assert m2[seq_of(store, fx.S2, rows["m7"])]["tool_calls"] is None
        assert m2[seq_of(store, fx.S2, rows["m8"])]["display_metadata"] == {"kind": "note"}
        assert m2[seq_of(store, fx.S2, rows["m9"])]["display_metadata"] is None
        assert m2[seq_of(store, fx.S2, rows["m18"])]["active"]  # compacted rows stay visible

        m3 = {m["id"]: m for m in store.get_messages(fx.S3)}
        assert len(m3) == 5
        for key in ("m10", "m11", "m12"):  # dropped times fall back to the event time
            stamp = m3[seq_of(store, fx.S3, rows[key])]["timestamp"]
            assert stamp is not None and stamp > fx.T0 + 100_000
        assert m3[seq_of(store, fx.S3, rows["m14"])]["content"] == [{"type": "text", "text": "double encoded parts"}]
        assert m3[seq_of(store, fx.S3, rows["m21"])]["token_count"] is None

        usage = store.get_usage(fx.S1)
        assert len(usage) == 1
        assert {k: usage[0][k] for k in ("model", "provider", "task", "input_tokens", "output_tokens",
                                         "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                                         "estimated_cost_usd", "actual_cost_usd")} == {
            "model": "claude-x", "provider": "anthropic", "task": "hermes-import", "input_tokens": 1000,
            "output_tokens": 500, "cache_read_tokens": 100, "cache_write_tokens": 50, "reasoning_tokens": 20,
            "estimated_cost_usd": 0.12, "actual_cost_usd": None}
        assert store.get_usage(fx.S3) == []

        assert hit_ids(store.search("zebra")) == {seq_of(store, fx.S1, rows["m4"])}
        assert seq_of(store, fx.S2, rows["m5"]) in hit_ids(store.search("giraffe"))
        assert hit_ids(store.search("milk")) == {seq_of(store, fx.S3, rows["m10"])}
        assert hit_ids(store.search("undone")) == set()  # rewound messages are not searched
        assert hit_ids(store.search("orphan")) == set()
        assert store.log.verify().ok
    assert fingerprint(path) == before  # bytes, mtime, and no file created beside it


def test_second_run_imports_nothing(home: Path, source: tuple[Path, dict[str, Any]]) -> None:
    path, _ = source
    with open_store(home) as store:
        first = import_hermes(store, path)
        head = store.log.head()
        again = import_hermes(store, path)
        assert (again.sessions, again.messages, again.usage, again.events) == (0, 0, 0, 0)
        assert again.already_present == first.events
        assert store.log.head() == head

        # A later copy of the same state.db with two more rows appends exactly those.
        later = path.parent / "later.db"
        shutil.copyfile(path, later)
        with sqlite3.connect(later) as conn:
            for text in ("one more thing", "and another"):
                conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', ?, ?)",
                             (fx.S1, text, fx.T0 + 8))
        conn.close()
        delta = import_hermes(store, later)
        assert (delta.sessions, delta.messages, delta.events) == (0, 2, 2)
        store.sync()
        assert [m["content"] for m in store.get_messages(fx.S1)][-2:] == ["one more thing", "and another"]

        # A row edited since the first import keeps its first version, with a warning.
        with sqlite3.connect(later) as conn:
            conn.execute("UPDATE messages SET content = 'rewritten' WHERE content = 'Fixed the zebra tokenizer'")
            row = conn.execute("SELECT id FROM messages WHERE content = 'rewritten'").fetchone()[0]
        conn.close()
        changed = import_hermes(store, later)
        assert changed.events == 0 and changed.skipped == 2 + 1
        assert has_warning(changed, f"session '{fx.S1}' message row {row}", "kept the stored version")
        store.sync()
        assert "Fixed the zebra tokenizer" in [m["content"] for m in store.get_messages(fx.S1)]


@pytest.mark.parametrize("read_model", READ_MODELS)
def test_legacy_schema(home: Path, tmp_path: Path, read_model: str) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "old.db"
    rows = fx.make_legacy(path)["rows"]
    before = fingerprint(path)
    with open_store(home, read_model) as store:
        report = import_hermes(store, path)
        assert (report.sessions, report.messages, report.usage, report.skipped) == (2, 3, 1, 2)
        assert has_warning(report, f"session 'old-1' message row {rows['b']}", "role None", "skipped")
        assert has_warning(report, f"session 'old-1' message row {rows['c']}", "tool_calls", "wrapped in a list")
        assert has_warning(report, "session 'old-2'", "parent 'gone'", "not in the source")
        assert has_warning(report, "session 'nobody'", f"rows {rows['e']}", "orphans")
        store.sync()
        old1, old2 = store.get_session("old-1"), store.get_session("old-2")
        assert (old1["title"], old1["model"], old1["end_reason"], old1["ended_at"]) == (
            "Legacy chat", "gpt-4", "unknown", fx.T0 + 60)
        assert (old1["input_tokens"], old1["output_tokens"]) == (10, 20)
        assert (old2["source"], old2["parent_session_id"], old2["end_reason"]) == (None, "gone", "user_exit")
        calls = store.get_messages("old-1")[1]["tool_calls"]
        assert calls[0]["function"]["name"] == "lookup"
        assert hit_ids(store.search("walrus")) == {seq_of(store, "old-1", rows["a"])}
        assert hit_ids(store.search("lookup")) == {seq_of(store, "old-1", rows["c"])}
        assert len(hit_ids(store.search("legacy"))) == 1
    assert fingerprint(path) == before


def test_closed_wal_database_gets_no_sidecars(home: Path, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "wal.db"
    fx.make_current(path, wal=True)
    before = fingerprint(path)
    assert before["listing"] == ["wal.db"]
    with open_store(home) as store:
        report = import_hermes(store, path)
        assert (report.sessions, report.messages) == (7, 20)
    assert fingerprint(path) == before


def test_live_wal_source_is_snapshotted(home: Path, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "live.db"
    fx.make_current(path, wal=True)
    main_before = fingerprint(path)["live.db"]
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        with writer:
            writer.execute("INSERT INTO sessions (id, source, started_at, title) VALUES ('wal-only', 'cli', ?, 'In the WAL')",
                           (fx.T0 + 500,))
            writer.execute("INSERT INTO messages (session_id, role, content, timestamp) "
                           "VALUES ('wal-only', 'user', 'written only to the wal', ?)", (fx.T0 + 501,))
        live = fingerprint(path)
        assert "live.db-wal" in live and live["live.db"] == main_before
        with open_store(home) as store:
            report = import_hermes(store, path)
            assert (report.sessions, report.messages) == (8, 21)
            store.sync()
            assert store.get_session("wal-only")["title"] == "In the WAL"
            assert [m["content"] for m in store.get_messages("wal-only")] == ["written only to the wal"]
        after = fingerprint(path)
        assert after["live.db"] == main_before and after["live.db-wal"] == live["live.db-wal"]
        assert writer.execute("SELECT count(*) FROM messages").fetchone()[0] == 23  # the writer is fine
    finally:
        writer.close()


def test_id_collision_and_taken_titles(home: Path, source: tuple[Path, dict[str, Any]]) -> None:
    path, facts = source
    with open_store(home) as store:
        store.create_session(fx.S1, title="Fix the parser", source="web")
        store.create_session("other", title="Groceries")
        report = import_hermes(store, path)
        moved = "h-" + __import__("hashlib").sha1(("hermes:" + fx.S1).encode()).hexdigest()[:20]
        assert has_warning(report, f"session '{fx.S1}'", "already has another session", moved)
        store.sync()
        mine = store.get_session(fx.S1)
        assert (mine["source"], mine["message_count"]) == ("web", 0)  # untouched
        imported = store.get_session(moved)
        assert imported["title"] == "Fix the parser #2" and imported["message_count"] == 5
        assert store.get_session(fx.S2)["parent_session_id"] == moved
        assert store.get_session(fx.S2)["title"] == "Fix the parser #3"
        assert {store.get_session(fx.S3)["title"], store.get_session(fx.S4)["title"]} == {"Groceries #2", "Groceries #3"}
        again = import_hermes(store, path)
        assert (again.events, again.already_present) == (0, report.events)


def test_bad_sources_append_nothing(home: Path, tmp_path: Path) -> None:
    with open_store(home) as store:
        with pytest.raises(ValidationError) as err:
            import_hermes(store, tmp_path / "missing.db")
        assert err.value.field == "source"
        assert not (tmp_path / "missing.db").exists()
        junk = tmp_path / "junk.db"
        junk.write_bytes(b"this is not a database at all" * 100)
        with pytest.raises(StorageError):
            import_hermes(store, junk)
        other = tmp_path / "other.db"
        sqlite3.connect(other).execute("CREATE TABLE notes (x)").connection.close()
        with pytest.raises(ValidationError):
            import_hermes(store, other)
        assert store.log.head()[0] == 0


def test_empty_state_db(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    conn = sqlite3.connect(path)
    conn.executescript(fx.CURRENT_SCHEMA)
    conn.close()
    seen: list[tuple[int, int]] = []
    with open_store(home) as store:
        report = import_hermes(store, path, progress=lambda d, t: seen.append((d, t)))
        assert report.to_dict() == {"sessions": 0, "messages": 0, "usage": 0, "skipped": 0, "warnings": [],
                                    "already_present": 0, "events": 0, "warning_count": 0}
        assert seen[-1] == (0, 0)


# ---------------------------------------------------------------------------------------
# Whatever the cells hold, the import finishes, reports consistently and is idempotent.

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_json_texts = st.sampled_from([
    '[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]', '{"a": 1}', '"[1]"',
    '"{\\"k\\": \\"v\\"}"', "[", "null", "[NaN]", "", "[[[[1]]]]", '{"a": {"b": []}}'])
_cell = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(), _text, st.binary(max_size=8),
                  _json_texts, st.sampled_from([fx.T0, 1e30, -1.0, "2025-01-01T00:00:00Z", "0", "1"]))
_ids = st.sampled_from(["s1", "s2", "s 3", "", "x" * 130, 7, None, "s1"])
_SESSION_CELLS = {
    "id": _ids, "source": _cell, "model": _cell, "model_config": _cell, "title": st.one_of(_cell, st.just("T")),
    "title_source": _cell, "started_at": _cell, "ended_at": _cell, "end_reason": _cell,
    "parent_session_id": _ids, "archived": _cell, "pinned": _cell, "hidden": _cell, "cwd": _cell,
    "user_id": _cell, "tool_names": _cell, "input_tokens": _cell, "estimated_cost_usd": _cell}
_MESSAGE_CELLS = {
    "session_id": _ids, "role": st.one_of(st.sampled_from(["user", "assistant", "tool", "User ", "bot"]), _cell),
    "content": _cell, "tool_calls": _cell, "tool_name": _cell, "timestamp": _cell, "token_count": _cell,
    "reasoning": _cell, "reasoning_details": _cell, "display_metadata": _cell, "active": _cell,
    "compacted": _cell, "finish_reason": _cell}


@settings(max_examples=int(os.environ.get("EVENTLOG_EXAMPLES", "100")) // 4 or 1, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sessions=st.lists(st.fixed_dictionaries(_SESSION_CELLS), max_size=5),
       messages=st.lists(st.fixed_dictionaries(_MESSAGE_CELLS), max_size=12))
def test_any_cells_never_abort(tmp_path_factory: pytest.TempPathFactory,
                               sessions: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    path = base / "fuzz.db"
    conn = sqlite3.connect(path)
    # No declared types: every cell keeps whatever type it was given.
    conn.execute(f"CREATE TABLE sessions (id PRIMARY KEY, {', '.join(k for k in _SESSION_CELLS if k != 'id')})")
    conn.execute(f"CREATE TABLE messages (id INTEGER PRIMARY KEY, {', '.join(_MESSAGE_CELLS)})")
    with conn:
        for row in sessions:
            try:
                conn.execute(f"INSERT INTO sessions ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                             tuple(row.values()))
            except sqlite3.IntegrityError:
                pass  # a repeated id
        for row in messages:
            conn.execute(f"INSERT INTO messages ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                         tuple(row.values()))
    conn.close()
    with SessionStore.open(base / "home", "fuzz", read_model="fold", durability="nosync") as store:
        report = import_hermes(store, path)
        assert report.warning_count == len(report.warnings)
        store.sync()
        imported = store.list_sessions(archived=None, hidden=None, limit=None)
        assert len(imported) == report.sessions
        total = sum(len(store.get_messages(s["id"], include_inactive=True)) for s in imported)
        assert total == report.messages
        again = import_hermes(store, path)
        assert again.events == 0 and again.already_present == report.events
        assert store.log.verify().ok



def test_oversized_values_are_cut_not_lost(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    conn = sqlite3.connect(path)
    conn.executescript(fx.CURRENT_SCHEMA)
    image = "data:image/png;base64," + "A" * (9 * 1024 * 1024)
    parts = [{"type": "text", "text": "look at this lighthouse"}, {"type": "image_url", "image_url": {"url": image}}]
    with conn:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('big', 'cli', ?)", (fx.T0,))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('big', 'user', ?, ?)",
                     ("y" * (9 * 1024 * 1024), fx.T0 + 1))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('big', 'user', ?, ?)",
                     (fx.SENTINEL + __import__("json").dumps(parts), fx.T0 + 2))
    conn.close()
    with open_store(home) as store:
        report = import_hermes(store, path)
        assert (report.messages, report.skipped) == (2, 0)
        assert has_warning(report, "session 'big' message row 1", "longer than 8 MiB; truncated")
        assert has_warning(report, "session 'big' message row 2", "inline data: payloads were replaced")
        store.sync()
        text, picture = (m["content"] for m in store.get_messages("big"))
        assert 8 * 1024 * 1024 - 100 < len(text) <= 8 * 1024 * 1024
        assert picture[0] == parts[0] and picture[1]["image_url"]["url"].startswith("data:image/png;base64,...")
        assert hit_ids(store.search("lighthouse"))

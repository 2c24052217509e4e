"""Migration from a Hermes Agent state.db (sqlite_export.hermes): lossless, once, read-only.

Lossless is checked by projecting the imported events with the Hermes adapter's fold and
comparing every Hermes table with the source, value and type; eventlog's own view of the
import is checked through SessionStore."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.adapters.hermes import schema
from eventlog.adapters.hermes.projection import apply_events
from eventlog.errors import StorageError, ValidationError
from eventlog.log.memory import MemoryLog
from eventlog.sessions.store import SessionStore
from sqlite_export.hermes import import_hermes, map_session_id

sys.path.insert(0, str(Path(__file__).parent))
import fixtures_hermes as fx  # noqa: E402

HERMES_TABLES = ("sessions", "messages", "session_model_usage", "state_meta", "gateway_routing")


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


def project(log: Any) -> sqlite3.Connection:
    """The Hermes projection of a log (the adapter's fold on a fresh Hermes-schema database)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("BEGIN")
    schema.create(conn)
    _, _, skipped = apply_events(conn, log.read())
    conn.execute("COMMIT")
    assert skipped == 0
    return conn


def rows(conn: sqlite3.Connection, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    order = "rowid" if table != "session_model_usage" else "session_id, model, task"
    return [tuple((type(v).__name__, v) for v in r)
            for r in conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}")]


def assert_lossless(source: Path, log: Any, orphans: set[Any] = frozenset()) -> None:  # type: ignore[assignment]
    """Every column the source and Hermes' schema share, in every Hermes table, row for row."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    out = project(log)
    try:
        for table in HERMES_TABLES:
            have = [r[1] for r in src.execute(f'PRAGMA table_info("{table}")')]
            if not have:
                continue
            known = {r[1] for r in out.execute(f'PRAGMA table_info("{table}")')}
            columns = [c for c in have if c in known]
            if table == "sessions":
                columns = ["rowid", *columns]
            expected = rows(src, table, columns)
            if table == "messages" and orphans:
                expected = [r for r in expected if r[columns.index("session_id")][1] not in orphans]
            assert rows(out, table, columns) == expected, table
    finally:
        src.close()
        out.close()


def v22(path: Path) -> sqlite3.Connection:
    """A database with Hermes' own v22 schema (no eventlog bookkeeping)."""
    conn = sqlite3.connect(path)
    schema.create(conn)
    conn.execute("DROP TABLE eventlog_projection")
    conn.execute("PRAGMA application_id = 0")
    return conn


@pytest.fixture
def hermes_db(tmp_path: Path) -> Path:
    """A v22 state.db holding what the old importer lost: system prompts, per-model/route/task
    usage rows with their API call counts, gateway state."""
    d = tmp_path / "hermes"
    d.mkdir()
    path = d / "state.db"
    conn = v22(path)
    with conn:
        conn.execute("INSERT INTO sessions (id, source, model, system_prompt, started_at, title, input_tokens,"
                     " api_call_count, billing_provider) VALUES ('s1', 'cli', 'gpt', 'You are Hermes.', ?, 'Plan',"
                     " 900, 3, 'openai')", (fx.T0,))
        conn.execute("INSERT INTO sessions (id, source, started_at, parent_session_id, ended_at, end_reason, archived)"
                     " VALUES ('s2', 'telegram', ?, 's1', ?, 'compression', 1)", (fx.T0 + 5, fx.T0 + 9))
        for task, model, calls, tokens in (("", "gpt", 2, 600), ("", "gpt-mini", 1, 300), ("title_generation", "small", 4, 40)):
            conn.execute("INSERT INTO session_model_usage (session_id, model, billing_provider, task, api_call_count,"
                         " input_tokens, estimated_cost_usd, first_seen, last_seen) VALUES ('s1', ?, 'openai', ?, ?, ?,"
                         " 0.5, ?, ?)", (model, task, calls, tokens, fx.T0, fx.T0 + 1))
        calls_json = json.dumps([fx.call("terminal", {"cmd": "ls"})])
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp, tool_calls) VALUES"
                     " ('s1', 'assistant', 'running ls', ?, ?)", (fx.T0 + 1, calls_json))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp, active) VALUES"
                     " ('s1', 'user', 'take it back', ?, 0)", (fx.T0 + 2,))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s2', 'user', ?, ?)",
                     (fx.SENTINEL + json.dumps([{"type": "text", "text": "a picture"}]), fx.T0 + 6))
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('last_auto_prune', '1')")
        conn.execute("INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) VALUES ('', 'k', '{}', 1.5)")
    conn.close()
    return path


def test_nothing_hermes_keeps_is_lost(hermes_db: Path) -> None:
    before = fingerprint(hermes_db)
    log = MemoryLog()
    report = import_hermes(log, hermes_db)
    assert (report.sessions, report.messages, report.usage) == (2, 3, 3)
    assert_lossless(hermes_db, log)
    assert fingerprint(hermes_db) == before  # never written, no file created beside it
    out = project(log)
    assert out.execute("SELECT system_prompt FROM sessions WHERE id = 's1'").fetchone()[0] == "You are Hermes."
    usage = out.execute("SELECT model, task, api_call_count, input_tokens FROM session_model_usage"
                        " ORDER BY model").fetchall()
    assert usage == [("gpt", "", 2, 600), ("gpt-mini", "", 1, 300), ("small", "title_generation", 4, 40)]
    assert out.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()[0] == 3


@pytest.mark.parametrize("read_model", ["fold", "projection"])
def test_eventlogs_own_view_of_the_import(home: Path, hermes_db: Path, read_model: str) -> None:
    with SessionStore.open(home, "imported", read_model=read_model, durability="nosync") as store:
        import_hermes(store, hermes_db)
        store.sync()
        s1, s2 = store.get_session("s1"), store.get_session("s2")
        assert (s1["source"], s1["model"], s1["title"], s1["started_at"]) == ("cli", "gpt", "Plan", fx.T0)
        assert (s2["parent_session_id"], s2["end_reason"], s2["ended_at"]) == ("s1", "compression", fx.T0 + 9)
        msgs = store.get_messages("s1", include_inactive=True)
        assert msgs[0]["tool_calls"][0]["function"]["name"] == "terminal"
        assert store.get_messages("s2")[0]["content"] == [{"type": "text", "text": "a picture"}]
        by_task = {(u["model"], u["task"]): u["input_tokens"] for u in store.get_usage("s1")}
        assert by_task == {("gpt", ""): 600, ("gpt-mini", ""): 300, ("small", "title_generation"): 40}
        assert store.search("running")


def test_import_once_then_only_what_is_new(home: Path, hermes_db: Path) -> None:
    with SessionStore.open(home, "imported", read_model="fold", durability="nosync") as store:
        first = import_hermes(store, hermes_db)
        head = store.log.head()
        again = import_hermes(store, hermes_db)
        assert (again.events, again.already_present, again.changed) == (0, first.events, 0)
        assert store.log.head() == head

        later = hermes_db.parent / "later.db"
        shutil.copyfile(hermes_db, later)
        with sqlite3.connect(later) as conn:
            conn.execute("UPDATE sessions SET title = 'Plan, renamed' WHERE id = 's1'")
            conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s1', 'user', 'new', ?)",
                         (fx.T0 + 3,))
            conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s3', 'cli', ?)", (fx.T0 + 20,))
            conn.execute("UPDATE messages SET content = 'rewritten' WHERE content = 'running ls'")
        conn.close()
        delta = import_hermes(store, later)
        # The new session and message, and the rename; the edited message keeps its first import.
        assert (delta.sessions, delta.messages) == (1, 1)
        assert delta.changed >= 1 and any("changed since it was first imported" in w for w in delta.warnings)
        store.sync()
        assert store.get_session("s1")["title"] == "Plan, renamed"
        assert store.get_session("s3") is not None
        assert [m["content"] for m in store.get_messages("s1", include_inactive=True)][0] == "running ls"
        out = project(store.log)
        assert out.execute("SELECT title FROM sessions WHERE id = 's1'").fetchone()[0] == "Plan, renamed"


def test_fixture_schema_with_damaged_rows(tmp_path: Path) -> None:
    """A Hermes-like database of another layout (extra columns, TEXT timestamps, 1e30, broken
    JSON, an id eventlog cannot use as a stream id, an orphan message): every shared column kept
    exactly, the orphan left out with a warning, eventlog's fold unharmed."""
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "state.db"
    facts = fx.make_current(path)
    before = fingerprint(path)
    log = MemoryLog()
    report = import_hermes(log, path)
    assert report.sessions == facts["sessions"]
    assert report.messages == facts["messages_ok"] + facts["bad_roles"]  # a 'robot' role is still a row
    assert any("ghost-session" in w and "orphans" in w for w in report.warnings)
    # What Hermes itself holds once it restored its unique title index: the newest keeps a title.
    repaired = tmp_path / "repaired.db"
    shutil.copyfile(path, repaired)
    with sqlite3.connect(repaired) as conn:
        conn.execute("UPDATE sessions AS o SET title = NULL WHERE title IS NOT NULL AND EXISTS"
                     " (SELECT 1 FROM sessions n WHERE n.title = o.title AND n.rowid > o.rowid)")
    conn.close()
    assert any(f"'{fx.S3}': title 'Groceries'" in w for w in report.warnings)
    assert_lossless(repaired, log, orphans={"ghost-session"})
    assert fingerprint(path) == before
    odd = [e for e in log.read() if e["type"] == "session.created" and e["data"].get("sid") == fx.S5]
    assert odd and odd[0]["session"] == map_session_id(fx.S5)
    from eventlog.sessions.fold import Fold

    fold = Fold()
    for env in log.read():
        fold.apply(env)
    assert fold.get_session(fx.S1)["title"] == "Fix the parser"
    assert fold.get_session(map_session_id(fx.S5))["title"] == "Odd one"
    # display_metadata, a column of this layout that Hermes 0.19 lacks: an object is carried
    # (issue 5), a broken one dropped with its warning (it was dropped whole, even when valid).
    shown = {m["content"]: m["display_metadata"] for m in fold.get_messages(fx.S1) + fold.get_messages(fx.S2)
             if isinstance(m["content"], str)}
    assert shown["Fixed the zebra tokenizer"] == {"reactions": {"user": "+1"}}
    assert shown["meta twice"] is None and shown["meta invalid"] is None
    again = import_hermes(log, path)  # and a second run finds nothing changed
    assert (again.events, again.changed) == (0, 0), again.warnings
    # A profile imported by a release that did not carry it: its next import reports no change.
    older = MemoryLog()
    older.append([{k: v for k, v in e.items() if k in ("id", "type", "session", "v")}
                  | {"data": {k: v for k, v in e["data"].items() if k != "display_metadata"}}
                  for e in log.read()])
    again = import_hermes(older, path)
    assert (again.events, again.changed) == (0, 0), again.warnings


def test_legacy_schema(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "old.db"
    fx.make_legacy(path)
    log = MemoryLog()
    report = import_hermes(log, path)
    assert (report.sessions, report.messages) == (2, 4)
    assert any("'nobody'" in w for w in report.warnings)
    # An old database has fewer columns: the shared ones are kept exactly; a parent that is not in
    # the source is dropped (Hermes' foreign key refuses it).
    out = project(log)
    assert out.execute("SELECT title, model, ended_at FROM sessions WHERE id = 'old-1'").fetchone() == (
        "Legacy chat", "gpt-4", fx.T0 + 60)
    assert out.execute("SELECT parent_session_id FROM sessions WHERE id = 'old-2'").fetchone() == (None,)
    assert out.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'walrus'").fetchone()[0] == 1


def test_a_legacy_database_without_active_shows_every_message(tmp_path: Path) -> None:
    """A database from before Hermes' ``active`` column, imported where Hermes is not installed
    (so its migration, which adds the column as 1, does not run): every message was taken for
    one Hermes no longer shows and hidden with ``messages.rewound`` (`eventlog sessions list`:
    0 msgs; rewinds=2). Hermes shows them all; so does the import now, with no rewind."""
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "old.db"
    fx.make_legacy(path)
    home = tmp_path / "home"
    with SessionStore.open(home, "p", follower=False) as store:
        report = import_hermes(store, path)  # no upgrade: Hermes is not installed here
        assert (report.messages, report.rewinds) == (4, 0)
        counts = {s["id"]: s["message_count"] for s in store.list_sessions()}
        assert counts == {map_session_id("old-1"): 3, map_session_id("old-2"): 1}
        assert [m["content"] for m in store.get_messages(map_session_id("old-1"))] == [
            "an ancient walrus question", "who said this", "an ancient answer"]
        assert [r["snippet"] for r in store.search("walrus")["results"]] == ["an ancient «walrus» question"]


def test_live_wal_source_is_snapshotted(tmp_path: Path) -> None:
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
        live = fingerprint(path)
        log = MemoryLog()
        report = import_hermes(log, path)
        assert report.sessions == 8
        after = fingerprint(path)
        assert after["live.db"] == main_before and after["live.db-wal"] == live["live.db-wal"]
        assert project(log).execute("SELECT title FROM sessions WHERE id = 'wal-only'").fetchone() == ("In the WAL",)
    finally:
        writer.close()


def test_closed_wal_database_gets_no_sidecars(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "wal.db"
    fx.make_current(path, wal=True)
    before = fingerprint(path)
    assert before["listing"] == ["wal.db"]
    assert import_hermes(MemoryLog(), path).sessions == 7
    assert fingerprint(path) == before


def test_bad_sources_append_nothing(tmp_path: Path) -> None:
    log = MemoryLog()
    with pytest.raises(ValidationError) as err:
        import_hermes(log, tmp_path / "missing.db")
    assert err.value.field == "source"
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StorageError):
        import_hermes(log, junk)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE notes (x)").connection.close()
    with pytest.raises(ValidationError):
        import_hermes(log, other)
    assert log.head()[0] == 0


def test_an_empty_state_db_reports_zero(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    v22(path).close()
    seen: list[tuple[int, int]] = []
    report = import_hermes(MemoryLog(), path, progress=lambda d, t: seen.append((d, t)))
    assert (report.sessions, report.messages, report.usage, report.skipped) == (0, 0, 0, 0)
    assert seen[-1] == (0, 0)


def test_content_larger_than_an_event_is_cut_not_lost(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    conn = v22(path)
    with conn:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('big', 'cli', ?)", (fx.T0,))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('big', 'user', ?, ?)",
                     ("y" * (17 * 1024 * 1024), fx.T0 + 1))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('big', 'user', 'small', ?)",
                     (fx.T0 + 2,))
    conn.close()
    log = MemoryLog()
    report = import_hermes(log, path)
    assert report.messages == 2 and any("its first 8,388,608 bytes were kept" in w for w in report.warnings)
    texts = [r[0] for r in project(log).execute("SELECT content FROM messages ORDER BY id")]
    assert len(texts[0]) == 8 * 1024 * 1024 and texts[1] == "small"


# ---- whatever the cells hold, the import finishes, keeps them exactly and is idempotent ----------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_cell = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), _text,
                  st.binary(max_size=8), st.sampled_from([fx.T0, 1e30, -1.0, "2025-01-01T00:00:00Z", "[1]", "{"]))
_ids = st.sampled_from(["s1", "s2", "s 3", "x" * 130, "s1"])
_SESSION = {"id": _ids, "source": _cell, "model": _cell, "model_config": _cell, "title": _cell, "started_at": _cell,
            "ended_at": _cell, "end_reason": _cell, "archived": _cell, "input_tokens": _cell, "system_prompt": _cell}
_MESSAGE = {"session_id": _ids, "role": _cell, "content": _cell, "tool_calls": _cell, "timestamp": _cell,
            "token_count": _cell, "active": _cell}


@settings(max_examples=int(os.environ.get("EVENTLOG_EXAMPLES", "100")) // 4 or 1, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sessions=st.lists(st.fixed_dictionaries(_SESSION), max_size=5),
       messages=st.lists(st.fixed_dictionaries(_MESSAGE), max_size=10))
def test_any_cells_are_kept_exactly(tmp_path_factory: pytest.TempPathFactory, sessions: list[dict[str, Any]],
                                    messages: list[dict[str, Any]]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    conn = sqlite3.connect(path)
    # No declared types: every cell keeps whatever type it was given.
    conn.execute(f"CREATE TABLE sessions (id PRIMARY KEY, {', '.join(k for k in _SESSION if k != 'id')})")
    conn.execute(f"CREATE TABLE messages (id INTEGER PRIMARY KEY, {', '.join(_MESSAGE)})")
    with conn:
        for row in sessions:
            conn.execute(f"INSERT OR IGNORE INTO sessions ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                         tuple(row.values()))
        for row in messages:
            conn.execute(f"INSERT INTO messages ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                         tuple(row.values()))
    conn.close()
    log = MemoryLog()
    report = import_hermes(log, path)
    assert report.warning_count == len(report.warnings)
    known = {s["id"] for s in sessions}
    src = sqlite3.connect(path)
    n_sessions = src.execute("SELECT count(*) FROM sessions").fetchone()[0]
    n_messages = src.execute(f"SELECT count(*) FROM messages WHERE session_id IN ({','.join('?' * len(known))})",
                             tuple(known)).fetchone()[0] if known else 0
    src.close()
    assert (report.sessions, report.messages) == (n_sessions, n_messages)
    again = import_hermes(log, path)
    assert again.events == 0 and again.already_present == report.events
    assert log.verify().ok


def test_catalogue_versions_are_in_step() -> None:
    from eventlog.sessions.events import CURRENT_VERSIONS
    from sqlite_export.hermes import CURRENT_VERSIONS as USED

    for kind in ("session.created", "message.appended", "session.titled", "session.ended", "session.archived",
                 "session.unarchived", "session.reopened", "session.meta_updated", "usage.recorded"):
        assert USED.get(kind, 1) == CURRENT_VERSIONS[kind], kind

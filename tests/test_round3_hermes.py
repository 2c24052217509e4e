"""Third-round outside audit of the Hermes facade (helper-62): the gateway routing index and the
Telegram topic methods on read_only handles.

The tests without a marker run in the default suite against the facade alone, with what Hermes'
``hermes_state.SessionDB`` (hermes-agent 0.19.0) does written out; the ``hermes`` tests drive the
real class beside the facade (``python3 run compat``).
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eventlog.adapters.hermes import SessionDB
from eventlog.adapters.hermes.projection import Layout

try:
    import hermes_state
except ImportError:  # pragma: no cover - the marker keeps the differential test out of such environments
    hermes_state = None


def rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table`` with its rowid, typed, in rowid order."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [tuple((type(v).__name__, v) for v in r)
                for r in conn.execute(f"SELECT rowid, * FROM {table} ORDER BY rowid")]
    finally:
        conn.close()


def logged(path: Path) -> list[dict[str, Any]]:
    """The log's envelopes, read in a fresh process (one LMDB environment per process)."""
    code = ("import sys, json; from eventlog.log.lmdb import EventLog\n"
            "log = EventLog.open(sys.argv[1]); print(json.dumps(list(log.read()))); log.close()")
    out = subprocess.run([sys.executable, "-c", code, str(Layout(path).log_dir)], capture_output=True, text=True,
                         check=True).stdout
    return list(json.loads(out))


def gateway_entry(i: int, turns: int = 0) -> str:
    """A routing entry the size of the JSON Hermes' gateway stores for a Telegram DM (~0.9 KB)."""
    return json.dumps({
        "session_key": f"agent:main:telegram:dm:{100000 + i}", "session_id": f"20260101_120000_{i:08x}",
        "created_at": "2026-01-01T12:00:00.000000", "updated_at": "2026-01-01T12:00:00.000000",
        "origin": {"platform": "telegram", "chat_id": str(100000 + i), "chat_name": f"Chat {i}", "chat_type": "dm",
                   "user_id": str(900000 + i), "user_name": f"user{i}", "thread_id": None, "chat_topic": None},
        "display_name": f"user{i}", "platform": "telegram", "chat_type": "dm", "input_tokens": 1000 + turns,
        "output_tokens": 200 + turns, "cache_read_tokens": 0, "cache_write_tokens": 0, "total_tokens": 1200 + turns,
        "estimated_cost_usd": 0.0123, "cost_status": "estimated", "last_prompt_tokens": 900, "was_auto_reset": False,
        "auto_reset_reason": None, "reset_had_activity": False, "is_fresh_reset": False, "expiry_finalized": False,
        "suspended": False, "resume_pending": False, "resume_reason": None, "last_resume_marked_at": None,
        "model_override": None, "padding": "x" * 200,
    })


def gateway_index(n: int, turned: int = -1) -> dict[str, str]:
    return {f"agent:main:telegram:dm:{100000 + i}": gateway_entry(i, 1 if i == turned else 0) for i in range(n)}


def test_a_gateway_turn_logs_what_changed_in_the_routing_index_not_the_whole_index(tmp_path: Path) -> None:
    """Hermes' gateway rewrites its whole routing index (``replace_gateway_routing_entries``)
    after every interaction. Each call appended the whole index to the log: with 1,000 chats,
    ~1 MB of events (~120 KB on disk, compressed) per message handled, for good. A turn that
    changed one entry now logs that entry and the index's keys; the rows are still the ones
    Hermes' delete-and-insert leaves (rows inserted again in the caller's order, every row
    stamped with the time of the call), live, rebuilt and reopened."""
    path = tmp_path / "state.db"
    db = SessionDB(path)
    db.replace_gateway_routing_entries({"other": "{}"}, scope="/elsewhere")
    db.replace_gateway_routing_entries(gateway_index(1000))
    db.replace_gateway_routing_entries(gateway_index(1000, turned=7))
    live = rows(path, "gateway_routing")
    assert db.load_gateway_routing_entries() == gateway_index(1000, turned=7)
    db.close()

    last = logged(path)[-1]
    assert last["type"] == "hermes.routing_restated"
    size = len(json.dumps(last["data"]))
    whole = len(json.dumps(gateway_index(1000)))
    assert size < whole // 10, f"one changed entry logged {size} bytes (the whole index is {whole})"

    # rowid 1 is the other scope's; this scope's rows were deleted and inserted again, in order
    assert [(r[0][1], r[2][1]) for r in live] == list(enumerate(["other"] + list(gateway_index(1000)), 1))
    stamps = {r[4][1] for r in live[1:]}
    assert len(stamps) == 1 and stamps != {live[0][4][1]}

    db = SessionDB(path)
    assert rows(Path(db.db_path).resolve(), "gateway_routing") == live
    assert db._engine is not None
    db._engine.rebuild()
    assert rows(Path(db.db_path).resolve(), "gateway_routing") == live
    assert db.load_gateway_routing_entries() == gateway_index(1000, turned=7)
    db.close()


def test_a_routing_index_larger_than_one_event_is_stored(tmp_path: Path) -> None:
    """A gateway with ~20,000 chats: its index (~19 MB encoded) did not fit in one event, so
    every ``replace_gateway_routing_entries`` raised EventTooLargeError (Hermes stores it; its
    gateway logs a warning and keeps a stale index in state.db for its next start). The changed
    entries now go in as many events as they need, in the same write."""
    path = tmp_path / "state.db"
    db = SessionDB(path)
    big = gateway_index(20000)
    assert len(json.dumps(big)) > 17 * 1024 * 1024
    db.replace_gateway_routing_entries(big)
    db.replace_gateway_routing_entries(gateway_index(20000, turned=3))
    assert db.load_gateway_routing_entries() == gateway_index(20000, turned=3)
    live = rows(path, "gateway_routing")
    assert db._engine is not None
    db._engine.rebuild()
    assert rows(Path(db.db_path).resolve(), "gateway_routing") == live
    db.close()


def test_a_routing_index_logged_whole_by_an_earlier_release_still_replays(tmp_path: Path) -> None:
    """Logs written before the restatement hold ``hermes.routing_replaced`` with the whole index:
    a rebuild gives back that index, and a restatement after it keeps the entries it left alone."""
    path = tmp_path / "state.db"
    db = SessionDB(path)
    assert db._engine is not None
    whole = {"scope": "", "entries": [["a", "1"], ["b", "2"], ["c", "3"]], "updated_at": 1.5}
    db._write(lambda tx: tx.emit("hermes.routing_replaced", None, whole))  # as earlier releases wrote it
    db.replace_gateway_routing_entries({"a": "1", "b": "20", "c": "3"})
    db._engine.rebuild()
    assert db.load_gateway_routing_entries() == {"a": "1", "b": "20", "c": "3"}
    db.close()
    assert [e["type"] for e in logged(path)][-2:] == ["hermes.routing_replaced", "hermes.routing_restated"]


def test_a_program_that_predates_the_restatement_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    """A restatement is a type of its own, so a program that predates it (a gateway not restarted
    yet after an update, rebuilding its projection) ignores it as a newer program's event: its
    index stays as it was before the restatement. Carried as a field of ``routing_replaced``,
    that program took the changed entries for the whole index and dropped every other row."""
    from eventlog.adapters.hermes import apply as rules

    path = tmp_path / "state.db"
    db = SessionDB(path)
    assert db._engine is not None
    before = {"scope": "", "entries": [[k, v] for k, v in gateway_index(30).items()], "updated_at": 1.5}
    db._write(lambda tx: tx.emit("hermes.routing_replaced", None, before))  # written by the earlier release
    db.replace_gateway_routing_entries(gateway_index(30, turned=4))  # this release: one entry changed
    new = {t: rules._HANDLERS.pop(t) for t in ("hermes.routing_restated", "hermes.routing_upserted")}
    try:
        db._engine.rebuild()  # replayed by rules without the new types
        assert db.load_gateway_routing_entries() == gateway_index(30)
    finally:
        rules._HANDLERS.update(new)
    db._engine.rebuild()
    assert db.load_gateway_routing_entries() == gateway_index(30, turned=4)
    db.close()


def test_routing_values_hermes_binds_as_they_are_keep_their_types(tmp_path: Path) -> None:
    """Only the entries that differ from the stored row (type and value) are left out of the
    log's event; a value SQLite converts on the way in (an int key, bytes) is always carried."""
    path = tmp_path / "state.db"
    db = SessionDB(path)
    db.replace_gateway_routing_entries({"a": "1", 5: b"\x00raw", "c": "3"})
    db.replace_gateway_routing_entries({"a": "1", 5: b"\x00raw", "c": "4", "d": 7})
    live = rows(path, "gateway_routing")
    assert [(r[2], r[3]) for r in live] == [(("str", "a"), ("str", "1")), (("str", "5"), ("bytes", b"\x00raw")),
                                            (("str", "c"), ("str", "4")), (("str", "d"), ("str", "7"))]
    assert db._engine is not None
    db._engine.rebuild()
    assert rows(Path(db.db_path).resolve(), "gateway_routing") == live
    with pytest.raises(sqlite3.IntegrityError):  # 5 and "5" are one key in SQLite, as in Hermes
        db.replace_gateway_routing_entries({5: "x", "5": "y"})
    assert rows(Path(db.db_path).resolve(), "gateway_routing") == live
    db.close()


def test_topic_cleanups_on_a_read_only_handle_are_silent_no_ops_as_in_hermes(tmp_path: Path) -> None:
    """Hermes' ``disable_telegram_topic_mode`` and ``delete_telegram_topic_binding`` take any
    OperationalError of their statements for 'the tables are not there yet' (a cleanup path that
    never raises): on a read_only handle they answer None and 0 and change nothing. The facade
    raised OperationalError there. ``apply_telegram_topic_migration`` always writes (its script
    and the state_meta row), so on a read_only handle it raises, where the facade returned once
    the tables existed."""
    path = tmp_path / "state.db"
    db = SessionDB(path)
    db.create_session("s1", "telegram")
    db.enable_telegram_topic_mode(chat_id="c", user_id="u")
    db.bind_telegram_topic(chat_id="c", thread_id="t", user_id="u", session_key="k", session_id="s1")
    ro = SessionDB(path, read_only=True)
    try:
        assert ro.delete_telegram_topic_binding(chat_id="c", thread_id="t") == 0
        assert ro.disable_telegram_topic_mode(chat_id="c") is None
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro.apply_telegram_topic_migration()
        assert ro.get_telegram_topic_binding(chat_id="c", thread_id="t") is not None
        assert ro.is_telegram_topic_mode_enabled(chat_id="c", user_id="u") is True
    finally:
        ro.close()
    assert db.delete_telegram_topic_binding(chat_id="c", thread_id="t") == 1
    db.close()


@pytest.mark.hermes
def test_routing_and_read_only_topics_match_the_real_sessiondb(tmp_path: Path) -> None:
    """The same calls through Hermes' own class and the facade: same answers, same rows."""
    assert hermes_state is not None
    Real = getattr(hermes_state, "HermesSessionDB", hermes_state.SessionDB)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("replace_gateway_routing_entries", {"entries": {"o": "{}"}, "scope": "/x"}),
        ("replace_gateway_routing_entries", {"entries": gateway_index(50)}),
        ("replace_gateway_routing_entries", {"entries": gateway_index(50, turned=3)}),
        ("replace_gateway_routing_entries", {"entries": dict(list(gateway_index(50).items())[::-1])}),
        ("save_gateway_routing_entry", {"session_key": "new", "entry_json": "{}"}),
        ("replace_gateway_routing_entries", {"entries": {"a": "1", 5: b"\x00", "c": 2.5}}),
        ("replace_gateway_routing_entries", {"entries": {"a": "1", 5: b"\x00", "c": 2.5, "": "x", "e": ""}}),
        ("replace_gateway_routing_entries", {"entries": {5: "x", "5": "y"}}),
        ("replace_gateway_routing_entries", {"entries": {"a": float("nan")}}),
        ("replace_gateway_routing_entries", {"entries": {}}),
        ("create_session", {"session_id": "s1", "source": "telegram"}),
        ("enable_telegram_topic_mode", {"chat_id": "c", "user_id": "u"}),
        ("bind_telegram_topic", {"chat_id": "c", "thread_id": "t", "user_id": "u", "session_key": "k",
                                 "session_id": "s1"}),
    ]
    read_only_calls: list[tuple[str, dict[str, Any]]] = [
        ("delete_telegram_topic_binding", {"chat_id": "c", "thread_id": "t"}),
        ("delete_telegram_topic_binding", {"chat_id": "c", "thread_id": "nope"}),
        ("disable_telegram_topic_mode", {"chat_id": "c"}),
        ("apply_telegram_topic_migration", {}),
        ("replace_gateway_routing_entries", {"entries": {}}),
    ]

    def outcome(db: Any, name: str, kw: dict[str, Any]) -> Any:
        try:
            return ("ok", getattr(db, name)(**kw))
        except Exception as e:
            return ("raised", type(e).__name__)

    def table(path: Path) -> list[tuple[Any, ...]]:
        return [r[:4] + r[5:] for r in rows(path, "gateway_routing")]  # updated_at: each its own clock

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    real, ours = Real(tmp_path / "a" / "state.db"), SessionDB(tmp_path / "b" / "state.db")
    try:
        for name, kw in calls:
            assert outcome(ours, name, kw) == outcome(real, name, kw), name
            assert table(Path(ours.db_path).resolve()) == table(tmp_path / "a" / "state.db"), name
        real_ro = Real(tmp_path / "a" / "state.db", read_only=True)
        ours_ro = SessionDB(tmp_path / "b" / "state.db", read_only=True)
        try:
            for name, kw in read_only_calls:
                assert outcome(ours_ro, name, kw) == outcome(real_ro, name, kw), name
        finally:
            real_ro.close()
            ours_ro.close()
        assert ours._engine is not None
        ours._engine.rebuild()
        assert table(Path(ours.db_path).resolve()) == table(tmp_path / "a" / "state.db")
    finally:
        real.close()
        ours.close()

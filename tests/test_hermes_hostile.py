"""The Hermes facade under hostile arguments: each case was found by driving every public
method of Hermes' ``hermes_state.SessionDB`` (0.19.0) and eventlog's side by side with odd
values (NaN, None for a string, lists, lone surrogates, huge ints) and comparing the exception
type, the result and every row afterwards. The unmarked tests check the facade alone against
what Hermes was seen to do; the ``hermes`` ones compare with the real class."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from eventlog.adapters.hermes import SessionDB

TABLES = ("sessions", "messages", "session_model_usage", "state_meta", "compression_locks")


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: [tuple((type(v).__name__, v) for v in r)
                    for r in conn.execute(f"SELECT rowid, * FROM {t} ORDER BY rowid")] for t in TABLES}
    finally:
        conn.close()


def head(db: SessionDB) -> int:
    assert db._engine is not None
    return int(db._engine.log.head()[0])


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "hermes" / "state.db"


@pytest.mark.parametrize("source", [None, float("nan")])
def test_recreating_a_session_with_a_null_source_fails_like_hermes(path: Path, source: Any) -> None:
    """Hermes' insert-or-enrich binds ``source`` into ``sessions.source NOT NULL``; SQLite checks
    that constraint before the upsert's ON CONFLICT, so a None (or NaN, bound as NULL) source
    fails with IntegrityError also when the session exists. The facade used to return the id."""
    db = SessionDB(path)
    db.create_session("s1", "cli", model="gpt")
    before, rows = head(db), dump(path)
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL constraint failed: sessions.source"):
        db.create_session("s1", source, model="other")
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL constraint failed: sessions.source"):
        db.ensure_session("s1", source)
    assert head(db) == before and dump(path) == rows
    assert db.get_session("s1")["source"] == "cli"
    db.close()


def test_read_only_writes_that_break_a_constraint_fail_as_read_only_writes(path: Path) -> None:
    """Hermes' read-only connection refuses a write statement before SQLite checks any
    constraint, so such a call fails with OperationalError ('attempt to write a readonly
    database') whatever it carries; the facade raised the IntegrityError the write would meet
    (a new session without a source)."""
    db = SessionDB(path)
    db.create_session("s1", "cli")
    db.close()
    ro = SessionDB(path, read_only=True)
    try:
        for call in (lambda: ro.create_session("new", None), lambda: ro.ensure_session("s1", None)):  # type: ignore[arg-type]
            with pytest.raises(sqlite3.OperationalError, match="attempt to write a readonly database"):
                call()
        # What Hermes raises before it binds or steps still comes first.
        with pytest.raises(sqlite3.ProgrammingError):
            ro.create_session("new", ["not", "bindable"])  # type: ignore[arg-type]
    finally:
        ro.close()


def test_a_bind_with_an_unstorable_value_still_creates_the_topic_tables(path: Path) -> None:
    """Hermes' ``bind_telegram_topic`` runs the topic migration (its own committed write: the
    tables and their ``state_meta`` row) before it binds anything, so a managed_mode SQLite
    cannot bind fails the bind but leaves the tables. The facade checked the value first and
    created nothing: its rows and ``get_meta`` differed from Hermes' afterwards."""
    db = SessionDB(path)
    db.create_session("s1", "cli")
    with pytest.raises(OverflowError):
        db.bind_telegram_topic(chat_id="c", thread_id="t", user_id="u", session_key="k", session_id="s1",
                               managed_mode=2**63)  # type: ignore[arg-type]
    assert db.get_meta("telegram_dm_topic_schema_version") == "2"
    assert db.list_telegram_topic_bindings_for_chat(chat_id="c") == []
    assert db._engine is not None
    db._engine.rebuild()
    assert db.get_meta("telegram_dm_topic_schema_version") == "2"
    db.close()


def test_compression_lock_and_cooldown_values_sqlite_refuses_fail_softly_like_hermes(path: Path) -> None:
    """Hermes runs these calls' statements inside ``try: ... except sqlite3.Error`` (log a
    warning, answer False/None), so a holder or cooldown value sqlite3 cannot bind (a list, a
    dict: ProgrammingError) is logged and answered, not raised. The facade converted the values
    before its own guard and raised ProgrammingError. What is not an sqlite3.Error (an int over
    64 bits: OverflowError) is still raised, as Hermes raises it."""
    db = SessionDB(path)
    db.create_session("s1", "cli")
    before, rows = head(db), dump(path)
    assert db.try_acquire_compression_lock("s1", ["holder"]) is False  # type: ignore[arg-type]
    assert db.refresh_compression_lock("s1", {"holder": 1}) is False  # type: ignore[arg-type]
    assert db.record_compression_failure_cooldown("s1", [1.0]) is None  # type: ignore[arg-type]
    assert db.record_compression_failure_cooldown("s1", 1.0, error={"e": 1}) is None  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        db.try_acquire_compression_lock("s1", 2**63)  # type: ignore[arg-type]
    assert head(db) == before and dump(path) == rows
    assert db.get_compression_lock_holder("s1") is None and db.get_compression_failure_cooldown("s1") is None
    db.close()
    # On a read_only handle Hermes' first statement (a DELETE of an expired lock, which binds
    # only the id and the time) is refused before the holder is bound: False, whatever it is.
    ro = SessionDB(path, read_only=True)
    try:
        assert ro.try_acquire_compression_lock("s1", 2**63) is False  # type: ignore[arg-type]
        assert ro.try_acquire_compression_lock("s1", "h") is False
        with pytest.raises(OverflowError):  # the id is bound by that DELETE: its binding error comes first
            ro.try_acquire_compression_lock(2**63, "h")  # type: ignore[arg-type]
    finally:
        ro.close()

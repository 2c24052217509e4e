"""Invariants 5-7 of DESIGN.md at the projections, each test written against a mutation no other
test caught (docs/RELIABILITY.md, "Mutation audit"): a cursor is committed in the transaction
of the rows it covers (state.db's and an extension read model's alike), a projection of another
log or another application is rebuilt, and an extension read model, like the core tables, is
built only from the verified prefix of the log."""
from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest

from eventlog.log import codec
from eventlog.log.lmdb import EventLog, generation_dir, seq_key
from eventlog.sessions.events import make_event
from eventlog.sessions.extensions import EventType, Extension, ReadModel
from eventlog.sessions.store import SessionStore


def _state_file(home: Path) -> Path:
    return (home / "profiles" / "p" / "state.db").resolve()


def _refuse_meta_key(state: Path, key: str, above: int) -> None:
    """A trigger in the state file that fails any write of meta ``key`` past ``above``: the
    write of a cursor fails, as a crash or a full disk between rows and cursor would."""
    conn = sqlite3.connect(state)
    try:
        conn.execute(f"CREATE TRIGGER refuse_cursor BEFORE INSERT ON meta WHEN NEW.key = '{key}' AND NEW.value > {above} "
                     "BEGIN SELECT RAISE(ABORT, 'cursor write refused'); END")
        conn.commit()
    finally:
        conn.close()


def _message(content: str) -> dict[str, Any]:
    return make_event("message.appended", "s1", {"role": "user", "content": content})


def test_a_state_cursor_that_cannot_be_written_takes_its_rows_with_it(tmp_path: Path) -> None:
    """Rows and cursor commit together (invariant 5): when the cursor write of a batch fails,
    none of the batch's rows stay in state.db, so the next catch-up applies them exactly once."""
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        store.create_session("s1")
        store.append_message("s1", "user", "first")
        assert store.sync() == 2
        head = store.log.head()[0]
    state = _state_file(tmp_path)
    _refuse_meta_key(state, "last_seq", head)
    with EventLog.open(tmp_path / "profiles" / "p" / "log") as lg:
        lg.append([_message("second"), _message("third")])
    with pytest.raises(sqlite3.IntegrityError, match="cursor write refused"):
        with SessionStore.open(tmp_path, "p", follower=False) as store:
            store.get_messages("s1")
    conn = sqlite3.connect(f"file:{state}?mode=ro", uri=True)
    try:
        contents = [r[0] for r in conn.execute("SELECT content FROM messages ORDER BY id")]
        cursor = conn.execute("SELECT value FROM meta WHERE key = 'last_seq'").fetchone()[0]
    finally:
        conn.close()
    assert cursor == head
    assert contents == ["first"], "rows of a batch whose cursor was not written stayed in state.db"


def test_a_projection_of_a_log_that_diverged_after_its_first_event_is_rebuilt(tmp_path: Path) -> None:
    """Invariant 6, "derived from another log (cursor hash mismatch)": two logs with the same
    first event (a profile restored from an export, then written on both sides) and the same
    head seq. The cursor's seq fits, its hash does not: the projection is another log's."""
    one, two = tmp_path / "one", tmp_path / "two"
    with SessionStore.open(one, "p", follower=False) as store:
        store.create_session("s1")
        store.append_message("s1", "user", "written in one")
        assert store.sync() == 2
        first = list(store.log.read(1, 1, raw=True))
    shutil.copytree(one, two, symlinks=True)
    shutil.rmtree(two / "profiles" / "p" / "log")
    with EventLog.open(two / "profiles" / "p" / "log", profile="p") as lg:
        lg.append_sealed([raw for _, raw in first])
        lg.append([_message("written in two")])
        assert lg.head()[0] == 2
    with SessionStore.open(two, "p", follower=False) as store:
        assert [m["content"] for m in store.get_messages("s1")] == ["written in two"]
        assert store.health(full=False)["ok"]


def test_a_state_file_of_another_application_is_not_taken_for_a_projection(tmp_path: Path) -> None:
    """The projection's own identity check (DESIGN.md's hazards: only your own application_id,
    schema version and cursor catch a mispaired file): a generation file whose application_id is
    not eventlog's is foreign and rebuilt, even when its tables and meta look right."""
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        store.create_session("s1")
        store.append_message("s1", "user", "hello")
    state = _state_file(tmp_path)
    conn = sqlite3.connect(state)
    try:
        conn.execute("UPDATE messages SET content = 'not from the log'")
        conn.execute("PRAGMA application_id = 0")
        conn.commit()
    finally:
        conn.close()
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        assert [m["content"] for m in store.get_messages("s1")] == ["hello"]


def _check_note(data: dict[str, Any]) -> dict[str, Any]:
    return {"text": str(data.get("text"))}


def _apply_note(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
    if env.get("type") == "notes.added":
        conn.execute("INSERT INTO notes_items (seq, text) VALUES (?, ?)", (env["seq"], env["data"]["text"]))


def _notes(version: int) -> Extension:
    return Extension("notes", event_types=[EventType("notes.added", 1, validate=_check_note)],
                     read_models=[ReadModel("notes", version, ["CREATE TABLE notes_items (seq INTEGER PRIMARY KEY, text TEXT)"],
                                            _apply_note)])


def _note(text: str) -> dict[str, Any]:
    return {"type": "notes.added", "session": "n1", "data": {"text": text}}


def test_an_extension_cursor_that_cannot_be_written_takes_its_rows_with_it(tmp_path: Path) -> None:
    """An extension read model catching up on its own (registered after state.db was built)
    commits its rows and its cursor together, as the core tables do."""
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        store.create_session("s1")
        store.log.append([_note("one"), _note("two")])
        assert store.sync() == 3
    state = _state_file(tmp_path)
    _refuse_meta_key(state, "ext:notes:seq", 0)
    with pytest.raises(sqlite3.IntegrityError, match="cursor write refused"):
        with SessionStore.open(tmp_path, "p", extensions=[_notes(1)], follower=False) as store:
            with store.read_model("notes", wait=2) as conn:
                conn.execute("SELECT 1").fetchall()
    from eventlog.log import lmdb as lmdb_module
    from eventlog.sessions import store as store_module

    # The open that failed left nothing open behind it (its core stayed registered, its log open).
    assert store_module._shared == {} and not lmdb_module._open_envs
    conn = sqlite3.connect(f"file:{state}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT seq, text FROM notes_items").fetchall()
        cursor = conn.execute("SELECT value FROM meta WHERE key = 'ext:notes:seq'").fetchone()[0]
    finally:
        conn.close()
    assert cursor == 0
    assert rows == [], "rows of a batch whose cursor was not written stayed in state.db"


def test_an_extension_read_model_built_on_its_own_stops_before_a_tampered_event(tmp_path: Path) -> None:
    """The projections are built only from the verified prefix of the log (docs/RELIABILITY.md),
    extension read models included: one rebuilt on its own (a new version of it, here) after an
    event was tampered with stops before that event, says so, and does not wait for the rest."""
    with SessionStore.open(tmp_path, "p", extensions=[_notes(1)], follower=False) as store:
        store.append_events([_note("genuine"), _note("also genuine")])
        with store.read_model("notes") as conn:
            assert conn.execute("SELECT text FROM notes_items ORDER BY seq").fetchall() == [("genuine",), ("also genuine",)]
    log_dir = tmp_path / "profiles" / "p" / "log"
    with EventLog.open(log_dir) as lg:
        forged = lg.get(2)
    assert forged is not None
    forged["data"]["text"] = "forged"
    env = lmdb.open(str(generation_dir(log_dir)), max_dbs=8)
    events = env.open_db(b"events")
    with env.begin(write=True) as txn:  # the canonical JSON with the old hash: a first-format value any reader takes
        txn.put(seq_key(2), codec.canonical(forged), db=events)
    env.close()
    started = time.monotonic()
    with SessionStore.open(tmp_path, "p", extensions=[_notes(2)], follower=False) as store:
        with store.read_model("notes", wait=10) as conn:
            texts = [r[0] for r in conn.execute("SELECT text FROM notes_items ORDER BY seq")]
        assert store.health(full=False)["damage"]["seq"] == 2
    assert texts == ["genuine"], "a tampered event reached an extension read model"
    assert time.monotonic() - started < 5


def test_a_read_model_read_over_damage_not_applied_yet_answers_as_of_the_last_good_seq(tmp_path: Path) -> None:
    """The same over events state.db has not applied yet: the catch-up stops before the damage,
    and a read model read waits for nothing past it (it spun on the lease, never reaching its
    deadline, until the reads learnt that nothing past a damaged seq can come)."""
    with SessionStore.open(tmp_path, "p", extensions=[_notes(1)], follower=False) as store:
        store.append_events([_note("one")])
        with store.read_model("notes") as conn:
            conn.execute("SELECT 1").fetchall()
    log_dir = tmp_path / "profiles" / "p" / "log"
    with EventLog.open(log_dir) as lg:
        lg.append([_note("two"), _note("three")])
        forged = lg.get(2)
    assert forged is not None
    forged["data"]["text"] = "forged"
    env = lmdb.open(str(generation_dir(log_dir)), max_dbs=8)
    events = env.open_db(b"events")
    with env.begin(write=True) as txn:
        txn.put(seq_key(2), codec.canonical(forged), db=events)
    env.close()
    started = time.monotonic()
    with SessionStore.open(tmp_path, "p", extensions=[_notes(1)], follower=False) as store:
        with store.read_model("notes", wait=3) as conn:
            assert conn.execute("SELECT seq, text FROM notes_items").fetchall() == [(1, "one")]
    assert time.monotonic() - started < 2.5

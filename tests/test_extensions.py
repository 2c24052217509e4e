"""Extension events: namespaced event types with their own validators, upcasters and read models,
appended through SessionStore into the same log and chain, projected by the same projector."""
from __future__ import annotations

import io
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import EventTooLargeError, NotFoundError, ProjectionError, ValidationError
from eventlog.log.lmdb import EventLog
from eventlog.sessions.extensions import CATALOGUE, EventType, Extension, ReadModel
from eventlog.sessions.fold import Fold
from eventlog.sessions.store import SessionStore
from sqlite_export.jsonl import export_jsonl, import_jsonl


def check_note(data: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(data.get("text"), str) or not data["text"]:
        raise ValidationError("data.text", "must be a non-empty string")
    unknown = set(data) - {"text", "pinned"}
    if unknown:
        raise ValidationError(f"data.{sorted(unknown)[0]}", "not a field of notes.added")
    return {"text": data["text"], "pinned": bool(data.get("pinned", False))}


def apply_note(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
    if env.get("type") == "notes.added":
        conn.execute("INSERT INTO notes_items (seq, stream, text, pinned) VALUES (?, ?, ?, ?)",
                     (env["seq"], env["session"], env["data"]["text"], int(env["data"]["pinned"])))
    elif env.get("type") == "notes.cleared":
        conn.execute("DELETE FROM notes_items WHERE stream = ?", (env["session"],))


NOTES = Extension("notes", event_types=[EventType("notes.added", 1, validate=check_note),
                                        EventType("notes.cleared")],
                  read_models=[ReadModel("notes", 1, ["CREATE TABLE notes_items (seq INTEGER PRIMARY KEY, stream TEXT, "
                                                      "text TEXT, pinned INTEGER)"], apply_note)])


def rows(store: SessionStore) -> list[tuple[Any, ...]]:
    with store.read_model("notes") as conn:
        return conn.execute("SELECT stream, text, pinned FROM notes_items ORDER BY seq").fetchall()


def test_extension_events_share_the_log_and_build_their_read_model(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[NOTES], follower=False) as store:
        sid = store.create_session(source="cli")
        seqs = store.append_events([
            {"type": "notes.added", "session": "n1", "data": {"text": "buy milk"}},
            {"type": "notes.added", "session": "n1", "data": {"text": "call bob", "pinned": True}},
            {"type": "message.appended", "session": sid, "data": {"role": "user", "content": "and a message"}},
        ])
        assert seqs == [2, 3, 4]
        assert rows(store) == [("n1", "buy milk", 0), ("n1", "call bob", 1)]
        assert [m["content"] for m in store.get_messages(sid)] == ["and a message"]  # core types project too
        store.append_events([{"type": "notes.cleared", "session": "n1", "data": {}}])
        assert rows(store) == []
        assert store.log.verify().ok and store.log.get(2)["v"] == 1
        assert store.health()["ok"]


@pytest.mark.parametrize("bad,field", [
    ({"type": "notes.added", "session": "n1", "data": {"text": ""}}, "events[1].data.text"),
    ({"type": "notes.added", "session": "n1", "data": {"text": "x", "colour": 1}}, "events[1].data.colour"),
    ({"type": "notes.nope", "session": "n1", "data": {}}, "events[1].type"),
    ({"type": "other.thing", "session": "n1", "data": {}}, "events[1].type"),
    ({"type": "notes.added", "session": "../x", "data": {"text": "x"}}, "events[1].session"),
    ({"type": "notes.added", "data": {"text": "x"}, "extra": 1}, "events[1].extra"),
    ({"type": "message.appended", "session": "nosuch", "data": {"role": "user"}}, None),
])
def test_bad_extension_events_are_refused_naming_the_field_and_nothing_is_appended(
        tmp_path: Path, bad: dict[str, Any], field: str | None) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[NOTES], follower=False) as store:
        head = store.log.head()
        good = {"type": "notes.added", "session": "n1", "data": {"text": "fine"}}
        with pytest.raises((ValidationError, NotFoundError)) as info:
            store.append_events([good, bad])
        if field is not None:
            assert isinstance(info.value, ValidationError) and info.value.field == field
            with pytest.raises(ValidationError) as again:  # check_events: the same judgement, no append
                store.check_events([good, bad])
            assert again.value.field == field
        else:
            assert isinstance(info.value, NotFoundError)
            store.check_events([good, bad])  # a session's liveness is append_events' own check
        assert store.log.head() == head


def test_check_events_applies_the_logs_own_limits_too(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[NOTES], follower=False) as store:
        huge = {"type": "notes.added", "session": "n1", "data": {"text": "x" * (17 << 20)}}
        for call in (store.check_events, store.append_events):
            with pytest.raises(EventTooLargeError) as info:
                call([huge])
            assert info.value.field == "events[0].data"
        with pytest.raises(ValidationError):
            store.check_events({"type": "notes.added"})  # not a list
        assert store.log.head()[0] == 0


def test_extension_definitions_are_checked() -> None:
    with pytest.raises(ValidationError):
        Extension("session", event_types=[EventType("session.mine")])  # a built-in namespace
    with pytest.raises(ValidationError):
        Extension("notes", event_types=[EventType("other.added")])
    with pytest.raises(ValidationError):
        Extension("Notes!")
    assert {t.name for t in CATALOGUE.event_types} >= {"session.created", "message.appended"}


def test_the_read_model_survives_rebuild_and_a_version_change_rebuilds_it(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", extensions=[NOTES], follower=False) as store:
        store.append_events([{"type": "notes.added", "session": f"n{i % 3}", "data": {"text": f"t{i}"}}
                             for i in range(50)])
        before = rows(store)
        store.rebuild()
        assert rows(store) == before
    v2 = Extension("notes", event_types=NOTES.event_types, read_models=[ReadModel(
        "notes", 2, ["CREATE TABLE notes_items (seq INTEGER PRIMARY KEY, stream TEXT, text TEXT, pinned INTEGER)",
                     "CREATE TABLE notes_counts (stream TEXT PRIMARY KEY, n INTEGER)"],
        lambda conn, env: (apply_note(conn, env), env.get("type") == "notes.added" and conn.execute(
            "INSERT INTO notes_counts VALUES (?, 1) ON CONFLICT(stream) DO UPDATE SET n = n + 1", (env["session"],))))])
    with SessionStore.open(tmp_path, "p", extensions=[v2], follower=False) as store:
        assert rows(store) == before
        with store.read_model("notes") as conn:
            assert dict(conn.execute("SELECT stream, n FROM notes_counts").fetchall()) == {"n0": 17, "n1": 17, "n2": 16}


def test_the_read_model_survives_export_import_and_replay(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "a", "p", extensions=[NOTES], follower=False) as store:
        store.append_events([{"type": "notes.added", "session": "n1", "data": {"text": f"t{i}"}} for i in range(5)])
        expect = rows(store)
        out = io.BytesIO()
        export_jsonl(store.log, out)
        snap = tmp_path / "replay.db"
        store.snapshot(snap, until_seq=3)
    conn = sqlite3.connect(snap)
    assert [r[0] for r in conn.execute("SELECT text FROM notes_items ORDER BY seq")] == ["t0", "t1", "t2"]
    conn.close()
    with EventLog.open(tmp_path / "b" / "profiles" / "p" / "log", profile="p") as lg:
        import_jsonl(lg, out.getvalue().splitlines())
    with SessionStore.open(tmp_path / "b", "p", extensions=[NOTES], follower=False) as store:
        assert rows(store) == expect and store.log.verify().ok


def test_upcasters_bring_old_events_to_the_current_version(tmp_path: Path) -> None:
    old = Extension("notes", event_types=[EventType("notes.added", 1, validate=None)])
    with SessionStore.open(tmp_path, "p", extensions=[old], follower=False) as store:
        store.append_events([{"type": "notes.added", "session": "n1", "data": {"body": "old shape"}}])

    seen: list[dict[str, Any]] = []
    new = Extension("notes", event_types=[EventType("notes.added", 2, upcasters={
        1: lambda d: {"text": d.pop("body"), "pinned": False}})],
        read_models=[ReadModel("notes", 1, ["CREATE TABLE notes_seen (seq INTEGER)"],
                               lambda conn, env: seen.append(env) if env.get("type") == "notes.added" else None)])
    with SessionStore.open(tmp_path, "p", extensions=[new], follower=False) as store:
        with store.read_model("notes"):
            pass
    assert [(e["v"], e["data"]) for e in seen] == [(2, {"text": "old shape", "pinned": False})]


def test_a_failing_read_model_stops_alone(tmp_path: Path) -> None:
    def boom(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
        if env.get("type") == "notes.added":
            raise RuntimeError("bug in the extension")

    bad = Extension("notes", event_types=NOTES.event_types, read_models=[ReadModel("notes", 1, [], boom)])
    with SessionStore.open(tmp_path, "p", extensions=[bad], follower=False) as store:
        sid = store.create_session(source="cli")
        store.append_events([{"type": "notes.added", "session": "n1", "data": {"text": "x"}}])
        with pytest.raises(ProjectionError):
            with store.read_model("notes"):
                pass
        store.append_message(sid, "user", "the core keeps going")
        assert [m["content"] for m in store.get_messages(sid)] == ["the core keeps going"]


def test_a_file_error_without_a_code_is_the_files_not_the_read_models() -> None:
    """Python 3.10's sqlite3 errors carry no sqlite_errorcode (3.11 added it): every error raised
    in a read model was taken as that read model's own fault, so a full disk or a lock stopped it
    as broken instead of going to the healer (found by helper-85). SQLite's words decide there.
    An error made here carries no code on any Python."""
    from projections.extensions import _its_own

    for words in ("database or disk is full", "database is locked", "disk I/O error",
                  "database disk image is malformed", "attempt to write a readonly database"):
        assert not _its_own(sqlite3.OperationalError(words)), words
    for words in ("no such table: notes", "near \"SELEC\": syntax error"):
        assert _its_own(sqlite3.OperationalError(words)), words
    assert _its_own(sqlite3.IntegrityError("UNIQUE constraint failed: notes.id"))
    assert _its_own(KeyError("x")) and not _its_own(ProjectionError("the file's"))


def test_a_read_model_in_step_takes_the_core_pass_and_fails_alone(tmp_path: Path) -> None:
    """Once its cursor is state.db's, a read model takes each event in the core tables' pass
    (one decode, one transaction, cursors together); when its apply raises there, the core rows
    of the same batch still land and the read model alone is reported broken."""
    def picky(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
        if env.get("type") == "notes.added" and env["data"]["text"] == "bad":
            raise RuntimeError("bug in the extension")
        apply_note(conn, env)

    ext = Extension("notes", event_types=NOTES.event_types, read_models=[ReadModel("notes", 1, NOTES.read_models[0].ddl, picky)])
    with SessionStore.open(tmp_path, "p", extensions=[ext], follower=False) as store:
        sid = store.create_session(source="cli")
        store.append_events([{"type": "notes.added", "session": "n1", "data": {"text": "first"}}])
        assert rows(store) == [("n1", "first", 0)]  # built on its own, now in step
        store.append_events([{"type": "notes.added", "session": "n1", "data": {"text": "second"}}])
        store.sync()  # the core catch-up alone: the read model rides along
        with sqlite3.connect(tmp_path / "profiles" / "p" / "state.db") as raw:
            meta = dict(raw.execute("SELECT key, value FROM meta WHERE key IN ('last_seq', 'ext:notes:seq')"))
            assert meta["ext:notes:seq"] == meta["last_seq"] == 3
            assert raw.execute("SELECT text FROM notes_items ORDER BY seq").fetchall() == [("first",), ("second",)]
        store.append_events([{"type": "message.appended", "session": sid, "data": {"role": "user", "content": "before"}},
                             {"type": "notes.added", "session": "n1", "data": {"text": "bad"}},
                             {"type": "message.appended", "session": sid, "data": {"role": "user", "content": "after"}}])
        assert [m["content"] for m in store.get_messages(sid)] == ["before", "after"]
        with pytest.raises(ProjectionError, match="bug in the extension"):
            with store.read_model("notes"):
                pass
        store.append_message(sid, "user", "the core keeps going")
        assert [m["content"] for m in store.get_messages(sid)][-1] == "the core keeps going"


def test_a_rebuild_builds_the_read_models_in_its_own_pass(tmp_path: Path) -> None:
    """A full rebuild of state.db builds the registered read models into the new file in the
    same pass (the file is swapped in with them at its cursor); one whose apply raises there is
    left out of the file, the core rows are whole, and its own catch-up then reports it broken."""
    def picky(conn: sqlite3.Connection, env: dict[str, Any]) -> None:
        if env.get("type") == "notes.added" and env["data"]["text"] == "bad":
            raise RuntimeError("bug in the extension")
        apply_note(conn, env)

    ext = Extension("notes", event_types=NOTES.event_types, read_models=[ReadModel("notes", 1, NOTES.read_models[0].ddl, picky)])
    with SessionStore.open(tmp_path, "p", extensions=[ext], follower=False) as store:
        sid = store.create_session(source="cli")
        store.append_events([{"type": "notes.added", "session": "n1", "data": {"text": "one"}},
                             {"type": "message.appended", "session": sid, "data": {"role": "user", "content": "hi"}},
                             {"type": "notes.added", "session": "n1", "data": {"text": "two"}}])
        projector = store._core.projector
        built = projector._builder.rebuild_state()  # the build alone, before any catch-up
        state = tmp_path / "profiles" / "p" / built["files"][0]
        with sqlite3.connect(state) as raw:
            meta = dict(raw.execute("SELECT key, value FROM meta WHERE key IN "
                                    "('last_seq', 'ext:notes:seq', 'ext:notes:version')"))
            assert meta == {"last_seq": 4, "ext:notes:seq": 4, "ext:notes:version": 1}
            assert raw.execute("SELECT text FROM notes_items ORDER BY seq").fetchall() == [("one",), ("two",)]
        assert rows(store) == [("n1", "one", 0), ("n1", "two", 0)]

        store.append_events([{"type": "notes.added", "session": "n1", "data": {"text": "bad"}}])
        store.append_message(sid, "user", "after")
        store.rebuild()
        with sqlite3.connect(tmp_path / "profiles" / "p" / "state.db") as raw:
            (reached,) = raw.execute("SELECT value FROM meta WHERE key = 'ext:notes:seq'").fetchone()
            assert reached < 6  # stopped before the event it cannot apply
        assert [m["content"] for m in store.get_messages(sid)] == ["hi", "after"]
        with pytest.raises(ProjectionError, match="bug in the extension"):
            with store.read_model("notes"):
                pass


def test_a_state_db_rebuilt_at_open_is_built_with_the_read_models(tmp_path: Path) -> None:
    """A store opened with extensions on a profile whose state.db is gone registers their read
    models before the projections heal, so the rebuild builds their tables in its own pass: the
    log is not read a second time for them after the swap."""
    with SessionStore.open(tmp_path, "p", extensions=[NOTES], follower=False) as store:
        sid = store.create_session(source="cli")
        for i in range(150):
            store.append_events([{"type": "notes.added", "session": "n1", "data": {"text": f"note {i}"}},
                                 {"type": "message.appended", "session": sid, "data": {"role": "user", "content": f"m{i}"}}])
    (tmp_path / "profiles" / "p" / "state.db").unlink()

    read_for_extensions: list[int] = []
    with EventLog.open(tmp_path / "profiles" / "p" / "log") as lg:
        plain_read = lg.read

        def counting_read(*args: Any, **kwargs: Any) -> Any:
            for env in plain_read(*args, **kwargs):
                read_for_extensions.append(env["seq"])
                yield env
        lg.read = counting_read  # type: ignore[method-assign]
        with SessionStore.open(tmp_path, "p", log=lg, extensions=[NOTES], follower=False) as store:
            assert len(rows(store)) == 150
            assert store.get_session(sid)["message_count"] == 150
    assert read_for_extensions == []


def test_a_log_holding_a_type_of_a_newer_program_is_read_and_counted(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        sid = store.create_session(source="cli")
        store.log.append([{"type": "future.feature", "session": sid, "data": {"whatever": [1, 2]}, "v": 7},
                          {"type": "session.titled", "session": sid, "data": {"title": "still here"}, "v": 9}])
        store.append_message(sid, "user", "after the unknown events")
        assert store.get_session(sid)["message_count"] == 1
        fold = Fold()
        for env in store.log.read():
            fold.apply(env)
        assert fold.get_session(sid)["message_count"] == 1
    from projections.doctor import examine

    with EventLog.open(tmp_path / "profiles" / "p" / "log") as lg:
        report = examine(tmp_path / "profiles" / "p", lg, "p")
    assert report["state"]["skipped_types"].get("future.feature") == 1

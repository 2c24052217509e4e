"""Retention's idea of activity: a session's newest event, not only its newest message. It read
``last_activity_at`` (the messages' timestamps) alone, so a LangGraph thread whose checkpoints
were written a moment before (its messages not mirrored, or a graph without a ``messages``
channel) and a session pinned, titled or written through an extension's events since were
erased as old (outside audit, helper-52). Times an event's data carries (a session's start, a
message's timestamp, an end) still count as given, so an import of old history stays old."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from eventlog.sessions.store import SessionStore

sys.path.insert(0, str(Path(__file__).parent))
from test_erase import MARKER, traces  # noqa: E402

OLD = 1_000_000_000.0


def test_a_langgraph_thread_written_to_now_is_not_old(tmp_path: Path) -> None:
    from test_adapter_langgraph import _chat_graph  # (langgraph is imported only by this test)

    from eventlog.adapters.langgraph import EventlogSaver

    config = {"configurable": {"thread_id": "busy"}}
    with EventlogSaver(home=tmp_path, mirror_messages=False) as saver:
        graph = _chat_graph(saver)
        graph.invoke({"messages": [("user", f"first {MARKER}")]}, config)
        time.sleep(1.5)
        graph.invoke({"messages": [("user", "second, a moment ago")]}, config)
        with SessionStore.open(tmp_path, follower=False) as store:
            assert store.retention(1.0, dry_run=True)["sessions"] == []
            assert store.retention(1.0)["sessions"] == []  # it was: ['lg:busy'], the thread erased
        assert saver.get_tuple(config) is not None
        time.sleep(1.5)  # now the thread has been idle longer than a second
        with SessionStore.open(tmp_path, follower=False) as store:
            assert store.retention(1.0)["sessions"] == ["lg:busy"]
        assert saver.get_tuple(config) is None
    assert traces(tmp_path) == []


@pytest.mark.parametrize("what", ["pin", "title", "usage", "reaction", "extension event"])
def test_a_session_used_since_without_a_new_message_is_not_old(tmp_path: Path, what: str) -> None:
    from eventlog.sessions.extensions import EventType, Extension

    note = Extension(namespace="notes", event_types=[EventType("notes.added")])
    with SessionStore.open(tmp_path, "p", follower=False, extensions=[note]) as store:
        used = store.create_session(source="cli", started_at=OLD)
        mid = store.append_message(used, "user", "old words", timestamp=OLD + 1)
        idle = store.create_session(source="cli", started_at=OLD)
        store.append_message(idle, "user", "old words too", timestamp=OLD + 1)
        if what == "pin":
            store.pin(used)
        elif what == "title":
            store.set_title(used, "renamed today")
        elif what == "usage":
            store.record_usage(used, model="m", input_tokens=5)
        elif what == "reaction":
            store.react(mid, author="alice", emoji="👍")
        else:
            store.append_events([{"type": "notes.added", "session": used, "data": {"text": "today"}}])
        assert store.retention(30 * 86400)["sessions"] == [idle]
        assert store.get_session(used) is not None


def test_imported_history_keeps_the_times_it_came_with(tmp_path: Path) -> None:
    """An import writes old sessions now: its events' data carry the source's times, and its
    echoes (a title, an end, an archive flag, marked ``imported``) are no activity of their own."""
    from test_hermes_import import v22

    from sqlite_export.hermes import import_hermes

    source = tmp_path / "hermes.db"
    conn = v22(source)
    conn.execute("INSERT INTO sessions (id, source, started_at, title, ended_at, end_reason, archived) "
                 "VALUES ('old', 'cli', ?, 'an old title', ?, 'done', 1)", (OLD, OLD + 5))
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('old', 'user', ?, ?)",
                 (f"old {MARKER}", OLD + 1))
    conn.commit()
    conn.close()
    with SessionStore.open(tmp_path / "home", "p", follower=False) as store:
        import_hermes(store, source)
        fresh = store.create_session(source="cli")
        assert store.retention(30 * 86400)["sessions"] == ["old"]
        assert store.get_session(fresh) is not None
    assert traces(tmp_path / "home") == []


def test_a_deleted_session_is_as_old_as_its_data_says(tmp_path: Path) -> None:
    """Deleted sessions are found by a scan of the log; their age is read the same way as a
    live session's (it was the time their events were written, so an imported session deleted
    here stayed for a whole retention period after the import)."""
    with SessionStore.open(tmp_path, "p", follower=False) as store:
        gone = store.create_session(source="cli", started_at=OLD)
        store.append_message(gone, "user", f"deleted {MARKER}", timestamp=OLD + 1)
        store.delete_session(gone)
        recent = store.create_session(source="cli")
        store.append_message(recent, "user", f"recent {MARKER}")
        store.delete_session(recent)
        assert store.retention(30 * 86400)["sessions"] == [gone]
        assert store.retention(0.0)["sessions"] == [recent]
    assert traces(tmp_path) == []

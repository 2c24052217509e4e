"""EventlogSaver: the gaps an outside audit found (docs/ADAPTERS.md) -- a copy that lived on its
source's events, writes that did not notice another process's erase, a copy that mirrored the
transcript twice. Real files and processes throughout."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from test_adapter_langgraph import _chat_graph, cfg, checkpoint

from eventlog import SessionStore
from eventlog.adapters.langgraph import EventlogSaver
from eventlog.adapters.langgraph import model as lg_model
from eventlog.errors import NotFoundError

ROOT = Path(__file__).resolve().parent.parent


def _populate(s: EventlogSaver, thread: str) -> None:
    """Checkpoints in two namespaces, raw bytes, metadata, regular and special pending writes,
    and a mirrored conversation."""
    _chat_graph(s).invoke({"messages": [("user", "hello aurora")]}, cfg(thread))
    c = s.put(cfg(thread, "child:1"), checkpoint({"b": bytes(range(256))}, {"b": 1}),
              {"source": "loop", "step": 0, "run_id": "run-x"}, {"b": 1})
    s.put_writes(c, [("b", b"\x00pending\xff"), ("__error__", "boom")], "task-1", "path")


def _rows(thread: str, home: Path) -> dict[str, Any]:
    """Every read-model row of ``thread`` (the raw bytes; seq left out: it names the event a
    row came from) and what the saver returns for it, read by a fresh saver."""
    with EventlogSaver(home=home) as s:
        store = s._open()
        with store.read_model(lg_model.NAMESPACE) as conn:
            rows = {table: sorted(conn.execute(f"SELECT {cols} FROM {table} WHERE thread_id = ?", (thread,)).fetchall())
                    for table, cols in (
                        ("langgraph_checkpoints", "checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, "
                         "checkpoint_type, checkpoint, metadata_type, metadata, channel_versions"),
                        ("langgraph_blobs", "checkpoint_ns, channel, version, type, data"),
                        ("langgraph_writes", "checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path"))}
        rows["tuples"] = [(t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
                          for ns in ("", "child:1") for t in s.list(cfg(thread, ns))]
        latest = s.get_tuple(cfg(thread))
        rows["latest"] = None if latest is None else (latest.checkpoint, latest.pending_writes)
        rows["messages"] = [(m["role"], m["content"]) for m in store.get_messages(lg_model.thread_session(thread))]
    return rows


# ---------------------------------------------------------------- 1. a copy outlives its source's erase

def _erase(how: str, home: Path, thread: str) -> None:
    if how == "delete_thread":
        with EventlogSaver(home=home, erase_deleted=True) as s:
            s.delete_thread(thread)
    elif how == "erase_session":
        with SessionStore.open(home) as store:
            store.erase_session(lg_model.thread_session(thread), "gdpr")
    else:
        with SessionStore.open(home) as store:
            done = store.retention(1.0)
            assert done["sessions"] == [lg_model.thread_session(thread)], done


@pytest.mark.parametrize("how", ["delete_thread", "erase_session", "retention"])
def test_a_copy_keeps_its_rows_and_messages_after_its_source_is_erased(tmp_path: Path, how: str) -> None:
    """copy_thread(A, B) wrote an event naming A, and B's rows were rebuilt from A's: an erase
    of A emptied them, so B read as missing after the erase's purge of the projections, a
    rebuild or a reopen without state.db (found by an outside audit)."""
    with EventlogSaver(home=tmp_path) as s:
        _populate(s, "src")
        if how == "retention":
            time.sleep(1.5)  # the source's last activity is older than a second, the copy's is not
        s.copy_thread("src", "dst")
    before = _rows("dst", tmp_path)
    assert before == {**_rows("src", tmp_path), "tuples": before["tuples"], "latest": before["latest"]}
    assert len(before["langgraph_checkpoints"]) == 4 and len(before["langgraph_writes"]) >= 2
    assert before["messages"] == [("user", "hello aurora"), ("assistant", "echo: hello aurora")]

    _erase(how, tmp_path, "src")
    assert _rows("src", tmp_path)["tuples"] == []
    assert _rows("dst", tmp_path) == before
    with SessionStore.open(tmp_path, extensions=[lg_model.EXTENSION]) as store:
        store.rebuild()
        assert store.log.verify().ok and store.log.verify().erased > 0
    assert _rows("dst", tmp_path) == before
    for p in tmp_path.rglob("state.db*"):
        p.unlink()
    assert _rows("dst", tmp_path) == before


def test_a_large_thread_is_copied_in_several_events_of_one_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lg_model, "COPY_PART_BYTES", 2000)
    with EventlogSaver(home=tmp_path) as s:
        c = cfg("big")
        for step in range(6):
            c = s.put(c, checkpoint({"v": "x" * 1500}, {"v": step + 1}), {"step": step}, {"v": step + 1})
            s.put_writes(c, [("v", "w" * 800)], f"task-{step}")
        s.copy_thread("big", "big-copy")
        store = s._open()
        copies = [e for e in store.log.read() if e["type"] == "langgraph.thread_copied"]
        assert len(copies) > 3 and len({e["seq"] for e in copies}) == len(copies)
        assert all(e["v"] == 2 and e["session"] == "lg:big-copy" for e in copies)
        store.erase_session("lg:big", "gone")
    rows = _rows("big-copy", tmp_path)
    assert len(rows["langgraph_checkpoints"]) == 6 and len(rows["langgraph_writes"]) == 6
    assert rows["latest"] is not None and rows["latest"][1] == [("task-5", "v", "w" * 800)]


def test_a_log_with_a_copy_event_of_the_earlier_release_still_reads(tmp_path: Path) -> None:
    """A ``thread_copied`` v1 (it names its source only) is applied as before: the source's rows."""
    with EventlogSaver(home=tmp_path) as s:
        _populate(s, "old-src")
        store = s._open()
        store.create_session("lg:old-dst", source="langgraph", model_config={"langgraph": {"thread_id": "old-dst"}})
        store.log.append([{"type": "langgraph.thread_copied", "v": 1, "session": "lg:old-dst",
                           "data": {"thread_id": "old-dst", "source_thread_id": "old-src"}}])
    src = _rows("old-src", tmp_path)
    with SessionStore.open(tmp_path, extensions=[lg_model.EXTENSION]) as store:
        store.rebuild()
    dst = _rows("old-dst", tmp_path)
    assert dst["langgraph_checkpoints"] == src["langgraph_checkpoints"] and dst["langgraph_writes"] == src["langgraph_writes"]
    assert dst["latest"] == src["latest"] and dst["latest"] is not None


# ---------------------------------------------------------------- 2. writes notice another process's erase

_ERASER = textwrap.dedent("""
    import sys
    from eventlog.adapters.langgraph import EventlogSaver
    with EventlogSaver(home=sys.argv[1], erase_deleted=True) as s:
        s.delete_thread(sys.argv[2])
    print("erased")
""")


@pytest.mark.parametrize("read_first", [False, True], ids=["never-read", "read-before-the-erase"])
@pytest.mark.parametrize("op", ["put", "put_writes"])
def test_a_write_to_a_thread_another_process_erased_is_refused(tmp_path: Path, op: str, read_first: bool) -> None:
    """The erase was noticed on reads only: a saver that wrote a thread (or read it before the
    erase) and did not read it since appended its next write to the erased stream."""
    with EventlogSaver(home=tmp_path) as s:
        assert s.get_tuple(cfg("t")) is None  # as a graph's run starts: the saver knows the erase mark now
        c = s.put(cfg("t"), checkpoint({"v": "secret"}, {"v": 1}), {"step": 0}, {"v": 1})
        s.put_writes(c, [("v", "pending")], "task-1")
        s.put(cfg("other"), checkpoint({"v": "kept"}, {"v": 1}), {"step": 0}, {"v": 1})
        if read_first:
            assert s.get_tuple(cfg("t")) is not None  # the saver's copy of the thread, at its version
        done = subprocess.run([sys.executable, "-c", _ERASER, str(tmp_path), "t"], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 0 and done.stdout.strip() == "erased", done.stderr
        store = s._open()
        head, version = store.log.head()[0], store.version("lg:t")
        with pytest.raises(NotFoundError):
            if op == "put":
                s.put(c, checkpoint({"v": "again"}, {"v": 2}), {"step": 1}, {"v": 2})
            else:
                s.put_writes(c, [("v", "again")], "task-2")
        assert store.log.head()[0] == head and store.version("lg:t") == version  # nothing written
        assert s.get_tuple(cfg("t")) is None
        with pytest.raises(NotFoundError):  # and so on, for either kind of write
            s.put_writes(c, [("v", "again")], "task-3")
        assert store.log.head()[0] == head
        s.put(cfg("other"), checkpoint({"v": "still"}, {"v": 2}), {"step": 1}, {"v": 2})  # other threads go on
        got = s.get_tuple(cfg("other"))
        assert got is not None and got.checkpoint["channel_values"] == {"v": "still"}
        assert store.log.verify().ok


# ---------------------------------------------------------------- 3. a copy mirrors each message once

def test_copying_into_a_target_that_shows_the_sources_messages_adds_only_the_new_ones(tmp_path: Path) -> None:
    """A second copy_thread(A, B) appended A's whole transcript to B again (the earlier turns
    twice; found by an outside audit)."""
    with EventlogSaver(home=tmp_path) as s:
        graph = _chat_graph(s)
        graph.invoke({"messages": [("user", "one")]}, cfg("a"))
        s.copy_thread("a", "b")
        graph.invoke({"messages": [("user", "two")]}, cfg("a"))
        s.copy_thread("a", "b")
        s.copy_thread("a", "b")  # nothing new
        store = s._open()
        expected = ["one", "echo: one", "two", "echo: two"]
        assert [m["content"] for m in store.get_messages("lg:b")] == expected
        state = graph.get_state(cfg("b")).values["messages"]
        assert [m.content for m in state] == expected
        graph.invoke({"messages": [("user", "three")]}, cfg("b"))  # the target goes on: once each
        assert [m["content"] for m in store.get_messages("lg:b")] == expected + ["three", "echo: three"]

"""EventlogSaver: a thread's life across refusals, deletions and a stalled projector (the second
outside audit): a refused write that left a stream without its session, a session deleted with
eventlog's own tools, a peer process stopped while it holds the projector lease, pending writes
without a checkpoint, and calls on a closed saver. Real files and processes throughout."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from test_adapter_langgraph import cfg, checkpoint

from eventlog.adapters.langgraph import EventlogSaver
from eventlog.errors import ClosedError, ValidationError

# ---------------------------------------------------------------- 1. a refused write in a combined batch


def _queue_behind_a_slow_first_append(s: EventlogSaver, sid: str, calls: list[Any]) -> dict[str, str]:
    """Run ``calls`` on threads: the first one's append is held until all the others are queued
    behind it (so they are combined into one batch); each call's outcome by its index."""
    append, in_flight, release = s._append, threading.Event(), threading.Event()

    def slow_first(*args: Any, **kwargs: Any) -> None:
        if not in_flight.is_set():
            in_flight.set()
            release.wait(10)  # the first append "syncs" while the others queue behind it
        append(*args, **kwargs)

    s._append = slow_first  # type: ignore[method-assign]
    out: dict[str, str] = {}

    def run(i: int, call: Any) -> None:
        try:
            call()
            out[f"#{i + 1}"] = "ok"
        except ValidationError as e:
            out[f"#{i + 1}"] = type(e).__name__

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    threads[0].start()
    assert in_flight.wait(10)
    for n, t in enumerate(threads[1:], 1):
        t.start()  # one by one, in order: each queues behind the append in flight
        while len(s._combiner._queues.get(sid, ())) < n:
            threading.Event().wait(0.001)
    release.set()
    for t in threads:
        t.join()
    s._append = append  # type: ignore[method-assign]
    return out


BAD = checkpoint({"x": 1}, {"x": True})  # a bool channel version: the log refuses the event


def test_a_write_combined_with_a_refused_one_on_a_new_thread_keeps_its_session(tmp_path: Path) -> None:
    """Three writes start a new thread at once: #1 is in flight while #2 (refused by the log) and
    #3 queue behind it and are combined. The combined batch carried one creation, #2's; #2 was
    then tried alone (refused) and #3 appended without any: a stream with no session, the thread
    unusable for good. Each attempt now derives its events from each request's own."""
    with EventlogSaver(home=tmp_path) as s:
        store = s._open()
        out = _queue_behind_a_slow_first_append(s, "lg:fresh", [
            lambda: s.put(cfg("fresh"), BAD, {}, {"x": True}),
            lambda: s.put(cfg("fresh"), BAD, {}, {"x": True}),
            lambda: s.put_writes(cfg("fresh", checkpoint_id="c1"), [("a", "small")], "task")])
        assert out == {"#1": "ValidationError", "#2": "ValidationError", "#3": "ok"}
        assert [e["type"] for e in store.log.read_session("lg:fresh")] == ["session.created", "langgraph.writes_put"]
        assert store.get_session("lg:fresh") is not None
        s.put(cfg("fresh"), checkpoint({"x": "next"}, {"x": 1}), {}, {"x": 1})  # the thread goes on
        found = s.get_tuple(cfg("fresh"))
        assert found is not None and found.checkpoint["channel_values"] == {"x": "next"}


def test_a_write_combined_with_a_refused_one_keeps_its_mirrored_messages(tmp_path: Path) -> None:
    """The same with the message mirror: two puts queued together carry the same new message; the
    batch kept it in the first one's events only, the first was refused and tried alone, and the
    second was appended without the message: the transcript lost it."""
    msg = {"id": "m1", "type": "human", "content": "hello from the queue"}

    def put(versions: dict[str, Any]) -> Any:
        return lambda: s.put(cfg("chat"), checkpoint({"messages": [msg]}, versions), {}, versions)

    with EventlogSaver(home=tmp_path) as s:
        store = s._open()
        out = _queue_behind_a_slow_first_append(s, "lg:chat", [
            lambda: s.put_writes(cfg("chat", checkpoint_id="c0"), [("a", "first")], "task"),
            put({"messages": 1, "x": True}), put({"messages": 1})])
        assert out == {"#1": "ok", "#2": "ValidationError", "#3": "ok"}
        assert [m["content"] for m in store.get_messages("lg:chat")] == ["hello from the queue"]


# ---------------------------------------------------------------- 4. pending writes without a checkpoint

def _bare(cid: str) -> Any:
    c = checkpoint({}, {})
    c["id"] = cid
    return c


def test_prune_delete_takes_pending_writes_that_have_no_checkpoint(tmp_path: Path) -> None:
    """A thread whose only rows are writes for a checkpoint id not stored (after delete_for_runs
    took its checkpoints) was not pruned at all: the writes came back as the pending writes of a
    later checkpoint with that id."""
    with EventlogSaver(home=tmp_path) as s:
        s.put_writes(cfg("T", checkpoint_id="X"), [("a", "stale")], "task")
        s.put(cfg("T"), _bare("A"), {"run_id": "r1"}, {})
        s.delete_for_runs(["r1"])  # no checkpoint left, only the write for X
        s.prune(["T"], strategy="delete")
        s.put(cfg("T"), _bare("X"), {}, {})
        found = s.get_tuple(cfg("T"))
        assert found is not None and found.pending_writes == []
        s._open().rebuild()  # the read model derived again from the log says the same
        found = s.get_tuple(cfg("T"))
        assert found is not None and found.pending_writes == []


def test_copy_thread_copies_pending_writes_of_a_source_without_a_checkpoint(tmp_path: Path) -> None:
    with EventlogSaver(home=tmp_path) as s:
        s.put_writes(cfg("src", checkpoint_id="X"), [("a", "early")], "task")
        s.copy_thread("src", "dst")
        s.put(cfg("dst"), _bare("X"), {}, {})
        found = s.get_tuple(cfg("dst"))
        assert found is not None and found.pending_writes == [("task", "a", "early")]


# ---------------------------------------------------------------- calls on a closed saver

def test_a_closed_saver_refuses_the_calls_that_have_nothing_to_do(tmp_path: Path) -> None:
    with EventlogSaver(home=tmp_path) as s:
        s.put(cfg("t"), _bare("A"), {}, {})
    for call in (lambda: s.put_writes(cfg("t", checkpoint_id="A"), [], "task"), lambda: s.prune([]),
                 lambda: s.delete_for_runs([]), lambda: s.copy_thread("t", "t")):
        with pytest.raises(ClosedError):
            call()

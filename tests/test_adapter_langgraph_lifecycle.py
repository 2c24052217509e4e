"""EventlogSaver: a thread's life across refusals, deletions and a stalled projector (the second
outside audit): a refused write that left a stream without its session, a session deleted with
eventlog's own tools, a peer process stopped while it holds the projector lease, pending writes
without a checkpoint, and calls on a closed saver. Real files and processes throughout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_adapter_langgraph import cfg, checkpoint

from eventlog import SessionStore
from eventlog.adapters.langgraph import EventlogSaver
from eventlog.errors import ClosedError, NotFoundError, ProjectionError, ValidationError, process_state

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- 1. a refused write in a combined batch


def _queue_behind_a_slow_first_append(s: EventlogSaver, sid: str, calls: list[Any]) -> dict[str, str]:
    """Run ``calls`` on threads: the first one's append is held until all the others are queued
    behind it (so they are combined into one batch); each call's outcome by its index."""
    append, in_flight, release = s._append, threading.Event(), threading.Event()

    def slow_first(*args: Any, **kwargs: Any) -> Any:
        if not in_flight.is_set():
            in_flight.set()
            release.wait(10)  # the first append "syncs" while the others queue behind it
        return append(*args, **kwargs)

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


# ---------------------------------------------------------------- 2. a thread whose session was deleted

def _put(s: EventlogSaver, thread: str, cid: str, run: str) -> None:
    c = checkpoint({"x": thread}, {"x": 1})
    c["id"] = cid
    s.put(cfg(thread), c, {"run_id": run}, {"x": 1})


@pytest.mark.parametrize("how", ["store", "cli"])
def test_a_thread_whose_session_is_deleted_is_gone_and_blocks_nothing(tmp_path: Path, how: str) -> None:
    """Deleted with eventlog's own tools, a thread's session was still served as a live thread,
    delete_thread on it raised NotFoundError (its hint said "erased"), and prune/delete_for_runs
    over several threads raised for all of them."""
    with EventlogSaver(home=tmp_path) as s:
        for thread in ("t", "other"):
            _put(s, thread, "c1", "run-1")
        assert s.get_tuple(cfg("t")) is not None  # the saver's copy and what it knows of the session
        if how == "cli":
            done = subprocess.run([sys.executable, "-c", "import sys; from eventlog.cli import main; sys.exit(main())",
                                   "--home", str(tmp_path), "sessions", "delete", "lg:t"], capture_output=True,
                                  text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            assert done.returncode == 0, done.stderr
        else:
            with SessionStore.open(tmp_path) as store:
                store.delete_session("lg:t")
        assert s.get_tuple(cfg("t")) is None and list(s.list(cfg("t"))) == []
        assert [t.config["configurable"]["thread_id"] for t in s.list(None)] == ["other"]
        s.delete_thread("t")  # nothing left to remove: no error
        s.prune(["t", "other"], strategy="delete")  # the other thread is pruned all the same
        assert list(s.list(cfg("other"))) == []
        _put(s, "other", "c2", "run-2")
        s.delete_for_runs(["run-2"])
        assert list(s.list(cfg("other"))) == []
        s.copy_thread("t", "t2")  # nothing to copy
        assert list(s.list(cfg("t2"))) == []
        store = s._open()
        head = store.log.head()[0]
        for write in (lambda: _put(s, "t", "c3", "run-3"),
                      lambda: s.put_writes(cfg("t", checkpoint_id="c1"), [("x", "late")], "task")):
            with pytest.raises(NotFoundError, match="was deleted"):  # the saver knew it live: it looks again
                write()
        assert store.log.head()[0] == head  # nothing written
    with EventlogSaver(home=tmp_path) as s:  # a saver that never saw it live
        with pytest.raises(NotFoundError, match="was deleted"):
            _put(s, "t", "c3", "run-3")
        s._open().rebuild()  # the read model derived again from the log says the same
        assert s.get_tuple(cfg("t")) is None and list(s.list(cfg("other"))) == []


def test_a_stream_without_a_session_can_be_deleted_and_says_so(tmp_path: Path) -> None:
    """A stream that an earlier release left without its session (a refused first write): its
    rows can be deleted, and a write to it says what happened instead of "erased"."""
    with EventlogSaver(home=tmp_path) as s:
        store = s._open()
        store.append_events([{"type": "langgraph.writes_put", "session": "lg:orphan", "data": {
            "thread_id": "orphan", "checkpoint_ns": "", "checkpoint_id": "c1", "task_id": "task", "task_path": "",
            "writes": [{"idx": 0, "channel": "a", "type": "msgpack", "data": ""}]}}], expected_version=0)
        with pytest.raises(NotFoundError, match="holds no session"):
            s.put_writes(cfg("orphan", checkpoint_id="c1"), [("a", "again")], "task-2")
        s.delete_thread("orphan")
        with store.read_model("langgraph") as conn:
            assert conn.execute("SELECT COUNT(*) FROM langgraph_writes").fetchone() == (0,)
        s.prune(["orphan"], strategy="delete")


# ---------------------------------------------------------------- 3. a stopped process holds the projector lease

_HOLD_AND_STOP = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from projections.lease import Lease
    assert Lease(Path(sys.argv[1])).acquire(0)
    print("held", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
""")

_TURN = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from test_adapter_langgraph_lifecycle import _chat_graph
    from eventlog.adapters.langgraph import EventlogSaver
    with EventlogSaver(home=sys.argv[1]) as s:
        _chat_graph(s).invoke({"messages": [("user", sys.argv[2])]}, {"configurable": {"thread_id": "t"}})
    print("done")
""")


def _chat_graph(saver: EventlogSaver) -> Any:
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    def bot(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"echo: {state['messages'][-1].content}")]}

    return StateGraph(MessagesState).add_node("bot", bot).add_edge(START, "bot").compile(checkpointer=saver)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.fixture
def stopped_lease_holder(tmp_path: Path) -> Iterator[Any]:
    """A process that takes the profile's projector lease and stops itself (SIGSTOP): started by
    calling the fixture's value; continued and killed at the end."""
    held: list[subprocess.Popen[str]] = []

    def start() -> int:
        p = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, str(tmp_path / "profiles" / "default")],
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        held.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        deadline = time.monotonic() + 10
        while process_state(p.pid) != "stopped":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return p.pid

    yield start
    for p in held:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


def test_a_stopped_lease_holder_does_not_stop_the_turns(tmp_path: Path, stopped_lease_holder: Any) -> None:
    """A peer process stopped while it holds the projector lease made every turn wait 30 s for
    the read model and then fail (ProjectionError). A read of one thread now answers from the
    thread's own stream after a short wait (READ_WAIT_S, once), with every write in the log: its
    own, another saver's, another process's; a turn on a new thread never needs the read model."""
    with EventlogSaver(home=tmp_path) as s:
        graph = _chat_graph(s)
        graph.invoke({"messages": [("user", "one")]}, cfg("t"))
        done = _run(_TURN, str(tmp_path), "two", str(Path(__file__).parent))  # another process's turn
        assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
        holder = stopped_lease_holder()
        began = time.monotonic()
        state = graph.invoke({"messages": [("user", "three")]}, cfg("t"))
        graph.invoke({"messages": [("user", "hello")]}, cfg("new"))
        assert time.monotonic() - began < 12  # two turns, four puts that mirror messages
        assert [m.content for m in state["messages"]] == ["one", "echo: one", "two", "echo: two", "three",
                                                          "echo: three"]
        with EventlogSaver(home=tmp_path) as other:  # another saver of the process: no copy, the stream
            began = time.monotonic()
            got = other.get_tuple(cfg("t"))
            assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 6
            assert len(list(other.list(cfg("new")))) == 3
            assert time.monotonic() - began < 3
            with pytest.raises(ProjectionError, match=f"process {holder}, stopped"):
                list(other.list(None))  # every thread: no one stream to answer from
        os.kill(holder, signal.SIGCONT)  # resumed: the read model catches up, and agrees
        store = s._open()
        deadline = time.monotonic() + 10
        while True:
            try:
                with store.read_model("langgraph", wait=1) as conn:
                    rows = conn.execute("SELECT COUNT(*) FROM langgraph_checkpoints WHERE thread_id = 't'").fetchone()
                break
            except ProjectionError:
                assert time.monotonic() < deadline
        assert rows == (len(list(s.list(cfg("t")))),)
        # each message mirrored once, whoever wrote it
        assert [m["content"] for m in store.get_messages("lg:t")] == ["one", "echo: one", "two", "echo: two",
                                                                      "three", "echo: three"]


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


def test_a_saver_whose_store_open_could_not_bring_the_read_model_up_goes_on_from_the_streams(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the store with the saver's extension waits for the read model (the store's own
    wait) and raised when it did not get there: the saver now goes on with the extension
    registered, and reads each thread from its stream while the read model stays out of reach."""
    with EventlogSaver(home=tmp_path) as s:
        _chat_graph(s).invoke({"messages": [("user", "before")]}, cfg("t"))
    with SessionStore.open(tmp_path, follower=False) as app:  # the profile is open, without the extension
        def unreachable(name: str, to_seq: int, wait: float = 30.0) -> None:
            raise ProjectionError(f"read model {name!r} did not reach seq {to_seq} in time")

        monkeypatch.setattr(app._need_projector(), "advance_read_model", unreachable)
        with EventlogSaver(home=tmp_path) as s:
            state = _chat_graph(s).invoke({"messages": [("user", "after")]}, cfg("t"))
            assert [m.content for m in state["messages"]] == ["before", "echo: before", "after", "echo: after"]
            with pytest.raises(ProjectionError):
                list(s.list(None))
        monkeypatch.undo()
        assert [m["content"] for m in app.get_messages("lg:t")] == ["before", "echo: before", "after", "echo: after"]


def test_a_fresh_process_opens_and_turns_without_waiting_for_a_stopped_lease_holder(
        tmp_path: Path, stopped_lease_holder: Any) -> None:
    """Behind a stopped lease holder, a new process's saver waited 30 s in the store's open for
    the extension read model, and each put that mirrors messages about a second in the store's
    liveness check; the open now waits a second and the check reads the stream (an outside audit
    saw a turn take 33 s). The turn is run with a timeout below the old wait."""
    with EventlogSaver(home=tmp_path) as s:
        _chat_graph(s).invoke({"messages": [("user", "one")]}, cfg("t"))
    stopped_lease_holder()
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _TURN, str(tmp_path), "two", str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=25, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    print(f"turn in a fresh process behind a stopped lease holder: {time.monotonic() - began:.1f} s")
    with EventlogSaver(home=tmp_path) as s:
        state = s.get_tuple(cfg("t"))
        assert state is not None and [m.content for m in state.checkpoint["channel_values"]["messages"]] == \
            ["one", "echo: one", "two", "echo: two"]

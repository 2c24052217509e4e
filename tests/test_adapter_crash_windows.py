"""An adapter call makes its change in one append: a process SIGKILLed the moment its call first
reaches the log leaves all of the call or none of it. An outside audit killed processes between
two appends of one call and found a thread deleted but never erased (its words still searchable),
checkpoints deleted with their transcript still active, a copy without its transcript, and empty
sessions from a first write (LangGraph and OpenAI Agents). Real processes, real SIGKILL."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from eventlog import SessionStore
from eventlog.adapters.langgraph import EventlogSaver

ROOT = Path(__file__).resolve().parent.parent

_GRAPH = """
    import sys
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph
    from eventlog.adapters.langgraph import EventlogSaver
    def bot(state):
        return {"messages": [AIMessage(content="echo: " + state["messages"][-1].content)]}
    builder = StateGraph(MessagesState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    saver = EventlogSaver(erase_deleted=sys.argv[1] == "erase")
    graph = builder.compile(checkpointer=saver)
    def turn(thread, text):
        graph.invoke({"messages": [("user", text)]}, {"configurable": {"thread_id": thread}})
"""

_CALLS = {
    "first write": "turn('T', 'secret words')",
    "delete": "saver.delete_thread('T')",
    "copy": "saver.copy_thread('T', 'D')",
}


def _kill_when_it_reaches_the_log(home: Path, prepare: str, call: str, mode: str = "") -> None:
    """Run ``prepare`` in a child, then ``call``; SIGKILL the child as soon as the log grows."""
    code = textwrap.dedent(_GRAPH) + textwrap.dedent(f"""
        {prepare}
        print("READY", flush=True)
        sys.stdin.readline()
        {call}
        print("DONE", flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), EVENTLOG_HOME=str(home))
    child = subprocess.Popen([sys.executable, "-c", code, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdin is not None
        ready = child.stdout.readline().strip()
        assert ready == "READY", child.stderr.read() if child.stderr else ready
        with SessionStore.open(home, follower=False) as store:
            before = store.log.head()[0]
            child.stdin.write("go\n")
            child.stdin.flush()
            deadline = time.monotonic() + 60
            while store.log.head()[0] == before and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.0002)
            assert store.log.head()[0] != before, "the call never reached the log"
    finally:
        child.kill()
        child.wait()


def _state(home: Path, thread: str) -> dict[str, Any]:
    with EventlogSaver(home=home) as saver, SessionStore.open(home, follower=False) as store:
        sid = f"lg:{thread}"
        found = saver.get_tuple({"configurable": {"thread_id": thread}})
        return {"session": store.get_session(sid) is not None,
                "checkpoint": found is not None,
                "thread_events": [e["type"] for e in store.log.read_session(sid) if e["type"].startswith("langgraph.")],
                "transcript": [m["content"] for m in store.get_messages(sid)],
                "searchable": [r["session_id"] for r in store.search("secret")["results"] if r["session_id"] == sid]}


def test_a_first_write_killed_leaves_its_session_with_it_or_nothing(tmp_path: Path) -> None:
    _kill_when_it_reaches_the_log(tmp_path, "", _CALLS["first write"])
    state = _state(tmp_path, "T")
    # The creation came with the thread's first write: a checkpoint, or the pending writes that
    # LangGraph's executor may commit first (never an empty session).
    assert state["session"] and state["thread_events"][:1] in (["langgraph.checkpoint_put"], ["langgraph.writes_put"]), state


@pytest.mark.parametrize("mode", ["rewind", "erase"])
def test_a_delete_thread_killed_is_whole(tmp_path: Path, mode: str) -> None:
    _kill_when_it_reaches_the_log(tmp_path, "turn('T', 'secret words')", _CALLS["delete"], mode)
    state = _state(tmp_path, "T")
    assert not state["checkpoint"] and state["transcript"] == [] and state["searchable"] == [], state
    if mode == "erase":
        assert not state["session"]


def test_a_copy_thread_killed_copies_the_transcript_with_the_checkpoints(tmp_path: Path) -> None:
    _kill_when_it_reaches_the_log(tmp_path, "turn('T', 'secret words')", _CALLS["copy"])
    state = _state(tmp_path, "D")
    assert state["checkpoint"] and state["transcript"] == ["secret words", "echo: secret words"], state


def test_an_openai_first_add_killed_leaves_its_session_with_its_items_or_nothing(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import asyncio, sys
        from eventlog.adapters.openai_agents import EventlogSession
        session = EventlogSession("chat-9")
        asyncio.run(session.get_items())
        print("READY", flush=True)
        sys.stdin.readline()
        asyncio.run(session.add_items([{"role": "user", "content": "hi"}]))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), EVENTLOG_HOME=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY"
        with SessionStore.open(tmp_path, follower=False) as store:
            child.stdin.write("go\n")
            child.stdin.flush()
            deadline = time.monotonic() + 60
            while not store.log.head()[0] and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.0002)
    finally:
        child.kill()
        child.wait()
    with SessionStore.open(tmp_path, follower=False) as store:
        session = store.get_session("chat-9")
        assert session is not None and session["message_count"] == 1, session

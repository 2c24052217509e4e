"""The adapters' own read models, written against mutations no other test caught (the mutation
audit): the LangGraph read model is a function of the log that ignores a deleted thread's later
events, whoever appended them (an earlier program, another host), rebuilt or caught up."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from test_adapter_langgraph import cfg, checkpoint
from test_adapter_openai_agents import contents, run, user

from eventlog import SessionStore
from eventlog.adapters.langgraph import EventlogSaver
from eventlog.adapters.openai_agents import EventlogSession


def _late_rows(s: EventlogSaver) -> int:
    with s._open().read_model("langgraph") as conn:
        return int(conn.execute("SELECT count(*) FROM langgraph_checkpoints WHERE thread_id = 't'").fetchone()[0])


def test_a_checkpoint_appended_after_its_threads_deletion_is_not_in_the_read_model(tmp_path: Path) -> None:
    with EventlogSaver(home=tmp_path) as s:
        c = checkpoint({"x": "t"}, {"x": 1})
        c["id"] = "c1"
        s.put(cfg("t"), c, {"run_id": "run-1"}, {"x": 1})
        store = s._open()
        put = next(e for e in store.log.read_session("lg:t") if e["type"] == "langgraph.checkpoint_put")
        with SessionStore.open(tmp_path) as other:
            other.delete_session("lg:t")
        # What a process that did not know of the deletion could still append to the stream.
        store.log.append([{"type": put["type"], "session": "lg:t", "v": put["v"],
                           "data": {**put["data"], "checkpoint_id": "c2"}}])
        assert _late_rows(s) == 0
        assert s.get_tuple(cfg("t")) is None
    with EventlogSaver(home=tmp_path) as s:
        s._open().rebuild()
        assert _late_rows(s) == 0
        assert s.get_tuple(cfg("t")) is None


def test_a_pop_raced_by_an_add_takes_the_added_item_not_the_one_it_read(tmp_path: Path) -> None:
    """docs/ADAPTERS.md: EventlogSession's pops append at the version read. An item added by
    another writer after the pop read the history, and before it wrote its rewind, makes the
    rewind refused (nothing written) and the pop looks again: it takes the new latest item, and
    the item it had read stays. Appended at the version of the moment instead, the rewind of
    the item read would hide the added one with it, a write nobody took back."""
    popper, adder = EventlogSession("chat", home=tmp_path), EventlogSession("chat", home=tmp_path)
    try:
        run(adder.add_items([user("a"), user("b")]))
        refresh = popper._refresh
        raced = []

        def refresh_then_add(store: Any, need: Any = None) -> Any:
            h = refresh(store, need)
            if not raced:
                raced.append(True)
                run(adder.add_items([user("c")]))  # lands between the pop's read and its rewind
            return h

        popper._refresh = refresh_then_add  # type: ignore[method-assign]
        popped = run(popper.pop_item())
        assert raced and popped is not None and popped["content"] == "c"
        assert contents(run(adder.get_items())) == ["a", "b"]
    finally:
        popper.close()
        adder.close()


def test_two_profiles_with_the_same_session_id_read_their_own_items(tmp_path: Path) -> None:
    """Invariant 9 in the OpenAI adapter's history cache, which is shared by the objects of a
    process: a session id used in two profiles of one process is two histories."""
    one = EventlogSession("chat", home=tmp_path, profile="one")
    two = EventlogSession("chat", home=tmp_path, profile="two")
    try:
        run(one.add_items([user("only in one")]))
        run(two.add_items([user("only in two")]))
        for profile, expected in (("one", ["only in one"]), ("two", ["only in two"])):
            fresh = EventlogSession("chat", home=tmp_path, profile=profile)
            try:
                assert contents(run(fresh.get_items())) == expected
            finally:
                fresh.close()
    finally:
        one.close()
        two.close()

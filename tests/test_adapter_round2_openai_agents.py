"""Second-round outside audit of EventlogSession (helper-56).

A server makes a new EventlogSession per request. Once an SDK id's session was deleted
(`eventlog sessions delete`, a deleted ancestor), its history lives in the next incarnation, and
every new object of the process read and folded the whole deleted stream again to find that out:
0.35-0.46 s a request for a deleted incarnation of 20,000 items, against 0.3 ms before the
deletion. What a process learnt of a gone incarnation is kept like any other history.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pytest
from test_adapter_openai_agents import contents, run, user

from eventlog import SessionStore
from eventlog.adapters import openai_agents
from eventlog.adapters.openai_agents import EventlogSession, session_key


@pytest.fixture(autouse=True)
def _no_store_left_open() -> Any:
    yield
    from eventlog.sessions import store as store_module

    assert store_module._shared == {}  # every object closed: the profile's store with the last


@pytest.fixture
def folded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many events of the log the adapter folded (one entry per fold, with its count)."""
    counts: list[int] = []
    real = openai_agents._fold_stream

    def counting(base: Any, envelopes: Iterable[dict[str, Any]], *args: Any) -> Any:
        seen = list(envelopes)
        counts.append(len(seen))
        return real(base, seen, *args)

    monkeypatch.setattr(openai_agents, "_fold_stream", counting)
    monkeypatch.setattr(openai_agents, "_HISTORIES", openai_agents._Histories())  # as a fresh process
    return counts


@pytest.mark.parametrize("first", ["get_items", "get_items(limit=10)", "add_items"])
def test_new_objects_do_not_fold_a_deleted_incarnation_again(tmp_path: Path, folded: list[int], first: str) -> None:
    writer = EventlogSession("chat", home=tmp_path)
    run(writer.add_items([user(f"old {i}") for i in range(300)]))
    with SessionStore.open(tmp_path) as store:
        store.delete_session(session_key("chat"))
    run(writer.add_items([user("new")]))  # the session goes on in its next incarnation
    writer.close()
    openai_agents._HISTORIES = openai_agents._Histories()  # a process that has read nothing yet
    keeper = EventlogSession("other", home=tmp_path)  # the server's other sessions keep the store open
    run(keeper.get_items())
    folded.clear()

    try:
        for request in range(3):
            s = EventlogSession("chat", home=tmp_path)
            if first == "add_items":
                run(s.add_items([user(f"req {request}")]))
                got = contents(run(s.get_items()))[:-1]
            else:
                got = contents(run(s.get_items(10 if "limit" in first else None)))
                run(s.add_items([user(f"req {request}")]))
            assert s.key != session_key("chat")
            s.close()
            assert got[0] == "new" and got[-1] == ("new" if not request else f"req {request - 1}")
            if request == 0:
                assert sum(folded) >= 300  # the first read of the process learns the deletion
            else:
                assert sum(folded) <= 4, folded  # later objects pass the deleted incarnation at once
            folded.clear()
    finally:
        keeper.close()


def test_a_kept_gone_incarnation_still_yields_to_an_erase(tmp_path: Path, folded: list[int]) -> None:
    s = EventlogSession("chat", home=tmp_path)
    run(s.add_items([user("old")]))
    with SessionStore.open(tmp_path) as store:
        store.delete_session(session_key("chat"))
    run(s.add_items([user("one")]))
    run(s.clear_session(erase=True))  # the deleted incarnation's words go too, and a new mark
    run(s.add_items([user("two")]))
    s.close()
    fresh = EventlogSession("chat", home=tmp_path)
    assert contents(run(fresh.get_items())) == ["two"]
    fresh.close()


def test_the_shared_histories_count_every_entry_against_their_budget(tmp_path: Path) -> None:
    """An empty history (a cleared session, a gone incarnation) held no bytes by the budget's
    count, so the process kept one entry for every such session it ever saw: without bound."""
    shared = openai_agents._Histories(budget=64 * 1024)
    keeper = EventlogSession("keeper", home=tmp_path)
    try:
        profile = openai_agents._shared.profile_of(keeper._open())
        for i in range(5000):
            shared.put(profile, f"s{i}", openai_agents._fold_stream(None, [], 0))
        assert len(shared._entries) <= 200  # 64 KiB of histories, whatever they hold
        assert shared._bytes <= shared.budget
    finally:
        keeper.close()


def test_objects_inside_tuples_keep_their_key_order_in_every_process(tmp_path: Path) -> None:
    """A tuple is stored as a JSON list; the key order of the objects in it was not recorded, so
    another process (or a new one) read them back sorted while this one served them as given."""
    item = {"role": "user", "content": "x", "calls": ({"name": "f", "args": {"z": 1, "a": 2}},)}
    s = EventlogSession("tuples", home=tmp_path)
    run(s.add_items([item]))
    s.close()
    saved = openai_agents._HISTORIES
    openai_agents._HISTORIES = openai_agents._Histories()  # as another process reads it
    try:
        fresh = EventlogSession("tuples", home=tmp_path)
        (got,) = run(fresh.get_items())
        fresh.close()
    finally:
        openai_agents._HISTORIES = saved
    assert list(got["calls"][0]) == ["name", "args"] and list(got["calls"][0]["args"]) == ["z", "a"]
    assert list(got) == ["role", "content", "calls"]

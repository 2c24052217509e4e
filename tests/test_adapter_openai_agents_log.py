"""EventlogSession reads its history from the log, never from the projections.

An outside audit (helper-43) found the history built from projections that lagged the log (a
stopped projector lease holder, a rebuild in another process) and cached under the log's
current stream version: acknowledged items stayed hidden, and a pop then rewound from an older
item. Here: the adapter's fold of one stream against the reference fold, reads with a stopped
and with a running lease holder in another process, and a new object starting from the
history another object of the process already read.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_adapter_openai_agents import contents, run, user

from eventlog import SessionStore
from eventlog.adapters import openai_agents
from eventlog.adapters.openai_agents import EventlogSession, item_to_message, message_to_item
from eventlog.log.codec import stub
from eventlog.sessions.fold import Fold


def read_once(home: Path, sid: str, limit: int | None = None) -> list[Any]:
    """A new object's items (as a server reads them: a new object per request)."""
    s = EventlogSession(sid, home=home)
    try:
        return contents(run(s.get_items(limit)))
    finally:
        s.close()


@pytest.fixture(autouse=True)
def _no_store_left_open() -> Any:
    yield
    from eventlog.sessions import store as store_module

    assert store_module._shared == {}  # every object closed: the profile's store with the last


# ---------------------------------------------------------------- the fold of one stream

_ITEMS = st.sampled_from([
    user("hi"), {"role": "assistant", "content": [{"type": "output_text", "text": "yo", "annotations": []}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": {"z": 1, "a": [2, {"y": 0, "b": 1}]}},
    {"type": "reasoning", "summary": [], "id": "r"},
])
_ODD_DATA = st.sampled_from([
    {"role": "user", "content": "plain, not an item"},
    {"role": "user", "content": 5, "display_kind": "openai_agents:message",
     "display_metadata": {"item": {"role": "user"}, "content_key": "content"}},
    {"role": "user", "content": "x", "display_kind": "openai_agents:message", "display_metadata": "not an object"},
    {"role": "user", "content": "x", "display_kind": 3, "display_metadata": {"item": {}, "content_key": "content"}},
    {"role": "user", "content": "x", "display_kind": "openai_agents:message",
     "display_metadata": {"item": ["not", "an", "object"]}},
])


@st.composite
def _streams(draw: Any) -> list[dict[str, Any]]:
    """Envelopes of one session stream, well-formed or not (raced writers, imports, old releases)."""
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 14))):
        seq = len(out) + 1
        kind = draw(st.sampled_from(["created", "created", "item", "item", "item", "odd", "v1", "rewind", "rewind",
                                     "deleted", "titled", "nodata"]))
        v = 1
        if kind == "created":
            etype, data = "session.created", draw(st.sampled_from([{}, {"source": "x"}, {"parent_session_id": "p"}]))
        elif kind == "item":
            etype, v = "message.appended", 2
            data = {k: val for k, val in item_to_message(draw(_ITEMS)).items() if val is not None}
        elif kind == "odd":
            etype, data, v = "message.appended", dict(draw(_ODD_DATA)), 2
        elif kind == "v1":
            etype, data = "message.appended", {"role": "user", "text": "from an old release"}
        elif kind == "rewind":
            earlier = [e["seq"] for e in out] or [1]
            target = draw(st.one_of(st.sampled_from(earlier), st.sampled_from([0, -1, 10**6, "2", True, None])))
            etype, data = "messages.rewound", {"message_id": target}
        elif kind == "deleted":
            etype, data = "session.deleted", {}
        elif kind == "titled":
            etype, data = "session.titled", {"title": f"t{seq}"}
        else:
            etype, data = draw(st.sampled_from(["message.appended", "messages.rewound", "session.created"])), None
        env: dict[str, Any] = {"seq": seq, "id": f"e{seq}", "ts": 1_700_000_000_000_000_000 + seq, "type": etype,
                               "v": v, "session": "s", "prev": "0" * 64, "hash": "0" * 64,
                               "data": data if data is not None else ["not", "an", "object"]}
        out.append(env)
    if out and draw(st.integers(0, 3)) == 0:
        # An erase (SessionStore.erase_session, retention) takes the whole stream as it stands;
        # events after it are what a writer that counted nothing appended later.
        erased = draw(st.integers(1, len(out)))
        out = [stub(e) for e in out[:erased]] + out[erased:]
    return out


def _folded(envelopes: list[dict[str, Any]]) -> Fold:
    """The reference fold of the stream, the erase record (which is not in the stream) in its
    place right after the erase."""
    fold = Fold()
    erased = sum(1 for e in envelopes if e.get("erased"))
    for i, env in enumerate(envelopes):
        fold.apply(env)
        if i + 1 == erased:
            fold.apply({"seq": env["seq"], "type": "log.erased", "session": None, "data": {"sessions": ["s"]}})
    return fold


def _reference(envelopes: list[dict[str, Any]]) -> tuple[list[int], list[Any], bool]:
    """What the reference fold answers: the active messages' ids, their items, and whether the
    session is gone (created, then deleted; or erased)."""
    fold = _folded(envelopes)
    erased = sum(1 for e in envelopes if e.get("erased"))
    messages = fold.get_messages("s")
    ever = erased > 0 or any(e["type"] == "session.created" for e in envelopes)
    return [m["id"] for m in messages], [message_to_item(m) for m in messages], ever and not fold.is_live("s")


@settings(max_examples=400, deadline=None)
@given(_streams(), st.integers(0, 14))
def test_the_adapters_fold_of_a_stream_is_the_reference_folds_answer(envelopes: list[dict[str, Any]],
                                                                     cut: int) -> None:
    ids, items, gone = _reference(envelopes)
    whole = openai_agents._fold_stream(None, envelopes, None)
    in_two = openai_agents._fold_stream(openai_agents._fold_stream(None, envelopes[:cut], None), envelopes[cut:], None)
    for h in (whole, in_two):
        assert h.ids == ids
        assert [None if b is None else orjson.loads(b) for b in h.items] == items
        assert h.gone == gone
        assert h.version == len(envelopes) and h.last == (envelopes[-1]["seq"] if envelopes else 0)
        assert h.size == sum(16 + len(b or b"") for b in h.items)


@settings(max_examples=400, deadline=None)
@given(_streams(), st.integers(1, 14))
def test_a_tail_of_the_stream_gives_the_reference_folds_answer_or_says_where_to_begin(
        envelopes: list[dict[str, Any]], floor: int) -> None:
    """The tail after ``floor``, of a session live at ``floor``: its active messages are the
    fold's above the floor, or _Unknown names a lower floor to begin at."""
    if not _folded([e for e in envelopes if e["seq"] <= floor]).is_live("s"):
        return  # the tail is read only past a seq where the projections saw the session live
    ids, items, gone = _reference(envelopes)
    while floor > 0:
        try:
            h = openai_agents._fold_stream(None, [e for e in envelopes if e["seq"] > floor], None, floor)
            break
        except openai_agents._Unknown as e:
            assert e.floor < floor
            floor = e.floor
    else:
        return  # the whole stream: the test above
    above = [i for i, m in enumerate(ids) if m > floor]
    assert h.ids == [ids[i] for i in above]
    assert [None if b is None else orjson.loads(b) for b in h.items] == [items[i] for i in above]
    assert h.gone == gone and h.floor == (floor if h.live else 0)


def test_items_written_by_other_writers_and_rewinds_in_the_log_read_as_the_store_reads_them(tmp_path: Path) -> None:
    s = EventlogSession("mixed", home=tmp_path)
    run(s.add_items([user("a"), user("b")]))
    with SessionStore.open(tmp_path) as store:
        ids = [m["id"] for m in store.get_messages("mixed")]
        store.append_message("mixed", "assistant", "not an item")  # `eventlog messages add`
        store.rewind("mixed", ids[1])  # b and the plain message leave the history
        store.append_messages("mixed", [item_to_message(user("c"))])
        expected = [message_to_item(m) for m in store.get_messages("mixed")]
    assert run(s.get_items()) == [i for i in expected if i is not None] == [user("a"), user("c")]
    fresh = EventlogSession("mixed", home=tmp_path)
    assert run(fresh.get_items()) == [user("a"), user("c")]
    s.close()
    fresh.close()


# ---------------------------------------------------------------- a lease holder in another process

HOLD_LEASE = """
import sys, time
from pathlib import Path
from projections.lease import Lease
lease = Lease(Path(sys.argv[1]))
assert lease.acquire(timeout=5)
print('HELD', flush=True)
time.sleep(120)
"""


def _holder(home: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LEASE, str(home / "profiles" / "default")],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
    return holder


def test_a_stopped_projection_lease_holder_never_hides_acknowledged_items(tmp_path: Path) -> None:
    """helper-43's repro, small: B reads, the lease holder (a rebuild) is stopped, A adds "turn 2"
    (acknowledged). B's read then answered from the projections as they stood and cached that
    under the log's current version: "turn 2" stayed hidden after the holder finished, and B's
    pop returned "turn 1" and hid both. Read from the log, B sees what A added."""
    a, b = EventlogSession("chat", home=tmp_path), EventlogSession("chat", home=tmp_path)
    run(a.add_items([user("turn 1")]))
    assert contents(run(b.get_items())) == ["turn 1"]
    holder = _holder(tmp_path)
    try:
        holder.send_signal(signal.SIGSTOP)
        run(a.add_items([user("turn 2")]))
        assert contents(run(b.get_items())) == ["turn 1", "turn 2"]
        assert read_once(tmp_path, "chat") == ["turn 1", "turn 2"]
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    assert contents(run(b.get_items())) == ["turn 1", "turn 2"]
    assert run(b.pop_item()) == user("turn 2")
    assert read_once(tmp_path, "chat") == ["turn 1"]
    with SessionStore.open(tmp_path) as store:
        assert [m["content"] for m in store.get_messages("chat")] == ["turn 1"]
        assert store.log.verify().ok
    a.close()
    b.close()


def test_a_pop_while_the_lease_holder_is_stopped_takes_the_latest_item(tmp_path: Path) -> None:
    """The rewind is appended at the stream version the log was read at, with no check on the
    projections (whose stale copy does not know the latest item: NotFoundError before)."""
    a = EventlogSession("chat", home=tmp_path)
    run(a.add_items([user("one")]))
    holder = _holder(tmp_path)
    try:
        holder.send_signal(signal.SIGSTOP)
        run(a.add_items([user("two")]))
        b = EventlogSession("chat", home=tmp_path)
        assert run(b.pop_item()) == user("two")
        assert contents(run(a.get_items())) == contents(run(b.get_items())) == ["one"]
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    with SessionStore.open(tmp_path) as store:
        assert [m["content"] for m in store.get_messages("chat")] == ["one"]
    a.close()
    b.close()


def test_a_read_never_waits_for_a_running_lease_holder(tmp_path: Path) -> None:
    """While another process holds the projector lease and runs (`eventlog rebuild` of a large
    profile), a new object's get_items waited for it — 20 s on a 480k-event profile, then
    ProjectionError after 30 s — although its items were in the log (helper-43)."""
    a = EventlogSession("chat", home=tmp_path)
    run(a.add_items([user("hello")]))
    holder = _holder(tmp_path)
    try:
        run(a.add_items([user("hi")]))  # this process's write, which the projections do not hold
        started = time.monotonic()
        got = read_once(tmp_path, "chat")
        took = time.monotonic() - started
        assert got == ["hello", "hi"] and took < 3, took
        b = EventlogSession("chat", home=tmp_path)
        assert run(b.pop_item()) == user("hi") and contents(run(b.get_items())) == ["hello"]
        assert time.monotonic() - started < 6
    finally:
        holder.kill()
        holder.wait()
    a.close()
    b.close()


# ---------------------------------------------------------------- a new object per request

def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many stream events each read_session of the log yields (one entry per call)."""
    from eventlog.log.lmdb import EventLog

    counts: list[int] = []
    real = EventLog.read_session

    def read_session(self: EventLog, session_id: str, *, after: int = 0) -> Any:
        counts.append(0)
        for env in real(self, session_id, after=after):
            counts[-1] += 1
            yield env

    monkeypatch.setattr(EventLog, "read_session", read_session)
    return counts


def test_a_new_object_reads_only_what_the_process_has_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server makes a new session object per request: each read the whole stream again
    (get_items(limit=10) on 20,000 items: 400-560 ms, helper-43). The process keeps the latest
    history per session: a new object reads the stream's events after it — none when nothing
    changed — and still sees every write, its own process's or another's."""
    w = EventlogSession("long", home=tmp_path)
    for b in range(4):
        run(w.add_items([user(f"{b}-{i}") for i in range(50)]))
    counts = _counting_reads(monkeypatch)
    fresh = EventlogSession("long", home=tmp_path)
    assert contents(run(fresh.get_items(limit=3))) == ["3-47", "3-48", "3-49"]
    assert sum(counts) == 0
    fresh.close()
    with SessionStore.open(tmp_path) as store:  # another writer: a rewind and a message
        store.rewind("long", store.get_messages("long")[-1]["id"])
        store.append_messages("long", [item_to_message(user("late"))])
    counts.clear()
    fresh = EventlogSession("long", home=tmp_path)
    assert contents(run(fresh.get_items(limit=3))) == ["3-47", "3-48", "late"]
    assert sum(counts) == 2
    assert len(run(fresh.get_items())) == 200
    fresh.close()
    w.close()


def test_a_cold_read_with_a_limit_reads_only_the_streams_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first read of a session in a process (nothing shared yet) with a limit reads the
    stream from its end back only as far as the items asked for — and gives what the whole
    stream gives, across pops, clears, other writers' rewinds and deletions."""
    w = EventlogSession("tail", home=tmp_path)
    for b in range(6):
        run(w.add_items([user(f"{b}-{i}") for i in range(100)]))
    run(w.pop_item())
    run(w.add_items([user("after the pop")]))

    def cold(limit: int | None) -> list[Any]:
        monkeypatch.setattr(openai_agents, "_HISTORIES", openai_agents._Histories())
        w._open().sync()  # the projections, which say how far back the session was live, are current
        s = EventlogSession("tail", home=tmp_path)
        try:
            return contents(run(s.get_items(limit)))
        finally:
            s.close()

    counts = _counting_reads(monkeypatch)
    whole = cold(None)
    assert len(whole) == 600 and whole[-2:] == ["5-98", "after the pop"]
    for limit in (1, 5, 40, 300, 600, 1000):
        counts.clear()
        assert cold(limit) == whole[-limit:]
        assert limit > 40 or sum(counts) < 300, (limit, counts)  # a few hundred seqs back, not 600 items
    run(w.clear_session())  # a rewind from the very first message: every later one hides
    run(w.add_items([user("fresh start")]))
    for limit in (1, 2, 10):
        assert cold(limit) == ["fresh start"]
    with SessionStore.open(tmp_path) as store:
        store.delete_session("tail")
    for limit in (1, 10):
        assert cold(limit) == []
    w.close()


def test_the_shared_histories_stay_within_their_budget_and_forget_erased_sessions(tmp_path: Path) -> None:
    saved = openai_agents._HISTORIES
    openai_agents._HISTORIES = shared = openai_agents._Histories(budget=4000)
    try:
        sessions = [EventlogSession(f"s{i}", home=tmp_path) for i in range(6)]
        for s in sessions:
            run(s.add_items([user("x" * 300) for _ in range(3)]))
        assert 0 < shared._bytes <= 4000 and len(shared._entries) < 6
        run(sessions[-1].clear_session(erase=True))  # a new erase mark: what was read before goes
        assert all(h.mark == sessions[-1]._history.mark for _, h in shared._entries.values())  # type: ignore[union-attr]
        assert read_once(tmp_path, "s0") == ["x" * 300] * 3
        for s in sessions:
            s.close()
    finally:
        openai_agents._HISTORIES = saved


def test_a_profile_opened_anew_at_a_freed_address_starts_with_no_erase_mark() -> None:
    """Profiles are told apart by identity (held weakly): a new one that CPython puts where a
    closed one was must not inherit its erase mark, which refused every history read under a
    lower one."""
    import weakref

    class Profile:
        pass

    gone, new = Profile(), Profile()
    shared = openai_agents._Histories()
    shared._marks[id(new)] = (weakref.ref(gone), 500)  # as if ``gone`` had lived at ``new``'s address
    h = openai_agents._fold_stream(None, [], 0)
    shared.put(new, "s", h)
    assert shared.get(new, "s", 0) is h


# ---------------------------------------------------------------- the event loop

def test_items_are_converted_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 6 MB tool output kept the loop busy 581 ms in item_to_message (helper-43): the items
    are converted in the worker thread, and a refused one is named as before."""
    import threading

    from eventlog.errors import ValidationError

    threads: list[int] = []
    real = openai_agents.item_to_message

    def spy(item: Any, index: int = 0) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return real(item, index)

    monkeypatch.setattr(openai_agents, "item_to_message", spy)

    async def go() -> int:
        s = EventlogSession("loop", home=tmp_path)
        await s.add_items([user("x"), {"type": "function_call_output", "call_id": "c", "output": [{"b": 1, "a": 2}]}])
        with pytest.raises(ValidationError) as refused:
            await s.add_items([user("ok"), {"role": "user", "content": float("nan")}])
        assert refused.value.field.startswith("items[1]")
        assert contents(await s.get_items()) == ["x", None]
        s.close()
        return threading.get_ident()

    loop_thread = run(go())
    assert threads and loop_thread not in threads

"""EventlogSaver's copy of each thread's latest checkpoints (eventlog/adapters/langgraph/latest.py):
what get_tuple serves from it equals what the read model (and a rebuild of it from the log)
holds, through every kind of write; another writer's event makes it stale at once."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from test_adapter_langgraph import cfg

from eventlog.adapters import _shared
from eventlog.adapters.langgraph import EventlogSaver
from eventlog.adapters.langgraph import model as lg_model
from eventlog.errors import ValidationError

ROOT = Path(__file__).resolve().parent.parent


def _checkpoint(cid: str, values: dict[str, Any], versions: dict[str, Any]) -> Any:
    cp = empty_checkpoint()
    cp["id"] = cid
    cp["channel_values"] = values
    cp["channel_versions"] = versions
    return cp


def _view(t: Any) -> Any:
    return None if t is None else (t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)


def _from_read_model(s: EventlogSaver, thread: str, ns: str, cid: str | None = None) -> Any:
    """What the read model answers (``list`` never uses the copy)."""
    found = list(s.list(cfg(thread, ns, cid), limit=1))
    return _view(found[0]) if found else None


def _copy_version(s: EventlogSaver, thread: str) -> int | None:
    copy = s._copies.get(lg_model.thread_session(thread))
    return None if copy is None else copy.version


def _random_ops(s: EventlogSaver, rng: random.Random, threads: list[str], n: int) -> int:
    """``n`` random writes and reads; checks every get_tuple against the read model; returns how
    many get_tuple calls the copy answered (the stream version it holds was current)."""
    served = 0
    ids = [f"{k:04d}" for k in range(12)]
    counter = iter(range(100, 10_000))

    def pick() -> str:
        """Mostly the next new id (LangGraph's ids grow), sometimes an older or a used one; the
        next id is also given to writes before its checkpoint is stored, as LangGraph may do."""
        r = rng.random()
        if r < 0.4:
            return f"{next(counter):04d}"
        if r < 0.6:
            return f"{int(max(ids)) + 1:04d}"
        return rng.choice(ids)

    for _ in range(n):
        thread, ns = rng.choice(threads), rng.choice(["", "", "child:1"])
        op = rng.random()
        if op < 0.45:
            cid = pick()  # older, equal and newer ids than the latest, in any order
            ids.append(cid)
            channels = rng.sample(["a", "b", "c"], rng.randint(0, 3))
            versions = {ch: rng.choice([1, 2, 3, "x", 2.5]) for ch in channels}
            values = {ch: rng.choice(["v", b"\x00raw", [1, {"k": None}], 7]) for ch in channels
                      if rng.random() < 0.8}
            new = {ch: v for ch, v in versions.items() if rng.random() < 0.7}
            parent = rng.choice([None, rng.choice(ids)])
            s.put(cfg(thread, ns, parent), _checkpoint(cid, values, versions),
                  {"step": rng.randint(-1, 5), "run_id": rng.choice(["r1", "r2"])}, new)
        elif op < 0.75:
            writes = [(rng.choice(["a", "b", "__error__", "__interrupt__"]), rng.choice(["w", 1, None]))
                      for _ in range(rng.randint(1, 3))]
            s.put_writes(cfg(thread, ns, pick()), writes, rng.choice(["t1", "t2"]), rng.choice(["", "p"]))
        elif op < 0.78:
            s.prune([thread], strategy=rng.choice(["keep_latest", "delete"]))
        elif op < 0.80:
            s.delete_for_runs([rng.choice(["r1", "r2"])])
        elif op < 0.81:
            s.copy_thread(thread, rng.choice(threads))
        elif op < 0.82:
            s.delete_thread(thread)
        else:
            cid = rng.choice([None, None, rng.choice(ids), pick()])
            before = _copy_version(s, thread)
            current = s._open().version(lg_model.thread_session(thread))
            got = _view(s.get_tuple(cfg(thread, ns, cid)))
            if before is not None and before == current:
                served += 1
            assert got == _from_read_model(s, thread, ns, cid), (thread, ns, cid)
    return served


@pytest.mark.parametrize("seed", range(4))
def test_what_the_copy_serves_equals_the_read_model_and_its_rebuild(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    threads = ["t1", "t2", "with space"]
    with EventlogSaver(home=tmp_path) as s:
        served = _random_ops(s, rng, threads, 400)
        assert served > 10  # the copy answered reads, so the comparison above tested it
        latest = {(t, ns): _view(s.get_tuple(cfg(t, ns))) for t in threads for ns in ("", "child:1")}
        assert latest == {(t, ns): _from_read_model(s, t, ns) for t in threads for ns in ("", "child:1")}
        s._open().rebuild()
        assert latest == {(t, ns): _view(s.get_tuple(cfg(t, ns))) for t in threads for ns in ("", "child:1")}
        assert latest == {(t, ns): _from_read_model(s, t, ns) for t in threads for ns in ("", "child:1")}


def test_a_graph_turn_reads_its_own_writes_from_the_copy(tmp_path: Path) -> None:
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    def bot(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="echo " + str(state["messages"][-1].content))]}

    builder = StateGraph(MessagesState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    with EventlogSaver(home=tmp_path) as s:
        graph = builder.compile(checkpointer=s)
        config = {"configurable": {"thread_id": "chat"}}
        for i in range(5):
            graph.invoke({"messages": [("user", f"turn {i}")]}, config)
            store = s._open()
            assert _copy_version(s, "chat") == store.version("lg:chat")  # the turn's writes carried it along
            assert _view(s.get_tuple(config)) == _from_read_model(s, "chat", "")
        assert len(graph.get_state(config).values["messages"]) == 10


def test_another_savers_write_makes_the_copy_stale_at_once(tmp_path: Path) -> None:
    with EventlogSaver(home=tmp_path) as a, EventlogSaver(home=tmp_path) as b:
        a.put(cfg("t"), _checkpoint("0001", {"x": "a"}, {"x": 1}), {"step": 0}, {"x": 1})
        assert a.get_tuple(cfg("t")).checkpoint["channel_values"] == {"x": "a"}
        version = _copy_version(a, "t")
        assert version is not None
        b.put(cfg("t"), _checkpoint("0002", {"x": "b"}, {"x": 2}), {"step": 1}, {"x": 2})
        assert a.get_tuple(cfg("t")).checkpoint["channel_values"] == {"x": "b"}
        # a's next write meets b's event: its expected version fails, it is appended anyway
        a.put_writes(cfg("t", checkpoint_id="0002"), [("x", "w")], "task")
        assert a.get_tuple(cfg("t")).pending_writes == [("task", "x", "w")]
        assert b.get_tuple(cfg("t")).pending_writes == [("task", "x", "w")]


def test_another_processs_write_makes_the_copy_stale_at_once(tmp_path: Path) -> None:
    child = textwrap.dedent(f"""
        from langgraph.checkpoint.base import empty_checkpoint
        from eventlog.adapters.langgraph import EventlogSaver
        with EventlogSaver(home={str(tmp_path)!r}) as s:
            cp = empty_checkpoint()
            cp["id"] = "0002"
            cp["channel_values"] = {{"who": "child"}}
            cp["channel_versions"] = {{"who": 2}}
            s.put({{"configurable": {{"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "0001"}}}}, cp,
                  {{"step": 1}}, {{"who": 2}})
        print("ok")
    """)
    with EventlogSaver(home=tmp_path) as s:
        s.put(cfg("t"), _checkpoint("0001", {"who": "parent"}, {"who": 1}), {"step": 0}, {"who": 1})
        assert s.get_tuple(cfg("t")).checkpoint["channel_values"] == {"who": "parent"}
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
        got = s.get_tuple(cfg("t"))
        assert got is not None and got.checkpoint["channel_values"] == {"who": "child"}
        assert got.parent_config == cfg("t", checkpoint_id="0001")


def test_a_thread_event_outside_its_threads_stream_is_refused(tmp_path: Path) -> None:
    with EventlogSaver(home=tmp_path) as s:
        store = s._open()
        head = store.log.head()[0]
        with pytest.raises(ValidationError) as e:
            _shared.append_events(store, [{"type": "langgraph.thread_deleted", "session": "lg:other",
                                           "data": {"thread_id": "t"}}])
        assert e.value.field == "events[0].data.thread_id"
        assert store.log.head()[0] == head


def test_writes_stored_before_their_checkpoint_are_in_the_copy(tmp_path: Path) -> None:
    """LangGraph may store a task's writes before the checkpoint they belong to (both run in its
    background executor): the copy keeps them for when the checkpoint arrives."""
    with EventlogSaver(home=tmp_path) as s:
        assert s.get_tuple(cfg("t")) is None  # establishes the copy: no checkpoint yet
        s.put(cfg("t"), _checkpoint("0001", {"x": "a"}, {"x": 1}), {"step": 0}, {"x": 1})
        s.put_writes(cfg("t", checkpoint_id="0002"), [("x", "early"), ("__error__", "e")], "task", "p")
        s.put(cfg("t", checkpoint_id="0001"), _checkpoint("0002", {"x": "b"}, {"x": 2}), {"step": 1}, {"x": 2})
        version = _copy_version(s, "t")
        assert version is not None and version == s._open().version("lg:t")  # the copy is current
        got = _view(s.get_tuple(cfg("t")))
        assert got == _from_read_model(s, "t", "")
        assert got[4] == [("task", "__error__", "e"), ("task", "x", "early")]


def test_concurrent_writes_to_one_thread_share_appends_and_each_gets_its_own_answer(tmp_path: Path) -> None:
    """Writes to one thread queued behind an append in flight go to the log as one batch
    (combine.py); every caller returns after its own events are durable, and an invalid write
    fails alone."""
    import threading

    with EventlogSaver(home=tmp_path) as s:
        s.put(cfg("t"), _checkpoint("0001", {"x": "a"}, {"x": 1}), {"step": 0}, {"x": 1})
        s.get_tuple(cfg("t"))
        store = s._open()
        commits_before, head_before = store.log._core.commits, store.log.head()[0]
        errors: list[BaseException] = []
        done: list[int] = []
        start = threading.Barrier(17)
        # The first append is held until the other writers are queued behind it (at most 30 s),
        # so that their sharing a commit does not depend on the machine's scheduling.
        combiner = s._combiner
        real_append, held = combiner._append, threading.Event()

        def held_append(sid: str, batch: list[Any]) -> None:
            if not held.is_set():
                held.set()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    with combiner._mu:
                        if len(combiner._queues.get(sid, ())) >= 15:
                            break
                    time.sleep(0.005)
            real_append(sid, batch)

        combiner._append = held_append

        def write(k: int) -> None:
            start.wait()
            try:
                if k == 16:  # refused by the serializer's output check: a channel name that is not a string
                    s.put_writes(cfg("t", checkpoint_id="0001"), [(7, "bad")], f"task-{k}")  # type: ignore[list-item]
                else:
                    s.put_writes(cfg("t", checkpoint_id="0001"), [("x", k)], f"task-{k}")
                done.append(k)
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=write, args=(k,)) for k in range(17)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(done) == list(range(16)) and len(errors) == 1 and isinstance(errors[0], ValidationError)
        assert store.log.head()[0] == head_before + 16  # every valid write durable, the bad one not at all
        assert store.log._core.commits - commits_before < 16  # some of them shared a commit
        got = s.get_tuple(cfg("t"))
        assert got is not None and sorted(got.pending_writes) == sorted((f"task-{k}", "x", k) for k in range(16))
        assert _view(got) == _from_read_model(s, "t", "")
        assert _copy_version(s, "t") == store.version("lg:t")


def test_the_combiner_batches_queued_writes_and_refuses_an_invalid_one_alone() -> None:
    import threading

    from eventlog.adapters.langgraph.combine import Combiner, Request

    first_in_flight, release = threading.Event(), threading.Event()
    appended: list[list[str]] = []

    def append(sid: str, batch: list[Request]) -> None:
        names = [e["name"] for r in batch for e in r.events]
        if any(n.startswith("bad") for n in names):  # the log refuses the whole batch, naming the event
            raise ValidationError(f"events[{[n.startswith('bad') for n in names].index(True)}].data", "bad")
        if not appended:
            first_in_flight.set()
            release.wait(10)  # the first append "syncs" while the others queue behind it
        appended.append(names)

    c = Combiner(append)
    errors: dict[str, BaseException] = {}

    def write(name: str) -> None:
        try:
            c.write("s", [{"name": name}], None)
        except ValidationError as e:
            errors[name] = e

    first = threading.Thread(target=write, args=("first",))
    first.start()
    assert first_in_flight.wait(10)
    others = [threading.Thread(target=write, args=(n,)) for n in ("a", "bad", "b", "c")]
    for t in others:
        t.start()
    while len(c._queues["s"]) < 4:  # all four queued behind the append in flight
        threading.Event().wait(0.001)
    release.set()
    for t in [first, *others]:
        t.join()
    assert appended[0] == ["first"]
    # the batch failed; the write it named went alone (and failed), the others again as one batch
    assert appended[1:] == [["a", "b", "c"]]
    assert list(errors) == ["bad"]
    assert "s" not in c._queues  # nothing left in flight


def test_the_saver_asks_for_no_follower_unless_told_and_reads_still_see_every_write(tmp_path: Path) -> None:
    from eventlog import SessionStore

    with EventlogSaver(home=tmp_path) as s:
        s.put(cfg("t"), _checkpoint("0001", {"x": "a"}, {"x": 1}), {"step": 0}, {"x": 1})
        store = s._open()
        assert store._core.followers == 0 and not store._need_projector().following
        assert [t.checkpoint["channel_values"] for t in s.list(cfg("t"))] == [{"x": "a"}]  # caught up by the read
        with SessionStore.open(tmp_path) as app:  # an application's own handle brings the follower
            assert store._core.followers == 1
            assert app.get_session("lg:t") is not None
    with EventlogSaver(home=tmp_path, follower=True) as s:
        assert s._open()._core.followers == 1

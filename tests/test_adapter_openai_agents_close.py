"""close() while calls are running: of an EventlogSession, and of the LMDB log underneath.

An outside audit (helper-43) closed a session while its own add_items/pop_item calls ran: they
failed with StorageError "append failed: OSError(9, 'Bad file descriptor')", "Attempt to operate
on closed/deleted/dropped object", once a 10 s stall ending in WriterBusyError naming its own
pid — the store's last handle closed the LMDB environment under a commit in another thread
(undefined behaviour: a descriptor number reused meanwhile gets the commit's pages). Now a
session gives its store back when its last running call ends, and the log never closes its
environment under a transaction of its process: every call either completes or raises
ClosedError, and what completed is in the log.
"""
from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eventlog import SessionStore
from eventlog.adapters import _shared
from eventlog.adapters.openai_agents import EventlogSession
from eventlog.errors import ClosedError
from eventlog.log import lmdb as lmdb_log
from eventlog.log.lmdb import EventLog
from eventlog.sessions.events import make_event


def user(text: str, pad: int = 0) -> dict[str, Any]:
    item: dict[str, Any] = {"role": "user", "content": text}
    if pad:
        item["pad"] = "x" * pad
    return item


@pytest.fixture(autouse=True)
def _no_store_left_open() -> Any:
    yield
    from eventlog.sessions import store as store_module

    assert store_module._shared == {}  # every session closed: the profile's store went with the last


def test_a_call_running_when_the_session_closes_completes_and_the_store_goes_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inside, go_on = threading.Event(), threading.Event()
    real = SessionStore.append_messages

    def held(self: SessionStore, *a: Any, **k: Any) -> Any:
        inside.set()
        assert go_on.wait(10)
        return real(self, *a, **k)

    async def main() -> None:
        s = EventlogSession("chat", home=tmp_path)
        await s.add_items([user("first")])
        store = s._store
        assert store is not None
        monkeypatch.setattr(SessionStore, "append_messages", held)
        task = asyncio.create_task(s.add_items([user("in flight")]))
        while not inside.is_set():
            await asyncio.sleep(0.005)
        s.close()
        assert _shared.references(store) == 1  # still in use by the running call
        with pytest.raises(ClosedError):
            await s.get_items()  # a call after close
        go_on.set()
        await task  # the running call completes
        assert _shared.references(store) == 0
        monkeypatch.setattr(SessionStore, "append_messages", real)

    asyncio.run(main())
    with SessionStore.open(tmp_path) as store:
        assert [m["content"] for m in store.get_messages("chat")] == ["first", "in flight"]


def test_closing_a_session_under_running_adds_and_pops_gives_done_or_closed_never_storage_errors(
        tmp_path: Path) -> None:
    """helper-43's hammer, small: each round starts adds (up to 200 KB each) and a pop, then
    closes the session after a random pause."""
    outcomes: dict[str, str] = {}

    async def one(seed: int) -> None:
        rnd = random.Random(seed)
        s = EventlogSession(f"h{seed}", home=tmp_path)
        await s.add_items([user(f"{seed}-first")])
        tags = [f"{seed}-{i}" for i in range(5)]
        adds = [asyncio.create_task(s.add_items([user(t, rnd.randint(0, 200_000))])) for t in tags]
        pop = asyncio.create_task(s.pop_item())
        await asyncio.sleep(rnd.random() * 0.03)
        s.close()
        for tag, r in zip(tags + ["pop"], await asyncio.gather(*adds, pop, return_exceptions=True)):
            ok = not isinstance(r, BaseException)
            assert ok or isinstance(r, ClosedError), repr(r)
            outcomes[tag if tag != "pop" else f"{seed}-pop"] = "done" if ok else "closed"

    async def main() -> None:
        for seed in range(25):
            await one(seed)

    asyncio.run(main())
    assert "done" in outcomes.values()
    with SessionStore.open(tmp_path) as store:
        assert store.log.verify().ok
        written = {m["content"] for sid in (f"h{seed}" for seed in range(25))
                   for m in store.get_messages(sid, include_inactive=True)}
    for tag, outcome in outcomes.items():
        if not tag.endswith("-pop"):
            assert (tag in written) == (outcome == "done"), tag


# ---------------------------------------------------------------- the log itself

def _message(tag: str) -> dict[str, Any]:
    return {"type": "message.appended", "session": "s", "id": f"id-{tag}", "data": {"role": "user", "content": tag}}


def test_the_last_handle_closing_waits_for_a_commit_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append whose group is being committed when another thread closes the last handle:
    the close waits for the commit, and the append is in the log."""
    log = EventLog.open(tmp_path / "log", profile="p")
    log.append([make_event("session.created", "s", {})])
    inside, go_on = threading.Event(), threading.Event()
    real = lmdb_log._Environment._write_group

    def held(self: Any, group: Any) -> None:
        inside.set()
        assert go_on.wait(10)
        real(self, group)

    monkeypatch.setattr(lmdb_log._Environment, "_write_group", held)
    result: list[Any] = []
    appender = threading.Thread(target=lambda: result.append(_outcome(log, "committing")))
    appender.start()
    assert inside.wait(10)
    closer = threading.Thread(target=log.close)
    closer.start()
    time.sleep(0.2)
    assert closer.is_alive()  # not while the commit is in progress
    go_on.set()
    appender.join(10)
    closer.join(10)
    assert not closer.is_alive() and result == ["done"]
    monkeypatch.setattr(lmdb_log._Environment, "_write_group", real)
    with EventLog.open(tmp_path / "log", profile="p") as again:
        assert [e["data"]["content"] for e in again.read() if e["type"] == "message.appended"] == ["committing"]
        assert again.verify().ok


def _outcome(log: EventLog, tag: str) -> str:
    try:
        log.append([_message(tag)])
        return "done"
    except ClosedError:
        return "closed"
    except Exception as e:  # noqa: BLE001 - the test reports any other kind
        return f"{type(e).__name__}: {e}"


def test_appends_from_threads_while_the_last_handle_closes_complete_or_raise_closed(tmp_path: Path) -> None:
    """Six threads append (with group commit) while the main thread closes the last handle at a
    random moment: each append is done (and in the log after reopening) or ClosedError (and not
    in the log); never StorageError, never a hang; the chain verifies."""
    rnd = random.Random(7)
    seen: set[str] = set()
    for round_ in range(12):
        path = tmp_path / f"log{round_}"
        log = EventLog.open(path, profile="p")
        log.append([make_event("session.created", "s", {})])
        outcomes: dict[str, str] = {}
        start = threading.Barrier(7)

        def worker(i: int) -> None:
            start.wait()
            for j in range(40):
                outcomes[f"{i}-{j}"] = _outcome(log, f"{i}-{j}")

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(rnd.random() * 0.03)
        closer = threading.Thread(target=log.close, daemon=True)
        closer.start()
        closer.join(30)
        for t in threads:
            t.join(30)
        assert not closer.is_alive() and not any(t.is_alive() for t in threads), "hung"
        odd = {k: v for k, v in outcomes.items() if v not in ("done", "closed")}
        assert not odd, odd
        with EventLog.open(path, profile="p") as again:
            present = {e["data"]["content"] for e in again.read() if e["type"] == "message.appended"}
            assert again.verify().ok
        assert present == {k for k, v in outcomes.items() if v == "done"}
        seen.update(outcomes.values())
    assert seen == {"done", "closed"}  # the closes landed among the appends

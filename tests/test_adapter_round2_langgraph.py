"""Second-round outside audit of EventlogSaver (helper-56).

``prune`` and ``delete_for_runs`` append one event per thread, several threads' streams in one
batch, which no stream version can check. An erase that landed between the read model showing
a thread and that append (another process in a loop: 3 threads of 20) left a live event in the
erased stream, whose data names the thread id — the words an erase promises to take out of
every file (a hashed thread id is nowhere else in the log).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from eventlog import SessionStore
from eventlog.adapters.langgraph import EventlogSaver, model

THREAD = "alice@example.com: taxes"  # not an eventlog id: its session id is a hash


def _put(saver: EventlogSaver, thread: str, k: int, run: str) -> None:
    cp = empty_checkpoint()
    cp["id"], cp["channel_versions"], cp["channel_values"] = f"{k:03d}", {"a": str(k)}, {"a": k}
    saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, cp, {"run_id": run}, {"a": str(k)})


@pytest.mark.parametrize("call", [
    lambda s: s.prune([THREAD, "other"], strategy="keep_latest"),
    lambda s: s.prune([THREAD, "other"], strategy="delete"),
    lambda s: s.delete_for_runs(["r1"]),
], ids=["prune keep_latest", "prune delete", "delete_for_runs"])
def test_an_erase_between_the_read_and_the_append_leaves_nothing_live_in_the_stream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: Callable[[EventlogSaver], None]) -> None:
    saver = EventlogSaver(home=tmp_path)
    for thread in (THREAD, "other"):
        for k in range(3):
            _put(saver, thread, k, "r1" if k < 2 else "r2")
    real = EventlogSaver._threads_where_in

    def read_then_erase(self: EventlogSaver, *args: Any, **kwargs: Any) -> set[str]:
        found = real(self, *args, **kwargs)  # the read model shows the thread...
        with SessionStore.open(tmp_path) as other:  # ...and an erase lands before the append
            other.erase_session(model.thread_session(THREAD), "the user asked")
        return found

    monkeypatch.setattr(EventlogSaver, "_threads_where_in", read_then_erase)
    try:
        call(saver)
        monkeypatch.undo()
        with SessionStore.open(tmp_path) as store:
            stream = list(store.log.read_session(model.thread_session(THREAD)))
            assert stream and all(env.get("erased") for env in stream)
            assert THREAD not in str(list(store.log.read(1)))  # nowhere in the log
            assert {"langgraph.thread_pruned", "langgraph.runs_deleted"} & {
                e["type"] for e in store.log.read_session("lg:other")}  # the other thread: done as asked
        assert len(list(saver.list({"configurable": {"thread_id": "other"}}))) < 3
    finally:
        saver.close()

"""A cancelled or timed-out async saver call (outside audit, helper-67): the CancelledError is
raised only once the call's worker thread has finished, so the thread's state is decided when
the caller sees it -- a write cancelled and then followed by ``adelete_thread`` (the natural
clean-up after ``asyncio.wait_for`` timed out a graph run) used to land after the deletion and
bring the thread back."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from eventlog.adapters import _shared
from eventlog.adapters.langgraph import EventlogSaver


def _checkpoint(saver: EventlogSaver) -> dict[str, Any]:
    c = empty_checkpoint()
    c["channel_values"] = {"n": 1}
    c["channel_versions"] = {"n": saver.get_next_version(None, None)}
    return dict(c)


Held = tuple[threading.Event, threading.Event, threading.Event]


@pytest.fixture
def held_append(monkeypatch: pytest.MonkeyPatch) -> Held:
    """The saver's next append waits in its worker thread until ``gate`` is set (``entered`` says
    it got there, ``left`` that it returned): a cancellation then always lands while the write is
    running."""
    entered, gate, left = threading.Event(), threading.Event(), threading.Event()
    real = _shared.append_events

    def held(*args: Any, **kwargs: Any) -> list[int]:
        if entered.is_set():
            return real(*args, **kwargs)
        entered.set()
        gate.wait(30)
        try:
            return real(*args, **kwargs)
        finally:
            left.set()

    monkeypatch.setattr(_shared, "append_events", held)
    return entered, gate, left


@pytest.mark.parametrize("op", ["aput", "aput_writes"])
def test_a_cancelled_write_is_settled_before_the_cancellation_is_raised(
        tmp_path: Path, held_append: Held, op: str) -> None:
    entered, gate, _ = held_append

    async def main() -> None:
        async with EventlogSaver(home=tmp_path / "home") as saver:
            cfg: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
            c = _checkpoint(saver)
            if op == "aput":
                call = saver.aput(cfg, c, {"step": 1}, c["channel_versions"])  # type: ignore[arg-type]
            else:
                entered.set()  # the put goes through
                cfg = await saver.aput(cfg, c, {"step": 1}, c["channel_versions"])  # type: ignore[arg-type]
                entered.clear()
                call = saver.aput_writes(cfg, [("ch", "v")], task_id="task")
            task = asyncio.ensure_future(call)
            await asyncio.to_thread(entered.wait, 30)
            task.cancel()
            for _ in range(50):
                await asyncio.sleep(0)
            settled_early = task.done()
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not settled_early, "the cancellation was raised while the write was still running"
            got = await saver.aget_tuple(cfg)
            assert got is not None and got.checkpoint["id"] == c["id"]
            if op == "aput_writes":
                assert [(w[1], w[2]) for w in got.pending_writes] == [("ch", "v")]
            # and the saver still works
            c2 = _checkpoint(saver)
            await saver.aput(got.config, c2, {"step": 2}, c2["channel_versions"])  # type: ignore[arg-type]
            assert (await saver.aget_tuple({"configurable": {"thread_id": "t1"}})).checkpoint["id"] == c2["id"]  # type: ignore[union-attr]

    asyncio.run(main())


def test_a_write_timed_out_then_the_thread_deleted_stays_deleted(
        tmp_path: Path, held_append: Held) -> None:
    entered, gate, left = held_append

    def release_later() -> None:  # the write takes longer than the caller waits for it
        if entered.wait(30):
            threading.Event().wait(0.3)
            gate.set()

    async def main() -> None:
        async with EventlogSaver(home=tmp_path / "home") as saver:
            cfg: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
            c = _checkpoint(saver)
            threading.Thread(target=release_later, daemon=True).start()
            with pytest.raises((asyncio.TimeoutError, TimeoutError)):
                await asyncio.wait_for(saver.aput(cfg, c, {"step": 1}, c["channel_versions"]), 0.05)  # type: ignore[arg-type]
            await saver.adelete_thread("t1")
            assert await asyncio.to_thread(left.wait, 30)  # the write has returned, whatever it did
            assert await saver.aget_tuple(cfg) is None
            assert [t async for t in saver.alist({"configurable": {"thread_id": "t1"}})] == []

    asyncio.run(main())

"""Pending writes larger together than one event (issue 16, outside audit helper-67): a task's
``put_writes`` whose values add up past the log's 16 MiB event limit, each of them well under
it, was refused whole (EventTooLargeError naming ``events[0].data``, a field the caller never
wrote) and failed the graph run, where LangGraph's own savers store it. It is now appended as
several ``langgraph.writes_put`` events in one atomic batch."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from eventlog.adapters.langgraph import EventlogSaver
from eventlog.errors import EventTooLargeError
from eventlog.sessions.store import SessionStore


def _put(saver: EventlogSaver, thread: str) -> Any:
    c = empty_checkpoint()
    c["channel_values"] = {"n": 1}
    c["channel_versions"] = {"n": saver.get_next_version(None, None)}
    cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(cfg, c, {"step": 1}, c["channel_versions"])  # type: ignore[arg-type]


def test_writes_larger_together_than_one_event_are_stored_whole(tmp_path: Path) -> None:
    home = tmp_path / "home"
    values = [os.urandom(1 << 20) for _ in range(20)]  # 20 MiB raw, ~27 MiB as base64
    with EventlogSaver(home=home) as saver:
        cfg = _put(saver, "t1")
        saver.put_writes(cfg, [(f"ch{i}", v) for i, v in enumerate(values)], task_id="task-1")
        got = saver.get_tuple(cfg)
        assert got is not None
        assert [(t, ch, v) for t, ch, v in got.pending_writes] == [("task-1", f"ch{i}", v) for i, v in enumerate(values)]
        # and again: stored once per (task, idx)
        saver.put_writes(cfg, [(f"ch{i}", v) for i, v in enumerate(values)], task_id="task-1")
    with SessionStore.open(str(home), "default") as store:
        store.rebuild()
    with EventlogSaver(home=home) as saver:
        got = saver.get_tuple(cfg)
        assert got is not None
        assert [v for _, _, v in got.pending_writes] == values
        listed = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "t1"}})]
        assert listed == [cfg["configurable"]["checkpoint_id"]]


def test_one_write_over_the_event_limit_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    with EventlogSaver(home=tmp_path / "home") as saver:
        cfg = _put(saver, "t1")
        with pytest.raises(EventTooLargeError):
            saver.put_writes(cfg, [("small", b"x"), ("big", os.urandom(13 << 20))], task_id="task-1")
        got = saver.get_tuple(cfg)
        assert got is not None and got.pending_writes == []


def test_a_checkpoint_whose_channel_values_outgrow_one_event_is_stored_whole(tmp_path: Path) -> None:
    """The same for ``put``: three channels of 5 MiB each (a state holding documents) were one
    ``checkpoint_put`` of ~20 MiB, refused, where LangGraph's own savers store it."""
    home = tmp_path / "home"
    values = {f"doc{i}": os.urandom(5 << 20) for i in range(3)}
    with EventlogSaver(home=home) as saver:
        c = empty_checkpoint()
        c["channel_values"] = dict(values)
        c["channel_versions"] = {ch: saver.get_next_version(None, None) for ch in values}
        first: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        cfg = saver.put(first, c, {"step": 1}, c["channel_versions"])  # type: ignore[arg-type]
        c2 = empty_checkpoint()  # a child that changes one channel: the others' values stay shared
        c2["channel_values"] = {**values, "doc0": b"small"}
        c2["channel_versions"] = {**c["channel_versions"], "doc0": saver.get_next_version(c["channel_versions"]["doc0"], None)}
        cfg2 = saver.put(cfg, c2, {"step": 2}, {"doc0": c2["channel_versions"]["doc0"]})  # type: ignore[arg-type]
        got = saver.get_tuple(cfg)
        assert got is not None and got.checkpoint["channel_values"] == values
    with SessionStore.open(str(home), "default") as store:
        store.rebuild()
    with EventlogSaver(home=home) as saver:
        listed = {t.checkpoint["id"]: t.checkpoint["channel_values"] for t in saver.list({"configurable": {"thread_id": "t1"}})}
        assert listed == {c["id"]: values, c2["id"]: {**values, "doc0": b"small"}}
        assert cfg2["configurable"]["checkpoint_id"] == c2["id"]

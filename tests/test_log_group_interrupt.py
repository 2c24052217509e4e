"""An exception that is not an Exception (KeyboardInterrupt, or SystemExit from a signal handler's
sys.exit) in the thread leading an LMDB group commit: every other caller of that group is told
the outcome is unknown (OutcomeUnknownError with its event ids, re-appendable idempotently),
never handed seqs as if its events were stored. The leader's `finally` marked the group done and
its callers returned what their requests held (second-round audit, helper-57, on the PostgreSQL
log's group commit of the same shape)."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import OutcomeUnknownError
from eventlog.log import lmdb as lmdb_log
from eventlog.log.lmdb import EventLog


def _event(i: int) -> dict[str, Any]:
    return {"type": "test.note", "data": {"i": i}}


def test_an_interrupted_group_leader_leaves_its_followers_an_unknown_outcome(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    original = lmdb_log._Environment._write_group
    first_in, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def write_group(self: Any, group: list[Any]) -> None:
        calls.append(len(group))
        if len(calls) == 1:  # the first group's leader waits here until two more callers queued
            first_in.set()
            assert release.wait(30)
            return original(self, group)
        if len(group) > 1:  # the second group: its leader is interrupted before its commit
            raise KeyboardInterrupt
        return original(self, group)

    monkeypatch.setattr(lmdb_log._Environment, "_write_group", write_group)
    outcomes: dict[str, Any] = {}
    with EventLog.open(tmp_path / "log") as lg:
        def append(name: str, i: int) -> None:
            try:
                outcomes[name] = lg.append([_event(i)])
            except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is the point
                outcomes[name] = e

        first = threading.Thread(target=append, args=("first", 0))
        first.start()
        assert first_in.wait(30)
        others = [threading.Thread(target=append, args=(n, i)) for i, n in enumerate(("b", "c"), 1)]
        for t in others:
            t.start()
        deadline = time.monotonic() + 30
        core = lg._core  # both queued behind the first group's leader: they make the second group
        while len(core._queue) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        release.set()
        for t in (first, *others):
            t.join(30)
        assert outcomes["first"] == [1]
        kinds = sorted(type(outcomes[n]).__name__ for n in ("b", "c"))
        assert kinds == ["KeyboardInterrupt", "OutcomeUnknownError"], outcomes
        unknown = next(outcomes[n] for n in ("b", "c") if isinstance(outcomes[n], OutcomeUnknownError))
        assert len(unknown.event_ids) == 1
        assert lg.head()[0] == 1  # nothing of the interrupted group was stored
        monkeypatch.setattr(lmdb_log._Environment, "_write_group", original)
        retry = lg.append([{**_event(9), "id": unknown.event_ids[0]}])  # the ids are idempotency keys
        assert retry == [2] and lg.append([{**_event(9), "id": unknown.event_ids[0]}]) == [2]

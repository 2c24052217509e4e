"""A committed append is never reported as failed. After its commit, the PostgreSQL log adopts a
compression dictionary another host trained meanwhile; when loading it failed (the server out of
reach for longer than the reconnect timeout), the StorageError reached the callers of a group
that was stored: they would append it again, under new ids (second-round audit, helper-57). The
adoption now waits for a later commit. The load's failure is injected (a server lost exactly
between the commit and the load cannot be arranged from outside); the commit, the other host's
dictionary and the reads are real."""
from __future__ import annotations

import random
import string
from typing import Any

import pytest

from eventlog.errors import StorageError
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres


def _events(n: int, rng: random.Random) -> list[dict[str, Any]]:
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(400)]
    return [{"type": "test.note", "data": {"text": " ".join(rng.choices(words, k=60)), "n": i}} for i in range(n)]


def test_a_dictionary_that_cannot_be_loaded_after_a_commit_fails_nothing(pg_url: str, pg_profile: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    with PostgresLog.open(pg_url, profile=pg_profile) as a, PostgresLog.open(pg_url, profile=pg_profile) as b:
        a.append(_events(1, rng))  # a knows the log with no dictionary
        b.append(_events(300, rng))
        assert b.train_dictionary() == 1
        loads: list[int] = []

        def unreachable(dict_id: int) -> Any:
            loads.append(dict_id)
            raise StorageError("the server could not be reached again within the reconnect timeout")

        monkeypatch.setattr(a, "_load_dict", unreachable)
        a._cached_head = None  # the usual path: it reads the newest dictionary with the head
        seqs = a.append(_events(1, rng))
        assert loads == [1], "the append did not meet the dictionary another host trained"
        assert seqs == [a.head()[0]] and [e["data"]["n"] for e in a.read(seqs[0], seqs[0])] == [0]
        monkeypatch.undo()
        a._cached_head = None
        a.append(_events(1, rng))
        assert a._compression.current == 1  # adopted at the next commit that could load it

"""The log contract (eventlog.log.contract), run against the in-memory reference log and the LMDB log."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.log import Log, codec
from eventlog.log.contract import JSON_VALUES, Edit, EraseContract, GroupCommitContract, LogContract
from eventlog.log.lmdb import EventLog, generation_dir, seq_key
from eventlog.log.memory import MemoryLog


class TestMemoryLog(LogContract, EraseContract):
    def make_log(self, tmp_path: Path) -> Log:
        return MemoryLog(profile="t")

    def reopen(self, log: Log) -> Log:
        assert isinstance(log, MemoryLog)
        log.close()
        return MemoryLog(profile=log.profile, storage=log.storage)

    def tamper(self, log: Log, edit: Edit) -> Log:
        assert isinstance(log, MemoryLog)
        log.close()
        storage = log.storage
        events = dict(storage.events)
        edit(events)
        storage.events = events
        return MemoryLog(profile=log.profile, storage=storage)


class TestLMDBLog(LogContract, GroupCommitContract, EraseContract):
    def make_log(self, tmp_path: Path) -> Log:
        return EventLog.open(tmp_path / "log", profile="t", durability="sync")

    def reopen(self, log: Log) -> Log:
        assert log.path is not None
        log.close()
        return EventLog.open(log.path, profile="t")

    def tamper(self, log: Log, edit: Edit) -> Log:
        """Edits the canonical bytes; a changed event is written back as a format-1 value (the
        canonical JSON itself, which every reader of the log accepts), a removed one deleted.
        Byte-level damage to format-2 values is tested in test_log_lmdb.py."""
        assert log.path is not None
        before = dict(log.read(raw=True))
        log.close()
        after = dict(before)
        edit(after)
        env = lmdb.open(str(generation_dir(log.path)), max_dbs=8)
        db = env.open_db(b"events")
        with env.begin(write=True) as txn:
            for seq in before.keys() - after.keys():
                txn.delete(seq_key(seq), db=db)
            for seq, raw in after.items():
                if before.get(seq) != raw:
                    txn.put(seq_key(seq), raw, db=db)
        env.close()
        return EventLog.open(log.path, profile="t")


@settings(max_examples=200)
@given(
    data=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5),
    session=st.none() | st.from_regex(codec.ID_RE, fullmatch=True),
    etype=st.from_regex(codec.TYPE_RE, fullmatch=True).filter(lambda t: len(t) <= 128),
    v=st.integers(1, 1000),
    eid=st.none() | st.from_regex(codec.ID_RE, fullmatch=True),
    seq=st.integers(1, 2**40),
    ts=st.integers(0, 2**62),
    prev=st.binary(min_size=32, max_size=32).map(bytes.hex),
)
def test_sealed_bytes_are_the_canonical_encoding(
    data: dict[str, Any], session: str | None, etype: str, v: int, eid: str | None, seq: int, ts: int, prev: str
) -> None:
    event: dict[str, Any] = {"type": etype, "session": session, "data": data, "v": v}
    if eid is not None:
        event["id"] = eid
    p = codec.prepare(event)
    raw, digest = codec.seal(p, seq, ts, prev)
    env = codec.decode(raw)
    assert codec.canonical(env) == raw
    assert env["hash"] == digest
    assert (env["type"], env["v"], env["session"], env["seq"], env["ts"], env["prev"]) == (etype, v, session, seq, ts, prev)
    assert env["id"] == (eid if eid is not None else p.id)
    assert codec.check_stored(raw, seq, prev)[1] is None

"""Invariants 1-3 of DESIGN.md at the log, each test written against a mutation no other test
caught (docs/RELIABILITY.md, "Mutation audit"): the recorded head's hash is part of what
`verify` checks, an append never overwrites a stored event, and the default durability syncs."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import lmdb
import psycopg
import pytest

from eventlog.errors import StorageError
from eventlog.log.damage import Verified
from eventlog.log.lmdb import EventLog, generation_dir, seq_key
from eventlog.log.memory import MemoryLog
from eventlog.log.postgres import PostgresLog


def ev(i: int) -> dict[str, Any]:
    return {"type": "test.happened", "session": "s1", "data": {"i": i}}


def _lmdb_meta(path: Path) -> tuple[lmdb.Environment, Any, Any]:
    env = lmdb.open(str(generation_dir(path)), max_dbs=8)
    return env, env.open_db(b"meta"), env.open_db(b"events")


OTHER_HASH = hashlib.sha256(b"not the last event").hexdigest()


def test_verify_names_a_recorded_head_whose_hash_is_not_the_last_events_lmdb(tmp_path: Path) -> None:
    """The head records the right seq but another hash: the chain's end no longer matches what
    the log says it holds, so `verify` fails (at the last event), though every event checks out."""
    path = tmp_path / "log"
    with EventLog.open(path, durability="nosync") as lg:
        lg.append([ev(i) for i in range(3)])
        assert lg.verify().ok
    env, meta, _ = _lmdb_meta(path)
    with env.begin(write=True) as txn:
        txn.put(b"head", seq_key(3) + bytes.fromhex(OTHER_HASH), db=meta)
    env.close()
    with EventLog.open(path) as lg:
        result = lg.verify()
    assert not result.ok
    assert result.first_bad_seq == 3
    assert result.reason == "recorded head does not match the last event"


def test_verify_names_a_recorded_head_whose_hash_is_not_the_last_events_memory() -> None:
    lg = MemoryLog(profile="t")
    lg.append([ev(i) for i in range(3)])
    lg.storage.head = OTHER_HASH
    result = lg.verify()
    assert not result.ok and result.first_bad_seq == 3
    assert result.reason == "recorded head does not match the last event"


@pytest.mark.postgres
def test_verify_names_a_recorded_head_whose_hash_is_not_the_last_events_postgres(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        lg.append([ev(i) for i in range(3)])
        assert lg.verify().ok
    with psycopg.connect(pg_url, autocommit=True) as c:
        row = c.execute("SELECT schema_name FROM eventlog.profiles WHERE name = %s", (pg_profile,)).fetchone()
        assert row is not None
        c.execute(f'UPDATE "{row[0]}".head SET hash = %s', (OTHER_HASH,))
    with PostgresLog.open(pg_url, profile=pg_profile) as lg:
        result = lg.verify()
    assert not result.ok and result.first_bad_seq == 3
    assert result.reason == "recorded head does not match the last event"


def test_an_append_onto_a_head_recorded_behind_the_stored_events_overwrites_none(tmp_path: Path) -> None:
    """A head set back by one event (damage outside the program) makes the next append's seq one
    that is stored already: LMDB's append-only put refuses it, the batch fails and event 3 keeps its
    bytes — an append never rewrites an event (invariant 2), whatever the head says."""
    path = tmp_path / "log"
    with EventLog.open(path, durability="nosync") as lg:
        lg.append([ev(i) for i in range(3)])
        before = dict(lg.read(raw=True))
        second = lg.hash_at(2)
    assert second is not None
    env, meta, _ = _lmdb_meta(path)
    with env.begin(write=True) as txn:
        txn.put(b"head", seq_key(2) + bytes.fromhex(second), db=meta)
    env.close()
    with EventLog.open(path) as lg:
        with pytest.raises(StorageError, match="out of order"):
            lg.append([ev(99)])
        assert dict(lg.read(raw=True)) == before


def test_the_default_durability_syncs_every_commit(tmp_path: Path) -> None:
    """DESIGN.md: "An append returns only after its events are durable under the configured
    durability (default: synced to disk)". The environment a default open gets syncs data and
    meta pages on commit; `nosync` is the only way to turn that off."""
    with EventLog.open(tmp_path / "a") as lg:
        assert lg.durability == "sync"
        flags = lg._env.flags()
        assert flags["sync"] and flags["metasync"]
    with EventLog.open(tmp_path / "b", durability="nosync") as lg:
        assert not lg._env.flags()["sync"]


@pytest.mark.parametrize("raw", [True, False])
def test_a_chain_check_names_a_deleted_event_by_its_own_seq(tmp_path: Path, raw: bool) -> None:
    """A removed event is a gap: a catch-up's chain check (damage.Verified, which builds and
    catch-ups use) names the missing seq itself, not the next event whose prev no longer fits."""
    path = tmp_path / "log"
    with EventLog.open(path, durability="nosync") as lg:
        lg.append([ev(i) for i in range(9)])
        fifth = lg.hash_at(5)
    env, _, events = _lmdb_meta(path)
    with env.begin(write=True) as txn:
        assert txn.delete(seq_key(6), db=events)
    env.close()
    with EventLog.open(path) as lg:
        for start, prev in ((1, None), (4, None), (6, fifth)):
            checked = Verified(lg, start, None, prev, record=False, raw=raw)
            seqs = [seq for seq, _, _ in checked]
            assert seqs == list(range(start, 6))
            assert checked.damage is not None and checked.damage.seq == 6, (start, checked.damage)

"""Invariants 1-4 of DESIGN.md at the logs, each test written against a mutation no other test
caught, or caught only incidentally (docs/RELIABILITY.md, "Mutation audit"): the recorded head's
hash is part of what `verify` checks, an append never overwrites a stored event, the default
durability syncs (LMDB and PostgreSQL), a deleted event is named by its own seq, doctor and
rebuild leave the log's bytes alone, LMDB's own lock on lock.mdb survives our appends, and
PostgreSQL's rules lock lets one host in at a time."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import orjson
import psycopg
import pytest

from eventlog.errors import StorageError, WriterBusyError
from eventlog.log.damage import Verified
from eventlog.log.lmdb import EventLog, generation_dir, seq_key
from eventlog.log.memory import MemoryLog
from eventlog.log.postgres import PostgresLog
from eventlog.sessions.store import SessionStore


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


def _log_files(log_dir: Path) -> dict[str, bytes]:
    """Every file of the log directory (LMDB's reader table, lock.mdb, aside: every open of the
    log registers in it), and where each symlink points."""
    out = {}
    for p in sorted(log_dir.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(log_dir))] = os.readlink(p).encode()
        elif p.is_file() and p.name != "lock.mdb":
            out[str(p.relative_to(log_dir))] = p.read_bytes()
    return out


def test_repair_rebuild_and_doctor_never_write_the_log(tmp_path: Path) -> None:
    """Invariant 2: "Repair, rebuild and doctor never write the log" — byte for byte, with
    projections broken enough that every command has something to do."""
    home = tmp_path / "home"
    with SessionStore.open(home, "p", follower=False) as store:
        for s in range(3):
            sid = store.create_session(f"s{s}", title=f"session {s}")
            for i in range(5):
                store.append_message(sid, "user", f"message {i} of session {s}")
        store.sync()
    profile = home / "profiles" / "p"
    before = _log_files(profile / "log")
    exe = str(Path(sys.executable).with_name("eventlog"))
    for command in (["doctor", "--fix"], ["rebuild"], ["doctor", "--deep", "--fix"], ["doctor", "--deep"]):
        for kind in ("state", "fts"):
            (profile / os.readlink(profile / f"{kind}.db")).write_bytes(os.urandom(8192))
        done = subprocess.run([exe, "--home", str(home), "--profile", "p", *command], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, (command, done.stderr)
        assert _log_files(profile / "log") == before, command
    with SessionStore.open(home, "p", follower=False) as store:
        assert store.log.verify().ok and len(store.get_messages("s2")) == 5


@pytest.mark.postgres
def test_the_default_durability_commits_synchronously_on_postgres(pg_url: str, pg_profile: str) -> None:
    """The same promise on PostgreSQL: the writer's commits wait for the WAL flush unless the
    handle was opened with `nosync`."""
    for durability, expected in (("sync", "on"), ("nosync", "off")):
        with PostgresLog.open(pg_url, profile=pg_profile, durability=durability) as lg:
            lg.append([ev(0)])
            assert lg._writer_conn().execute("SHOW synchronous_commit").fetchone()[0] == expected


def test_appends_and_reads_keep_lmdbs_own_lock_on_its_lock_file(tmp_path: Path) -> None:
    """Invariant 4, "no code path opens, reads or closes a live database file with plain file
    I/O": LMDB holds a POSIX (fcntl) lock on lock.mdb for as long as a process has the log open —
    how another process knows it is not alone, and how eventlog itself finds the processes that
    have the log open (posix_lock_holders) — and closing any descriptor of that file in this
    process would cancel it. Seen from another process, it is still held after appends and reads."""
    path = tmp_path / "log"
    probe = ("import sys; from pathlib import Path; from eventlog.log.lmdb import posix_lock_holders; "
             "print(posix_lock_holders(Path(sys.argv[1])))")
    with EventLog.open(path, durability="nosync") as lg:
        lock = generation_dir(path) / "lock.mdb"
        lg.append([ev(0)])
        lg.append([ev(1)], expected_version=1)
        assert [e["seq"] for e in lg.read()] == [1, 2] and lg.verify().ok
        seen = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True, timeout=60)
        assert seen.returncode == 0, seen.stderr
        assert os.getpid() in orjson.loads(seen.stdout), seen.stdout


@pytest.mark.postgres
def test_the_postgres_rules_lock_lets_one_host_at_a_time_in(pg_url: str, pg_profile: str) -> None:
    """What SessionStore._ruled takes so that hosts sharing a log check a domain rule and append
    as one step: held by one handle (one host), another waits and is refused in time."""
    with PostgresLog.open(pg_url, profile=pg_profile) as a, PostgresLog.open(pg_url, profile=pg_profile) as b:
        with a.rules_lock(5.0):
            with pytest.raises(WriterBusyError):
                with b.rules_lock(0.3):
                    pass
        with b.rules_lock(5.0):  # free again once the holder let go
            pass

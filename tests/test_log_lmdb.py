"""LMDB-specific promises: persistence, map growth, bounded reads, fork safety, offline tampering."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import lmdb
import pytest

import eventlog.log.lmdb as logmod
from eventlog import profiles
from eventlog.errors import ForkedEnvironmentError, ProfileNameError, StorageError, ValidationError
from eventlog.log.lmdb import EventLog, seq_key


def ev(session: str = "s1", **data: object) -> dict[str, object]:
    return {"type": "test.happened", "session": session, "data": data}


def fill(path: Path, n: int, **extra: object) -> list[dict[str, object]]:
    with EventLog.open(path, durability="nosync") as lg:
        lg.append([ev(i=i, marker=f"MARK{i:04d}", **extra) for i in range(n)])
        return list(lg.read())


def test_events_survive_reopen_and_ids_stay_idempotent(tmp_path: Path) -> None:
    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        assert lg.append([dict(ev(n=1), id="k1")]) == [1]
    with EventLog.open(p) as lg:
        assert lg.append([dict(ev(n=1), id="k1")]) == [1]
        assert lg.append([ev(n=2)]) == [2]
        assert lg.verify().ok and lg.head()[0] == 2


def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        EventLog.open(tmp_path / "log", durability="fast")


def test_map_full_grows_the_map_and_retries_the_whole_batch(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", map_size=256 * 1024, durability="nosync") as lg:
        seqs: list[int] = []
        for b in range(20):
            seqs += lg.append([ev(i=i, pad="x" * 2000) for i in range(25)])
        assert seqs == list(range(1, 501))
        assert lg._env.info()["map_size"] > 256 * 1024
        assert lg.verify().ok


def test_long_scan_holds_no_read_transaction_between_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logmod, "READ_CHUNK", 10)
    with EventLog.open(tmp_path / "log", durability="nosync") as lg:
        lg.append([ev(i=i) for i in range(55)])
        it = lg.read()
        for _ in range(15):
            next(it)
        assert lg._readers == 0, "a paused scan must not pin a read transaction"
        assert [e["seq"] for e in it][-1] == 55
        sess = lg.read_session("s1")
        next(sess)
        assert lg._readers == 0
        assert len(list(sess)) == 54


def test_reader_check_runs_on_open(tmp_path: Path) -> None:
    fill(tmp_path / "log", 3)
    with EventLog.open(tmp_path / "log") as lg:
        assert lg.reader_check() == 0


def test_use_after_fork_is_a_clear_error(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as lg:
        lg.append([ev(n=1)])
        pid = os.fork()
        if pid == 0:  # child
            code = 3
            try:
                lg.append([ev(n=2)])
            except ForkedEnvironmentError:
                code = 0
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert lg.append([ev(n=3)]) == [2]


def test_generated_ids_of_a_forked_child_do_not_collide_with_the_parent() -> None:
    # A forked child inherits the id counter; its salt is re-rolled at fork, so two processes
    # generating ids in the same nanosecond with the same counter still differ.
    from eventlog.log import codec

    parent = codec.new_id(now_ns=1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.write(w, codec.new_id(now_ns=1).encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert len(child) == len(parent) == 32
    assert child[-10:] != parent[-10:], "the child kept the parent's id salt"
    assert child != codec.new_id(now_ns=1)


def test_closed_log_refuses_use(tmp_path: Path) -> None:
    lg = EventLog.open(tmp_path / "log")
    lg.close()
    with pytest.raises(StorageError):
        lg.head()


def test_unwritable_directory_gives_a_hint(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores permission bits; use a path under a regular file instead
        (tmp_path / "file").write_text("x")
        with pytest.raises(StorageError) as info:
            EventLog.open(tmp_path / "file" / "log")
        assert info.value.message
        return
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    with pytest.raises(StorageError):
        EventLog.open(d / "log")


def test_files_and_dirs_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.umask(0o022)
    try:
        d = profiles.profile_dir(tmp_path / "h", "p1")
        with EventLog.open(d / "log") as lg:
            lg.append([ev(n=1)])
    finally:
        os.umask(old)
    for p in [tmp_path / "h", tmp_path / "h" / "profiles", d, d / "log"]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    for f in (d / "log").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "", "x" * 65, "nul\x00", ".", "..", "-lead", "new\nline", "a b", 7])
def test_hostile_profile_names_are_refused_before_touching_disk(tmp_path: Path, name: object) -> None:
    with pytest.raises(ProfileNameError):
        profiles.profile_dir(tmp_path / "h", name)  # type: ignore[arg-type]
    assert not (tmp_path / "h").exists()


def test_good_profile_names(tmp_path: Path) -> None:
    for name in ["default", "a", "A.b-c_9", "x" * 64]:
        assert profiles.profile_dir(tmp_path / "h", name).is_dir()


# ------------------------------------------------------------------ offline tampering

def raw_env(path: Path) -> tuple[lmdb.Environment, object]:
    env = lmdb.open(str(path), max_dbs=8)
    return env, env.open_db(b"events")


def test_flipped_byte_in_the_file_is_found(tmp_path: Path) -> None:
    p = tmp_path / "log"
    fill(p, 30)
    data = bytearray((p / "data.mdb").read_bytes())
    at = data.find(b"MARK0017")
    assert at > 0
    data[at + 5] ^= 0x01
    (p / "data.mdb").write_bytes(bytes(data))
    with EventLog.open(p) as lg:
        res = lg.verify()
    assert not res.ok and res.first_bad_seq == 18, res


def test_removed_event_is_found(tmp_path: Path) -> None:
    p = tmp_path / "log"
    fill(p, 20)
    env, db = raw_env(p)
    with env.begin(write=True) as txn:
        assert txn.delete(seq_key(7), db=db)
    env.close()
    with EventLog.open(p) as lg:
        res = lg.verify()
    assert not res.ok and res.first_bad_seq == 7 and "missing" in (res.reason or "")


def test_removed_last_event_is_found(tmp_path: Path) -> None:
    p = tmp_path / "log"
    fill(p, 5)
    env, db = raw_env(p)
    with env.begin(write=True) as txn:
        assert txn.delete(seq_key(5), db=db)
    env.close()
    with EventLog.open(p) as lg:
        res = lg.verify()
    assert not res.ok and res.first_bad_seq == 5


def test_swapped_events_are_found(tmp_path: Path) -> None:
    p = tmp_path / "log"
    fill(p, 12)
    env, db = raw_env(p)
    with env.begin(write=True) as txn:
        a, b = txn.get(seq_key(4), db=db), txn.get(seq_key(9), db=db)
        txn.put(seq_key(4), b, db=db)
        txn.put(seq_key(9), a, db=db)
    env.close()
    with EventLog.open(p) as lg:
        res = lg.verify()
    assert not res.ok and res.first_bad_seq == 4


def test_rewritten_event_with_recomputed_own_hash_is_found_at_the_next(tmp_path: Path) -> None:
    """A forger who rewrites one event and fixes its own hash still breaks the next link."""
    from eventlog.log import codec

    p = tmp_path / "log"
    envs = fill(p, 8)
    forged = dict(envs[2])
    forged["data"] = {"i": 999}
    prep = codec.prepare({"type": forged["type"], "session": forged["session"], "data": forged["data"], "id": forged["id"]})
    raw, _ = codec.seal(prep, 3, forged["ts"], forged["prev"])
    env, db = raw_env(p)
    with env.begin(write=True) as txn:
        txn.put(seq_key(3), raw, db=db)
    env.close()
    with EventLog.open(p) as lg:
        res = lg.verify()
    assert not res.ok and res.first_bad_seq == 4


def test_group_commit_shares_synced_transactions(tmp_path: Path) -> None:
    import threading

    with EventLog.open(tmp_path / "log", durability="sync") as lg:
        barrier = threading.Barrier(8)

        def work(w: int) -> None:
            barrier.wait()
            for i in range(40):
                lg.append([ev(f"w{w}", i=i)])

        ts = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert lg.head()[0] == 320
        assert lg.commits < 320 * 0.8, f"{lg.commits} commits for 320 appends: no sharing"
        assert lg.verify().ok


def test_reformatted_bytes_with_the_same_content_are_found(tmp_path: Path) -> None:
    """Stored bytes must be the canonical encoding: a same-content rewrite is still tampering."""
    import orjson

    p = tmp_path / "log"
    fill(p, 6)
    env, db = raw_env(p)
    with env.begin(write=True) as txn:
        obj = orjson.loads(txn.get(seq_key(2), db=db))
        txn.put(seq_key(2), orjson.dumps(obj, option=orjson.OPT_INDENT_2), db=db)
    env.close()
    with EventLog.open(p) as lg:
        res = lg.verify()
    assert not res.ok and res.first_bad_seq == 2 and "canonical" in (res.reason or "")

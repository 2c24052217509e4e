"""Corruption matrix beyond the projections: lock files deleted under running processes, the
LMDB reader table full of dead readers, and the disk filling up mid-append.

What happens, case by case:

- ``lock.mdb`` deleted under a lone running writer: harmless. The writer keeps the deleted
  inode and its own lock table; the next process to open creates a new ``lock.mdb`` and from then
  on fresh processes serialize on it.
- ``lock.mdb`` deleted while the old writer keeps writing and a fresh process starts writing
  too: the two processes hold two different lock tables, so LMDB's single-writer mutex no longer
  excludes them. The log must notice (refuse with a clear error) rather than let both commit.
- Reader slots of SIGKILLed processes: ``reader_check`` on open must clear them, also while
  another live process keeps the environment open (then LMDB does not reset the table).
- Disk full (a small tmpfs, as root): the append fails with a StorageError, nothing acknowledged
  is lost, verify passes, and appends work again once space is freed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import pytest
from campaign import PROFILE, Child, check_log, child_env, log_dir, parse_acks, projection_problems
from campaign.summary import note, record
from fixtures_fs import tmpfs

from eventlog.errors import DiskFullError, StorageError
from eventlog.log import EventLog

pytest_plugins = ["campaign.summary"]


def writer(path: Path, name: str, stop: Path) -> Child:
    child = Child("log_writer", path, name, stop)
    assert child.wait_line("READY", timeout=60) is not None, child.stderr
    return child


def refusals(child: Child) -> list[str]:
    return [line for line in child.lines if line.startswith("REFUSED")]


def wait_acks(child: Child, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(parse_acks(child.lines)) < n and time.monotonic() < deadline and child.proc.poll() is None:
        time.sleep(0.01)


# ------------------------------------------------------------------ lock.mdb deleted

def only_reopen_warnings(stderr: str) -> bool:
    """The one thing a process may say when its lock file vanished: that it reopened the log."""
    return all("was deleted or replaced; reopening the log" in line for line in stderr.splitlines())


def test_lock_file_deleted_under_a_lone_writer_then_fresh_processes_serialize(tmp_path: Path) -> None:
    path = tmp_path / "log"
    EventLog.open(path).close()
    stop = tmp_path / "stop1"
    a = writer(path, "A", stop)
    wait_acks(a, 50)
    (path / "lock.mdb").unlink()
    n = len(parse_acks(a.lines))
    wait_acks(a, n + 200)
    stop.touch()
    assert a.finish(60) == 0 and only_reopen_warnings(a.stderr), a.stderr
    acked = parse_acks(a.lines)
    assert len(acked) > n, "the writer kept appending after its lock file was deleted"
    assert not refusals(a)
    assert (path / "lock.mdb").exists(), "the writer rejoined a fresh lock file"

    stop2 = tmp_path / "stop2"
    b, c = writer(path, "B", stop2), writer(path, "C", stop2)  # the first one creates a new lock.mdb
    wait_acks(b, 200)
    wait_acks(c, 200)
    stop2.touch()
    for ch in (b, c):
        assert ch.finish(60) == 0 and only_reopen_warnings(ch.stderr) and not refusals(ch), (ch.stderr, refusals(ch))
        acked += parse_acks(ch.lines)
    problems, lost, envs = check_log(path, acked)
    record("lock.mdb deleted, then fresh writers", runs=1, passed=int(not problems), lost=lost)
    assert not problems, "\n".join(problems)
    assert len(envs) == len(acked), "every append was acknowledged and nothing else was written"
    assert (path / "lock.mdb").exists()


def test_lock_file_deleted_while_the_old_writer_keeps_writing_is_detected(tmp_path: Path) -> None:
    """The old writer and a fresh one would each hold a different LMDB lock table. The log must
    refuse (a clear EventLogError in at least one of them) instead of letting both commit: no
    acknowledged write may be lost and verify must pass."""
    path = tmp_path / "log"
    EventLog.open(path).close()
    stop = tmp_path / "stop"
    a = writer(path, "A", stop)
    wait_acks(a, 50)
    (path / "lock.mdb").unlink()
    b = writer(path, "B", stop)
    wait_acks(b, 300, timeout=5)
    time.sleep(0.3)
    stop.touch()
    codes = [a.finish(60), b.finish(60)]
    acked = parse_acks(a.lines) + parse_acks(b.lines)
    problems = [f"child failed: {ch.stderr[-1500:]}" for ch, code in zip((a, b), codes) if code]
    try:
        found, lost, _ = check_log(path, acked)
    except Exception as e:  # a corrupted environment may not even open
        found, lost = [f"the log cannot be read any more: {e!r}"], len(acked)
    problems += found
    record("lock.mdb deleted under two live writers", runs=1, passed=int(not problems), lost=lost)
    assert not problems, (f"{lost} of {len(acked)} acknowledged writes lost; refusals: "
                          f"{refusals(a)[:1] + refusals(b)[:1]}; " + "; ".join(problems[:5]))


# ------------------------------------------------------------------ reader table

def holder(path: Path, max_readers: int, hold: int) -> Child:
    child = Child("lmdb_holder", path, max_readers, hold, stdin=True)
    at = child.wait_line("HELD", timeout=60)
    assert at is not None, child.stderr
    assert child.lines[at] == f"HELD {hold}", child.lines
    return child


def fill_reader_table(path: Path, max_readers: int) -> None:
    """SIGKILL a process that holds every reader slot."""
    dead = holder(path, max_readers, max_readers)
    dead.kill()
    assert dead.proc.returncode == -9


def test_reader_table_full_of_dead_readers_with_no_live_process(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path, max_readers=4) as lg:
        lg.append([{"type": "test.written", "data": {"n": 1}}])
    fill_reader_table(path, 4)
    with EventLog.open(path, max_readers=4) as lg:
        lg.reader_check()
        assert lg.head()[0] == 1
        assert lg.append([{"type": "test.written", "data": {"n": 2}}]) == [2]
        assert lg.verify().ok
    record("reader table full, no live process", runs=1, passed=1)


def test_dead_readers_are_cleared_on_open_while_another_process_keeps_the_log_open(tmp_path: Path) -> None:
    """With a live process holding the environment, LMDB keeps the lock table as it is, so only
    reader_check can free the slots of the dead readers — and the next open must run it."""
    path = tmp_path / "log"
    with EventLog.open(path, max_readers=4) as lg:
        lg.append([{"type": "test.written", "data": {"n": 1}}])
    live = holder(path, 4, 0)
    try:
        fill_reader_table(path, 4)
        with pytest.raises(lmdb.ReadersFullError):  # the slots really are taken
            lmdb.open(str(path), max_dbs=8, max_readers=4)
        error = None
        try:
            with EventLog.open(path, max_readers=4) as lg:
                assert lg.head()[0] == 1
                assert lg.append([{"type": "test.written", "data": {"n": 2}}]) == [2]
                assert lg.verify().ok
        except StorageError as e:
            error = str(e)
        live.send("append")  # the live process meets the full table too (its own read runs reader_check)
        at = live.wait_line("", timeout=30, start=1)
        live_line = live.lines[at] if at is not None else f"<no answer: {live.lines[1:]}>"
    finally:
        live.kill()
    record("reader table full, live process", runs=1, passed=int(error is None and live_line.startswith("OK")))
    assert error is None, f"EventLog.open with the reader table full of dead readers: {error} (the live process: {live_line})"
    assert live_line == "OK 3 3", live_line


# ------------------------------------------------------------------ disk full

def event(i: int, pad: int) -> dict[str, object]:
    """An event of at least ``pad`` bytes once stored: random hex, which zstd only halves."""
    return {"type": "test.written", "session": "s", "id": f"e{i}", "data": {"i": i, "pad": os.urandom(pad).hex()}}


def fill_until_full(lg: EventLog, start: int = 0, pad: int = 6000) -> tuple[list[tuple[str, str, int]], BaseException]:
    acked: list[tuple[str, str, int]] = []
    for i in range(start, start + 100_000, 3):
        try:
            seqs = lg.append([event(i, pad), event(i + 1, pad), event(i + 2, pad)])
        except Exception as e:
            return acked, e
        acked += [("test.written", "s", s) for s in seqs]
    raise AssertionError("the file system never filled up")


def test_map_full_grows_the_map_on_a_small_file_system(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "8m") as fs:
        with EventLog.open(fs / "log", map_size=64 * 1024) as lg:
            seqs: list[int] = []
            for b in range(40):
                seqs += lg.append([event(b * 4 + k, 6000) for k in range(4)])
            grown = lg._env.info()["map_size"]
            assert seqs == list(range(1, 161))
            assert lg.verify().ok
        assert grown > 64 * 1024, "the map grew on MapFullError and the whole batch was retried"
    record("map full: map grows", runs=1, passed=1)


def test_disk_full_mid_append_loses_nothing_and_recovers(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "8m") as fs:
        (fs / "filler").write_bytes(b"\0" * (5 * 1024 * 1024))
        lg = EventLog.open(fs / "log", map_size=512 * 1024)
        try:
            acked, err = fill_until_full(lg)
            assert isinstance(err, StorageError), repr(err)
            assert acked, "some appends succeeded before the disk filled up"
            head = lg.head()[0]
            assert head == len(acked)
            st = os.statvfs(fs)
            too_big = st.f_bavail * st.f_frsize + 256 * 1024
            with pytest.raises(StorageError):  # a batch larger than the free space, all or nothing
                lg.append([event(-1 - k, 64 * 1024) for k in range(too_big // (64 * 1024) + 1)])
            assert lg.head()[0] == head, "a failed append writes nothing"
            problems_before = [] if lg.verify().ok else ["verify failed after ENOSPC"]
            (fs / "filler").unlink()
            more = lg.append([event(-2, 100)])
            assert more == [head + 1]
            acked.append(("test.written", "s", head + 1))
        finally:
            lg.close()
        problems, lost, _ = check_log(fs / "log", acked)
        problems = problems_before + problems
        r = subprocess.run([sys.executable, "-c", "import sys; from eventlog.log import EventLog\n"
                            "with EventLog.open(sys.argv[1]) as lg: print(lg.append([{'type': 't.x', 'data': {}}])[0])",
                            str(fs / "log")], capture_output=True, text=True, env=child_env())
        if r.returncode != 0 or r.stdout.strip() != str(head + 2):
            problems.append(f"a fresh process could not append after space returned: {r.stderr[-500:]}")
    record("disk full (tmpfs ENOSPC)", runs=1, passed=int(not problems), lost=lost)
    assert not problems, "\n".join(problems)


def test_disk_full_is_reported_as_disk_full(tmp_path: Path) -> None:
    """The user must learn that the disk is full (DiskFullError, "no space"), not a vague I/O error."""
    with tmpfs(tmp_path / "fs", "8m") as fs:
        (fs / "filler").write_bytes(b"\0" * (5 * 1024 * 1024))
        with EventLog.open(fs / "log", map_size=512 * 1024) as lg:
            _, err = fill_until_full(lg)
    assert isinstance(err, DiskFullError), f"{type(err).__name__}: {err}"


# ------------------------------------------------------------------ projector lease file deleted

def test_projector_lease_survives_its_file_being_deleted(tmp_path: Path) -> None:
    """One process at a time writes the projections: a process that takes the lease after its
    file was deleted (and so creates a new one) must still be refused while the holder lives."""
    from projections.lease import Lease

    holder_code = ("import sys, time\nfrom pathlib import Path\nfrom projections.lease import Lease\n"
                   "lease = Lease(Path(sys.argv[1]))\nassert lease.acquire(timeout=5)\n"
                   "print('HELD', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", holder_code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HELD"
        lease = Lease(tmp_path)
        assert not lease.acquire(timeout=0), "the lease is held by the other process"
        lease.close()
        lease.path.unlink()
        second = Lease(tmp_path)
        taken = second.acquire(timeout=0.2)
        if taken:
            second.release()
        second.close()
    finally:
        proc.kill()
        proc.wait()
    record("projector lease file deleted", runs=1, passed=int(not taken))
    assert not taken, "after projector.lock was deleted a second process took the lease while the holder lived"


def test_projector_lock_deleted_while_processes_project(tmp_path: Path) -> None:
    """Even if two projectors end up running, the projections must come out exactly as a fresh
    rebuild and no caller may see an error; warnings the library prints are reported."""
    from eventlog.sessions.store import SessionStore

    home = tmp_path / "home"
    SessionStore.open(home, PROFILE, read_model="projection").close()
    pdir = home / "profiles" / PROFILE
    writers = [Child("store_writer", home, PROFILE, f"w{n}", 2, 80, "projection") for n in range(3)]
    deleted = 0
    while any(w.proc.poll() is None for w in writers):
        for lock in pdir.glob("*.lock"):
            lock.unlink(missing_ok=True)
            deleted += 1
        time.sleep(0.005)
    codes = [w.finish(60) for w in writers]
    problems = [f"writer exited {c}: {w.stderr[-1500:]}" for w, c in zip(writers, codes) if c or "ERROR" in w.stderr]
    warnings = sorted({line for w in writers for line in w.stderr.splitlines() if line.strip()})
    acked = [a for w in writers for a in parse_acks(w.lines)]
    found, lost, envs = check_log(log_dir(home), acked)
    problems += found
    if not found:
        problems += projection_problems(home, tmp_path / "fresh", envs)
    record("projector lock deleted under writers", runs=1, passed=int(not problems), lost=lost)
    if warnings:
        note(f"projector lock deleted under writers: the library warned {warnings[:3]}")
    assert deleted, "the lease file was deleted at least once while the writers ran"
    assert not problems, "\n".join(problems)

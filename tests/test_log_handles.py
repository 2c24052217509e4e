"""LMDB log handles: many opens of one log share one environment; a frozen writer blocks no
reader and makes a writer fail in bounded time, naming the process."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from eventlog.errors import ClosedError, StorageError, ValidationError, WriterBusyError
from eventlog.log.lmdb import EventLog, _open_envs


def ev(session: str = "s1", **data: object) -> dict[str, object]:
    return {"type": "test.happened", "session": session, "data": data}


def test_many_handles_share_one_environment_and_close_independently(tmp_path: Path) -> None:
    p = tmp_path / "log"
    handles = [EventLog.open(p, durability="nosync") for _ in range(5)]
    assert len({id(h._core) for h in handles}) == 1 and handles[0]._core.refs == 5
    for i, h in enumerate(handles):
        h.append([ev(i=i)])
    assert [h.head()[0] for h in handles] == [5] * 5
    handles[2].close()
    handles[2].close()  # idempotent
    with pytest.raises(ClosedError):
        handles[2].head()
    assert handles[0].append([ev(i=9)]) == [6] and handles[4].head()[0] == 6
    for h in handles:
        h.close()
    assert os.path.realpath(p) not in _open_envs
    with EventLog.open(p) as again:  # a fresh environment after the last close
        assert again.head()[0] == 6 and again.verify().ok


def test_handles_opened_and_closed_from_many_threads_in_random_order(tmp_path: Path) -> None:
    p = tmp_path / "log"
    errors: list[BaseException] = []

    def library(n: int) -> None:
        rng = random.Random(n)
        try:
            for round_ in range(10):
                with EventLog.open(p, durability="nosync") as lg:
                    lg.append([ev(f"lib{n}", round=round_)])
                    time.sleep(rng.random() / 200)
                    assert lg.stream_version(f"lib{n}") == round_ + 1
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=library, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert os.path.realpath(p) not in _open_envs
    with EventLog.open(p) as lg:
        assert lg.head()[0] == 60 and lg.verify().ok


def test_a_stronger_durability_than_the_open_one_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "log"
    with EventLog.open(p, durability="nosync"):
        with pytest.raises(ValidationError) as info:
            EventLog.open(p, durability="sync")
        assert info.value.field == "durability"
    with EventLog.open(p, durability="sync") as strong, EventLog.open(p, durability="nosync") as weak:
        assert weak.durability == strong.durability == "sync"


def test_a_read_only_handle_refuses_appends(tmp_path: Path) -> None:
    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        lg.append([ev(n=1)])
    with EventLog.open(p, readonly=True) as ro:
        assert ro.head()[0] == 1
        with pytest.raises(StorageError):
            ro.append([ev(n=2)])
        with pytest.raises(ValidationError):
            EventLog.open(p)  # the environment is read-only in this process


HOLDER = textwrap.dedent("""
    import sys, time
    from eventlog.log.lmdb import EventLog
    log = EventLog.open(sys.argv[1])
    core = log._core
    with core._writing():                      # what an append holds while it commits
        txn = core._env.begin(write=True)
        txn.put(b"x", b"half-written", db=core._meta)
        print("HOLDING", flush=True)
        time.sleep(120)
""")

READER = textwrap.dedent("""
    import sys, time
    from eventlog.log.lmdb import EventLog
    t0 = time.monotonic()
    with EventLog.open(sys.argv[1]) as log:
        seq, _ = log.head()
        n = sum(1 for _ in log.read())
        ok = log.verify().ok
    print(seq, n, ok, round(time.monotonic() - t0, 3), flush=True)
""")

WRITER = textwrap.dedent("""
    import sys, time
    from eventlog.errors import WriterBusyError
    from eventlog.log.lmdb import EventLog
    t0 = time.monotonic()
    with EventLog.open(sys.argv[1], lock_timeout=0.5) as log:
        try:
            log.append([{"type": "test.happened", "session": "s1", "data": {}}])
            print("APPENDED", flush=True)
        except WriterBusyError as e:
            print("BUSY", e.pid, round(time.monotonic() - t0, 3), str(e), flush=True)
""")


def test_a_stopped_writer_blocks_no_reader_and_a_writer_gives_up_naming_it(tmp_path: Path) -> None:
    p = tmp_path / "log"
    with EventLog.open(p) as lg:
        lg.append([ev(n=i) for i in range(50)])
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(p)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HOLDING"
        os.kill(holder.pid, signal.SIGSTOP)
        out = subprocess.run([sys.executable, "-c", READER, str(p)], capture_output=True, text=True, timeout=20)
        seq, n, ok, seconds = out.stdout.split()
        assert (seq, n, ok) == ("50", "50", "True"), out
        assert float(seconds) < 1.0, out.stdout
        out = subprocess.run([sys.executable, "-c", WRITER, str(p)], capture_output=True, text=True, timeout=20)
        word, pid, seconds, message = out.stdout.split(" ", 3)
        assert word == "BUSY" and int(pid) == holder.pid, out
        assert 0.4 <= float(seconds) < 5.0 and "stopped" in message and "kill -CONT" in message, out.stdout
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()
    # The holder's half-written transaction is gone and the next writer goes through at once.
    out = subprocess.run([sys.executable, "-c", WRITER, str(p)], capture_output=True, text=True, timeout=20)
    assert out.stdout.startswith("APPENDED"), out
    with EventLog.open(p) as lg:
        assert lg.head()[0] == 51 and lg.verify().ok


STORE_WRITER = textwrap.dedent("""
    import sys, time
    from eventlog.errors import WriterBusyError
    from eventlog.sessions.store import SessionStore
    with SessionStore.open(sys.argv[1], "p", follower=False, lock_timeout=float(sys.argv[2])) as store:
        listed = len(store.list_sessions())            # a read answers past the frozen writer
        t0 = time.monotonic()
        try:
            store.create_session(source="cli")
            print("CREATED", flush=True)
        except WriterBusyError as e:
            print("BUSY", listed, e.pid, round(time.monotonic() - t0, 3), flush=True)
""")


def test_session_store_lock_timeout_bounds_a_write_behind_a_stopped_writer(tmp_path: Path) -> None:
    from eventlog.sessions.store import SessionStore

    with SessionStore.open(tmp_path, "p", follower=False) as store:
        store.create_session(source="cli")
    with pytest.raises(ValidationError):
        SessionStore.open(tmp_path, "q", follower=False, lock_timeout=-1)
    log_dir = tmp_path / "profiles" / "p" / "log"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(log_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HOLDING"
        os.kill(holder.pid, signal.SIGSTOP)
        for timeout in ("0.3", "1.5"):
            out = subprocess.run([sys.executable, "-c", STORE_WRITER, str(tmp_path), timeout],
                                 capture_output=True, text=True, timeout=30)
            word, listed, pid, seconds = out.stdout.split()
            assert (word, listed, int(pid)) == ("BUSY", "1", holder.pid), out
            assert float(timeout) - 0.05 <= float(seconds) < float(timeout) + 3.0, out.stdout
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()


def test_the_writer_lock_error_is_typed(tmp_path: Path) -> None:
    err = WriterBusyError(tmp_path, os.getpid(), 1.5)
    assert isinstance(err, StorageError) and err.pid == os.getpid() and "1.5 s" in str(err) and err.hint


def test_a_handle_closed_by_a_finalizer_during_an_open_does_not_deadlock(tmp_path: Path) -> None:
    """A garbage collection inside EventLog.open (which holds the registry lock) may run a
    finalizer that closes another handle (Hermes' adapter closes its engine that way)."""
    from eventlog.log import lmdb as lmdb_module

    other = EventLog.open(tmp_path / "other", durability="nosync")
    done = threading.Event()

    def open_while_collecting() -> None:
        with lmdb_module._open_envs_lock:  # as EventLog.open holds it while a GC runs a finalizer
            other.close()
        done.set()

    t = threading.Thread(target=open_while_collecting, daemon=True)
    t.start()
    t.join(5)
    assert done.is_set(), "closing a handle inside an open deadlocked"


def test_threads_reading_while_the_log_moves_to_a_new_generation_all_follow_it(tmp_path: Path) -> None:
    """Compaction moves the log to a new folder; every thread of the process that notices it at
    the same moment must reopen once, in turn — two reopening together closed each other's
    environment ("Attempt to operate on closed/deleted/dropped object")."""
    log = EventLog.open(tmp_path / "log")
    log.append([ev(n=i) for i in range(200)])
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                assert log.head()[0] >= 200
                assert len(list(log.read(from_seq=190))) >= 11
            except BaseException as e:  # noqa: BLE001 - every failure is the finding
                errors.append(e)
                return

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        for i in range(15):
            log.append([ev(n=1000 + i)])
            log.compact()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads), "a reader hung across a compaction"
    assert errors == [], errors[:3]
    assert log.verify().ok and log.head()[0] == 215
    log.close()


def test_an_open_while_the_last_handle_closes_waits_for_the_close(tmp_path: Path) -> None:
    """The last close waits for the reads and commits under way; an open of the same log meanwhile
    took the registry's entry as gone and opened a second environment on the same files, which
    LMDB forbids in one process. It waits for the close, then opens anew."""
    from eventlog.log import lmdb as lmdb_module

    p = tmp_path / "log"
    first = EventLog.open(p)
    first.append([{"type": "test.happened", "data": {"n": 1}}])
    old = first._core
    reading = threading.Event()
    release = threading.Event()

    def long_read() -> None:
        with old._read():
            reading.set()
            release.wait(5)

    reader = threading.Thread(target=long_read)
    reader.start()
    assert reading.wait(5)
    closer = threading.Thread(target=first.close)
    closer.start()
    time.sleep(0.2)
    assert closer.is_alive()  # waiting for the read
    opened: list[EventLog] = []
    opener = threading.Thread(target=lambda: opened.append(EventLog.open(p)))
    opener.start()
    time.sleep(0.3)
    assert not opened and closer.is_alive()  # the open waits: the old environment is still open
    release.set()
    for t in (reader, closer, opener):
        t.join(10)
    assert opened and opened[0]._core is not old and old._closed
    with opened[0] as again:
        assert again.append([{"type": "test.happened", "data": {"n": 2}}]) == [2] and again.verify().ok
    assert not lmdb_module._open_envs

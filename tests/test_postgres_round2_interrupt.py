"""Second-round audit of the PostgreSQL log: a KeyboardInterrupt (or a SystemExit raised by a
signal handler) in the thread leading a group commit. The group's other callers returned the
seqs their events had been sealed at, never committed: acknowledged appends not in the log."""
from __future__ import annotations

import signal
import threading
import time
from typing import Any

import psycopg
import pytest

from eventlog.errors import OutcomeUnknownError
from eventlog.log.pg_schema import LOCK_NAMESPACE
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres


def waiting_on_lock(admin: psycopg.Connection[Any], n: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND wait_event = 'advisory'").fetchone()
        if row is not None and row[0] >= n:
            return
        time.sleep(0.005)
    raise AssertionError("no append waiting on the profile's lock")


def test_an_interrupted_leader_never_leaves_its_group_acknowledged(pg_url: str, pg_profile: str) -> None:
    assert threading.current_thread() is threading.main_thread()  # where signals are handled
    led = 0
    with PostgresLog.open(pg_url, profile=pg_profile) as lg, psycopg.connect(pg_url, autocommit=True) as admin:
        key = (LOCK_NAMESPACE, lg.info.id)
        for rnd in range(40):
            got: dict[str, Any] = {}

            def append(name: str) -> None:
                try:
                    got[name] = lg.append([{"type": "x.y", "id": f"{name}{rnd}", "session": "s", "data": {}}])
                except Exception as e:  # collected for the assertions
                    got[name] = e

            admin.execute("SELECT pg_advisory_lock(%s, %s)", key)  # the first leader waits for it
            first = threading.Thread(target=append, args=("a",))
            first.start()
            waiting_on_lock(admin, 1)
            other = threading.Thread(target=append, args=("b",))
            timer = threading.Timer(0.1, other.start)  # queued behind main, both behind the first leader
            timer.start()

            def release() -> None:
                time.sleep(0.3)
                admin.execute("SELECT pg_advisory_unlock(%s, %s)", key)  # the first group commits, then the
                # second waits behind the next holder, queued before it

            with psycopg.connect(pg_url, autocommit=True) as holder:
                queued = threading.Thread(target=holder.execute, args=("SELECT pg_advisory_lock(%s, %s)", key))
                queued.start()
                waiting_on_lock(admin, 2)
                releaser = threading.Thread(target=release)
                releaser.start()
                old = signal.signal(signal.SIGALRM, signal.default_int_handler)  # KeyboardInterrupt in main
                signal.setitimer(signal.ITIMER_REAL, 0.8)
                try:
                    append("m")
                except KeyboardInterrupt:
                    pass
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, old)
                    releaser.join()
                    queued.join()
                    holder.execute("SELECT pg_advisory_unlock(%s, %s)", key)
                    first.join()
                    other.join()
            stored = {e["id"] for e in lg.read()}
            if f"m{rnd}" not in stored and "m" not in got:  # main led the group of b, and was interrupted
                led += 1
                b = got["b"]
                # was: b returned [seq] though nothing of that group was committed
                assert isinstance(b, OutcomeUnknownError) and b.event_ids == [f"b{rnd}"], b
                assert lg.append([{"type": "x.y", "id": f"b{rnd}", "session": "s", "data": {}}])  # the retry
            else:
                b = got["b"]
                assert isinstance(b, list) and lg.get(b[0])["id"] == f"b{rnd}"  # type: ignore[index]
            if led >= 2:
                break
        assert led, "the main thread never led the interrupted group"
        assert lg.verify().ok

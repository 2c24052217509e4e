"""A PostgreSQL server whose processes are frozen (SIGSTOP: a stalled VM)
while its host's kernel still acknowledges every packet. TCP keepalives and tcp_user_timeout see
nothing wrong, so a call waited until the server resumed (72 s for a server stopped that long);
with ``answer_timeout`` the statement's connection is cut once the server also fails to answer a
new connection, and the call fails as after a lost connection. A server that answers is never
cut, however long a statement waits (a wait for the append lock here)."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventlog.errors import OutcomeUnknownError, StorageError, ValidationError
from eventlog.log import pg_watch
from eventlog.log.pg_schema import LOCK_NAMESPACE
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres


def _server_pids(data: Path) -> list[int]:
    top = int((data / "postmaster.pid").read_text().split()[0])
    pids = [top]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == top:
                        pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return pids


@pytest.fixture
def private_server(pg_server: Any) -> Any:
    """A server of this test's own: the whole server is stopped, which the shared one cannot be."""
    from pg_server import PgServer

    with PgServer(pg_server.bindir) as srv:
        yield srv


def test_calls_to_a_frozen_server_fail_instead_of_waiting_for_it(private_server: Any) -> None:
    url = private_server.url()
    lg = PostgresLog.open(url, profile="frozen", answer_timeout=1, connect_timeout=1, reconnect_timeout=2)
    thawed = threading.Event()
    pids: list[int] = []
    once = threading.Lock()

    def thaw() -> None:
        with once:
            if not thawed.is_set():
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
                thawed.set()

    guard = threading.Timer(45, thaw)  # without the watch the calls below wait for this
    try:
        assert lg.append([{"type": "x.y", "id": "a1", "session": "s", "data": {"n": 1}}]) == [1]
        assert len(list(lg.read())) == 1  # a reader connection, open and idle in the pool: its statement is sent
        pids.extend(_server_pids(private_server.data))
        cuts = pg_watch.WATCH.cuts
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        guard.start()
        # A read: the statement is sent, nothing comes back. Was: it waited until SIGCONT.
        with pytest.raises(StorageError, match="cannot reach PostgreSQL"):
            list(lg.read())
        assert not thawed.is_set() and pg_watch.WATCH.cuts > cuts
        # An append: sent in one round trip with its COMMIT, so its outcome is unknown; the ids
        # in the error find it out once the server is back.
        with pytest.raises(OutcomeUnknownError) as caught:
            lg.append([{"type": "x.y", "id": "a2", "session": "s", "data": {"n": 2}}])
        assert not thawed.is_set()
        thaw()
        retry = lg.append([{"type": "x.y", "id": "a2", "session": "s", "data": {"n": 2}}])
        assert retry == [2] and caught.value.event_ids == ["a2"]
        assert [e["data"]["n"] for e in lg.read()] == [1, 2]
        assert lg.verify().ok
    finally:
        guard.cancel()
        thaw()
        lg.close()


def test_a_long_wait_on_a_server_that_answers_is_not_cut(pg_url: str, pg_profile: str) -> None:
    """The append waits 4 s for the append lock, 4x its answer_timeout: the server answers the
    watch's probe, so the statement is left alone and the append goes through."""
    with PostgresLog.open(pg_url, profile=pg_profile, answer_timeout=1) as lg, \
            psycopg.connect(pg_url, autocommit=True) as admin:
        cuts = pg_watch.WATCH.cuts
        admin.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, lg.info.id))
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(lg.append([{"type": "x.y", "session": "s", "data": {}}])))
        t.start()
        time.sleep(4)
        assert not result  # still waiting for the lock
        admin.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, lg.info.id))
        t.join(20)
        assert result == [[1]] and pg_watch.WATCH.cuts == cuts


@pytest.mark.parametrize("bad", ["x", -1, float("nan"), True])
def test_answer_timeout_must_be_seconds(pg_url: str, pg_profile: str, bad: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        PostgresLog.open(pg_url, profile=pg_profile, answer_timeout=bad)
    assert caught.value.field == "answer_timeout"


def test_the_watch_thread_runs_only_while_a_watched_log_is_open(pg_url: str, pg_profile: str) -> None:
    """No eventlog thread outlives the last handle (the embedding contract): the watch's thread
    stayed for the life of the process once one statement had been watched."""
    def watching() -> bool:
        return any(t.name == "eventlog-pg-watch" for t in threading.enumerate())

    a = PostgresLog.open(pg_url, profile=pg_profile)
    b = PostgresLog.open(pg_url, profile=pg_profile)
    unwatched = PostgresLog.open(pg_url, profile=pg_profile, answer_timeout=None)
    try:
        assert a.head() == b.head() and watching()
        a.close()
        a.close()  # idempotent: it does not count twice
        assert b.head() and watching()
    finally:
        b.close()
    assert not watching() and unwatched.head()  # an unwatched log needs no thread
    unwatched.close()

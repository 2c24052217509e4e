"""Second-round audit of the PostgreSQL log: the rules lock lost while held (its connection cut,
or ended by the server's idle_in_transaction_session_timeout) must not let two hosts act on
one rule — of two hosts setting one title, both were acknowledged."""
from __future__ import annotations

import time

import psycopg
import pytest

from eventlog.errors import StorageError, WriterBusyError
from eventlog.log import postgres
from eventlog.log.pg_schema import LOCK_NAMESPACE
from eventlog.log.postgres import PostgresLog

pytestmark = pytest.mark.postgres


def rules_holders(admin: psycopg.Connection, log: PostgresLog) -> list[int]:
    return [int(r[0]) for r in admin.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s AND granted",
        (LOCK_NAMESPACE + 1, log.info.id)).fetchall()]


def test_an_append_under_a_rules_lock_lost_meanwhile_is_refused_and_writes_nothing(pg_url: str,
                                                                                    pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as a, PostgresLog.open(pg_url, profile=pg_profile) as b, \
            psycopg.connect(pg_url, autocommit=True) as admin:
        with a.rules_lock(5):
            (holder,) = rules_holders(admin, a)
            admin.execute("SELECT pg_terminate_backend(%s)", (holder,))  # host a's lock is gone
            with b.rules_lock(5):  # so host b takes it, checks its rule and writes
                assert b.append([{"type": "x.y", "id": "b1", "session": "s", "data": {"by": "b"}}]) == [1]
            with pytest.raises(StorageError, match="rules lock .* was lost"):  # was: [2], both acknowledged
                a.append([{"type": "x.y", "session": "s", "data": {"by": "a"}}])
            # a replay writes nothing: it still returns the seqs it was stored at
            assert a.append([{"type": "x.y", "id": "b1", "session": "s", "data": {"by": "b"}}]) == [1]
        assert [e["data"]["by"] for e in a.read()] == ["b"]
        with a.rules_lock(5):  # taken again: its appends go through
            assert a.append([{"type": "x.y", "session": "s", "data": {"by": "a"}}]) == [2]
        assert a.verify().ok


def test_a_new_rules_holder_first_waits_for_the_appends_in_flight(pg_url: str, pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as b, psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, b.info.id))  # an append in flight
        with pytest.raises(WriterBusyError) as caught:  # was: taken at once, its check blind to that append
            with b.rules_lock(0.3):
                pass
        # and it names who the wait was for (was: "(rules lock)", no holder)
        assert f"held by server process {admin.info.backend_pid}" in str(caught.value), caught.value
        assert "append in flight" in str(caught.value) and caught.value.timeout == 0.3
        admin.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, b.info.id))
        with b.rules_lock(5):
            assert b.append([{"type": "x.y", "session": "s", "data": {}}]) == [1]
        assert not rules_holders(admin, b)


def test_an_erase_under_a_rules_lock_lost_meanwhile_is_refused_and_erases_nothing(pg_url: str,
                                                                                   pg_profile: str) -> None:
    with PostgresLog.open(pg_url, profile=pg_profile) as a, psycopg.connect(pg_url, autocommit=True) as admin:
        a.append([{"type": "x.y", "session": "s", "data": {"word": "secret"}}])
        with a.rules_lock(5):
            (holder,) = rules_holders(admin, a)
            admin.execute("SELECT pg_terminate_backend(%s)", (holder,))
            with pytest.raises(StorageError, match="rules lock .* was lost"):  # was: erased, the lineage unchecked
                a.erase([1], {"reason": "test"}, streams=["s"])
        assert a.head()[0] == 1 and a.get(1)["data"] == {"word": "secret"}
        with a.rules_lock(5):
            assert a.erase([1], {"reason": "test"}, streams=["s"]) == 2
        assert a.verify().ok


def test_a_rules_lock_held_past_the_servers_idle_timeout_is_kept(pg_url: str, pg_profile: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock's transaction is ended by the server after idle_in_transaction_session_timeout (60 s;
    2 s here): a holder that simply took that long (an erase of a large lineage) lost it, and with
    the check above its writes would then always be refused."""
    monkeypatch.setattr(postgres, "IDLE_IN_TRANSACTION_S", 2)
    with PostgresLog.open(pg_url, profile=pg_profile) as a, psycopg.connect(pg_url, autocommit=True) as admin:
        with a.rules_lock(5):
            time.sleep(4)
            assert rules_holders(admin, a)
            assert a.append([{"type": "x.y", "session": "s", "data": {}}]) == [1]
        assert not rules_holders(admin, a)

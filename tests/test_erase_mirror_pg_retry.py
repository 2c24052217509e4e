"""A PostgreSQL mirror's import of a log.erased record counts what it stubbed (``stubbed``, which
tells the CLI to rebuild the profile's projections) once, also when the import's COMMIT is lost
and the retry finds it landed. The count was kept only from one attempt to the next: a second
lost connection before the retry read the head (here: while it waited for the append lock)
forgot it (0: the CLI left the erased words in the projections), and a connection lost at the
NOTIFY after the commit counted it twice (12 for 6)."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import commits_held

from eventlog.log.copy import copy_log
from eventlog.log.lmdb import EventLog

sys.path.insert(0, str(Path(__file__).parent))
from test_erase_mirror import erase_at, source  # noqa: E402

pytestmark = pytest.mark.postgres


def _waiting(su: psycopg.Connection[Any], wait_event: str, seen: set[int], timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        su.execute("SELECT pg_stat_clear_snapshot()")
        for (pid,) in su.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'eventlog %%' "
                                 "AND wait_event = %s", (wait_event,)).fetchall():
            if pid not in seen:
                seen.add(pid)
                return int(pid)
        time.sleep(0.01)
    raise AssertionError(f"no eventlog backend waiting on {wait_event}")


def _copy_again(tmp_path: Path, url: str, profile: str, cut: Any) -> int:
    """Copy the source's log into the mirror after an erase at the source, with ``cut`` run
    (given a superuser connection) while the copy's COMMIT waits for a standby that does not
    exist; returns what the mirror's handle counted stubbed."""
    from eventlog.log.postgres import PostgresLog

    home, secret, kept = source(tmp_path)
    src_dir = home / "profiles" / "p" / "log"
    with PostgresLog.open(url, profile=profile) as target, EventLog.open(src_dir) as src:
        copy_log(src, target)
    erase_at(home, secret, kept)
    with psycopg.connect(url, autocommit=True) as su, \
            PostgresLog.open(url, profile=profile, reconnect_timeout=30) as target, EventLog.open(src_dir) as src:
        errors: list[BaseException] = []

        def copy() -> None:
            try:
                copy_log(src, target)
            except BaseException as e:  # noqa: BLE001 - handed to the test
                errors.append(e)

        t = threading.Thread(target=copy)
        try:
            with commits_held(su):
                t.start()
                cut(su)
        finally:
            t.join(60)
        assert not errors, errors
        assert target.verify().erased == 6 and list(target.read()) == list(src.read())
        return int(target.stubbed)


def test_a_second_lost_connection_before_the_retry_reads_the_head_keeps_the_count(
        tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    def cut(su: psycopg.Connection[Any]) -> None:
        seen: set[int] = set()
        committing = _waiting(su, "SyncRep", seen)
        holder = psycopg.connect(pg_url, autocommit=True)
        try:
            from eventlog.log.postgres import PostgresLog
            with PostgresLog.open(pg_url, profile=pg_profile, create=False) as peek:
                lock, args = peek._sql.lock, peek._sql.lock_args
            holder.execute("SET synchronous_commit = local")
            taking = threading.Thread(target=lambda: (holder.execute("BEGIN"), holder.execute(lock, args)))
            taking.start()  # queued behind the committing backend: it takes the lock when that one ends
            time.sleep(0.3)
            su.execute("SELECT pg_terminate_backend(%s)", (committing,))  # the COMMIT landed; its answer is lost
            taking.join(10)
            retry = _waiting(su, "advisory", seen)  # the retry waits for the lock the holder now has
            su.execute("SELECT pg_terminate_backend(%s)", (retry,))
            time.sleep(0.3)
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    assert _copy_again(tmp_path, pg_url, pg_profile, cut) == 6


def test_a_lost_notify_after_the_commit_does_not_count_twice(tmp_path: Path, pg_url: str, pg_profile: str) -> None:
    def cut(su: psycopg.Connection[Any]) -> None:
        seen: set[int] = set()
        committing = _waiting(su, "SyncRep", seen)
        # A transaction that notifies holds the server's notify lock while its COMMIT waits for
        # the standby: the retry's NOTIFY waits for that lock ('object') and is cut there.
        holder = psycopg.connect(pg_url, autocommit=True)
        taking = threading.Thread(target=lambda: holder.execute("BEGIN; CREATE TEMP TABLE t (x int); "
                                                                "NOTIFY eventlog_test; COMMIT"))
        try:
            taking.start()
            time.sleep(0.3)
            su.execute("SELECT pg_terminate_backend(%s)", (committing,))  # the COMMIT landed; its answer is lost
            su.execute("SELECT pg_terminate_backend(%s)", (_waiting(su, "object", seen),))  # the retry's NOTIFY
        finally:
            su.execute("ALTER SYSTEM RESET synchronous_standby_names")
            su.execute("SELECT pg_reload_conf()")
            taking.join(10)
            holder.close()

    assert _copy_again(tmp_path, pg_url, pg_profile, cut) == 6
